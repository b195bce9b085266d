package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// docs/reservations.md, "How long a token lives": a Limiter whose clock
// steps back after a token was settled may settle it again once the store
// has dropped the mark, as a first settlement; the refund rule then still
// hands nothing back, unless the step took the clock back by more than a
// period, the settle window and the grace together. Here the clock steps
// back by exactly that much from the first moment the mark may be gone,
// a second Limiter settles the token again, and the record, drained
// meanwhile, gets nothing back: for fixed windows and token buckets,
// unsharded and sharded, tokens refunded at once or late, reservations in
// debt or not.
func TestSettlementAgainAfterAClockStepGivesNothingBack(t *testing.T) {
	ctx := context.Background()
	grace := time.Duration(driver.ExpiryGrace) * time.Millisecond
	cfgs := []ratelimit.Config{
		{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, MaxReserved: 30},
		{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, MaxReserved: 30, Start: t0},
		{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute, MaxReserved: 1000, Shards: 10},
		{Kind: ratelimit.FixedWindow, Rate: 2.5, Period: 7 * time.Second, Capacity: 4, MaxReserved: 8, Shards: 2, Start: t0},
		{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, MaxReserved: 30},
		{Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Minute, MaxReserved: 1000, Shards: 10},
		{Kind: ratelimit.TokenBucket, Rate: 0.7, Period: 3 * time.Second, Capacity: 2, MaxReserved: 5, Shards: 2},
	}
	rng := rand.New(rand.NewPCG(3, 5))
	for ci, cfg := range cfgs {
		for _, window := range []time.Duration{0, 90 * time.Second} {
			for trial := range 12 {
				why := fmt.Sprintf("config %d %+v, settle window %v, trial %d", ci, cfg, window, trial)
				store := must(memstore.New())
				mock := newMock()
				mock.Add(time.Duration(rng.IntN(60_000)) * time.Millisecond)
				opts := []ratelimit.Option{ratelimit.WithClock(mock), ratelimit.WithSettleWindow(window), ratelimit.WithRand(rand.NewPCG(rng.Uint64(), 1))}
				lim := must(ratelimit.New(store, ratelimit.Limits{"x": cfg}, opts...))
				other := must(ratelimit.New(store, ratelimit.Limits{"x": cfg}, opts...))
				n := float64(max(cfg.Shards, 1))
				capa := cfg.Capacity
				if capa == 0 {
					capa = cfg.Rate
				}
				// Some of the bucket used, then a reservation of up to a
				// shard's capacity and MaxReserved.
				if pre := rng.Float64() * capa / n; pre > 0 {
					_, err := lim.Limit(ctx, "x", "k", ratelimit.Count(pre))
					require.NoError(t, err, why)
				}
				count := (0.1 + rng.Float64()*0.9) * (capa + cfg.MaxReserved) / n
				r, err := lim.Reserve(ctx, "x", "k", ratelimit.Count(count), ratelimit.WithReceipt())
				require.NoError(t, err, why)
				if !r.OK() {
					continue
				}
				tok := r.Token()
				// The first settlement: at once, or late within the
				// token's life.
				if rng.IntN(2) == 0 {
					mock.Set(tok.ChargedAt().Add(time.Duration(rng.Int64N(int64(tok.Expires().Sub(tok.ChargedAt())) + 1))))
				}
				require.NoError(t, r.Cancel(ctx), why)
				// The store drops the mark at the first moment it may.
				mock.Set(tok.Expires().Add(grace + time.Millisecond))
				_, err = store.DeleteExpired(ctx, mock.Now())
				require.NoError(t, err, why)
				// The clock steps back by a period, the settle window and
				// the grace: the token lives again.
				mock.Add(-(cfg.Period + window + grace))
				require.False(t, mock.Now().After(tok.Expires()), why)
				for range 40 * int(n) {
					_, _ = lim.Limit(ctx, "x", "k", ratelimit.Count(capa/n/4))
				}
				before, err := lim.Value(ctx, "x", "k")
				require.NoError(t, err, why)
				err = other.Refund(ctx, tok)
				after, verr := lim.Value(ctx, "x", "k")
				require.NoError(t, verr, why)
				require.LessOrEqual(t, after.Remaining, before.Remaining+1e-9,
					"%s: charged %v at %v, settled again at %v (%v): %v tokens came back a second time", why, count, tok.ChargedAt(), mock.Now(), err, after.Remaining-before.Remaining)
			}
		}
	}
}
