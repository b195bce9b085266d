package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

// Rounding never decides a call: the cases below are those where float
// arithmetic leaves a comparison a hair off, decided through the public
// API over the store, so that every native port meets them whatever its
// random differential sequences draw.

// testRounding runs the rounding cases.
func testRounding(t *testing.T, newStore NewStore) {
	for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
		for _, shards := range []int{1, 2} {
			t.Run(fmt.Sprintf("%v/%d shards", kind, shards), func(t *testing.T) {
				testReserveCapacityPlusMaxReserved(t, newStore, kind, shards)
			})
		}
	}
}

// roundingConfig is a limit of rate and capacity n per second, n the
// shards: one token per second on each shard.
func roundingConfig(kind ratelimit.Kind, shards int, capacity, maxReserved float64) ratelimit.Config {
	n := float64(shards)
	cfg := ratelimit.Config{Kind: kind, Rate: n, Capacity: capacity * n, MaxReserved: maxReserved * n, Period: time.Second, Shards: shards}
	if kind == ratelimit.FixedWindow {
		cfg.Start = time.UnixMilli(0)
	}
	return cfg
}

// A reservation of Capacity plus MaxReserved on full records owes exactly
// MaxReserved on each, which 1 − 1.3 overstates by float noise: it is
// granted, not refused at every retry. The records are stored, full
// again, so that a store that decides a missing record apart from a
// stored one (pgstore's lone upsert) decides it where it ports the
// comparison.
func testReserveCapacityPlusMaxReserved(t *testing.T, newStore NewStore, kind ratelimit.Kind, shards int) {
	ctx := context.Background()
	mock := newMock(epoch)
	lim, err := ratelimit.New(newStore(t), ratelimit.Limits{"r": roundingConfig(kind, shards, 1, 0.3)},
		ratelimit.WithClock(mock))
	require.NoError(t, err)
	for range 2 * shards { // every shard written, most likely
		res, err := lim.Limit(ctx, "r", "k", ratelimit.Count(0.5))
		require.NoError(t, err)
		require.True(t, res.OK)
		mock.Add(time.Second) // full again
	}
	res, err := lim.Limit(ctx, "r", "k", ratelimit.Count(1.3*float64(shards)), ratelimit.WithReserve())
	require.NoError(t, err)
	require.True(t, res.OK, "a debt of MaxReserved, overstated by float noise, is within MaxReserved")
	require.InDelta(t, -0.3*float64(shards), res.Remaining, 1e-9)
	if shards > 1 {
		return
	}
	// The same debt on a record that is not full: 0.5 − 0.8.
	res, err = lim.Limit(ctx, "r", "k2", ratelimit.Count(0.5))
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = lim.Limit(ctx, "r", "k2", ratelimit.Count(0.8), ratelimit.WithReserve())
	require.NoError(t, err)
	require.True(t, res.OK, "a debt of MaxReserved, overstated by float noise, is within MaxReserved")
	require.InDelta(t, -0.3, res.Remaining, 1e-9)
}
