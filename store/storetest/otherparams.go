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

// testStoredUnderOtherParams is the differential test over records that a
// fleet in the middle of a change leaves: two members share a store, each
// with its own config of the same limit names and its own clock. The
// second member's config is the first's with some of its capacity, rate,
// period, kind, phase, shard count and MaxReserved changed (a capacity a
// hair above or below the first's among them), and its clock lags the
// first's (or leads it) by a millisecond to decades. So each member reads
// records the other wrote under other params: cut to a lowered capacity or
// left below a raised one, at a fixed window's time off its phase's grid or
// a token bucket's time read as a window start, of shard 0 read by an
// unsharded limit and by a sharded one, in a debt past a lowered
// MaxReserved, ahead of the call's time. The first member writes alone for
// a while first, with counts that leave records at exactly their
// capacity, a hair short of it, and at exactly their MaxReserved. Ops are
// of every mode (limit, check, reserve, refund, settlement), of several
// items and two shards, alone (Apply), in batches (ApplyBatch) and
// through a BoundLimit (Binder); decisions and records must be Model's,
// bit for bit.
//
// A store may drop a record once its bucket is full again, as computed by
// the params that wrote it (docs/model.md, Changing limits); the test puts
// the same record away in Model too before an op reads one that a store
// may have dropped, so that it compares only what the semantics fix.
func testStoredUnderOtherParams(t *testing.T, newStore NewStore, s suite) {
	ctx := context.Background()
	for seed := range max(s.diffSeeds/2, 1) {
		store, model := newStore(t), NewModel()
		rng := rand.New(rand.NewPCG(uint64(seed), 0x07e4))
		f := newFleet(rng, seed)
		if b, ok := store.(driver.Binder); ok {
			f.bind(b)
		}
		batcher, _ := store.(driver.BatchApplier)
		base := epoch.UnixMilli()
		if rng.IntN(4) == 0 {
			maxPeriod := ratelimit.MaxPeriod.Milliseconds()
			base = []int64{driver.MaxTime - 2*maxPeriod, -driver.MaxTime, 0}[rng.IntN(3)]
		}
		for step := range s.diffSteps {
			where := fmt.Sprintf("seed %d step %d (%s)", seed, step, f)
			switch rng.IntN(8) {
			case 0:
				base += rng.Int64N(f.longest() + 1)
			case 1, 2:
				base += rng.Int64N(3)
			default:
				base += rng.Int64N(f.shortest()/2 + 2)
			}
			m := 0
			if step >= s.diffSteps/4 {
				m = rng.IntN(2)
			}
			if batcher != nil && rng.IntN(5) == 0 {
				f.batch(t, ctx, rng, batcher, model, base, where)
			} else {
				f.alone(t, ctx, rng, store, model, m, base, where)
			}
			if rng.IntN(8) == 0 {
				f.compare(t, ctx, store, model, where)
			}
		}
		f.compare(t, ctx, store, model, fmt.Sprintf("seed %d end (%s)", seed, f))
	}
}

// fleetLimit is a whole limit as a member configures it (Rate, Capacity
// and MaxReserved of all its shards together, no phase).
type fleetLimit struct {
	p      driver.Params
	shards int
}

// member is one process of a fleet: its limits and how far its clock lags
// the fleet's (negative: leads it).
type member struct {
	limits map[string]fleetLimit
	lag    int64
	bound  map[string]driver.BoundLimit
}

type fleet struct {
	names   []string
	keys    []string
	members [2]member
	// phases of every record (name, key, shard) for each member.
	phases [2]map[driver.RecordID]int64
	// writer holds the params of the last write of each record, by which
	// a store computes when it may drop it.
	writer map[driver.RecordID]driver.Params
	// maxNow is the latest time of an op sent so far.
	maxNow int64
	ids    [6][16]byte // settlement IDs, which come back
}

func newFleet(rng *rand.Rand, seed int) *fleet {
	f := &fleet{names: []string{"a", "b"}, keys: []string{"k", "k2"}, writer: map[driver.RecordID]driver.Params{},
		maxNow: -driver.MaxTime}
	f.members[0] = member{limits: map[string]fleetLimit{}}
	f.members[1] = member{limits: map[string]fleetLimit{}, lag: randomLag(rng)}
	for _, n := range f.names {
		a := fleetLimit{p: randomParams(rng), shards: 1 + rng.IntN(3)*rng.IntN(2)}
		if rng.IntN(4) == 0 {
			a.p = edgeParams(rng)
		}
		f.members[0].limits[n] = a
		f.members[1].limits[n] = otherLimit(rng, a)
	}
	for m := range f.members {
		f.phases[m] = map[driver.RecordID]int64{}
		for _, n := range f.names {
			for _, k := range f.keys {
				for sh := range 3 {
					f.phases[m][driver.RecordID{Name: n, Key: k, Shard: sh}] = rng.Int64N(f.members[m].limits[n].p.Period)
				}
			}
		}
	}
	for i := range f.ids {
		f.ids[i] = [16]byte{byte(seed), byte(i), 0x07, 0xe4, byte(rng.Uint32())}
	}
	return f
}

