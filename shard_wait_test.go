package ratelimit_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// replay is a source of randomness for WithRand that, while on, draws
// again the last two numbers it drew: a sharded limit's next call is then
// asked of the same two shards as the call before.
type replay struct {
	src  rand.Source
	last [2]uint64
	n    int
	on   bool
}

func (r *replay) Uint64() uint64 {
	i := r.n % 2
	r.n++
	if !r.on {
		r.last[i] = r.src.Uint64()
	}
	return r.last[i]
}

// add moves the clock forward by d.
func (c *stepClock) add(d time.Duration) { c.now = c.now.Add(d) }

// A refused call on a sharded limit is told the least wait after which the
// same call on the same two shards succeeds, as an unsharded one is
// (TestRetryAfterIsTheLeastWait): asked again RetryAfter later it is
// granted, and a millisecond before that it is refused (for a fixed
// window, whose shards gain tokens only at their windows' starts, that is
// any time before the window start RetryAfter names). The limits have
// fractional rates and capacities, or grant a shard a few times the noise
// per window or millisecond, or less than the noise, so that the
// shortfalls of the two shards together land within the tolerance by
// which they grant a call (twice driver.Noise): a wait that counted that
// shortfall in full was a window late (a fixed window of 1 token per shard
// per second, short by 2 tokens and 1.5e-9: told the second window,
// granted at the first), or some milliseconds.
func TestShardedRetryAfterIsTheLeastWait(t *testing.T) {
	for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
		t.Run(kind.String(), func(t *testing.T) {
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(29, uint64(kind)))
			refused := 0
			for i := range 5000 {
				shards := 2 + rng.IntN(4)
				n := float64(shards)
				period := []int64{1, 7, 1000, 60_000}[rng.IntN(4)]
				// A shard's tokens per window or millisecond: in tenths, or
				// near the noise, or below it.
				perStep := []float64{0.1, 0.3, 0.7, 1, 1.3, 2.5}[rng.IntN(6)]
				switch rng.IntN(3) {
				case 1:
					perStep = []float64{1e-9, 1.5e-9, 3e-9, 7e-9}[rng.IntN(4)]
				case 2:
					perStep = math.Pow(10, -12+4*rng.Float64())
				}
				cfg := ratelimit.Config{Kind: kind, Period: time.Duration(period) * time.Millisecond, Shards: shards}
				if kind == ratelimit.TokenBucket {
					cfg.Rate = perStep * float64(period) * n
				} else {
					cfg.Rate = perStep * n
				}
				cfg.Rate = max(cfg.Rate, 1e-9)
				// A shard's capacity: some steps' grants, or tenths of a token.
				if rng.IntN(2) == 0 {
					cfg.Capacity = cfg.Rate * []float64{1, 1.5, 3, 0.5 + 3*rng.Float64()}[rng.IntN(4)]
				} else {
					cfg.Capacity = float64(1+rng.IntN(30)) / 10 * n
				}
				if rng.IntN(2) == 0 {
					cfg.MaxReserved = float64(1+rng.IntN(20)) / 10 * n
				}
				if kind == ratelimit.FixedWindow && rng.IntN(2) == 0 {
					cfg.Start = time.UnixMilli(0) // every shard's windows alike
				}
				src := &replay{src: rand.NewPCG(uint64(i), 1)}
				mock := &stepClock{Mock: clock.NewMock(), now: t0.Add(time.Duration(rng.Int64N(period)) * time.Millisecond)}
				lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": cfg},
					ratelimit.WithClock(mock), ratelimit.WithRand(src))
				require.NoError(t, err, "case %d: %+v", i, cfg)
				shardCap, shardDebt := cfg.Capacity/n, cfg.MaxReserved/n
				if cfg.MaxReserved == 0 {
					shardDebt = 0
				}
				count := func(reserve bool) float64 {
					reach := 2 * shardCap
					if reserve {
						reach = 2 * (shardCap + shardDebt)
					}
					switch rng.IntN(4) {
					case 0:
						return countAtLeastMin(math.Min(math.Round(reach*10*rng.Float64())/10, reach), reach)
					case 1:
						return countAtLeastMin(math.Min(shardCap+float64(rng.IntN(3))*perStep, reach), reach) // a shard's capacity and a few steps
					case 2:
						// Tenths and a hair more: a shortfall just past a
						// whole number of grants.
						return countAtLeastMin(math.Min(math.Round(reach*10*rng.Float64())/10+1.5e-9, reach), reach)
					}
					return countAtLeastMin(reach*rng.Float64(), reach)
				}
				call := func(c float64, reserve bool) ratelimit.Result {
					opts := []ratelimit.CallOption{ratelimit.Count(c)}
					if reserve {
						opts = append(opts, ratelimit.WithReserve())
					}
					res, err := lim.Limit(ctx, "l", "k", opts...)
					require.NoError(t, err, "case %d: %+v count %v reserve %v", i, cfg, c, reserve)
					return res
				}
				// The shards as a few calls, each a while after the last,
				// left them.
				for range 1 + rng.IntN(2*shards) {
					mock.add(time.Duration(rng.Int64N(2*period)) * time.Millisecond)
					reserve := rng.IntN(3) == 0
					call(count(reserve), reserve)
				}
				mock.add(time.Duration(rng.Int64N(period)) * time.Millisecond)
				reserve := rng.IntN(3) == 0
				c := count(reserve)
				res := call(c, reserve)
				if res.OK || res.RetryAfter >= 1e12*time.Millisecond {
					continue
				}
				refused++
				w := res.RetryAfter
				where := fmt.Sprintf("case %d: %+v at %d: count %v reserve %v: refused, retry after %v",
					i, cfg, mock.Now().UnixMilli(), c, reserve, w)
				src.on = true // the same two shards
				mock.add(w - time.Millisecond)
				require.False(t, call(c, reserve).OK, "%s: OK a millisecond before", where)
				mock.add(time.Millisecond)
				require.True(t, call(c, reserve).OK, "%s: refused at its RetryAfter", where)
			}
			t.Logf("%d refused calls", refused)
			require.Greater(t, refused, 1000)
		})
	}
}

