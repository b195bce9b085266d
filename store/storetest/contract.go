package storetest

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// testContract checks the promises of package driver at their edges, one
// subtest each: what Load, Delete, Apply and ApplyBatch do with missing
// records, empty ops, outs of the wrong length and invalid ops (a nil op
// among them).
func testContract(t *testing.T, newStore NewStore) {
	now := epoch.UnixMilli()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	id := func(name string) driver.RecordID { return driver.RecordID{Name: name, Key: "k"} }
	junk := driver.Record{Found: true, State: driver.State{Remaining: -7, TS: 99}}

	t.Run("LoadMissing", func(t *testing.T) {
		s := newStore(t)
		charge(t, s, now, "kept", p)
		ids := []driver.RecordID{id("missing"), id("kept"), id("other")}
		out := []driver.Record{junk, junk, junk}
		require.NoError(t, s.Load(context.Background(), ids, out))
		require.Equal(t, driver.Record{}, out[0], "a missing record is Record{}, whatever out held")
		require.True(t, out[1].Found)
		require.Equal(t, 6.0, out[1].State.Remaining)
		require.Equal(t, driver.Record{}, out[2], "a missing record is Record{}, whatever out held")
	})
	t.Run("LoadDuplicate", func(t *testing.T) {
		s := newStore(t)
		charge(t, s, now, "dup", p)
		out := []driver.Record{junk, {}, junk}
		require.NoError(t, s.Load(context.Background(), []driver.RecordID{id("dup"), id("none"), id("dup")}, out))
		require.True(t, out[0].Found)
		require.Equal(t, out[0], out[2], "an id given twice reads the same record at both positions")
		require.Equal(t, driver.Record{}, out[1])
	})
	t.Run("LoadShortOut", func(t *testing.T) {
		s := newStore(t)
		var err error
		noPanic(t, func() {
			err = s.Load(context.Background(), []driver.RecordID{id("a"), id("b")}, make([]driver.Record, 1))
		})
		require.ErrorIs(t, err, driver.ErrOutLength, "an out shorter than ids is refused")
	})
	t.Run("DeleteMissing", func(t *testing.T) {
		s := newStore(t)
		require.NoError(t, s.Delete(context.Background(), []driver.RecordID{id("missing")}),
			"deleting a missing record is no error")
		require.NoError(t, s.Delete(context.Background(), nil))
	})
	t.Run("ApplyZeroItems", func(t *testing.T) {
		s := newStore(t)
		for _, m := range []driver.Mode{driver.ModeLimit, driver.ModeCheck, driver.ModeRefund} {
			noPanic(t, func() {
				require.NoError(t, s.Apply(context.Background(), &driver.Op{Mode: m, Now: now}, nil), "mode %d", m)
			})
		}
	})
	t.Run("ApplyShortOut", func(t *testing.T) {
		s := newStore(t)
		charge(t, s, now, "a", p)
		charge(t, s, now, "b", p)
		ids := []driver.RecordID{id("a"), id("b"), id("c")}
		before := make([]driver.Record, len(ids))
		require.NoError(t, s.Load(context.Background(), ids, before))
		for _, m := range []driver.Mode{driver.ModeLimit, driver.ModeCheck, driver.ModeRefund} {
			op := &driver.Op{Mode: m, Now: now + 1000, Items: []driver.Item{
				itemOf("a", "k", 1, p), itemOf("b", "k", 1, p), itemOf("c", "k", 1, p)}}
			for i := range op.Items {
				op.Items[i].At = now
			}
			for _, out := range [][]driver.Decision{nil, make([]driver.Decision, 2)} {
				var err error
				noPanic(t, func() { err = s.Apply(context.Background(), op, out) })
				require.ErrorIs(t, err, driver.ErrOutLength, "mode %d: an out of %d for 3 items is refused, not filled in part", m, len(out))
				after := make([]driver.Record, len(ids))
				require.NoError(t, s.Load(context.Background(), ids, after))
				require.Equal(t, before, after, "mode %d: a refused call writes nothing", m)
			}
		}
	})
	t.Run("ApplyInvalidOp", func(t *testing.T) {
		s := newStore(t)
		charge(t, s, now, "a", p)
		ids := invalidOpRecords()
		before := make([]driver.Record, len(ids))
		require.NoError(t, s.Load(context.Background(), ids, before))
		ops := invalidOps(now, p)
		for i, c := range ops {
			var err error
			noPanic(t, func() { err = s.Apply(context.Background(), c.op, make([]driver.Decision, len(c.op.Items))) })
			require.ErrorIs(t, err, driver.ErrInvalidOp, "%s: refused", c.name)
			after := make([]driver.Record, len(ids))
			require.NoError(t, s.Load(context.Background(), ids, after))
			require.Equal(t, before, after, "%s: a refused op writes nothing", c.name)
			requireUnsettled(t, s, now, p, invalidID(i), c.name)
		}
	})
	t.Run("ApplyNilOp", func(t *testing.T) {
		s := newStore(t)
		for _, out := range [][]driver.Decision{nil, make([]driver.Decision, 1)} {
			var err error
			noPanic(t, func() { err = s.Apply(context.Background(), nil, out) })
			require.ErrorIs(t, err, driver.ErrInvalidOp, "a nil op is refused, with an out of %d", len(out))
		}
	})
	t.Run("LimiterOpsAtTheBounds", func(t *testing.T) {
		// The ops a Limiter sends for limits at the bounds of what New
		// accepts are valid (driver.CheckOp): the store decides them.
		ctx := context.Background()
		mock := clock.NewMock()
		mock.Set(epoch)
		hundredYears := ratelimit.MaxPeriod
		lim, err := ratelimit.New(newStore(t), ratelimit.Limits{
			"slow":   {Kind: ratelimit.FixedWindow, Rate: 1e-9, Period: hundredYears, Capacity: 1, Shards: ratelimit.MaxShards},
			"long":   {Kind: ratelimit.FixedWindow, Rate: 3, Period: hundredYears, Start: epoch.Add(-7 * time.Millisecond)},
			"fast":   {Kind: ratelimit.TokenBucket, Rate: ratelimit.MaxTokens, Period: time.Millisecond, MaxReserved: ratelimit.MaxTokens},
			"tiny":   {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 2 * math.SmallestNonzeroFloat64, MaxReserved: 2 * math.SmallestNonzeroFloat64, Shards: 2},
			"thirds": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Millisecond, Capacity: 1.0 / 3, Shards: 3},
		}, ratelimit.WithClock(mock))
		require.NoError(t, err)
		for _, c := range []struct {
			name  string
			count float64
		}{{"slow", 1e-3}, {"long", 3}, {"fast", ratelimit.MaxTokens}, {"tiny", 0}, {"thirds", 0.2}} {
			_, err := lim.Limit(ctx, c.name, "k", ratelimit.Count(c.count))
			require.NoError(t, err, c.name)
			r, err := lim.Reserve(ctx, c.name, "k", ratelimit.Count(c.count))
			require.NoError(t, err, c.name)
			require.NoError(t, r.Cancel(ctx), c.name)
		}
		res, err := lim.LimitAll(ctx, "k2", []string{"slow", "long", "fast", "tiny", "thirds"}, ratelimit.Count(0), ratelimit.WithReceipt())
		require.NoError(t, err)
		require.True(t, res.OK)
		require.NoError(t, lim.Settle(ctx, res.Token, 0))
	})
	if _, ok := newStore(t).(driver.BatchApplier); !ok {
		return
	}
	t.Run("ApplyBatchEmpty", func(t *testing.T) {
		b := newStore(t).(driver.BatchApplier)
		noPanic(t, func() {
			require.NoError(t, b.ApplyBatch(context.Background(), nil, nil))
			require.NoError(t, b.ApplyBatch(context.Background(), []*driver.Op{{Now: now}}, [][]driver.Decision{nil}))
		})
	})
	t.Run("ApplyBatchShortOuts", func(t *testing.T) {
		s := newStore(t)
		b := s.(driver.BatchApplier)
		ops := func() []*driver.Op {
			return []*driver.Op{
				{Now: now, Items: []driver.Item{itemOf("a", "k", 1, p)}},
				{Now: now, Items: []driver.Item{itemOf("b", "k", 1, p), itemOf("c", "k", 1, p)}},
			}
		}
		for _, outs := range [][][]driver.Decision{
			nil,
			{make([]driver.Decision, 1)},
			{make([]driver.Decision, 1), make([]driver.Decision, 1)},
			{make([]driver.Decision, 1), make([]driver.Decision, 2), make([]driver.Decision, 1)},
		} {
			var err error
			noPanic(t, func() { err = b.ApplyBatch(context.Background(), ops(), outs) })
			require.ErrorIs(t, err, driver.ErrOutLength, "outs of lengths %v for ops of 1 and 2 items are refused", lens(outs))
			recs := make([]driver.Record, 3)
			require.NoError(t, s.Load(context.Background(), []driver.RecordID{id("a"), id("b"), id("c")}, recs))
			require.Equal(t, make([]driver.Record, 3), recs, "a refused batch writes nothing")
		}
	})
	t.Run("ApplyBatchNilOp", func(t *testing.T) {
		s := newStore(t)
		b := s.(driver.BatchApplier)
		valid := &driver.Op{Now: now, Items: []driver.Item{itemOf("v", "k", 1, p)}}
		for _, ops := range [][]*driver.Op{{nil}, {valid, nil}, {nil, valid}} {
			outs := make([][]driver.Decision, len(ops))
			for i := range outs {
				outs[i] = make([]driver.Decision, 1)
			}
			var err error
			noPanic(t, func() { err = b.ApplyBatch(context.Background(), ops, outs) })
			require.ErrorIs(t, err, driver.ErrInvalidOp, "a batch holding a nil op is refused")
			recs := make([]driver.Record, 1)
			require.NoError(t, s.Load(context.Background(), []driver.RecordID{id("v")}, recs))
			require.Equal(t, driver.Record{}, recs[0], "a refused batch writes nothing, not even its valid op")
		}
	})
	t.Run("ApplyBatchInvalidOp", func(t *testing.T) {
		s := newStore(t)
		b := s.(driver.BatchApplier)
		charge(t, s, now, "a", p)
		ids := append(invalidOpRecords(), id("v"))
		before := make([]driver.Record, len(ids))
		require.NoError(t, s.Load(context.Background(), ids, before))
		for i, c := range invalidOps(now, p) {
			valid := &driver.Op{Now: now, Items: []driver.Item{itemOf("v", "k", 1, p)}}
			for _, ops := range [][]*driver.Op{{valid, c.op}, {c.op, valid}} {
				outs := [][]driver.Decision{make([]driver.Decision, len(ops[0].Items)), make([]driver.Decision, len(ops[1].Items))}
				var err error
				noPanic(t, func() { err = b.ApplyBatch(context.Background(), ops, outs) })
				require.ErrorIs(t, err, driver.ErrInvalidOp, "%s: a batch holding it is refused", c.name)
				after := make([]driver.Record, len(ids))
				require.NoError(t, s.Load(context.Background(), ids, after))
				require.Equal(t, before, after, "%s: a refused batch writes nothing, not even its valid op", c.name)
			}
			requireUnsettled(t, s, now, p, invalidID(i), c.name)
		}
	})
}

