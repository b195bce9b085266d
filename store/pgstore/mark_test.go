package pgstore_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// A settlement whose mark (the row whose id is the token's) holds a value
// other than 1 (cancel) or 2 (use) fails with ErrBadRecord and settles
// nothing, alone or in a batch, whose other ops are decided: the
// token may have been settled already. A mark of 0, 0.4 or -1 was taken
// for none, so that a used token was handed back (-1 was never written
// over: the token could be settled again and again), one of 3 for a
// settlement of that kind, and NaN or an infinity failed with "bigint out
// of range".
func TestBadMarkFailsTheSettlement(t *testing.T) {
	ctx := context.Background()
	pool, table, s := newTableStore(t)
	lim, err := ratelimit.New(s, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	for _, bad := range []float64{0, 0.4, -1, 3, 1.5, 2.0000001, math.NaN(), math.Inf(1), math.Inf(-1)} {
		name := fmt.Sprint(bad)
		key := "k" + name
		r, err := lim.Reserve(ctx, "jobs", key, ratelimit.Count(4))
		require.NoError(t, err)
		tok := r.Token()
		id := tok.ID()
		_, err = pool.Exec(ctx, fmt.Sprintf("INSERT INTO %q (id, name, key, shard, value, ts, expires) VALUES ($1, '', '', 0, $2, $3, $3)", table),
			id[:], bad, tok.Expires().UnixMilli())
		require.NoError(t, err)

		for _, err := range storetest.SettleEveryWay(ctx, lim, r) {
			require.ErrorIs(t, err, driver.ErrBadRecord, name)
			require.ErrorIs(t, err, pgstore.ErrBadRecord, name)
			require.NotErrorIs(t, err, ratelimit.ErrAlreadySettled, name)
			require.ErrorContains(t, err, fmt.Sprintf("%x", id), "%s: names the row", name)
			require.ErrorContains(t, err, "treat it as settled", name)
			require.ErrorContains(t, err, "WithTable", name)
		}
		st, err := lim.Value(ctx, "jobs", key)
		require.NoError(t, err)
		require.Equal(t, 6.0, st.Remaining, "%s: nothing handed back", name)

		// In a batch, the op fails alone.
		p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
		now := t0.UnixMilli()
		op := &driver.Op{Mode: driver.ModeRefund, Now: now,
			Settle: &driver.Settlement{ID: id, Kind: driver.SettleCancel, Until: tok.Expires().UnixMilli()},
			Items:  []driver.Item{{Name: "jobs", Key: key, Count: 4, At: now, Shards: []driver.Shard{{Params: p}}}}}
		other := &driver.Op{Mode: driver.ModeLimit, Now: now,
			Items: []driver.Item{{Name: "jobs", Key: "other", Count: 1, Shards: []driver.Shard{{Params: p}}}}}
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		err = s.ApplyBatch(ctx, []*driver.Op{other, op}, outs)
		require.ErrorIs(t, err, driver.ErrBadRecord, name)
		require.Equal(t, []int{1}, storetest.FailedOps(t, err), name)
		require.True(t, outs[0][0].OK, "%s: the other op is decided", name)
	}
	st, err := lim.Value(ctx, "jobs", "other")
	require.NoError(t, err)
	require.Equal(t, 1.0, st.Remaining, "each other op decided once")
}

// A settlement keeps its settler (driver.Settlement.Settler) in the key
// column of its mark's row: empty for none (a holder's, by its token),
// as releases that kept no settler write every mark, which they read by
// its value alone; the settler's 16 bytes for a Reservation's. A mark of
// no settler, as an earlier release wrote it, is nobody's own: a
// Reservation's retried Wait or Cancel that finds one takes it for a
// holder's, rather than let the job run twice. A batch in which two
// settlers settle one ID tells each whose mark it finds.
func TestMarkFormat(t *testing.T) {
	ctx := context.Background()
	pool, table, s := newTableStore(t)
	lim, err := ratelimit.New(s, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	row := func(tok *ratelimit.Token) (value float64, key []byte) {
		id := tok.ID()
		require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf("SELECT value, key FROM %q WHERE id = $1", table), id[:]).Scan(&value, &key))
		return value, key
	}
	put := func(tok *ratelimit.Token, kind float64) {
		id := tok.ID()
		_, err := pool.Exec(ctx, fmt.Sprintf("INSERT INTO %q (id, name, key, shard, value, ts, expires) VALUES ($1, '', '', 0, $2, $3, $3)", table),
			id[:], kind, tok.Expires().UnixMilli())
		require.NoError(t, err)
	}

	r, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	holders := r.Token()
	require.NoError(t, lim.Refund(ctx, holders))
	v, key := row(holders)
	require.Equal(t, 1.0, v)
	require.Empty(t, key, "a holder's mark names no settler")

	r, err = lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	owners := r.Token()
	require.NoError(t, r.Cancel(ctx))
	v, key = row(owners)
	require.Equal(t, 1.0, v)
	require.Len(t, key, 16, "the owner's mark names its settler")
	require.NotEqual(t, make([]byte, 16), key)
	require.NoError(t, r.Cancel(ctx), "its own mark")

	// Marks of an earlier release: a use, a cancel, of no settler.
	for kind, want := range map[float64]error{2: ratelimit.ErrReservationUsed, 1: ratelimit.ErrReservationCanceled} {
		r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.WithReceipt())
		require.NoError(t, err)
		put(r.Token(), kind)
		require.ErrorIs(t, r.Wait(ctx), want, "kind %v: Wait", kind)
		r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.WithReceipt())
		require.NoError(t, err)
		put(r.Token(), kind)
		require.ErrorIs(t, r.Cancel(ctx), want, "kind %v: Cancel", kind)
	}

	// One batch: settler a settles, then b, none and a again find a's mark.
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
	now := t0.UnixMilli()
	id, a, b := [16]byte{0x5e, 1}, [16]byte{0xa}, [16]byte{0xb}
	_, err = pool.Exec(ctx, fmt.Sprintf("DELETE FROM %q WHERE id = $1", table), id[:])
	require.NoError(t, err)
	var ops []*driver.Op
	var outs [][]driver.Decision
	for _, settler := range [][16]byte{a, b, {}, a} {
		ops = append(ops, &driver.Op{Mode: driver.ModeRefund, Now: now,
			Settle: &driver.Settlement{ID: id, Kind: driver.SettleUse, Until: now + 60_000, Settler: settler},
			Items:  []driver.Item{{Name: "jobs", Key: "batch", Count: 1, At: now, Shards: []driver.Shard{{Params: p}}}}})
		outs = append(outs, make([]driver.Decision, 1))
	}
	require.NoError(t, s.ApplyBatch(ctx, ops, outs))
	require.True(t, outs[0][0].OK)
	for i, want := range []bool{false, false, true} {
		d := outs[i+1][0]
		require.Equal(t, driver.SettleUse, d.Settled, "op %d", i+1)
		require.Equal(t, want, d.Own, "op %d", i+1)
	}
	// One batch of one settler: the second finds the first's mark, written
	// by the same call, its own.
	id[1] = 2
	for _, op := range ops {
		op.Settle.ID, op.Settle.Settler = id, a
	}
	require.NoError(t, s.ApplyBatch(ctx, ops[:2], outs[:2]))
	require.True(t, outs[0][0].OK)
	require.Equal(t, driver.Decision{Now: now, Settled: driver.SettleUse, Own: true}, outs[1][0])
}
