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
