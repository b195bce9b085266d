package storetest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// The differential tests drive the store under test and Model with the
// same random sequence and require the same answers, bit for bit. A store
// with a native port of the transition (Lua, SQL) is proved equal to the Go
// function this way.

var (
	rates   = []float64{1, 2.5, 0.1, 7, 1000, 1.0 / 3}
	periods = []int64{1, 7, 1000, 3000, 60_000, 3_600_000}
)

// randomParams draws one limit's params (without phase).
func randomParams(rng *rand.Rand) driver.Params {
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: rates[rng.IntN(len(rates))], Period: periods[rng.IntN(len(periods))]}
	if rng.IntN(2) == 0 {
		p.Kind = ratelimit.TokenBucket
	}
	switch rng.IntN(3) {
	case 0:
		p.Capacity = p.Rate
	case 1:
		p.Capacity = p.Rate * 3
	default:
		p.Capacity = p.Rate * (0.5 + rng.Float64()*4)
	}
	switch rng.IntN(3) {
	case 1:
		p.MaxReserved = p.Capacity / 2
	case 2:
		p.MaxReserved = p.Capacity * 2.5
	}
	return p
}

// randomCount draws a count a call may ask of p (reaching up to two
// records' capacity).
func randomCount(rng *rand.Rand, p driver.Params, reach float64) float64 {
	switch rng.IntN(6) {
	case 0:
		return 0
	case 1:
		return 1
	case 2:
		return math.Floor(rng.Float64() * p.Capacity * reach)
	default:
		return rng.Float64() * p.Capacity * reach
	}
}

// askable returns count as an op of mode may carry it (driver.CheckOp):
// in a limit or a check, a count above 0 and below ratelimit.MinCount,
// which no call may ask, raised to MinCount, and one above
// ratelimit.MaxTokens (two shards' capacity at the bounds) lowered to it.
// A refund's count stays.
func askable(mode driver.Mode, count float64) float64 {
	if mode == driver.ModeRefund {
		return count
	}
	if count > 0 && count < ratelimit.MinCount {
		return ratelimit.MinCount
	}
	return min(count, ratelimit.MaxTokens)
}

// randomStep moves now forward by a random amount, sometimes not at all,
// sometimes far. The clock never steps back here: a store may drop a record
// once its bucket is full, and after a step back past that moment a dropped
// record (a full bucket) and Model's kept one (not quite full) differ, both
// within the semantics. testClockBackwards covers steps back.
func randomStep(rng *rand.Rand, period int64) int64 {
	switch rng.IntN(8) {
	case 0, 1:
		return 0
	case 2:
		return period * rng.Int64N(5)
	case 3:
		return rng.Int64N(period*20 + 1)
	default:
		return rng.Int64N(period/2 + 2)
	}
}

type universe struct {
	names  []string
	keys   []string
	params map[string]driver.Params
	phases map[driver.RecordID]int64
}

func newUniverse(rng *rand.Rand) *universe {
	u := &universe{names: []string{"x", "y", "z"}, keys: []string{"k", "k2"},
		params: map[string]driver.Params{}, phases: map[driver.RecordID]int64{}}
	for _, n := range u.names {
		u.params[n] = randomParams(rng)
	}
	return u
}

func (u *universe) shard(rng *rand.Rand, name, key string, idx int) driver.Shard {
	p := u.params[name]
	id := driver.RecordID{Name: name, Key: key, Shard: idx}
	ph, ok := u.phases[id]
	if !ok {
		ph = rng.Int64N(p.Period)
		u.phases[id] = ph
	}
	p.Phase = ph
	return driver.Shard{Index: idx, Params: p}
}

// randomOp draws an op over distinct records of the universe.
func (u *universe) randomOp(rng *rand.Rand, now int64) *driver.Op {
	op := &driver.Op{Now: now, Reserve: rng.IntN(3) == 0}
	switch rng.IntN(6) {
	case 0:
		op.Mode = driver.ModeCheck
	case 1:
		op.Mode = driver.ModeRefund
	}
	used := map[driver.RecordID]bool{}
	key := u.keys[rng.IntN(len(u.keys))] // an op's items share one key
	for range 1 + rng.IntN(3) {
		name := u.names[rng.IntN(len(u.names))]
		n := 1
		if op.Mode != driver.ModeRefund && rng.IntN(3) == 0 {
			n = 2
		}
		idx, ok := claimShards(rng, used, name, key, 3, n)
		if !ok {
			continue
		}
		it := driver.Item{Name: name, Key: key}
		for _, i := range idx {
			it.Shards = append(it.Shards, u.shard(rng, name, key, i))
		}
		p := u.params[name]
		it.Count = randomCount(rng, p, float64(n))
		if !op.Reserve && it.Count > p.Capacity*float64(n) {
			it.Count = p.Capacity * float64(n)
		}
		it.Count = askable(op.Mode, it.Count)
		op.Items = append(op.Items, it)
	}
	return op
}

