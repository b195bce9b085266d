package storetest

import (
	"context"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// testContract checks the promises of package driver at their edges, one
// subtest each: what Load, Delete, Apply and ApplyBatch do with missing
// records, empty ops and outs of the wrong length.
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
