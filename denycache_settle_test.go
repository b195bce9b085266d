package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// The deny cache answers as the store would through everything else that
// gives tokens back or changes what a record means: receipts settled in
// full, in part or not at all (Settle), reservations canceled or given up
// by a Wait whose context ended, and the limit's config changed
// (SetLimit) back and forth. A Limiter with the cache and one without,
// each on its own store and driven by the same calls on one clock, give
// the same results, while the cache answers many of them.
func TestDenyCacheIsExactThroughSettlementsAndLimitChanges(t *testing.T) {
	ctx := context.Background()
	ended, cancel := context.WithCancel(ctx)
	cancel()
	configs := []ratelimit.Config{
		{Kind: ratelimit.TokenBucket, Rate: 3, Period: time.Second, Capacity: 3, MaxReserved: 2},
		{Kind: ratelimit.TokenBucket, Rate: 1, Period: 2 * time.Second, Capacity: 2, MaxReserved: 1},
		{Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Second, MaxReserved: 1},
	}
	local := 0
	for seed := range 40 {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		mock := &stepClock{Mock: newMock(), now: t0}
		limits := ratelimit.Limits{"l": configs[0]}
		withCache, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithClock(mock), ratelimit.WithDenyCache(4))
		require.NoError(t, err)
		without, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithClock(mock))
		require.NoError(t, err)
		cfg := 0
		var receipts [][2]*ratelimit.Token // with the cache, without
		var held [][2]*ratelimit.Reservation
		for step := range 300 {
			mock.now = mock.now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
			if rng.IntN(15) == 0 {
				mock.now = mock.now.Add(-time.Duration(rng.IntN(2000)) * time.Millisecond)
			}
			key := []string{"k1", "k2"}[rng.IntN(2)]
			where := fmt.Sprintf("seed %d step %d", seed, step)
			var got, want ratelimit.Result
			var gerr, werr error
			switch rng.IntN(14) {
			case 0:
				cfg = (cfg + 1 + rng.IntN(2)) % len(configs)
				require.NoError(t, withCache.SetLimit("l", configs[cfg]))
				require.NoError(t, without.SetLimit("l", configs[cfg]))
				continue
			case 1, 2:
				if len(receipts) > 0 {
					i := rng.IntN(len(receipts))
					used := []float64{0, 0.5, 1}[rng.IntN(3)]
					gerr := withCache.Settle(ctx, receipts[i][0], used)
					werr := without.Settle(ctx, receipts[i][1], used)
					require.Equal(t, werr == nil, gerr == nil, "%s: settle: %v, %v", where, gerr, werr)
					receipts = slices.Delete(receipts, i, i+1)
				}
				continue
			case 3:
				if len(held) > 0 {
					i := rng.IntN(len(held))
					if rng.IntN(2) == 0 {
						gerr, werr = held[i][0].Cancel(ctx), held[i][1].Cancel(ctx)
					} else { // gives up, and hands the tokens back
						gerr, werr = held[i][0].Wait(ended), held[i][1].Wait(ended)
					}
					require.Equal(t, werr == nil, gerr == nil, "%s: cancel: %v, %v", where, gerr, werr)
					held = slices.Delete(held, i, i+1)
				}
				continue
			case 4:
				g, gerr := withCache.Reserve(ctx, "l", key)
				w, werr := without.Reserve(ctx, "l", key)
				require.Equal(t, werr, gerr, where)
				got, want = g.Result(), w.Result()
				if got.OK {
					held = append(held, [2]*ratelimit.Reservation{g, w})
				}
			case 5:
				got, gerr = withCache.Check(ctx, "l", key)
				want, werr = without.Check(ctx, "l", key)
			case 6, 7, 8:
				opts := []ratelimit.CallOption{ratelimit.WithReceipt()}
				if rng.IntN(3) == 0 {
					opts = append(opts, ratelimit.WithReserve())
				}
				got, gerr = withCache.Limit(ctx, "l", key, opts...)
				want, werr = without.Limit(ctx, "l", key, opts...)
				if got.OK && want.OK {
					receipts = append(receipts, [2]*ratelimit.Token{got.Token, want.Token})
				}
				got.Token, want.Token = nil, nil
			default:
				got, gerr = withCache.Limit(ctx, "l", key)
				want, werr = without.Limit(ctx, "l", key)
			}
			require.Equal(t, werr, gerr, where)
			if got.Local {
				local++
			}
			got.Local = false
			require.Equal(t, want, got, where)
		}
	}
	require.Greater(t, local, 1000, "the cache answered")
}
