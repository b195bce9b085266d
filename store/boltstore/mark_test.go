package boltstore_test

import (
	"context"
	"encoding/binary"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// markValue is a value of a mark's size whose kind is kind, expiring far
// away.
func markValue(kind float64) []byte {
	v := binary.BigEndian.AppendUint64(nil, math.Float64bits(kind))
	v = binary.BigEndian.AppendUint64(v, uint64(t0.UnixMilli()))
	return binary.BigEndian.AppendUint64(v, math.MaxInt64)
}

// A settlement whose mark cannot be read (the wrong size, or of no kind
// of settlement) fails with ErrBadMark and settles nothing: the token may
// have been settled already. The store used to take such a mark for none,
// and settled the token again: a canceled token could be used, its
// tokens handed back twice.
func TestBadMarkFailsTheSettlement(t *testing.T) {
	ctx := context.Background()
	for name, bad := range map[string][]byte{
		"empty":     {},
		"short":     {2},
		"long":      append(markValue(2), 0),
		"kind 0":    markValue(0),
		"kind 3":    markValue(3),
		"kind 1.5":  markValue(1.5),
		"kind NaN":  markValue(math.NaN()),
		"kind -Inf": markValue(math.Inf(-1)),
	} {
		s := open(t, filepath.Join(t.TempDir(), "limits.db"))
		lim, err := ratelimit.New(s, ratelimit.Limits{
			"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
		}, ratelimit.WithClock(newMock(t0)))
		require.NoError(t, err)
		r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
		require.NoError(t, err)
		tok := r.Token()
		require.NoError(t, s.DB().Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(boltstore.DefaultBucket)).Put(boltstore.MarkKey(tok.ID()), bad)
		}))

		for _, err := range storetest.SettleEveryWay(ctx, lim, r) {
			require.ErrorIs(t, err, boltstore.ErrBadMark, name)
			require.ErrorIs(t, err, driver.ErrBadRecord, "%s: the error of every store", name)
			require.NotErrorIs(t, err, ratelimit.ErrAlreadySettled, name)
			require.ErrorContains(t, err, "treat it as settled", name)
		}
		st, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		require.Equal(t, 6.0, st.Remaining, "%s: nothing handed back", name)

		// In a batch, the op fails alone.
		op := &driver.Op{Mode: driver.ModeRefund, Now: t0.UnixMilli(),
			Settle: &driver.Settlement{ID: tok.ID(), Kind: driver.SettleCancel, Until: tok.Expires().UnixMilli()},
			Items:  []driver.Item{{Name: "jobs", Key: "k", Count: 4, At: t0.UnixMilli(), Shards: []driver.Shard{{Params: tb}}}}}
		other := takeOp("other", "k", 1, t0.UnixMilli())
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		err = s.ApplyBatch(ctx, []*driver.Op{op, other}, outs)
		var oe *boltstore.OpError
		require.ErrorAs(t, err, &oe, name)
		require.Equal(t, 0, oe.Index, name)
		require.ErrorIs(t, err, boltstore.ErrBadMark, name)
		require.True(t, outs[1][0].OK, "%s: the other op is decided", name)
	}
}

// DeleteExpired keeps a mark it cannot read, however late: its expiry is
// unknown, and without it the token could be settled again. It removed
// it as it removes a record that does not decode, and the next settlement
// of the token took effect. A mark that reads is removed once expired.
func TestSweepKeepsBadMarks(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	lim, err := ratelimit.New(s, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	var bad []*ratelimit.Token
	for _, v := range [][]byte{{2}, markValue(0)} {
		r, err := lim.Reserve(ctx, "jobs", "k")
		require.NoError(t, err)
		tok := r.Token()
		bad = append(bad, tok)
		require.NoError(t, s.DB().Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(boltstore.DefaultBucket)).Put(boltstore.MarkKey(tok.ID()), v)
		}))
	}
	r, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	good := r.Token()
	require.NoError(t, lim.Refund(ctx, good))

	n, err := s.DeleteExpired(ctx, t0.Add(1000*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 2, n, "the record and the good mark")
	for _, tok := range bad {
		require.ErrorIs(t, lim.Refund(ctx, tok), boltstore.ErrBadMark, "the mark was kept")
	}
}
