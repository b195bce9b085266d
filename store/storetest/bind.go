package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// testBindDifferential drives a store that implements driver.Binder
// with random calls of unsharded limits, sending each Limit and Check
// through a BoundLimit or through Apply at random, mixed with refunds,
// ops of several items or two shards, and deletes (always through Apply
// and Delete), and requires the answers and records of Model applying
// every call as an op, bit for bit. A fixed window's phase comes from the
// phase function given to Bind, which the store may call for a missing
// record only.
func testBindDifferential(t *testing.T, newStore NewStore, s suite) {
	ctx := context.Background()
	for seed := range s.diffSeeds {
		store, model := newStore(t), NewModel()
		binder := store.(driver.Binder)
		rng := rand.New(rand.NewPCG(uint64(seed), 0xb1d))
		u := newUniverse(rng)
		bound := map[string]driver.BoundLimit{}
		for _, name := range u.names {
			p := u.params[name]
			p.Phase = rng.Int64N(p.Period) // must be ignored
			bound[name] = binder.Bind(name, p, func(key string) int64 {
				ph, ok := u.phases[driver.RecordID{Name: name, Key: key}]
				require.True(t, ok, "phase(%q) asked for a record no call has named", key)
				return ph
			})
			require.Equal(t, store, bound[name].Store())
		}
		now := epoch.UnixMilli()
		for step := range s.diffSteps {
			now += randomStep(rng, periods[rng.IntN(len(periods))])
			where := fmt.Sprintf("seed %d step %d", seed, step)
			if rng.IntN(4) == 0 {
				// Anything else, through Apply: refunds, several items,
				// two shards, other shards.
				op := u.randomOp(rng, now)
				if len(op.Items) == 0 {
					continue
				}
				got := make([]driver.Decision, len(op.Items))
				want := make([]driver.Decision, len(op.Items))
				require.NoError(t, model.Apply(ctx, op, want))
				require.NoError(t, store.Apply(ctx, op, got), where)
				require.Equal(t, want, got, "%s: %s", where, describe(op))
				continue
			}
			name, key := u.names[rng.IntN(len(u.names))], u.keys[rng.IntN(len(u.keys))]
			sh := u.shard(rng, name, key, 0)
			op := &driver.Op{Now: now, Reserve: rng.IntN(3) == 0}
			if rng.IntN(3) == 0 {
				op.Mode = driver.ModeCheck
			}
			count := randomCount(rng, sh.Params, 1)
			if !op.Reserve {
				count = min(count, sh.Params.Capacity)
			}
			op.Items = []driver.Item{{Name: name, Key: key, Count: count, Shards: []driver.Shard{sh}}}
			want := make([]driver.Decision, 1)
			require.NoError(t, model.Apply(ctx, op, want))
			got := make([]driver.Decision, 1)
			via := "Apply"
			if rng.IntN(3) != 0 {
				via = "Decide"
				v, err := bound[name].Decide(ctx, key, op.Mode, now, count, op.Reserve)
				require.NoError(t, err, where)
				got[0] = v.Decision(now, count)
			} else {
				require.NoError(t, store.Apply(ctx, op, got), where)
			}
			require.Equal(t, want, got, "%s via %s: %s", where, via, describe(op))
			if rng.IntN(4) == 0 {
				compareRecords(t, ctx, store, model, u, now, where)
			}
			if rng.IntN(25) == 0 {
				ids := []driver.RecordID{{Name: name, Key: key}}
				require.NoError(t, store.Delete(ctx, ids))
				require.NoError(t, model.Delete(ctx, ids))
			}
		}
		compareRecords(t, ctx, store, model, u, now, fmt.Sprintf("seed %d end", seed))
	}

	// A canceled context: an error, and nothing written.
	store := newStore(t)
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	b := store.(driver.Binder).Bind("c", p, func(string) int64 { return 0 })
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err := b.Decide(cctx, "k", driver.ModeLimit, epoch.UnixMilli(), 1, false)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 10.0, loadOne(t, store, p, driver.RecordID{Name: "c", Key: "k"}, epoch.UnixMilli()),
		"a canceled Decide must not have written")
}