func testApplyDifferential(t *testing.T, newStore NewStore, s suite) {
	ctx := context.Background()
	for seed := range s.diffSeeds {
		store, model := newStore(t), NewModel()
		rng := rand.New(rand.NewPCG(uint64(seed), 0xd1ff))
		u := newUniverse(rng)
		now := epoch.UnixMilli()
		for step := range s.diffSteps {
			now += randomStep(rng, periods[rng.IntN(len(periods))])
			op := u.randomOp(rng, now)
			if len(op.Items) == 0 {
				continue
			}
			withRuns(ctx, rng, model, op)
			applyBoth(t, ctx, store, model, op, seed, step)
			if rng.IntN(4) == 0 {
				compareRecords(t, ctx, store, model, u, now, fmt.Sprintf("seed %d step %d", seed, step))
			}
			if rng.IntN(25) == 0 {
				ids := []driver.RecordID{{Name: u.names[rng.IntN(3)], Key: u.keys[rng.IntN(2)], Shard: rng.IntN(3)}}
				require.NoError(t, store.Delete(ctx, ids))
				require.NoError(t, model.Delete(ctx, ids))
			}
		}
		compareRecords(t, ctx, store, model, u, now, fmt.Sprintf("seed %d end", seed))
	}
}

// withRuns gives each item of op, if a refund, a time of charge (if it
// has none) and a job time (randomRun): the refunds of randomOp and
// randomSettle, drawn without the records, then meet the boundary of the
// rule that gives nothing back behind later reservations.
func withRuns(ctx context.Context, rng *rand.Rand, model ratelimit.Store, op *driver.Op) {
	if op.Mode != driver.ModeRefund {
		return
	}
	for i := range op.Items {
		it := &op.Items[i]
		if it.At == 0 {
			it.At = clampTime(op.Now - rng.Int64N(3*it.Shards[0].Params.Period+1))
		}
		it.Run = randomRun(ctx, rng, model, it, op.Now)
	}
}

// randomRun draws the job time of the refund item it, charged at it.At,
// judged at now: mostly the time of the tail of its record's debt as model
// sees it (a reservation of nothing, checked: its time), or a millisecond
// either side; otherwise At itself, a time before it (read as At), or one
// up to four periods after.
func randomRun(ctx context.Context, rng *rand.Rand, model ratelimit.Store, it *driver.Item, now int64) int64 {
	period := it.Shards[0].Params.Period
	switch rng.IntN(6) {
	case 0, 1, 2:
		op := &driver.Op{Mode: driver.ModeCheck, Now: now, Reserve: true,
			Items: []driver.Item{{Name: it.Name, Key: it.Key, Shards: it.Shards}}}
		out := make([]driver.Decision, 1)
		if err := model.Apply(ctx, op, out); err != nil {
			panic(err) // the model refuses no valid op
		}
		return clampTime(out[0].Now + out[0].RetryAfter + rng.Int64N(3) - 1)
	case 3:
		return it.At
	case 4:
		return clampTime(it.At - 1 - rng.Int64N(period))
	}
	return clampTime(it.At + rng.Int64N(4*period+1))
}

// claimShards picks n (1 or 2) distinct shards of name and key among
// shards, and marks their records used, unless one of them is used
// already (an op names a record once): then it returns false.
func claimShards(rng *rand.Rand, used map[driver.RecordID]bool, name, key string, shards, n int) ([]int, bool) {
	a := rng.IntN(shards)
	idx := []int{a, (a + 1 + rng.IntN(max(shards-1, 1))) % shards}[:n]
	for _, i := range idx {
		if used[driver.RecordID{Name: name, Key: key, Shard: i}] {
			return nil, false
		}
	}
	for _, i := range idx {
		used[driver.RecordID{Name: name, Key: key, Shard: i}] = true
	}
	return idx, true
}

