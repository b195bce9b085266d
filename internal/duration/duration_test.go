package duration_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/duration"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Parse reads what time.ParseDuration reads, exactly: it refuses what is
// finer than a nanosecond, which ParseDuration truncates.
func TestParse(t *testing.T) {
	for s, want := range map[string]time.Duration{
		"0": 0, "1h30m": 90 * time.Minute, "1.5s": 1500 * time.Millisecond, "-1.5s": -1500 * time.Millisecond,
		"+.5s": 500 * time.Millisecond, "0.5ns0.5ns": time.Nanosecond, "0.5000000000000h": 30 * time.Minute,
		"1.5000000000000000000000000000s": 1500 * time.Millisecond, "1.5µs": 1500, "1.5μs": 1500, "1.5us": 1500,
		"2562047h47m16.854775807s": time.Duration(1<<63 - 1), "-2562047h47m16.854775808s": time.Duration(-1 << 63),
	} {
		d, err := duration.Parse(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, d, s)
		if std, _ := time.ParseDuration(s); std == want {
			continue
		}
		assert.Equal(t, "0.5ns0.5ns", s, "ParseDuration reads it otherwise")
	}
	for _, s := range []string{"0.5ns", "1.0000005ms", "1ms0.5ns", "0.0000000015s", "1.00000000000000000001s",
		"0." + strings.Repeat("0", 200) + "1s", "0." + strings.Repeat("1", 120) + "m"} {
		_, err := duration.Parse(s)
		assert.ErrorIs(t, err, duration.ErrNotWhole, s)
	}
	for _, s := range []string{"", "1", "1x", "h", "1h-1m", "1..5s"} {
		_, err := duration.Parse(s)
		assert.ErrorContains(t, err, "time: ", s)
	}
	// Written as a duration, beyond the range of time.Duration, which
	// time.ParseDuration called invalid ("time: invalid duration"), as
	// it does a typo.
	for _, s := range []string{"3000000h", "9999999h", "-3000000h", "2562047h47m16.854775808s", "99999999999999999999ns"} {
		_, err := duration.Parse(s)
		assert.ErrorIs(t, err, duration.ErrRange, s)
	}
}
