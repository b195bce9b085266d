package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// The advice of a sharded limit's ErrInvalidCount admits the count: a
// Limiter configured as it says grants a call of that count from fresh
// records. A count above one shard's worth of the whole Capacity (Capacity
// 10 over 2 shards, count 12) was told to "use one shard", which holds
// Capacity, 10, and refuses it the same way.
func TestShardedCountAdviceAdmitsTheCount(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		cfg   ratelimit.Config
		count float64
	}{
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Shards: 2}, 12},
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Shards: 4}, 6},
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Shards: 4}, 15},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, Shards: 4, MaxReserved: 8}, 25},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, Shards: 4}, ratelimit.MaxTokens},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, Shards: 8}, 6e14},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: ratelimit.MaxTokens, Period: time.Second, Shards: 1024}, 9e14},
	} {
		t.Run(fmt.Sprintf("%d shards, count %v", tc.cfg.Shards, tc.count), func(t *testing.T) {
			lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": tc.cfg}))
			_, err := lim.Limit(ctx, "l", "k", ratelimit.Count(tc.count))
			require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
			msg := err.Error()
			// Every config the message suggests grants the call.
			var suggested []ratelimit.Config
			var shards int
			var capacity float64
			if _, e := fmt.Sscanf(afterLast(msg, "use at most "), "%d shards", &shards); e == nil {
				c := tc.cfg
				c.Shards = shards
				suggested = append(suggested, c)
			}
			if _, e := fmt.Sscanf(afterLast(msg, "raise Capacity to "), "%g", &capacity); e == nil {
				c := tc.cfg
				c.Capacity = capacity
				suggested = append(suggested, c)
			}
			if _, e := fmt.Sscanf(afterLast(msg, "use 2 shards with Capacity "), "%g", &capacity); e == nil {
				c := tc.cfg
				c.Shards, c.Capacity = 2, capacity
				suggested = append(suggested, c)
			}
			require.NotContains(t, msg, "use one shard", "one shard holds no more than Capacity, less than the count: %s", msg)
			require.Contains(t, msg, "split the call", "%s", msg)
			for _, c := range suggested {
				l := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": c}, ratelimit.WithRand(rand.NewPCG(1, 1))))
				res, err := l.Limit(ctx, "l", "k", ratelimit.Count(tc.count))
				require.NoError(t, err, "%s: as suggested, %+v", msg, c)
				require.True(t, res.OK, "%s: as suggested, %+v", msg, c)
			}
		})
	}
}

// afterLast returns what follows the last sub in s, or "" without one.
func afterLast(s, sub string) string {
	for i := len(s) - len(sub); i >= 0; i-- {
		if s[i:i+len(sub)] == sub {
			return s[i+len(sub):]
		}
	}
	return ""
}

// A reservation of 0 takes no tokens, and its job waits for the debt
// before it, sharded or not (docs/reservations.md): on the two shards it
// draws, until the first of them has paid its debt, when a plain call of
// 0 on them is granted again (its RetryAfter). Split charged neither
// shard, and the job's time counted no shard's debt: a reservation of 0
// on two shards that owed their whole next window ran at once, beside the
// reservations it stood behind, while a plain call of 0 was refused until
// that window.
func TestShardedReservationOfZeroWaitsForTheDebt(t *testing.T) {
	ctx := context.Background()
	// The timeline of the report: 4 a second over 2 shards sharing Start;
	// four reservations of 2 leave each shard owing 2, granted at 1 s.
	mock := newMock()
	for _, shards := range []int{0, 2} {
		lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 4, Period: time.Second, Shards: shards, Start: t0}},
			ratelimit.WithClock(mock)))
		for range 4 {
			r, err := lim.Reserve(ctx, "l", "k", ratelimit.Count(2))
			require.NoError(t, err)
			require.True(t, r.OK())
		}
		r, err := lim.Reserve(ctx, "l", "k", ratelimit.Count(0))
		require.NoError(t, err)
		require.True(t, r.OK())
		require.Equal(t, t0.Add(time.Second), r.Time(), "%d shards: the job of 0 runs when the debt before it is paid", shards)
	}

	// Random records: the job's time is when a plain call of 0 on the same
	// shards is granted again.
	for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
		t.Run(kind.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, uint64(kind)))
			waited := 0
			for i := range 300 {
				shards := 2 + rng.IntN(4)
				cfg := ratelimit.Config{Kind: kind, Rate: float64(shards * (1 + rng.IntN(5))), Period: time.Duration(1+rng.IntN(1000)) * time.Millisecond,
					Shards: shards, MaxReserved: float64(shards * (1 + rng.IntN(10)))}
				src := &replay{src: rand.NewPCG(uint64(i), 3)}
				clk := &stepClock{Mock: clock.NewMock(), now: t0.Add(time.Duration(rng.IntN(1000)) * time.Millisecond)}
				lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": cfg}, ratelimit.WithClock(clk), ratelimit.WithRand(src)))
				for range rng.IntN(4 * shards) {
					clk.add(time.Duration(rng.Int64N(int64(cfg.Period/time.Millisecond)/2+1)) * time.Millisecond)
					_, err := lim.Reserve(ctx, "l", "k", ratelimit.Count(float64(1+rng.IntN(3))))
					require.NoError(t, err)
				}
				src.on = false
				plain, err := lim.Check(ctx, "l", "k", ratelimit.Count(0))
				require.NoError(t, err)
				src.on = true // the same two shards
				r, err := lim.Reserve(ctx, "l", "k", ratelimit.Count(0))
				require.NoError(t, err)
				require.True(t, r.OK())
				where := fmt.Sprintf("case %d: %+v: plain call of 0 %v, retry after %v", i, cfg, plain.OK, plain.RetryAfter)
				require.Equal(t, plain.RetryAfter, r.Delay(), "%s: the job of 0 waits until the plain call of 0 is granted", where)
				if !plain.OK {
					waited++
				}
			}
			t.Logf("%d calls of 0 waited", waited)
			require.Greater(t, waited, 20)
		})
	}
}
