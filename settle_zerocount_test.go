package ratelimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A call of Count(0) with WithReceipt, or a Reserve of Count(0), charges
// nothing and gets a token that charges 0: settling it, every way and
// from any process, hands nothing back, wherever the record stands (full,
// drained, in debt, a window later), so that it cannot be turned into
// capacity. A reservation of 0 keeps its token, which lets a worker mark
// its job run once (Use) after the debt before it.
func TestZeroCountTokenHandsNothingBack(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range []ratelimit.Config{
		{Kind: ratelimit.FixedWindow, Rate: 10, Capacity: 10, Period: time.Minute, Start: t0, MaxReserved: 20},
		{Kind: ratelimit.TokenBucket, Rate: 10, Capacity: 10, Period: time.Minute, MaxReserved: 20},
		{Kind: ratelimit.FixedWindow, Rate: 40, Capacity: 40, Period: time.Minute, Start: t0, MaxReserved: 40, Shards: 4},
	} {
		for _, settle := range []struct {
			name string
			do   func(lim *ratelimit.Limiter, tok *ratelimit.Token) error
		}{
			{"Refund", func(lim *ratelimit.Limiter, tok *ratelimit.Token) error { return lim.Refund(ctx, tok) }},
			{"Settle 0", func(lim *ratelimit.Limiter, tok *ratelimit.Token) error { return lim.Settle(ctx, tok, 0) }},
			{"Settle 5", func(lim *ratelimit.Limiter, tok *ratelimit.Token) error { return lim.Settle(ctx, tok, 5) }},
			{"Use", func(lim *ratelimit.Limiter, tok *ratelimit.Token) error { return lim.Use(ctx, tok) }},
		} {
			for _, state := range []string{"full", "drained", "in debt", "a window later"} {
				name := fmt.Sprintf("%v shards %d/%s/%s", cfg.Kind, cfg.Shards, settle.name, state)
				mock := newMock()
				store := must(memstore.New())
				lim := must(ratelimit.New(store, ratelimit.Limits{"jobs": cfg}, ratelimit.WithClock(mock)))
				limit := func(n float64, opts ...ratelimit.CallOption) ratelimit.Result {
					res, err := lim.Limit(ctx, "jobs", "k", append(opts, ratelimit.Count(n))...)
					require.NoError(t, err, name)
					return res
				}
				limit(1) // the key has a record
				var toks []*ratelimit.Token
				res := limit(0, ratelimit.WithReceipt())
				require.True(t, res.OK, name)
				toks = append(toks, res.Token)
				r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(0), ratelimit.WithReceipt())
				require.NoError(t, err, name)
				toks = append(toks, r.Token())
				r2, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(0))
				require.NoError(t, err, name)
				require.True(t, r2.OK(), name)
				for _, tok := range toks {
					require.NotNil(t, tok, name)
					assert.Zero(t, tok.Charged("jobs"), name)
				}
				// Take tokens one by one until refused (of a sharded
				// limit, until the shards picked are empty).
				drain := func(opts ...ratelimit.CallOption) {
					for range 1000 {
						if !limit(1, opts...).OK {
							return
						}
					}
					t.Fatalf("%s: never refused", name)
				}
				switch state {
				case "drained":
					drain()
				case "in debt":
					drain(ratelimit.WithReserve())
				case "a window later":
					drain()
					mock.Add(time.Minute + 7*time.Second)
					limit(3)
				}
				before, err := lim.Value(ctx, "jobs", "k")
				require.NoError(t, err, name)
				for _, tok := range toks {
					// From another process too: a Limiter of its own.
					other := must(ratelimit.New(store, ratelimit.Limits{"jobs": cfg}, ratelimit.WithClock(mock)))
					for _, l := range []*ratelimit.Limiter{lim, other} {
						_ = settle.do(l, tok)
						after, err := lim.Value(ctx, "jobs", "k")
						require.NoError(t, err, name)
						assert.Equal(t, before.Remaining, after.Remaining, "%s: a token of 0 handed tokens back", name)
					}
				}
				_ = r.Cancel(ctx) // settled by a holder above
				require.NoError(t, r2.Cancel(ctx), name)
				after, err := lim.Value(ctx, "jobs", "k")
				require.NoError(t, err, name)
				assert.Equal(t, before.Remaining, after.Remaining, "%s: a Cancel of a reservation of 0 handed tokens back", name)
			}
		}
	}
}