// The case of the report through the API: a fixed window of 1 token per
// shard per second, whose two shards hold 5 and 8 − 1.5e-9 tokens, is
// asked for 15 in the middle of a window. They are short by 2 tokens and
// 1.5e-9, within the tolerance of two shards together: the next window
// grants it, and it is told so, not the one after.
func TestShardedRetryAfterWithinTheNoise(t *testing.T) {
	ctx := context.Background()
	mock := &stepClock{Mock: clock.NewMock(), now: t0}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 2, Capacity: 20,
		Period: time.Second, Shards: 2, Start: time.UnixMilli(0)}}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	for _, c := range []float64{5, 2 + 1.5e-9} { // one shard each: 5 and 8 − 1.5e-9 left
		res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(c))
		require.NoError(t, err)
		require.True(t, res.OK)
	}
	mock.add(500 * time.Millisecond)
	res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(15))
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Equal(t, 500*time.Millisecond, res.RetryAfter, "the next window")
	mock.add(res.RetryAfter)
	res, err = lim.Limit(ctx, "l", "k", ratelimit.Count(15))
	require.NoError(t, err)
	require.True(t, res.OK)
}

// countAtLeastMin returns c, or for a count above 0 below MinCount, which
// a call may not ask for, MinCount if the limit can grant that much (reach),
// else 0.
func countAtLeastMin(c, reach float64) float64 {
	if c > 0 && c < ratelimit.MinCount {
		if reach >= ratelimit.MinCount {
			return ratelimit.MinCount
		}
		return 0
	}
	return c
}

// At the bounds of the config space too, through the API: a fixed window
// of a century granting each of its 2 shards 5e-9 tokens, drained in 2024,
// is asked for 3 windows' grants of both and 1.5e-9 more. The shards fall
// short by less than the noise of two at the window that starts on the
// last day of 2269, 246 years on, which grants it; the estimate, which
// counts the shortfall in full, says the window a century later, past the
// cap of 292 years, and the call was told the cap.
func TestShardedRetryAfterOfCenturies(t *testing.T) {
	ctx := context.Background()
	mock := &stepClock{Mock: clock.NewMock(), now: t0}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 1e-8, Capacity: 4e-8,
		Period: ratelimit.MaxPeriod, Shards: 2, Start: time.UnixMilli(0)}}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(4e-8))
	require.NoError(t, err)
	require.True(t, res.OK)
	count := ratelimit.Count(3e-8 + 1.5e-9)
	res, err = lim.Limit(ctx, "l", "k", count)
	require.NoError(t, err)
	require.False(t, res.OK)
	window := time.UnixMilli(3 * ratelimit.MaxPeriod.Milliseconds())
	require.Equal(t, window.Sub(t0), res.RetryAfter, "the window of %v", window.UTC())
	mock.add(res.RetryAfter - time.Millisecond)
	res, err = lim.Limit(ctx, "l", "k", count)
	require.NoError(t, err)
	require.False(t, res.OK, "a millisecond before")
	mock.add(time.Millisecond)
	res, err = lim.Limit(ctx, "l", "k", count)
	require.NoError(t, err)
	require.True(t, res.OK, "at its RetryAfter")
}
