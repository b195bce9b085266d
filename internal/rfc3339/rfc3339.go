// Package rfc3339 reads a time written as RFC 3339 writes one, as the
// limits file format and the command line's --start take it.
package rfc3339

import (
	"errors"
	"time"
)

// ErrSyntax is matched by the error of a text that time.Parse reads as
// time.RFC3339Nano but that is not RFC 3339: an hour of one digit, a
// comma before the fraction of a second, or an offset of 24 hours or of
// 60 minutes or more.
var ErrSyntax = errors.New("not an RFC 3339 time")

// Parse reads s, an RFC 3339 time with a fraction of a second or none.
// time.Parse reads more than RFC 3339 (go.dev/issue/54580), and
// time.Time.UnmarshalText, meant to be strict, does not yet check it: an
// offset of +24:00 or +00:60 (which it reads as an hour), so that a slip
// aligned windows to another instant without a word. It reads less, too:
// Parse takes a lower-case t and z, which RFC 3339 allows (section 5.6,
// as ABNF's strings are case-insensitive) and time.Parse refuses. As
// time.Parse does, it refuses a leap second (:60), which a time.Time
// cannot hold, and drops the digits of a fraction past the nanosecond
// (.1234567899 reads as .123456789).
func Parse(s string) (time.Time, error) {
	if len(s) > len("2006-01-02") && s[len("2006-01-02")] == 't' {
		s = s[:len("2006-01-02")] + "T" + s[len("2006-01-02")+1:]
	}
	if len(s) > 0 && s[len(s)-1] == 'z' {
		s = s[:len(s)-1] + "Z"
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, err
	}
	// time.Parse read "2006-01-02T", then the hour, of one digit or two.
	const date = len("2006-01-02T")
	if len(s) < date+len("15:04:05Z") || s[date+2] != ':' {
		return time.Time{}, ErrSyntax
	}
	if s[date+len("15:04:05")] == ',' {
		return time.Time{}, ErrSyntax
	}
	if z := s[len(s)-1]; z != 'Z' {
		offset := s[len(s)-len("07:00"):]
		if num2(offset[:2]) >= 24 || num2(offset[3:]) >= 60 {
			return time.Time{}, ErrSyntax
		}
	}
	return t, nil
}

// num2 reads two decimal digits, which time.Parse has checked.
func num2(s string) int { return 10*int(s[0]-'0') + int(s[1]-'0') }