// loadBoth reads the records of names and keys, shards 0 to 2, from
// store (got) and from model (want).
func loadBoth(t *testing.T, ctx context.Context, store, model ratelimit.Store, names, keys []string, where string) (ids []driver.RecordID, got, want []driver.Record) {
	t.Helper()
	for _, n := range names {
		for _, k := range keys {
			for sh := range 3 {
				ids = append(ids, driver.RecordID{Name: n, Key: k, Shard: sh})
			}
		}
	}
	got = make([]driver.Record, len(ids))
	want = make([]driver.Record, len(ids))
	require.NoError(t, store.Load(ctx, ids, got), where)
	require.NoError(t, model.Load(ctx, ids, want), where)
	return ids, got, want
}

// compareRecords requires every record of the universe to read the same,
// refreshed to now, from both stores (a store may have dropped a record
// whose bucket is full again: it reads as the same full bucket).
func compareRecords(t *testing.T, ctx context.Context, store, model ratelimit.Store, u *universe, now int64, where string) {
	t.Helper()
	ids, got, want := loadBoth(t, ctx, store, model, u.names, u.keys, where)
	for i, id := range ids {
		p := u.params[id.Name]
		p.Phase = u.phases[id]
		g := refreshed(p, got[i], now)
		w := refreshed(p, want[i], now)
		require.Equal(t, w, g, "%s: record %+v", where, id)
	}
}

func refreshed(p driver.Params, r driver.Record, now int64) driver.State {
	return ratelimit.StateAt(p, r, now)
}

func describe(op *driver.Op) string {
	s := fmt.Sprintf("mode %d now %d reserve %v:", op.Mode, op.Now, op.Reserve)
	for _, it := range op.Items {
		s += fmt.Sprintf(" [%s/%s count %v", it.Name, it.Key, it.Count)
		for _, sh := range it.Shards {
			s += fmt.Sprintf(" shard %d %+v", sh.Index, sh.Params)
		}
		s += "]"
	}
	if op.Settle != nil {
		s += fmt.Sprintf(" settle %+v", *op.Settle)
	}
	return s
}

// applyBoth applies op to store and to model, the Go function, and
// requires the same decisions of both; seed and step name the op in a
// failure.
func applyBoth(t *testing.T, ctx context.Context, store, model ratelimit.Store, op *driver.Op, seed, step int) {
	t.Helper()
	got := make([]driver.Decision, len(op.Items))
	want := make([]driver.Decision, len(op.Items))
	require.NoError(t, model.Apply(ctx, op, want))
	require.NoError(t, store.Apply(ctx, op, got), "seed %d step %d", seed, step)
	require.Equal(t, want, got, "seed %d step %d: %s", seed, step, describe(op))
}

// testLimiterDifferential drives two Limiters, one over the store and one
// over Model, with the same clock, shard choices and random calls of
// Limit, Check, Reset and Value.
func testLimiterDifferential(t *testing.T, newStore NewStore, s suite) {
	ctx := context.Background()
	for seed := range s.diffSeeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 0x11))
		cfg := randomConfig(rng)
		mock := &stepClock{Mock: clock.NewMock(), now: epoch}
		limits := ratelimit.Limits{"L": cfg}
		got, err := ratelimit.New(newStore(t), limits, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(uint64(seed), 1)))
		require.NoError(t, err)
		want, err := ratelimit.New(NewModel(), limits, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(uint64(seed), 1)))
		require.NoError(t, err)
		p := driver.Params{Capacity: cfg.Capacity, Period: cfg.Period.Milliseconds()}
		if p.Capacity == 0 {
			p.Capacity = cfg.Rate
		}
		for step := range s.diffSteps {
			where := fmt.Sprintf("seed %d step %d config %+v", seed, step, cfg)
			mock.now = mock.now.Add(time.Duration(randomStep(rng, p.Period)) * time.Millisecond)
			key := []string{"a", "b"}[rng.IntN(2)]
			var opts []ratelimit.CallOption
			if rng.IntN(3) == 0 {
				opts = append(opts, ratelimit.WithReserve())
			}
			opts = append(opts, ratelimit.Count(randomCount(rng, p, 1.2)))
			switch rng.IntN(10) {
			case 0:
				require.NoError(t, got.Reset(ctx, "L", key), where)
				require.NoError(t, want.Reset(ctx, "L", key), where)
			case 1, 2:
				g, gerr := got.Value(ctx, "L", key)
				w, werr := want.Value(ctx, "L", key)
				require.Equal(t, werr, gerr, where)
				require.Equal(t, w.Remaining, g.Remaining, where)
				require.Equal(t, w.NextGrant, g.NextGrant, where)
			case 3, 4:
				g, gerr := got.Check(ctx, "L", key, opts...)
				w, werr := want.Check(ctx, "L", key, opts...)
				require.Equal(t, werr, gerr, where)
				require.Equal(t, w, g, where)
			default:
				g, gerr := got.Limit(ctx, "L", key, opts...)
				w, werr := want.Limit(ctx, "L", key, opts...)
				require.Equal(t, werr, gerr, where)
				require.Equal(t, w, g, where)
			}
		}
	}
}

