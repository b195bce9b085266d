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
		"settler 0": append(markValue(2), make([]byte, 16)...),
		"settler 1": append(markValue(2), make([]byte, 15)...),
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

// A settlement of no settler (a holder's, by its token) writes the mark
// releases that kept no settler write, and read; one of a settler (a
// Reservation's) appends it. A mark of no settler, as an earlier release
// wrote it, is nobody's own: a Reservation's retried Wait or Cancel that
// finds one takes it for a holder's, rather than let the job run twice.
// Marks of both forms are swept once expired.
func TestMarkFormat(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	lim, err := ratelimit.New(s, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	mark := func(tok *ratelimit.Token) []byte {
		var v []byte
		require.NoError(t, s.DB().View(func(tx *bolt.Tx) error {
			v = append(v, tx.Bucket([]byte(boltstore.DefaultBucket)).Get(boltstore.MarkKey(tok.ID()))...)
			return nil
		}))
		return v
	}
	put := func(tok *ratelimit.Token, v []byte) {
		require.NoError(t, s.DB().Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(boltstore.DefaultBucket)).Put(boltstore.MarkKey(tok.ID()), v)
		}))
	}

	r, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	holders := r.Token()
	require.NoError(t, lim.Refund(ctx, holders))
	v := mark(holders)
	require.Len(t, v, 24, "a holder's mark: kind, time, expiry")
	require.Equal(t, markValue(1)[:16], v[:16])
	require.Equal(t, holders.Expires().UnixMilli(), int64(binary.BigEndian.Uint64(v[16:])))

	r, err = lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	owners := r.Token()
	require.NoError(t, r.Cancel(ctx))
	v = mark(owners)
	require.Len(t, v, 40, "the owner's mark: kind, time, expiry, settler")
	require.Equal(t, markValue(1)[:16], v[:16])
	require.Equal(t, owners.Expires().UnixMilli(), int64(binary.BigEndian.Uint64(v[16:])))
	require.NotEqual(t, make([]byte, 16), v[24:])

	// Marks of an earlier release: a use, a cancel, of no settler.
	for kind, want := range map[float64]error{2: ratelimit.ErrReservationUsed, 1: ratelimit.ErrReservationCanceled} {
		r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.WithReceipt())
		require.NoError(t, err)
		put(r.Token(), markValue(kind))
		require.ErrorIs(t, r.Wait(ctx), want, "kind %v: Wait", kind)
		r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.WithReceipt())
		require.NoError(t, err)
		put(r.Token(), markValue(kind))
		require.ErrorIs(t, r.Cancel(ctx), want, "kind %v: Cancel", kind)
	}

	n, err := s.DeleteExpired(ctx, t0.Add(1000*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1+2, n, "the record and the two marks this store wrote (the others expire never)")
	require.Nil(t, mark(owners))
}