// invalidOp is an op that package driver calls invalid (driver.CheckOp),
// named for the failure messages.
type invalidOp struct {
	name string
	op   *driver.Op
}

// invalidOpRecords returns the records that invalidOps touch (they must
// write none): the limits a to i of key k, shards 0 to 2, and b of k2.
func invalidOpRecords() []driver.RecordID {
	var ids []driver.RecordID
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"} {
		for sh := range 3 {
			ids = append(ids, driver.RecordID{Name: name, Key: "k", Shard: sh})
		}
	}
	return append(ids, driver.RecordID{Name: "b", Key: "k2"})
}

// invalidOps returns one op of each invalid kind, on the records (a, k) of
// params p at now (and those of invalidOpRecords): a settlement in a mode
// other than ModeRefund, without items or with a kind that is not one, a
// mode that is not one, a time beyond ±MaxTime, a count of NaN, negative
// or infinite, or of a limit or a check above 0 and below MinCount or above MaxTokens, a refund charged at a time beyond ±MaxTime, a settlement
// kept until a time beyond it, items of no shards, of three, or a refund's
// of two, a shard's index out of [0, MaxShards), items of two keys, two items of one record, an item of one shard
// twice, and params out of range (kind, period, phase, rate, capacity, max
// reserved). The settlement of the i-th has ID invalidID(i).
func invalidOps(now int64, p driver.Params) []invalidOp {
	shards := func(n int) []driver.Shard {
		sh := make([]driver.Shard, n)
		for i := range sh {
			sh[i] = driver.Shard{Index: i, Params: p}
		}
		return sh
	}
	// op returns an op of mode m of one item of n shards, settled with
	// kind k when settle, which change then alters.
	op := func(m driver.Mode, n int, settle bool, k driver.SettleKind, change func(*driver.Op)) *driver.Op {
		o := &driver.Op{Mode: m, Now: now + 1000,
			Items: []driver.Item{{Name: "a", Key: "k", Count: 1, At: now, Shards: shards(n)}}}
		if settle {
			o.Settle = &driver.Settlement{Kind: k, Until: now + 3_600_000}
		}
		if change != nil {
			change(o)
		}
		return o
	}
	reserve := func(o *driver.Op) { o.Reserve = true }
	const far = 1 << 60
	ops := []invalidOp{
		{"a settlement in ModeLimit", op(driver.ModeLimit, 1, true, driver.SettleCancel, nil)},
		{"a settlement in ModeLimit, reserving", op(driver.ModeLimit, 1, true, driver.SettleUse, reserve)},
		{"a settlement in ModeCheck", op(driver.ModeCheck, 1, true, driver.SettleCancel, nil)},
		{"a settlement in ModeCheck, reserving", op(driver.ModeCheck, 1, true, driver.SettleUse, reserve)},
		{"a settlement in ModeLimit of a sharded item", op(driver.ModeLimit, 2, true, driver.SettleCancel, nil)},
		{"a settlement without items", op(driver.ModeRefund, 1, true, driver.SettleCancel, func(o *driver.Op) { o.Items = nil })},
		{"a settlement of kind 0", op(driver.ModeRefund, 1, true, 0, nil)},
		{"a settlement of kind 3", op(driver.ModeRefund, 1, true, 3, nil)},
		{"mode 3", op(driver.Mode(3), 1, false, 0, nil)},
		{"mode 4", op(driver.Mode(4), 1, false, 0, nil)},
		{"an item of no shards", op(driver.ModeLimit, 0, false, 0, nil)},
		{"an item of three shards", op(driver.ModeLimit, 3, false, 0, nil)},
		{"a refund of two shards", op(driver.ModeRefund, 2, false, 0, nil)},
		{"a settlement of two shards", op(driver.ModeRefund, 2, true, driver.SettleUse, nil)},
		{"a shard of index -1", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Items[0].Shards[0].Index = -1 })},
		{"a shard of index MaxShards", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Items[0].Shards[0].Index = driver.MaxShards })},
		{"a second shard of index MaxShards", op(driver.ModeLimit, 2, false, 0, func(o *driver.Op) { o.Items[0].Shards[1].Index = driver.MaxShards })},
		{"a refund of a shard of index -1", op(driver.ModeRefund, 1, false, 0, func(o *driver.Op) { o.Items[0].Shards[0].Index = -1 })},
		{"a count of NaN", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Items[0].Count = math.NaN() })},
		{"a reservation of NaN", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Reserve, o.Items[0].Count = true, math.NaN() })},
		{"a refund of NaN", op(driver.ModeRefund, 1, false, 0, func(o *driver.Op) { o.Items[0].Count = math.NaN() })},
		{"a time past MaxTime", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Now = driver.MaxTime + 1 })},
		{"a time far before -MaxTime", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Now = -far })},
		{"a check far past MaxTime", op(driver.ModeCheck, 1, false, 0, func(o *driver.Op) { o.Now = far })},
		{"a settlement far past MaxTime", op(driver.ModeRefund, 1, true, driver.SettleCancel, func(o *driver.Op) { o.Now = far })},
		{"a negative count", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Items[0].Count = -1 })},
		{"a refund of a negative count", op(driver.ModeRefund, 1, false, 0, func(o *driver.Op) { o.Items[0].Count = -1 })},
		{"a reservation of +Inf", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Reserve, o.Items[0].Count = true, math.Inf(1) })},
		{"a refund of +Inf", op(driver.ModeRefund, 1, false, 0, func(o *driver.Op) { o.Items[0].Count = math.Inf(1) })},
		{"a count of -Inf", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Items[0].Count = math.Inf(-1) })},
		{"a count below MinCount", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Items[0].Count = driver.Noise })},
		{"a reservation of the least float64", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Reserve, o.Items[0].Count = true, math.SmallestNonzeroFloat64 })},
		{"a sharded count below MinCount", op(driver.ModeLimit, 2, false, 0, func(o *driver.Op) { o.Items[0].Count = 2 * driver.Noise })},
		{"a check just below MinCount", op(driver.ModeCheck, 1, false, 0, func(o *driver.Op) { o.Items[0].Count = math.Nextafter(ratelimit.MinCount, 0) })},
		{"a count above MaxTokens", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Items[0].Count = 2 * ratelimit.MaxTokens })},
		{"a sharded reservation just above MaxTokens", op(driver.ModeLimit, 2, false, 0, func(o *driver.Op) {
			o.Reserve, o.Items[0].Count = true, math.Nextafter(ratelimit.MaxTokens, math.Inf(1))
		})},
		{"a check of the most float64", op(driver.ModeCheck, 1, false, 0, func(o *driver.Op) { o.Items[0].Count = math.MaxFloat64 })},
		{"a refund charged far before -MaxTime", op(driver.ModeRefund, 1, false, 0, func(o *driver.Op) { o.Items[0].At = math.MinInt64 })},
		{"a refund charged before -MaxTime", op(driver.ModeRefund, 1, false, 0, func(o *driver.Op) { o.Items[0].At = -driver.MaxTime - 1 })},
		{"a settlement charged past MaxTime", op(driver.ModeRefund, 1, true, driver.SettleCancel, func(o *driver.Op) { o.Items[0].At = driver.MaxTime + 1 })},
		{"a settlement charged far past MaxTime", op(driver.ModeRefund, 1, true, driver.SettleUse, func(o *driver.Op) { o.Items[0].At = math.MaxInt64 })},
		{"a refund whose job runs before -MaxTime", op(driver.ModeRefund, 1, false, 0, func(o *driver.Op) { o.Items[0].Run = -driver.MaxTime - 1 })},
		{"a settlement whose job runs past MaxTime", op(driver.ModeRefund, 1, true, driver.SettleCancel, func(o *driver.Op) { o.Items[0].Run = driver.MaxTime + 1 })},
		{"a settlement whose job runs far past MaxTime", op(driver.ModeRefund, 1, true, driver.SettleUse, func(o *driver.Op) { o.Items[0].Run = math.MaxInt64 })},
		{"a settlement kept until past MaxTime", op(driver.ModeRefund, 1, true, driver.SettleCancel, func(o *driver.Op) { o.Settle.Until = driver.MaxTime + 1 })},
		{"a settlement kept until far past MaxTime", op(driver.ModeRefund, 1, true, driver.SettleUse, func(o *driver.Op) { o.Settle.Until = math.MaxInt64 })},
		{"a settlement kept until far before -MaxTime", op(driver.ModeRefund, 1, true, driver.SettleCancel, func(o *driver.Op) { o.Settle.Until = math.MinInt64 })},
	}
	// Items of two keys, or two of one record.
	item := func(name, key string, idx ...int) driver.Item {
		it := driver.Item{Name: name, Key: key, Count: 1, At: now}
		for _, i := range idx {
			it.Shards = append(it.Shards, driver.Shard{Index: i, Params: p})
		}
		return it
	}
	items := func(its ...driver.Item) func(*driver.Op) { return func(o *driver.Op) { o.Items = its } }
	nine := func(o *driver.Op) { // beyond the few items compared pair by pair
		o.Items = nil
		for _, name := range []string{"b", "c", "d", "e", "f", "g", "h", "i", "a"} {
			o.Items = append(o.Items, item(name, "k", 0))
		}
		o.Items = append(o.Items, item("a", "k", 0))
	}
	ops = append(ops,
		invalidOp{"items of two keys", op(driver.ModeLimit, 1, false, 0, items(item("a", "k", 0), item("b", "k2", 0)))},
		invalidOp{"a check of items of two keys", op(driver.ModeCheck, 1, false, 0, items(item("a", "k", 0), item("b", "k2", 0)))},
		invalidOp{"a refund of items of two keys", op(driver.ModeRefund, 1, false, 0, items(item("a", "k", 0), item("b", "k2", 0)))},
		invalidOp{"a settlement of items of two keys", op(driver.ModeRefund, 1, true, driver.SettleUse, items(item("a", "k", 0), item("b", "k2", 0)))},
		invalidOp{"a sharded item of another key", op(driver.ModeLimit, 1, false, 0, items(item("a", "k", 0), item("b", "k2", 0, 1)))},
		invalidOp{"two items of one record", op(driver.ModeLimit, 1, false, 0, items(item("a", "k", 0), item("a", "k", 0)))},
		invalidOp{"a reservation of one record twice", op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) {
			o.Reserve, o.Items = true, []driver.Item{item("a", "k", 1), item("b", "k", 0), item("a", "k", 1)}
		})},
		invalidOp{"a check of one record twice", op(driver.ModeCheck, 1, false, 0, items(item("a", "k", 0), item("a", "k", 0)))},
		invalidOp{"a refund of one record twice", op(driver.ModeRefund, 1, false, 0, items(item("a", "k", 0), item("a", "k", 0)))},
		invalidOp{"a settlement of one record twice", op(driver.ModeRefund, 1, true, driver.SettleCancel, items(item("a", "k", 0), item("a", "k", 0)))},
		invalidOp{"a sharded item and one of its shards", op(driver.ModeLimit, 1, false, 0, items(item("a", "k", 0, 1), item("a", "k", 1)))},
		invalidOp{"two sharded items sharing a shard", op(driver.ModeLimit, 1, false, 0, items(item("a", "k", 0, 2), item("a", "k", 1, 2)))},
		invalidOp{"an item of one shard twice", op(driver.ModeLimit, 1, false, 0, items(item("a", "k", 1, 1)))},
	)
	// The two shards of an item with other params (but for their phase).
	for _, c := range []struct {
		name   string
		change func(*driver.Params)
	}{
		{"kinds", func(q *driver.Params) { q.Kind = 3 - q.Kind }},
		{"rates", func(q *driver.Params) { q.Rate *= 2 }},
		{"periods", func(q *driver.Params) { q.Period++ }},
		{"capacities", func(q *driver.Params) { q.Capacity /= 2 }},
		{"max reserved", func(q *driver.Params) { q.MaxReserved += 1 }},
	} {
		other := p
		c.change(&other)
		ops = append(ops, invalidOp{"two shards of other " + c.name, op(driver.ModeLimit, 2, false, 0, func(o *driver.Op) { o.Items[0].Shards[1].Params = other })})
	}
	ops = append(ops,
		invalidOp{"one record twice among ten items", op(driver.ModeLimit, 1, false, 0, nine)},
	)
	// Params out of range, on an item's only shard, on its second, and on
	// a refund's.
	maxPeriod := ratelimit.MaxPeriod.Milliseconds()
	for _, c := range []struct {
		name   string
		change func(*driver.Params)
	}{
		{"kind 0", func(q *driver.Params) { q.Kind = 0 }},
		{"kind 3", func(q *driver.Params) { q.Kind = 3 }},
		{"period 0", func(q *driver.Params) { q.Period = 0 }},
		{"a negative period", func(q *driver.Params) { q.Period = -60_000 }},
		{"a period beyond MaxPeriod", func(q *driver.Params) { q.Period = maxPeriod + 1 }},
		{"a negative phase", func(q *driver.Params) { q.Kind, q.Phase = ratelimit.FixedWindow, -1 }},
		{"a phase of a period", func(q *driver.Params) { q.Kind, q.Phase = ratelimit.FixedWindow, q.Period }},
		{"a token bucket's phase beyond its period", func(q *driver.Params) { q.Phase = 1 << 62 }},
		{"a rate of NaN", func(q *driver.Params) { q.Rate = math.NaN() }},
		{"a rate of 0", func(q *driver.Params) { q.Rate = 0 }},
		{"a negative rate", func(q *driver.Params) { q.Rate = -1 }},
		{"a rate of +Inf", func(q *driver.Params) { q.Rate = math.Inf(1) }},
		{"a rate below 1e-9 over MaxShards", func(q *driver.Params) { q.Rate = 1e-9 / ratelimit.MaxShards / 2 }},
		{"a rate beyond MaxTokens", func(q *driver.Params) { q.Rate = 2 * ratelimit.MaxTokens }},
		{"a capacity of NaN", func(q *driver.Params) { q.Capacity = math.NaN() }},
		{"a negative capacity", func(q *driver.Params) { q.Capacity = -1 }},
		{"a capacity of +Inf", func(q *driver.Params) { q.Capacity = math.Inf(1) }},
		{"a capacity beyond MaxTokens", func(q *driver.Params) { q.Capacity = 2 * ratelimit.MaxTokens }},
		{"a max reserved of NaN", func(q *driver.Params) { q.MaxReserved = math.NaN() }},
		{"a negative max reserved", func(q *driver.Params) { q.MaxReserved = -1 }},
		{"a max reserved of +Inf", func(q *driver.Params) { q.MaxReserved = math.Inf(1) }},
		{"a max reserved beyond MaxTokens", func(q *driver.Params) { q.MaxReserved = 2 * ratelimit.MaxTokens }},
	} {
		bad := p
		c.change(&bad)
		ops = append(ops,
			invalidOp{c.name, op(driver.ModeLimit, 1, false, 0, func(o *driver.Op) { o.Items[0].Shards[0].Params = bad })},
			invalidOp{c.name + " on a second shard", op(driver.ModeLimit, 2, false, 0, func(o *driver.Op) { o.Reserve, o.Items[0].Shards[1].Params = true, bad })},
			invalidOp{c.name + " in a settlement", op(driver.ModeRefund, 1, true, driver.SettleUse, func(o *driver.Op) { o.Items[0].Shards[0].Params = bad })},
		)
	}
	for i := range ops {
		if st := ops[i].op.Settle; st != nil {
			st.ID = invalidID(i)
		}
	}
	return ops
}