// randomConfig draws a config that ratelimit.New takes. New refuses some
// corners of what drawConfig draws (a sharded limit whose unset capacity
// leaves a call less than one token): it draws again.
func randomConfig(rng *rand.Rand) ratelimit.Config {
	for {
		c := drawConfig(rng)
		if _, err := ratelimit.New(NewModel(), ratelimit.Limits{"L": c}); err == nil {
			return c
		}
	}
}

// drawConfig draws a config for randomConfig.
func drawConfig(rng *rand.Rand) ratelimit.Config {
	p := randomParams(rng)
	c := ratelimit.Config{Kind: p.Kind, Rate: p.Rate, Period: time.Duration(p.Period) * time.Millisecond, MaxReserved: p.MaxReserved}
	if rng.IntN(2) == 0 || c.Rate < 1 {
		c.Capacity = p.Capacity // left unset, a capacity below 1 is refused
	}
	if c.Kind == ratelimit.FixedWindow && rng.IntN(2) == 0 {
		c.Start = epoch.Add(time.Duration(rng.Int64N(1e12)-5e11) * time.Millisecond)
	}
	if rng.IntN(3) == 0 {
		c.Shards = 2 + rng.IntN(3)
	}
	return c
}

// stepClock is a clock for one goroutine whose Now is moved by hand
// without the millisecond pause that clock.Mock takes on every move.
type stepClock struct {
	*clock.Mock
	now time.Time
}

func (c *stepClock) Now() time.Time { return c.now }

// testBatchDifferential drives ApplyBatch of a store that implements
// driver.BatchApplier with random batches of mixed ops (limit, check,
// refund, reserving or not, several limits, two-shard items, the same
// records several times in one batch, settlements of a few IDs, so that
// a batch may settle one twice, nows a few milliseconds apart and out of
// order, as concurrent callers read them) and requires the answers of
// Model applying the same ops one after another, bit for bit.
func testBatchDifferential(t *testing.T, newStore NewStore, s suite) {
	ctx := context.Background()
	for seed := range s.diffSeeds {
		store, model := newStore(t), NewModel()
		batcher := store.(driver.BatchApplier)
		rng := rand.New(rand.NewPCG(uint64(seed), 0xba7c))
		u := newUniverse(rng)
		var ids [4][16]byte
		for i := range ids {
			ids[i] = [16]byte{byte(seed), byte(i), 0xba, 0x7c, byte(rng.Uint32())}
		}
		now := epoch.UnixMilli()
		for step := 0; step < s.diffSteps; step += 8 {
			now += randomStep(rng, periods[rng.IntN(len(periods))])
			var ops []*driver.Op
			for range 1 + rng.IntN(24) {
				op := u.randomOp(rng, now+rng.Int64N(7)-3)
				if rng.IntN(4) == 0 {
					op = u.randomSettle(rng, now+rng.Int64N(7)-3, ids[rng.IntN(len(ids))])
				}
				if len(op.Items) > 0 {
					withRuns(ctx, rng, model, op)
					ops = append(ops, op)
				}
			}
			got := make([][]driver.Decision, len(ops))
			want := make([][]driver.Decision, len(ops))
			for i, op := range ops {
				got[i] = make([]driver.Decision, len(op.Items))
				want[i] = make([]driver.Decision, len(op.Items))
				require.NoError(t, model.Apply(ctx, op, want[i]))
			}
			require.NoError(t, batcher.ApplyBatch(ctx, ops, got), "seed %d step %d", seed, step)
			for i, op := range ops {
				require.Equal(t, want[i], got[i], "seed %d step %d op %d of %d: %s", seed, step, i, len(ops), describe(op))
			}
			compareRecords(t, ctx, store, model, u, now+3, fmt.Sprintf("seed %d step %d", seed, step))
		}
	}
}

