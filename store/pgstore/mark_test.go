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
		require.ErrorContains(t, err, "op 1:", name)
		require.NotContains(t, err.Error(), "op 0:", name)
		require.True(t, outs[0][0].OK, "%s: the other op is decided", name)
	}
	st, err := lim.Value(ctx, "jobs", "other")
	require.NoError(t, err)
	require.Equal(t, 1.0, st.Remaining, "each other op decided once")
}
