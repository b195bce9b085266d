package storetest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// Rounding never decides a call: the cases below are those where float
// arithmetic leaves a comparison a hair off, decided through the public
// API over the store, so that every native port meets them whatever its
// random differential sequences draw.

// testRounding runs the rounding cases.
func testRounding(t *testing.T, newStore NewStore, s suite) {
	for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
		for _, shards := range []int{1, 2} {
			t.Run(fmt.Sprintf("%v/%d shards", kind, shards), func(t *testing.T) {
				testReserveCapacityPlusMaxReserved(t, newStore, kind, shards)
			})
		}
	}
	t.Run("FixedWindowRetryAfter", func(t *testing.T) { testFixedWindowRetryAfter(t, newStore) })
	t.Run("TokenBucketRetryAfter", func(t *testing.T) { testTokenBucketRetryAfter(t, newStore) })
	t.Run("ShardedRetryAfter", func(t *testing.T) { testShardedRetryAfter(t, newStore) })
	t.Run("Differential", func(t *testing.T) { testRoundingDifferential(t, newStore, s) })
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

// A fixed window's refused call is told the first window at which it
// succeeds, though float noise puts the shortfall a hair over a whole
// number of grants (1.7 − 2.7 = −1.0000000000000002 against a grant of 1):
// one window, not two.
func testFixedWindowRetryAfter(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	for _, c := range []struct {
		rate, spend, need float64
		retry             time.Duration
	}{
		{1, 1.3, 2.7, time.Second},
		{0.1, 0.1, 3, time.Second},
		{0.3, 1.5, 2.7, 4 * time.Second},
	} {
		mock := newMock(epoch)
		lim, err := ratelimit.New(newStore(t), ratelimit.Limits{
			"w": {Kind: ratelimit.FixedWindow, Rate: c.rate, Capacity: 3, Period: time.Second, Start: time.UnixMilli(0)},
		}, ratelimit.WithClock(mock))
		require.NoError(t, err)
		res, err := lim.Limit(ctx, "w", "k", ratelimit.Count(c.spend))
		require.NoError(t, err)
		require.True(t, res.OK)
		res, err = lim.Limit(ctx, "w", "k", ratelimit.Count(c.need))
		require.NoError(t, err)
		require.False(t, res.OK)
		require.Equal(t, c.retry, res.RetryAfter, "rate %v, %v then %v", c.rate, c.spend, c.need)
		mock.Add(c.retry - time.Second)
		res, err = lim.Check(ctx, "w", "k", ratelimit.Count(c.need))
		require.NoError(t, err)
		require.False(t, res.OK, "rate %v, %v then %v: OK a window before its RetryAfter", c.rate, c.spend, c.need)
		mock.Add(time.Second)
		res, err = lim.Check(ctx, "w", "k", ratelimit.Count(c.need))
		require.NoError(t, err)
		require.True(t, res.OK, "rate %v, %v then %v: refused at its RetryAfter", c.rate, c.spend, c.need)
	}
}

// testRoundingDifferential is the differential test with rates, capacities,
// debts and counts in tenths of a token, whose arithmetic leaves float
// noise in most shortfalls, and steps of whole periods as often as not:
// the waits land near whole windows and milliseconds, where the ports
// must round as the Go function does. Some limits grant a few times the
// noise per step, so that the waits land on the noise itself.
func testRoundingDifferential(t *testing.T, newStore NewStore, s suite) {
	ctx := context.Background()
	decimalRates := []float64{0.1, 0.3, 0.7, 1.3, 2.5}
	for seed := range max(s.diffSeeds/2, 1) {
		store, model := newStore(t), NewModel()
		rng := rand.New(rand.NewPCG(uint64(seed), 0x0d1e))
		u := &universe{names: []string{"x", "y", "z"}, keys: []string{"k", "k2"},
			params: map[string]driver.Params{}, phases: map[driver.RecordID]int64{}}
		for _, n := range u.names {
			rate := decimalRates[rng.IntN(len(decimalRates))]
			p := driver.Params{Kind: ratelimit.FixedWindow, Rate: rate, Period: []int64{7, 1000, 60_000}[rng.IntN(3)],
				Capacity: rate * []float64{1, 1.5, 3}[rng.IntN(3)]}
			if rng.IntN(3) == 0 {
				// A rate of a few times the noise per millisecond or window:
				// the tokens of a whole number of steps land on the noise
				// itself, where only the arithmetic of the transition tells
				// the step that grants from the one before.
				p.Rate, p.Period = []float64{1e-6, 2e-6, 3e-9}[rng.IntN(3)], []int64{1, 7, 1000}[rng.IntN(3)]
				p.Capacity = float64(1+rng.IntN(5)) / 10
			}
			if rng.IntN(2) == 0 {
				p.Kind = ratelimit.TokenBucket
			}
			if rng.IntN(3) > 0 {
				p.MaxReserved = float64(1+rng.IntN(int(p.Capacity*10)+1)) / 10
			}
			u.params[n] = p
		}
		now := epoch.UnixMilli()
		for step := range s.diffSteps {
			p := u.params[u.names[rng.IntN(len(u.names))]]
			switch rng.IntN(4) {
			case 0:
				now += p.Period
			case 1:
				now += rng.Int64N(p.Period + 1)
			}
			op := u.randomOp(rng, now)
			if len(op.Items) == 0 {
				continue
			}
			for i := range op.Items {
				it := &op.Items[i]
				q := u.params[it.Name]
				reach := q.Capacity * float64(len(it.Shards))
				if op.Reserve {
					reach = (q.Capacity + q.MaxReserved) * float64(len(it.Shards))
				}
				it.Count = math.Min(float64(rng.IntN(int(reach*10)+1))/10, reach)
				switch rng.IntN(6) {
				case 0:
					it.Count = reach
				case 1:
					// What one record holds and may owe, in tenths: float
					// noise may put it a hair above the sum.
					one := q.Capacity
					if op.Reserve {
						one += q.MaxReserved
					}
					it.Count = math.Min(math.Round(one*10)/10, reach)
				}
			}
			applyBoth(t, ctx, store, model, op, seed, step)
		}
		compareRecords(t, ctx, store, model, u, now, fmt.Sprintf("seed %d end", seed))
	}
}

