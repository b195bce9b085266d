// Package refill holds the arithmetic of a token bucket's time until full,
// which package ratelimit reports as Result.ResetAfter and package
// httplimit takes apart again to learn how far a record is ahead of the
// caller's clock: one copy, so that the two compute it by the same float
// operations in the same order, and their difference is the lag alone.
package refill

import "github.com/ratelimit-go/ratelimit/driver"

// Share returns one record's share of a limit's rate and capacity (a zero
// capacity is the rate) over shards records (0 or 1: one record): the
// Rate and Capacity of the driver.Params the stores decide with.
func Share(rate, capacity float64, shards int) (shareRate, shareCapacity float64) {
	if capacity == 0 {
		capacity = rate
	}
	if shards > 1 {
		n := float64(shards)
		rate /= n
		capacity /= n
	}
	return rate, capacity
}

// Millis returns how long, in milliseconds and not rounded, the records a
// call evaluated take to refill from remaining, their sum, to full at
// their rate together: one record of p, or two of a limit of shards > 1
// records, each of p (one record's share, Share). A record's shortfall
// is not known apart from the other's, and one shorter than the other is
// full later. The wait counts from the records' time: a caller whose
// clock lags it adds the lag.
func Millis(p *driver.Params, shards int, remaining float64) float64 {
	k := float64(min(max(shards, 1), 2))
	return max(p.Capacity*k-remaining, 0) * float64(p.Period) / p.Rate / k
}