// edges are limits at the bounds of the config space (ratelimit.New
// accepts them, testEdgeDifferential checks it; see MaxTokens,
// MaxFractionalTokens, MaxPeriod): the largest and smallest rates, the
// longest period, the largest capacities and debts, whole and fractional.
var edges = func() []driver.Params {
	maxPeriod := ratelimit.MaxPeriod.Milliseconds()
	return []driver.Params{
		{Kind: ratelimit.FixedWindow, Rate: ratelimit.MaxTokens, Period: 1, Capacity: ratelimit.MaxTokens, MaxReserved: ratelimit.MaxTokens},
		{Kind: ratelimit.FixedWindow, Rate: 1e-9, Period: maxPeriod, Capacity: 1, MaxReserved: ratelimit.MaxTokens},
		{Kind: ratelimit.FixedWindow, Rate: 3, Period: maxPeriod, Capacity: 3, MaxReserved: 2},
		{Kind: ratelimit.FixedWindow, Rate: 7, Period: 1, Capacity: ratelimit.MaxFractionalTokens - 1, MaxReserved: 1e-9},
		{Kind: ratelimit.TokenBucket, Rate: ratelimit.MaxTokens, Period: 1, Capacity: ratelimit.MaxTokens, MaxReserved: ratelimit.MaxTokens},
		{Kind: ratelimit.TokenBucket, Rate: 1e-9, Period: maxPeriod, Capacity: 1, MaxReserved: ratelimit.MaxTokens},
		{Kind: ratelimit.TokenBucket, Rate: 1, Period: maxPeriod, Capacity: ratelimit.MaxTokens, MaxReserved: 1},
		{Kind: ratelimit.TokenBucket, Rate: 1e-9, Period: 1, Capacity: 1e-9, MaxReserved: ratelimit.MaxFractionalTokens - 1},
	}
}()

// edgeParams returns one of edges.
func edgeParams(rng *rand.Rand) driver.Params { return edges[rng.IntN(len(edges))] }

// testEdgeDifferential is the differential test at the edges: limits at
// the bounds of the config space, counts up to what they may owe, clocks
// near ±driver.MaxTime and near zero, steps from a millisecond to a
// century. Every store must compute them as the Go function does.
func testEdgeDifferential(t *testing.T, newStore NewStore, s suite) {
	for i, p := range edges {
		c := ratelimit.Config{Kind: p.Kind, Rate: p.Rate, Period: time.Duration(p.Period) * time.Millisecond,
			Capacity: p.Capacity, MaxReserved: p.MaxReserved}
		if err := c.Validate(); err != nil {
			t.Fatalf("edge %d is not a limit ratelimit.New accepts: %v", i, err)
		}
	}
	ctx := context.Background()
	maxPeriod := ratelimit.MaxPeriod.Milliseconds()
	for seed := range max(s.diffSeeds/4, 1) {
		store, model := newStore(t), NewModel()
		rng := rand.New(rand.NewPCG(uint64(seed), 0xed6e))
		u := &universe{names: []string{"x", "y", "z"}, keys: []string{"k", "k2"},
			params: map[string]driver.Params{}, phases: map[driver.RecordID]int64{}}
		for _, n := range u.names {
			u.params[n] = edgeParams(rng)
		}
		starts := []int64{driver.MaxTime - 2*maxPeriod, -driver.MaxTime, 0, epoch.UnixMilli()}
		now := starts[rng.IntN(len(starts))]
		for step := range s.diffSteps {
			switch rng.IntN(6) {
			case 0:
				now += rng.Int64N(maxPeriod/2 + 1)
			case 1, 2:
				now += rng.Int64N(3)
			default:
				now += rng.Int64N(1000)
			}
			if now > driver.MaxTime {
				now = driver.MaxTime
			}
			op := u.randomOp(rng, now)
			if len(op.Items) == 0 {
				continue
			}
			for i := range op.Items {
				it := &op.Items[i]
				p := u.params[it.Name]
				reach := p.Capacity * float64(len(it.Shards))
				if op.Reserve {
					reach = math.Min(reach+p.MaxReserved*float64(len(it.Shards)), ratelimit.MaxTokens)
				}
				switch rng.IntN(4) {
				case 0:
					it.Count = reach
				case 1:
					it.Count = math.Min(1, reach)
				default:
					it.Count = rng.Float64() * reach
				}
				it.Count = askable(op.Mode, it.Count)
				if op.Mode == driver.ModeRefund {
					it.At = clampTime(now - rng.Int64N(maxPeriod))
				}
			}
			withRuns(ctx, rng, model, op)
			applyBoth(t, ctx, store, model, op, seed, step)
			if rng.IntN(4) == 0 {
				compareRecords(t, ctx, store, model, u, now, fmt.Sprintf("seed %d step %d", seed, step))
			}
		}
	}
}

