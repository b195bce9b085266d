// Package duration reads Go durations exactly. time.ParseDuration
// truncates the fraction of each unit, computed in float64, and drops the
// decimals beyond its range: it reads 0.5ns as 0, 1.0000005ms as 1ms and
// 1.00000000000000000001s as 1s. The limits file's reader and the command
// ratelimit read durations here, and refuse one finer than a nanosecond
// rather than take another.
package duration

import (
	"cmp"
	"errors"
	"math/big"
	"regexp"
	"strings"
	"time"
)

var (
	// ErrNotWhole is the error of a duration that is not a whole number
	// of nanoseconds.
	ErrNotWhole = errors.New("is not a whole number of nanoseconds")
	// ErrRange is the error of a duration beyond time.Duration's range.
	ErrRange = errors.New("is out of range")
)

// part matches one number and its unit of what time.ParseDuration reads:
// its whole part, its decimals and its unit.
var part = regexp.MustCompile(`(\d*)(?:\.(\d*))?(ns|us|µs|μs|ms|s|m|h)`)

// units are the units of time.ParseDuration, in nanoseconds.
var units = map[string]int64{"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}

// maxDecimals bounds the decimals of a number of a duration, but for
// trailing zeros: more are finer than a nanosecond of any unit (an hour
// has 3.6e12), and would only cost time.
const maxDecimals = 100

// Parse reads s as time.ParseDuration does ("90s", "1h30m", "1.5ms"),
// with its errors, but exactly: a duration that is not a whole number of
// nanoseconds is an error matching ErrNotWhole, and one beyond
// time.Duration's range ErrRange: by its exact value, or as it is written
// (9999999h), which time.ParseDuration calls invalid.
func Parse(s string) (time.Duration, error) {
	if _, err := time.ParseDuration(s); err != nil {
		if syntax.MatchString(s) {
			// Written as a duration, beyond its range: "invalid duration"
			// sent the reader looking for a typo in 9999999h.
			return 0, ErrRange
		}
		return 0, err
	}
	return Exact(s)
}

// syntax matches what time.ParseDuration reads, of any size: a duration
// it refuses though it matches is out of its range.
var syntax = regexp.MustCompile(`^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$`)

// Exact returns s, a duration that time.ParseDuration reads, as the exact
// number of nanoseconds it writes; see Parse.
func Exact(s string) (time.Duration, error) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimLeft(s, "+-")
	// Summed over a common denominator, 10^decimals: the decimals of
	// two units may add up to a whole nanosecond (0.5ns0.5ns).
	sum, ten := new(big.Int), big.NewInt(10)
	pow := func(n int) *big.Int { return new(big.Int).Exp(ten, big.NewInt(int64(n)), nil) }
	decimals := 0
	for _, m := range part.FindAllStringSubmatch(s, -1) {
		whole, frac := m[1], strings.TrimRight(m[2], "0")
		if len(frac) > maxDecimals {
			return 0, ErrNotWhole
		}
		if len(frac) > decimals {
			sum.Mul(sum, pow(len(frac)-decimals))
			decimals = len(frac)
		}
		x, _ := new(big.Int).SetString(cmp.Or(whole, "0")+frac, 10) // digits, as ParseDuration read them
		x.Mul(x, big.NewInt(units[m[3]]))
		sum.Add(sum, x.Mul(x, pow(decimals-len(frac))))
	}
	ns, rem := sum.QuoRem(sum, pow(decimals), new(big.Int))
	if rem.Sign() != 0 {
		return 0, ErrNotWhole
	}
	if neg {
		ns.Neg(ns)
	}
	if !ns.IsInt64() {
		return 0, ErrRange
	}
	return time.Duration(ns.Int64()), nil
}
