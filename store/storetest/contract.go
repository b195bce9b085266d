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
// records and empty ops.
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