// testTimeRange is the differential test across the whole range of times:
// a fixed window's record written in a window that starts before
// −driver.MaxTime, then read, refunded, reserved on and checked at
// driver.MaxTime, more than 2^53 ms later. A store that computes times in
// doubles (Lua) holds that span rounded to an even number of ms, which
// here crosses the end of a window: it must still count the windows as
// the Go function's int64 arithmetic does, and never write a record whose
// time lies beyond the latest time of an op. The spans are the last
// window's end less 1 ms, for periods whose window ends a double rounds
// the span to.
func testTimeRange(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	limits := []driver.Params{
		{Kind: ratelimit.FixedWindow, Rate: 1e-9, Period: ratelimit.MaxPeriod.Milliseconds(), Capacity: 1, MaxReserved: 1},
		{Kind: ratelimit.FixedWindow, Rate: 1e-9 / 1024, Period: 4, Capacity: 1e4, MaxReserved: 1e4},
		{Kind: ratelimit.FixedWindow, Rate: 1e-9 / 1024, Period: 1000, Capacity: 100, MaxReserved: 100},
	}
	for _, p := range limits {
		span := ((1<<53)/p.Period+1)*p.Period - 1 // from the record's window start to MaxTime
		start := driver.MaxTime - span
		if start >= -driver.MaxTime || start+p.Period <= -driver.MaxTime {
			t.Fatalf("period %d: the window at %d does not contain -MaxTime", p.Period, start)
		}
		p.Phase = (start%p.Period + p.Period) % p.Period
		store, model := newStore(t), NewModel()
		item := func(count float64) driver.Item {
			return driver.Item{Name: "range", Key: "k", Count: count, At: -driver.MaxTime, Run: -driver.MaxTime,
				Shards: []driver.Shard{{Params: p}}}
		}
		ops := []*driver.Op{
			{Mode: driver.ModeLimit, Now: -driver.MaxTime, Items: []driver.Item{item(p.Capacity / 2)}},
			{Mode: driver.ModeCheck, Now: driver.MaxTime, Items: []driver.Item{item(0)}},
			{Mode: driver.ModeRefund, Now: driver.MaxTime, Items: []driver.Item{item(p.Capacity / 4)}},
			{Mode: driver.ModeLimit, Now: driver.MaxTime, Reserve: true, Items: []driver.Item{item(p.Capacity * 1.5)}},
			{Mode: driver.ModeLimit, Now: driver.MaxTime, Items: []driver.Item{item(p.Capacity)}},
		}
		for step, op := range ops {
			applyBoth(t, ctx, store, model, op, int(p.Period), step)
			ids := []driver.RecordID{{Name: "range", Key: "k"}}
			got, want := make([]driver.Record, 1), make([]driver.Record, 1)
			require.NoError(t, store.Load(ctx, ids, got), "period %d step %d", p.Period, step)
			require.NoError(t, model.Load(ctx, ids, want))
			require.Equal(t, want, got, "period %d step %d: the record", p.Period, step)
		}
	}
}

