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
				applyBoth(t, ctx, store, model, op, seed, step)
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

// testBindHotKeys drives a Binder's BoundLimits as a key under attack
// drives them: two keys, many calls a millisecond, most of them of one
// token and refused, through two BoundLimits of one name bound at once
// with other params (as after a config change, while calls bound before
// it still run), mixed with checks, reservations, other counts, refunds
// through Apply and deletes, and requires Model's answers and records, bit for
// bit. A store that reuses an answer it decided before (for the same
// record, time and count) must give it only where the transition would
// give the same.
func testBindHotKeys(t *testing.T, newStore NewStore, s suite) {
	ctx := context.Background()
	for seed := range s.diffSeeds {
		store, model := newStore(t), NewModel()
		binder := store.(driver.Binder)
		rng := rand.New(rand.NewPCG(uint64(seed), 0x407))
		u := &universe{names: []string{"h"}, keys: []string{"a", "b"},
			params: map[string]driver.Params{}, phases: map[driver.RecordID]int64{}}
		var params [2]driver.Params
		var bound [2]driver.BoundLimit
		for i := range params {
			params[i] = driver.Params{Kind: ratelimit.TokenBucket, Rate: []float64{1, 3, 10, 100}[rng.IntN(4)],
				Period: []int64{7, 1000, 60_000}[rng.IntN(3)]}
			params[i].Capacity = params[i].Rate * float64(1+rng.IntN(2))
			if seed%4 == 3 {
				params[i].Kind = ratelimit.FixedWindow
			}
			bound[i] = binder.Bind("h", params[i], func(key string) int64 { return 0 })
		}
		u.params["h"] = params[0]
		now := epoch.UnixMilli()
		for step := range s.diffSteps {
			switch rng.IntN(8) {
			case 0, 1:
				now++
			case 2:
				now += rng.Int64N(params[0].Period + 1)
			}
			where := fmt.Sprintf("seed %d step %d", seed, step)
			which, key := rng.IntN(2), u.keys[rng.IntN(2)]
			p := params[which]
			sh := driver.Shard{Params: p}
			if rng.IntN(10) == 0 {
				// A refund of what a call at about now took.
				op := &driver.Op{Mode: driver.ModeRefund, Now: now, Items: []driver.Item{{Name: "h", Key: key,
					Count: 1, At: clampTime(now - rng.Int64N(3)), Shards: []driver.Shard{sh}}}}
				want, got := make([]driver.Decision, 1), make([]driver.Decision, 1)
				require.NoError(t, model.Apply(ctx, op, want))
				require.NoError(t, store.Apply(ctx, op, got), where)
				require.Equal(t, want, got, "%s: %s", where, describe(op))
				continue
			}
			op := &driver.Op{Now: now, Reserve: rng.IntN(8) == 0}
			if rng.IntN(4) == 0 {
				op.Mode = driver.ModeCheck
			}
			count := 1.0
			if rng.IntN(4) == 0 {
				count = randomCount(rng, p, 1)
			}
			op.Items = []driver.Item{{Name: "h", Key: key, Count: count, Shards: []driver.Shard{sh}}}
			want := make([]driver.Decision, 1)
			require.NoError(t, model.Apply(ctx, op, want))
			v, err := bound[which].Decide(ctx, key, op.Mode, now, count, op.Reserve)
			require.NoError(t, err, where)
			require.Equal(t, want[0], v.Decision(now, count), "%s via bound %d: %s", where, which, describe(op))
			if rng.IntN(8) == 0 {
				compareRecords(t, ctx, store, model, u, now, where)
			}
			if rng.IntN(20) == 0 {
				ids := []driver.RecordID{{Name: "h", Key: key}}
				require.NoError(t, store.Delete(ctx, ids))
				require.NoError(t, model.Delete(ctx, ids))
			}
		}
		compareRecords(t, ctx, store, model, u, now, fmt.Sprintf("seed %d end", seed))
	}

	// A record deleted and made again is not answered as the one before
	// was, at the same time after its own: among other records, so that
	// the store keeps the place the record had.
	store, model := newStore(t), NewModel()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 3}
	b := store.(driver.Binder).Bind("h", p, func(string) int64 { return 0 })
	t0 := epoch.UnixMilli()
	for i := range 2000 {
		_, err := b.Decide(ctx, fmt.Sprint("other-", i), driver.ModeLimit, t0, 1, false)
		require.NoError(t, err)
	}
	for i, c := range []struct {
		dt     int64
		count  float64
		delete bool
	}{{0, 2.5, false}, {1, 1, false}, {1, 1, false}, {2, 0, true}, {5, 3, false}, {6, 1, false}, {6, 1, false}} {
		if c.delete {
			ids := []driver.RecordID{{Name: "h", Key: "a"}}
			require.NoError(t, store.Delete(ctx, ids))
			require.NoError(t, model.Delete(ctx, ids))
			continue
		}
		op := &driver.Op{Now: t0 + c.dt, Items: []driver.Item{{Name: "h", Key: "a", Count: c.count, Shards: []driver.Shard{{Params: p}}}}}
		want := make([]driver.Decision, 1)
		require.NoError(t, model.Apply(ctx, op, want))
		v, err := b.Decide(ctx, "a", driver.ModeLimit, op.Now, c.count, false)
		require.NoError(t, err)
		require.Equal(t, want[0], v.Decision(op.Now, c.count), "call %d: %s", i, describe(op))
	}
}
