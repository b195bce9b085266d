package ratelimit_test

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// start is an RFC 3339 time, as the format says: time.Parse, which reads
// more, took an offset of 24 hours or more (+24:00), minutes of 60 or
// more (+00:60, read as an hour), an hour of one digit (T0:00:00Z) and a
// comma before the fraction of a second, none of which RFC 3339 has, so
// that a slip in a file aligned its windows to another instant without a
// word. It takes all RFC 3339 has but a leap second, lower-case t and z
// too, which time.Parse refused.
func TestParseLimitsStartRFC3339(t *testing.T) {
	doc := func(start string) []byte {
		return []byte("a:\n  kind: fixed window\n  rate: 1\n  period: 1m\n  start: " + start + "\n")
	}
	for _, bad := range []string{
		"2024-01-01T00:00:00+24:00",
		"2024-01-01T00:00:00-99:00",
		"2024-01-01T00:00:00+00:60",
		"2024-01-01T0:00:00Z",
		"2024-01-01T00:00:00,5Z",
		`"2024-01-01T00:00:00+24:00"`,
		"2016-12-31T23:59:60Z", // a leap second, which a time.Time cannot hold
		"2023-02-29T00:00:00Z",
	} {
		_, err := ratelimit.ParseLimits(doc(bad))
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "line 5: start: ", bad)
		assert.Contains(t, err.Error(), "is not a time: write an RFC 3339 time such as 2024-01-01T00:00:00Z", bad)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidConfig, bad)
	}
	for start, want := range map[string]time.Time{
		"2024-01-01T00:00:00Z":           time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC),
		"2024-01-01T00:00:00.5Z":         time.Date(2024, 1, 1, 0, 0, 0, 5e8, time.UTC),
		"2024-01-01T01:30:00+01:30":      time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC),
		"2024-01-01T00:00:00-23:59":      time.Date(2024, 1, 1, 23, 59, 0, 0, time.UTC),
		"2024-01-01T00:00:00.123456789Z": time.Date(2024, 1, 1, 0, 0, 0, 123456789, time.UTC),
		// Past the nanosecond, a fraction's digits are dropped, as
		// time.Parse drops them.
		"2024-01-01T00:00:00.1234567899Z": time.Date(2024, 1, 1, 0, 0, 0, 123456789, time.UTC),
		// RFC 3339 allows a lower-case t and z (section 5.6).
		"2024-01-01t00:00:00z":      time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC),
		"2024-02-29t01:30:00+01:30": time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC),
	} {
		limits, err := ratelimit.ParseLimits(doc(start))
		require.NoError(t, err, start)
		assert.True(t, want.Equal(limits["a"].Start), "%s: got %v, want %v", start, limits["a"].Start, want)
	}
}
