package driver_test

import (
	"math"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
)

// TestBoundsAreTheLimiters: CheckOp's bounds on params are those of the
// configs ratelimit.New accepts (written twice, since driver cannot import
// the root package): MaxTokens and MaxPeriod alike, and the least rate one
// shard of the most shards may have; its least count above 0 is MinCount. Should one side move alone, the
// stores would refuse ops of valid limits, or accept ops of none.
func TestBoundsAreTheLimiters(t *testing.T) {
	if driver.MaxTokensForTest != ratelimit.MaxTokens {
		t.Errorf("driver's most tokens %v, ratelimit.MaxTokens %v", float64(driver.MaxTokensForTest), float64(ratelimit.MaxTokens))
	}
	if driver.MinCountForTest != ratelimit.MinCount {
		t.Errorf("driver's least count %v, ratelimit.MinCount %v", float64(driver.MinCountForTest), float64(ratelimit.MinCount))
	}
	if want := ratelimit.MaxPeriod.Milliseconds(); driver.MaxPeriodForTest != want {
		t.Errorf("driver's longest period %d ms, ratelimit.MaxPeriod %d ms", int64(driver.MaxPeriodForTest), want)
	}
	// The least Rate a Config may have is the least a shard of the most
	// shards may have, times their number.
	least := driver.MinRateForTest * ratelimit.MaxShards
	c := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: least, Period: time.Second, Capacity: 1}
	if err := c.Validate(); err != nil {
		t.Errorf("a Rate of driver's least rate times MaxShards (%v) is refused: %v", least, err)
	}
	c.Rate = math.Nextafter(least, 0)
	if err := c.Validate(); err == nil {
		t.Errorf("a Rate below driver's least rate times MaxShards (%v) is accepted", c.Rate)
	}
}

// TestClampMilli: a time within ±MaxTime is its Unix milliseconds; one
// beyond, however far (its milliseconds past an int64's range too), is
// the bound on its side, so that less ExpiryGrace it cannot wrap around.
func TestClampMilli(t *testing.T) {
	for _, tc := range []struct {
		t    time.Time
		want int64
	}{
		{time.UnixMilli(0), 0},
		{time.UnixMilli(1_700_000_000_123), 1_700_000_000_123},
		{time.UnixMilli(driver.MaxTime), driver.MaxTime},
		{time.UnixMilli(-driver.MaxTime), -driver.MaxTime},
		{time.UnixMilli(driver.MaxTime + 1), driver.MaxTime},
		{time.UnixMilli(-driver.MaxTime - 1), -driver.MaxTime},
		{time.UnixMilli(math.MinInt64), -driver.MaxTime},
		{time.UnixMilli(math.MaxInt64), driver.MaxTime},
		{time.Unix(math.MinInt64/2, 0), -driver.MaxTime},
		{time.Unix(math.MaxInt64/2, 0), driver.MaxTime},
		{time.Time{}, time.Time{}.UnixMilli()},
	} {
		if got := driver.ClampMilli(tc.t); got != tc.want {
			t.Errorf("ClampMilli(%v) = %d, want %d", tc.t, got, tc.want)
		}
		if got := driver.ClampMilli(tc.t) - driver.ExpiryGrace; got > driver.MaxTime {
			t.Errorf("ClampMilli(%v) less the grace wrapped around to %d", tc.t, got)
		}
	}
}
