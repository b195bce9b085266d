package rfc3339

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, s := range []string{
		"2024-01-01T00:00:00Z", "2024-01-01T23:59:59.999999999Z", "2024-01-01T00:00:00+23:59",
		"2024-01-01T00:00:00-00:00", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59.5+05:30",
	} {
		got, err := Parse(s)
		want, _ := time.Parse(time.RFC3339Nano, s)
		if err != nil || !got.Equal(want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{
		"2024-01-01T00:00:00+24:00", "2024-01-01T00:00:00-24:00", "2024-01-01T00:00:00+00:60",
		"2024-01-01T0:00:00Z", "2024-01-01T00:00:00,5Z", "2024-01-01T0:00:00+01:00",
	} {
		if _, err := Parse(s); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q): got %v, want ErrSyntax", s, err)
		}
	}
	for _, s := range []string{"", "2024-01-01T00:00:00-99:00", "2024-01-01", "2024-01-01T00:00:00", "2024-01-01 00:00:00Z", "x"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q): got no error", s)
		}
	}
}

// RFC 3339 allows a lower-case t and z (section 5.6: ABNF's strings are
// case-insensitive), which time.Parse refuses. A leap second, which a
// time.Time cannot hold, is refused as time.Parse refuses it, and a
// fraction's digits past the nanosecond are dropped, as time.Parse drops
// them.
func TestParseRFC3339Edges(t *testing.T) {
	for s, want := range map[string]time.Time{
		"2024-01-01t00:00:00z":            time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC),
		"2024-01-01t00:00:00Z":            time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC),
		"2024-01-01T00:00:00.5z":          time.Date(2024, 1, 1, 0, 0, 0, 5e8, time.UTC),
		"2024-01-01t01:00:00+01:00":       time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC),
		"2024-01-01T00:00:00.1234567899Z": time.Date(2024, 1, 1, 0, 0, 0, 123456789, time.UTC),
		"2024-02-29T00:00:00Z":            time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC),
		"2000-02-29T00:00:00Z":            time.Date(2000, 2, 29, 0, 0, 0, 0, time.UTC),
		"0000-02-29T00:00:00Z":            time.Date(0, 2, 29, 0, 0, 0, 0, time.UTC),
		"9999-12-31T23:59:59.999999999Z":  time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		"2024-01-01T00:00:00-23:59":       time.Date(2024, 1, 1, 23, 59, 0, 0, time.UTC),
	} {
		got, err := Parse(s)
		if err != nil || !got.Equal(want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{
		"2016-12-31T23:59:60Z", "2023-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2024-04-31T00:00:00Z",
		"2024-01-01T00:00:00z ", "2024-01-01tt00:00:00Z", "2024-01-01T00:00:00.Z", "2024-01-01T00:00:00+01:00z",
		"2024-01-01T24:00:00Z", "+2024-01-01T00:00:00Z", "t", "z",
	} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q): got no error", s)
		}
	}
}

// Parse takes a text if and only if RFC 3339's grammar does, but for a
// leap second, and reads the instant time.Parse reads of every text both
// take.
func TestParseRandom(t *testing.T) {
	r := rand.New(rand.NewSource(time.Now().UnixNano()))
	for range 100000 {
		s := randomTime(r)
		got, err := Parse(s)
		valid, leap := grammar(s)
		if valid && !leap && err != nil {
			t.Fatalf("Parse(%q): %v; it is RFC 3339", s, err)
		}
		if (!valid || leap) && err == nil {
			t.Fatalf("Parse(%q) = %v; it is not RFC 3339, or a leap second", s, got)
		}
		if want, werr := time.Parse(time.RFC3339Nano, s); err == nil && werr == nil && !got.Equal(want) {
			t.Fatalf("Parse(%q) = %v; time.Parse reads %v", s, got, want)
		}
	}
}

// randomTime returns a text near an RFC 3339 time: most are one, the
// others have a field out of range or a character added or removed.
func randomTime(r *rand.Rand) string {
	digits := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('0' + r.Intn(10))
		}
		return string(b)
	}
	two := func(most int) string { return fmt.Sprintf("%02d", r.Intn(most+1)) }
	s := digits(4) + "-" + two(13) + "-" + two(31) + "Tt"[r.Intn(2):][:1] + two(24) + ":" + two(60) + ":" + two(60)
	if r.Intn(2) == 0 {
		s += ".,"[r.Intn(2)*r.Intn(2):][:1] + digits(1+r.Intn(12))
	}
	if r.Intn(2) == 0 {
		s += "Zz"[r.Intn(2):][:1]
	} else {
		s += "+-"[r.Intn(2):][:1] + two(25) + ":" + two(61)
	}
	switch r.Intn(8) {
	case 0:
		i := r.Intn(len(s))
		s = s[:i] + s[i+1:]
	case 1:
		i := r.Intn(len(s) + 1)
		s = s[:i] + "0:.+-TtZz, "[r.Intn(11):][:1] + s[i:]
	}
	return s
}

// grammar reports whether s is an RFC 3339 date-time (section 5.6), with
// its date in the calendar (section 5.7), and whether its second is 60.
func grammar(s string) (valid, leap bool) {
	num := func(t string, lo, hi int) bool {
		if len(t) == 0 {
			return false
		}
		n := 0
		for i := 0; i < len(t); i++ {
			if t[i] < '0' || t[i] > '9' {
				return false
			}
			n = 10*n + int(t[i]-'0')
		}
		return lo <= n && n <= hi
	}
	if len(s) < len("2006-01-02T15:04:05Z") || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') ||
		s[13] != ':' || s[16] != ':' || !num(s[:4], 0, 9999) || !num(s[5:7], 1, 12) ||
		!num(s[11:13], 0, 23) || !num(s[14:16], 0, 59) || !num(s[17:19], 0, 60) {
		return false, false
	}
	year, month := int(s[0]-'0')*1000+int(s[1]-'0')*100+int(s[2]-'0')*10+int(s[3]-'0'), 10*int(s[5]-'0')+int(s[6]-'0')
	if !num(s[8:10], 1, time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day()) {
		return false, false
	}
	rest := s[19:]
	if rest[0] == '.' {
		n := 1
		for n < len(rest) && '0' <= rest[n] && rest[n] <= '9' {
			n++
		}
		if n == 1 {
			return false, false
		}
		rest = rest[n:]
	}
	switch {
	case rest == "Z" || rest == "z":
	case len(rest) == len("+07:00") && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':' &&
		num(rest[1:3], 0, 23) && num(rest[4:6], 0, 59):
	default:
		return false, false
	}
	return true, s[17:19] == "60"
}