// invalidID is the settlement ID of the i-th of invalidOps.
func invalidID(i int) [16]byte { return [16]byte{0x1d, 0xe5, byte(i), byte(i >> 8)} }

// requireUnsettled requires that the settlement id was not settled by an
// op refused before (the case named what): a refund settling it now, of a
// record that is not touched otherwise, is applied and finds no mark.
func requireUnsettled(t *testing.T, s ratelimit.Store, now int64, p driver.Params, id [16]byte, what string) {
	t.Helper()
	item := itemOf("u", "k", 1, p)
	item.At = now
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(context.Background(), &driver.Op{Mode: driver.ModeRefund, Now: now + 1000, Items: []driver.Item{item},
		Settle: &driver.Settlement{ID: id, Kind: driver.SettleUse, Until: now + 3_600_000}}, out))
	require.Zero(t, out[0].Settled, "%s: a refused op marks no settlement", what)
}

// charge spends 4 tokens of the record (name, "k") of a token bucket of
// params p at now.
func charge(t *testing.T, s ratelimit.Store, now int64, name string, p driver.Params) {
	t.Helper()
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(context.Background(), &driver.Op{Now: now, Items: []driver.Item{itemOf(name, "k", 4, p)}}, out))
	require.True(t, out[0].OK)
}

// noPanic runs f, and fails t if f panics.
func noPanic(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("panicked: %v", r)
		}
	}()
	f()
}

func lens(outs [][]driver.Decision) []int {
	n := make([]int, len(outs))
	for i, o := range outs {
		n[i] = len(o)
	}
	return n
}