// testTimeSpans is the differential test of every span of time a store
// computes, swept across the bounds where a double stops holding it: a
// record written at ts0 and decided on at end, ts0 + span, for spans just
// below, at and above 2^52 and 2^53 ms, and at the ends of the windows
// around 2^53, for fixed windows and token buckets of periods from 1 ms to
// MaxPeriod, with records before −MaxTime, an odd and an even end, and a
// record read under another period than it was written with. At end every
// kind of op reads the record: a check (refresh); calls refused by a few
// windows or ms, whose wait counts the windows from the record as stored;
// a refund of a few windows' grants more than the limit granted since the
// charge (granted, queued); calls on two shards (pairWait, whose tries run
// past MaxTime); and limits that write. The rate grants a third of the
// capacity over 2^53 ms, so that a window more or less shows in every
// value. Each op must be answered as the Go function's int64 arithmetic
// answers it, and leave the same records.
func testTimeSpans(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	maxPeriod := ratelimit.MaxPeriod.Milliseconds()
	const capacity = 4e14
	type limit struct {
		kind   driver.Kind
		period int64
	}
	var limits []limit
	for _, period := range []int64{1, 3, 1000, maxPeriod - 1, maxPeriod} {
		limits = append(limits, limit{ratelimit.FixedWindow, period})
	}
	for _, period := range []int64{1, maxPeriod} {
		limits = append(limits, limit{ratelimit.TokenBucket, period})
	}
	rate := func(period int64) float64 { return capacity / 3 / float64((1<<53)/period) }
	// spans returns the spans from a record's time to the op's now swept
	// for a period: each bound, a millisecond or a few either side, and
	// the ends of the windows around 2^53, the first span a double rounds.
	spans := func(period int64) []int64 {
		end := ((1<<53)/period + 1) * period // the end of the window holding 2^53
		return []int64{1<<52 - 1, 1 << 52, 1<<53 - 1, 1 << 53, 1<<53 + 1, 1<<53 + 2, 1<<53 + 3,
			end - period - 1, end - 1, end, end + 1}
	}
	store, model := newStore(t), NewModel()
	n := 0
	for _, l := range limits {
		for _, span := range spans(l.period) {
			for _, debt := range []bool{false, true} {
				end := driver.MaxTime
				if debt {
					end-- // an odd now, and a record's time to match
				}
				ts0 := end - span
				now0 := max(ts0, -driver.MaxTime)
				if l.kind == ratelimit.TokenBucket && ts0 < -driver.MaxTime || ts0 <= -driver.MaxTime-l.period {
					continue // no record of the limit lies there
				}
				n++
				key := fmt.Sprintf("s%d", n)
				p := driver.Params{Kind: l.kind, Rate: rate(l.period), Period: l.period, Capacity: capacity, MaxReserved: capacity,
					Phase: (ts0%l.period + l.period) % l.period}
				other := p // the limit's second shard
				other.Phase = (p.Phase + l.period/2) % l.period
				item := func(p driver.Params, count float64) driver.Item {
					return driver.Item{Name: "span", Key: key, Count: count, Shards: []driver.Shard{{Params: p}}}
				}
				pairItem := func(count float64) driver.Item {
					return driver.Item{Name: "span", Key: key, Count: count, Shards: []driver.Shard{{Params: p}, {Index: 1, Params: other}}}
				}
				first := item(p, capacity/2)
				if debt {
					first.Count = capacity * 1.5
				}
				second := first // on the second shard
				second.Shards = []driver.Shard{{Index: 1, Params: other}}
				// The record's state at end, as the Go function refreshes it.
				var rec driver.Record
				at := func() driver.State { return ratelimit.StateAt(p, rec, end) }
				ops := []func() *driver.Op{
					func() *driver.Op {
						return &driver.Op{Mode: driver.ModeLimit, Now: now0, Reserve: debt, Items: []driver.Item{first}}
					},
					func() *driver.Op {
						return &driver.Op{Mode: driver.ModeLimit, Now: now0, Reserve: debt, Items: []driver.Item{second}}
					},
					func() *driver.Op {
						return &driver.Op{Mode: driver.ModeCheck, Now: end, Items: []driver.Item{item(p, 0)}}
					},
					func() *driver.Op {
						return &driver.Op{Mode: driver.ModeCheck, Now: end, Items: []driver.Item{item(p, max(at().Remaining, 0)+2.5*p.Rate)}}
					},
					func() *driver.Op {
						return &driver.Op{Mode: driver.ModeCheck, Now: end, Reserve: true, Items: []driver.Item{item(p, at().Remaining+p.MaxReserved+2.5*p.Rate)}}
					},
					func() *driver.Op {
						return &driver.Op{Mode: driver.ModeCheck, Now: end, Items: []driver.Item{pairItem(capacity * 1.9)}}
					},
					func() *driver.Op {
						return &driver.Op{Mode: driver.ModeCheck, Now: end, Reserve: true, Items: []driver.Item{pairItem(capacity * 2.5)}}
					},
				}
				// Refunds of charges at now0 and at −MaxTime: what the record
				// was granted since, as the Go function counts it, and a few
				// windows' (ms') grants more.
				for _, from := range []int64{now0, -driver.MaxTime} {
					ops = append(ops, func() *driver.Op {
						s := at()
						granted := float64(s.TS-from) * p.Rate / float64(p.Period)
						if p.Kind == ratelimit.FixedWindow {
							granted = p.Rate * float64((s.TS-from+p.Period-1)/p.Period)
						}
						it := item(p, granted+2.5*p.Rate)
						it.At, it.Run = from, from
						return &driver.Op{Mode: driver.ModeRefund, Now: end, Items: []driver.Item{it}}
					})
				}
				if l.kind == ratelimit.FixedWindow && l.period > 1 {
					// The record read under a period of a millisecond, or of
					// MaxPeriod: the windows counted are the span itself, or
					// a few.
					for _, q := range []int64{1, 3, maxPeriod} {
						o := p
						o.Period, o.Phase, o.Rate = q, 0, rate(q)
						ops = append(ops, func() *driver.Op {
							return &driver.Op{Mode: driver.ModeCheck, Now: end, Items: []driver.Item{item(o, 0)}}
						}, func() *driver.Op {
							s := ratelimit.StateAt(o, rec, end)
							return &driver.Op{Mode: driver.ModeCheck, Now: end, Reserve: true, Items: []driver.Item{item(o, s.Remaining+o.MaxReserved+2.5*o.Rate)}}
						})
					}
				}
				ops = append(ops,
					func() *driver.Op {
						return &driver.Op{Mode: driver.ModeLimit, Now: end, Reserve: true, Items: []driver.Item{item(p, capacity*1.5)}}
					},
					func() *driver.Op {
						return &driver.Op{Mode: driver.ModeLimit, Now: end, Items: []driver.Item{item(p, capacity)}}
					},
				)
				ids := []driver.RecordID{{Name: "span", Key: key}, {Name: "span", Key: key, Shard: 1}}
				where := fmt.Sprintf("kind %v period %d span %d now %d debt %v", l.kind, l.period, span, end, debt)
				batcher, batch := store.(driver.BatchApplier)
				batch = batch && debt // the ops of a record with a debt in one batch, where the store takes batches
				var sent []*driver.Op
				var wants [][]driver.Decision
				for step, next := range ops {
					op := next()
					where := fmt.Sprintf("%s step %d", where, step)
					want := make([]driver.Decision, len(op.Items))
					require.NoError(t, model.Apply(ctx, op, want), where)
					rw := make([]driver.Record, 2)
					require.NoError(t, model.Load(ctx, ids, rw), where)
					rec = rw[0]
					if batch {
						sent, wants = append(sent, op), append(wants, want)
						continue
					}
					got := make([]driver.Decision, len(op.Items))
					require.NoError(t, store.Apply(ctx, op, got), where)
					require.Equal(t, want, got, "%s: %s", where, describe(op))
					if op.Mode == driver.ModeCheck {
						continue // nothing written
					}
					rg := make([]driver.Record, 2)
					require.NoError(t, store.Load(ctx, ids, rg), where)
					require.Equal(t, rw, rg, "%s: the records", where)
				}
				if batch {
					outs := make([][]driver.Decision, len(sent))
					for i, op := range sent {
						outs[i] = make([]driver.Decision, len(op.Items))
					}
					require.NoError(t, batcher.ApplyBatch(ctx, sent, outs), where)
					for i, op := range sent {
						require.Equal(t, wants[i], outs[i], "%s op %d of the batch: %s", where, i, describe(op))
					}
					rg, rw := make([]driver.Record, 2), make([]driver.Record, 2)
					require.NoError(t, store.Load(ctx, ids, rg), where)
					require.NoError(t, model.Load(ctx, ids, rw), where)
					require.Equal(t, rw, rg, "%s: the records", where)
				}
			}
		}
	}
}
