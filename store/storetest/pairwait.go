package storetest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// pairWaitParams are shards of limits whose refused calls the estimates
// of the least wait of two shards (ratelimit.Evaluate) miss: a shard's
// share of limits at the bounds of the config space, a Period of a century
// and a Rate of a few 1e-9, whose waits of decades an estimate puts beyond
// driver.MaxRetryAfter, and ordinary ones, whose records, written by a
// clock ahead, an estimate misses by more than the candidates it tries.
var pairWaitParams = func() []driver.Params {
	century := ratelimit.MaxPeriod.Milliseconds()
	return []driver.Params{
		{Kind: ratelimit.FixedWindow, Rate: 4.329647261991161e-09, Period: century, Capacity: 9.667181816985408e-09, MaxReserved: 9.224013196245124e-09},
		{Kind: ratelimit.FixedWindow, Rate: 1e-9 / 2, Period: century, Capacity: 1.0 / 2, MaxReserved: 1e15 / 2},
		{Kind: ratelimit.FixedWindow, Rate: 1.296971759068489, Period: 1000, Capacity: 4.447590286234671, MaxReserved: 1.3452865030222183},
		{Kind: ratelimit.FixedWindow, Rate: 3.5, Period: 1, Capacity: 4194303.5, MaxReserved: 5e-10},
		{Kind: ratelimit.TokenBucket, Rate: 3.0688434318218836e-09, Period: century, Capacity: 8.272252307605854e-09, MaxReserved: 6.91685759215378e-09},
		{Kind: ratelimit.TokenBucket, Rate: 2.92565974809056e-10, Period: century, Capacity: 1e-06, MaxReserved: 1.0812010260176851e-07},
		{Kind: ratelimit.TokenBucket, Rate: 4.623732042311259, Period: century, Capacity: 9.984921179098757, MaxReserved: 1.6658792021248543},
	}
}()

// testPairWaitDifferential is the differential test of the wait of
// refused calls on two shards where it is hardest to find: limits of
// pairWaitParams or drawn near the bounds of the config space, whose two
// records are left anywhere from a debt to full, at a time up to a window
// before the call's or up to three ahead of it (a clock ahead wrote it).
// The records are written by a limit of another capacity and a rate so
// slow that no store may drop them as full. Every store must tell the
// same wait as the Go function, which is the least wait of the semantics
// to the millisecond (TestPairRetryAfterAtTheBoundsIsTheLeastWait of
// package ratelimit): here waits of decades, below the cap and at it.
func testPairWaitDifferential(t *testing.T, newStore NewStore, s suite) {
	ctx := context.Background()
	century := ratelimit.MaxPeriod.Milliseconds()
	refused, long := 0, 0
	for seed := range max(s.diffSeeds/4, 1) {
		store, model := newStore(t), NewModel()
		rng := rand.New(rand.NewPCG(uint64(seed), 0x9a17))
		for step := range s.diffSteps {
			p := pairWaitParams[rng.IntN(len(pairWaitParams))]
			if rng.IntN(2) == 0 {
				p = driver.Params{Kind: ratelimit.FixedWindow, Rate: math.Pow(10, -9+6*rng.Float64()) / 2,
					Period: []int64{1000, 365 * 24 * 3600 * 1000, century}[rng.IntN(3)]}
				if rng.IntN(2) == 0 {
					p.Kind = ratelimit.TokenBucket
				}
				p.Capacity = p.Rate * (0.5 + 3*rng.Float64())
				p.MaxReserved = p.Capacity * rng.Float64()
			}
			key := fmt.Sprintf("k%d", step)
			now := epoch.UnixMilli() + rng.Int64N(p.Period)
			// The writer: a token bucket (its record's time is the op's)
			// that holds any value the shards may, full ones never full
			// again within the stores' reach.
			w := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1e-12, Period: century, Capacity: 2 * p.Capacity, MaxReserved: 2 * p.MaxReserved}
			var items []driver.Shard
			for sh := range 2 {
				at := now - rng.Int64N(p.Period)
				if rng.IntN(4) == 0 {
					at = now + rng.Int64N(3*p.Period)
				}
				v := rng.Float64() * p.Capacity
				if rng.IntN(4) == 0 {
					v = -rng.Float64() * p.MaxReserved
				}
				op := &driver.Op{Now: clampTime(at), Reserve: v < 0, Items: []driver.Item{{Name: "pw", Key: key,
					Count: askable(driver.ModeLimit, w.Capacity-v), Shards: []driver.Shard{{Index: sh, Params: w}}}}}
				applyBoth(t, ctx, store, model, op, seed, step)
				q := p
				if q.Kind == ratelimit.FixedWindow {
					q.Phase = rng.Int64N(q.Period)
				}
				items = append(items, driver.Shard{Index: sh, Params: q})
			}
			op := &driver.Op{Now: now, Reserve: rng.IntN(4) == 0, Items: []driver.Item{{Name: "pw", Key: key, Shards: items}}}
			reach := 2 * p.Capacity
			if op.Reserve {
				reach += 2 * p.MaxReserved
			}
			op.Items[0].Count = askable(driver.ModeLimit, reach*(0.5+0.5*rng.Float64()))
			if op.Mode == driver.ModeLimit && rng.IntN(4) == 0 {
				op.Mode = driver.ModeCheck
			}
			want := make([]driver.Decision, 1)
			require.NoError(t, model.Apply(ctx, op, want))
			if !want[0].OK {
				refused++
				if want[0].RetryAfter > 10*365*24*3600*1000 && want[0].RetryAfter < driver.MaxRetryAfter {
					long++
				}
			}
			got := make([]driver.Decision, 1)
			require.NoError(t, store.Apply(ctx, op, got), "seed %d step %d", seed, step)
			require.Equal(t, want, got, "seed %d step %d: %s", seed, step, describe(op))
		}
	}
	t.Logf("%d refused calls, %d told more than 10 years and less than the cap", refused, long)
	require.Greater(t, refused, 0)
}
