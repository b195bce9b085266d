package ratelimit

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
)

// resetOne must give resetMillis's answer, bit for bit, without its
// division when it can: random limits and remainders, and remainders
// placed so that the wait falls on, or a rounding away from, a whole
// millisecond.
func TestResetOneIsResetMillis(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	rates := []float64{1, 3, 7, 10, 1000, 1e9, 1e12, 1e15, 0.1, 1.0 / 3, 2.5, 1e-9}
	periods := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, time.Minute, time.Hour, 24 * time.Hour, MaxPeriod}
	n := 2_000_000
	if testing.Short() {
		n = 100_000
	}
	for i := range n {
		c := Config{Kind: driver.TokenBucket, Rate: rates[rng.IntN(len(rates))], Period: periods[rng.IntN(len(periods))]}
		c.Capacity = c.Rate * []float64{1, 1.5, 3, 0.25, 1000}[rng.IntN(5)]
		lim, err := compile("l", c)
		if err != nil {
			continue
		}
		p := lim.base
		var remaining float64
		switch rng.IntN(6) {
		case 0: // the wait is a whole number of milliseconds, or a hair off
			w := float64(rng.Int64N(1 << 20))
			remaining = p.Capacity - w*p.Rate/float64(p.Period)
			for range rng.IntN(3) {
				remaining = math.Nextafter(remaining, math.Inf(rng.IntN(2)*2-1))
			}
		case 1:
			remaining = p.Capacity
		case 2:
			remaining = -rng.Float64() * p.Capacity * 5
		case 3:
			remaining = math.Floor(rng.Float64() * p.Capacity)
		case 4:
			remaining = p.Capacity - math.Ldexp(rng.Float64(), -rng.IntN(1000))
		default:
			remaining = rng.Float64() * p.Capacity
		}
		now := int64(1_700_000_000_000)
		ts := now
		if rng.IntN(4) == 0 { // a record ahead of a lagging caller
			ts += rng.Int64N(1 << 32)
		}
		want := resetMillis(&p, 1, remaining, now, ts)
		if got := lim.resetOne(remaining, now, ts); got != want {
			t.Fatalf("case %d: params %+v remaining %v: resetOne %v, resetMillis %v", i, p, remaining, got, want)
		}
	}
}