// randomLag draws how far the second member's clock lags the first's:
// from a millisecond to decades, now and then ahead.
func randomLag(rng *rand.Rand) int64 {
	const year = 31_556_952_000
	lag := []int64{0, 1, 2, 7, 999, 1000, 60_001, 3_600_000, 86_400_000, year, 30 * year}[rng.IntN(11)]
	if rng.IntN(4) == 0 {
		lag = -lag
	}
	return lag
}

// otherLimit returns a, changed as a config is changed: one or more of
// its capacity (lowered, raised, or moved by float noise), rate, period,
// kind, shard count and MaxReserved.
func otherLimit(rng *rand.Rand, a fleetLimit) fleetLimit {
	b := a
	for changed := false; !changed; {
		if rng.IntN(3) == 0 {
			changed = true
			switch rng.IntN(4) {
			case 0:
				b.p.Capacity *= []float64{0.25, 0.5, 1.5, 4}[rng.IntN(4)]
			case 1:
				b.p.Capacity = math.Nextafter(b.p.Capacity, []float64{0, math.Inf(1)}[rng.IntN(2)])
			case 2:
				d := driver.Noise * []float64{0.5, 1, 2}[rng.IntN(3)]
				if rng.IntN(2) == 0 && b.p.Capacity > d {
					d = -d
				}
				b.p.Capacity += d
			default:
				b.p.Capacity = b.p.Rate * (0.5 + rng.Float64()*4)
			}
		}
		if rng.IntN(3) == 0 {
			changed = true
			b.p.Rate *= []float64{0.1, 0.5, 2, 10}[rng.IntN(4)]
		}
		if rng.IntN(3) == 0 {
			changed = true
			b.p.Period = periods[rng.IntN(len(periods))]
		}
		if rng.IntN(4) == 0 {
			changed = true
			b.p.Kind = driver.FixedWindow + driver.TokenBucket - b.p.Kind
		}
		if rng.IntN(3) == 0 {
			changed = true
			b.shards = 1 + rng.IntN(3)
		}
		if rng.IntN(3) == 0 {
			changed = true
			b.p.MaxReserved = []float64{0, driver.Noise, b.p.Capacity / 10, b.p.Capacity * 3}[rng.IntN(4)]
		}
		if rng.IntN(5) == 0 {
			changed = true // the phase alone (drawn for every member)
		}
	}
	// Within the bounds of Params, as a Limiter's config is.
	b.p.Rate = math.Min(b.p.Rate, ratelimit.MaxTokens)
	b.p.Capacity = math.Min(b.p.Capacity, ratelimit.MaxTokens)
	b.p.MaxReserved = math.Min(b.p.MaxReserved, ratelimit.MaxTokens)
	return b
}

func (f *fleet) String() string {
	s := ""
	for m := range f.members {
		s += fmt.Sprintf("member %d lag %d:", m, f.members[m].lag)
		for _, n := range f.names {
			l := f.members[m].limits[n]
			s += fmt.Sprintf(" %s %+v ×%d;", n, l.p, l.shards)
		}
	}
	return s
}

func (f *fleet) longest() int64 {
	var p int64
	for m := range f.members {
		for _, l := range f.members[m].limits {
			p = max(p, l.p.Period)
		}
	}
	return p
}

func (f *fleet) shortest() int64 {
	p := int64(math.MaxInt64)
	for m := range f.members {
		for _, l := range f.members[m].limits {
			p = min(p, l.p.Period)
		}
	}
	return p
}

// params returns member m's params of one shard of name for key, as its
// Limiter would send them.
func (f *fleet) params(m int, name, key string, shard int) driver.Params {
	l := f.members[m].limits[name]
	p := l.p
	if n := float64(l.shards); l.shards > 1 {
		p.Rate /= n
		p.Capacity /= n
		p.MaxReserved /= n
	}
	p.Phase = f.phases[m][driver.RecordID{Name: name, Key: key, Shard: shard}]
	return p
}