// A token bucket's refused call is told the first millisecond at which it
// succeeds, though float noise puts the refill it needs a hair over a
// whole number of milliseconds (1.0000000000000002 tokens at 1 per
// second, 1000.0000000000002 ms): 1000 ms, not 1001, and a reservation
// of 0.30000000000000004 tokens owed is granted in 300 ms, not 301.
func testTokenBucketRetryAfter(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	mock := newMock(epoch)
	lim, err := ratelimit.New(newStore(t), ratelimit.Limits{
		"b": {Kind: ratelimit.TokenBucket, Rate: 1, Capacity: 3, Period: time.Second},
		"r": {Kind: ratelimit.TokenBucket, Rate: 1, Capacity: 1, MaxReserved: 0.3, Period: time.Second},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "b", "k", ratelimit.Count(1.3))
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = lim.Limit(ctx, "b", "k", ratelimit.Count(2.7))
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Equal(t, time.Second, res.RetryAfter)
	mock.Add(time.Second - time.Millisecond)
	res, err = lim.Check(ctx, "b", "k", ratelimit.Count(2.7))
	require.NoError(t, err)
	require.False(t, res.OK, "OK a millisecond before its RetryAfter")
	mock.Add(time.Millisecond)
	res, err = lim.Check(ctx, "b", "k", ratelimit.Count(2.7))
	require.NoError(t, err)
	require.True(t, res.OK, "refused at its RetryAfter")

	res, err = lim.Limit(ctx, "r", "k", ratelimit.Count(1.3), ratelimit.WithReserve())
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Equal(t, 300*time.Millisecond, res.RetryAfter, "when the 0.30000000000000004 tokens owed are granted")
}

// A refused call on two shards whose count, less one shard's debt
// allowance, float noise puts a hair above that shard's capacity (2.2 −
// 0.8 = 1.4000000000000001 against 1.4), which the shard alone grants
// when full: it is told when that shard alone grants it, not the later
// time both together would.
func testShardedRetryAfter(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store, model := newStore(t), NewModel()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1.4, Period: 1000, Capacity: 1.4, MaxReserved: 0.8}
	shard := func(i int) driver.Shard { return driver.Shard{Index: i, Params: p} }
	now := epoch.UnixMilli()
	for _, op := range []*driver.Op{
		{Now: now, Items: []driver.Item{{Name: "s", Key: "k", Count: 1.2, Shards: []driver.Shard{shard(1)}}}},
		{Now: now + 512, Items: []driver.Item{{Name: "s", Key: "k", Count: 1.4, Shards: []driver.Shard{shard(0)}}}},
		{Now: now + 753, Reserve: true, Items: []driver.Item{{Name: "s", Key: "k", Count: 2.2, Shards: []driver.Shard{shard(0), shard(1)}}}},
	} {
		got, want := make([]driver.Decision, 1), make([]driver.Decision, 1)
		require.NoError(t, model.Apply(ctx, op, want))
		require.NoError(t, store.Apply(ctx, op, got))
		require.Equal(t, want, got, describe(op))
		if op.Reserve {
			require.False(t, got[0].OK)
			require.Equal(t, int64(105), got[0].RetryAfter, "when shard 1 alone grants it")
		}
	}
}