// bind binds every unsharded limit of each member.
func (f *fleet) bind(b driver.Binder) {
	for m := range f.members {
		f.members[m].bound = map[string]driver.BoundLimit{}
		for _, n := range f.names {
			if f.members[m].limits[n].shards != 1 {
				continue
			}
			phases := f.phases[m]
			f.members[m].bound[n] = b.Bind(n, f.params(m, n, "", 0), func(key string) int64 {
				return phases[driver.RecordID{Name: n, Key: key}]
			})
		}
	}
}

// randomOp draws an op of member m at now: a limit, check, reservation,
// refund or settlement of one to three items of one key, each of one
// shard or two of its limit's, with counts that empty a record, leave it
// a hair short of its capacity, or take it to exactly its MaxReserved.
func (f *fleet) randomOp(rng *rand.Rand, m int, now int64) *driver.Op {
	op := &driver.Op{Now: now}
	switch rng.IntN(7) {
	case 0:
		op.Mode = driver.ModeCheck
	case 1:
		op.Mode = driver.ModeCheck
		op.Reserve = true
	case 2, 3:
		op.Reserve = true
	case 4:
		op.Mode = driver.ModeRefund
	case 5:
		op.Mode = driver.ModeRefund
		kind := driver.SettleCancel
		if rng.IntN(2) == 0 {
			kind = driver.SettleUse
		}
		op.Settle = &driver.Settlement{ID: f.ids[rng.IntN(len(f.ids))], Kind: kind,
			Until: clampTime(max(f.maxNow, now) + 315_569_520_000)} // never dropped in the test
	}
	key := f.keys[rng.IntN(len(f.keys))]
	if op.Settle != nil {
		key = f.keys[int(op.Settle.ID[1])%len(f.keys)] // an ID comes with one key
	}
	used := map[driver.RecordID]bool{}
	for range 1 + rng.IntN(3) {
		name := f.names[rng.IntN(len(f.names))]
		l := f.members[m].limits[name]
		n := 1
		if op.Mode != driver.ModeRefund && l.shards > 1 && rng.IntN(4) > 0 {
			n = 2
		}
		idx, ok := claimShards(rng, used, name, key, l.shards, n)
		if !ok {
			continue
		}
		it := driver.Item{Name: name, Key: key}
		for _, i := range idx {
			it.Shards = append(it.Shards, driver.Shard{Index: i, Params: f.params(m, name, key, i)})
		}
		p := it.Shards[0].Params
		reach := p.Capacity * float64(n)
		if op.Reserve {
			if p.MaxReserved == 0 {
				reach *= 4
			} else {
				reach += p.MaxReserved * float64(n)
			}
		}
		switch rng.IntN(8) {
		case 0:
			it.Count = 0
		case 1:
			it.Count = reach // to exactly MaxReserved, or empty
		case 2:
			it.Count = p.Capacity // one shard's whole
		case 3:
			it.Count = p.Capacity * 1e-12 // a hair short of full
		case 4:
			it.Count = math.Min(1, reach)
		default:
			it.Count = rng.Float64() * reach
		}
		it.Count = askable(op.Mode, it.Count)
		if op.Mode == driver.ModeRefund {
			switch rng.IntN(4) {
			case 0:
				it.At = now
			case 1:
				it.At = clampTime(now + f.members[1].lag - f.members[m].lag) // the other member's clock
			default:
				it.At = clampTime(now - rng.Int64N(3*p.Period+1))
			}
			if op.Settle != nil && op.Settle.Kind == driver.SettleUse && rng.IntN(2) == 0 {
				it.Count = 0
			}
		}
		op.Items = append(op.Items, it)
	}
	return op
}

// droppable reports whether a store may have dropped the record id, whose
// state in Model is st, by the time of an op at now: its bucket is full
// again by the params that wrote it, at now (a store may read it as
// missing from then on), or by a grace before the latest op's time (a
// store may sweep it, or Redis expire it, meanwhile).
func (f *fleet) droppable(id driver.RecordID, st driver.State, now int64) bool {
	full := ratelimit.FullAt(f.writer[id], st)
	return full <= now || full <= f.maxNow-driver.ExpiryGrace/2
}

// modelApply applies op to model, first putting away (in store and
// model) every record it touches that a store may have dropped, when
// store is not nil, or, when it is nil, refusing an op that touches one
// (it returns false and applies nothing). It keeps f.writer.
func (f *fleet) modelApply(t *testing.T, ctx context.Context, store, model ratelimit.Store, op *driver.Op, want []driver.Decision) bool {
	t.Helper()
	ids := op.AppendRecordIDs(nil)
	prev := make([]driver.Record, len(ids))
	require.NoError(t, model.Load(ctx, ids, prev))
	for i, id := range ids {
		if !prev[i].Found || !f.droppable(id, prev[i].State, op.Now) {
			continue
		}
		if store == nil {
			return false
		}
		require.NoError(t, store.Delete(ctx, ids[i:i+1]))
		require.NoError(t, model.Delete(ctx, ids[i:i+1]))
		delete(f.writer, id)
		prev[i] = driver.Record{}
	}
	next := make([]driver.Update, len(ids))
	ratelimit.Evaluate(op, prev, make([]driver.Decision, len(op.Items)), next)
	require.NoError(t, model.Apply(ctx, op, want))
	if len(want) > 0 && want[0].Settled != 0 {
		return true // settled before: nothing written
	}
	r := 0
	for _, it := range op.Items {
		for _, sh := range it.Shards {
			if next[r].Write {
				f.writer[ids[r]] = sh.Params
			}
			r++
		}
	}
	return true
}

// alone sends one op of member m, at the fleet's time base, through
// Apply or, for a limit or check of one unsharded record, through its
// BoundLimit.
func (f *fleet) alone(t *testing.T, ctx context.Context, rng *rand.Rand, store, model ratelimit.Store, m int, base int64, where string) {
	t.Helper()
	now := min(max(base-f.members[m].lag, -driver.MaxTime), driver.MaxTime)
	op := f.randomOp(rng, m, now)
	if len(op.Items) == 0 {
		return
	}
	withRuns(ctx, rng, model, op)
	f.maxNow = max(f.maxNow, now)
	want := make([]driver.Decision, len(op.Items))
	f.modelApply(t, ctx, store, model, op, want)
	got := make([]driver.Decision, len(op.Items))
	it := &op.Items[0]
	via := "Apply"
	if bl := f.members[m].bound[it.Name]; bl != nil && len(op.Items) == 1 && op.Mode != driver.ModeRefund &&
		it.Shards[0].Index == 0 && rng.IntN(2) == 0 {
		via = "Decide"
		v, err := bl.Decide(ctx, it.Key, op.Mode, now, it.Count, op.Reserve)
		require.NoError(t, err, where)
		got[0] = v.Decision(now, it.Count)
	} else {
		require.NoError(t, store.Apply(ctx, op, got), where)
	}
	require.Equal(t, want, got, "%s: member %d via %s: %s", where, m, via, describe(op))
}

// batch sends one to eight ops of both members, at times a few
// milliseconds around their clocks' readings of the fleet's time base,
// in one ApplyBatch. An op that would read a record a store may have
// dropped is left out.
func (f *fleet) batch(t *testing.T, ctx context.Context, rng *rand.Rand, batcher driver.BatchApplier, model ratelimit.Store, base int64, where string) {
	t.Helper()
	var ops []*driver.Op
	var want, got [][]driver.Decision
	var from []int
	for range 1 + rng.IntN(8) {
		m := rng.IntN(2)
		now := min(max(base-f.members[m].lag+rng.Int64N(7)-3, -driver.MaxTime), driver.MaxTime)
		op := f.randomOp(rng, m, now)
		if len(op.Items) == 0 {
			continue
		}
		withRuns(ctx, rng, model, op)
		f.maxNow = max(f.maxNow, now)
		w := make([]driver.Decision, len(op.Items))
		if !f.modelApply(t, ctx, nil, model, op, w) {
			continue
		}
		ops, want, from = append(ops, op), append(want, w), append(from, m)
		got = append(got, make([]driver.Decision, len(op.Items)))
	}
	require.NoError(t, batcher.ApplyBatch(ctx, ops, got), where)
	for i, op := range ops {
		require.Equal(t, want[i], got[i], "%s: op %d of %d, member %d: %s", where, i, len(ops), from[i], describe(op))
	}
}

// compare requires every record to be stored as in Model, bit for bit,
// unless a store may have dropped it.
func (f *fleet) compare(t *testing.T, ctx context.Context, store, model ratelimit.Store, where string) {
	t.Helper()
	ids, got, want := loadBoth(t, ctx, store, model, f.names, f.keys, where)
	for i, id := range ids {
		if !got[i].Found && want[i].Found && ratelimit.FullAt(f.writer[id], want[i].State) <= f.maxNow {
			continue // full again: the store may have dropped it
		}
		require.Equal(t, want[i], got[i], "%s: record %+v", where, id)
	}
}
