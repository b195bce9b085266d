package boltstore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// recordValue is a record's value in the bucket: tokens, ts and expires.
func recordValue(tokens float64, ts, expires int64) []byte {
	v := binary.BigEndian.AppendUint64(nil, math.Float64bits(tokens))
	v = binary.BigEndian.AppendUint64(v, uint64(ts))
	return binary.BigEndian.AppendUint64(v, uint64(expires))
}

// TestRecordNoReleaseWrites: a value where a record belongs that no
// release writes (of another size, or a record of NaN or infinitely many
// tokens, or of a time beyond any call's: driver.CheckState), expired or
// not, fails every op on it (a limit, a check, a refund), alone or
// batched (the other ops are decided), and Load, with ErrBadRecord, the
// key and what to do, and is left as it is. The store read a value of
// another size as a missing record, a full bucket (a damaged file let
// every limit start over), and decided on the others: NaN tokens refused
// every call, +Inf read as a full bucket.
func TestRecordNoReleaseWrites(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	now := t0.UnixMilli()
	never := int64(math.MaxInt64)
	for name, bad := range map[string][]byte{
		"empty":                       {},
		"short":                       recordValue(5, now, never)[:23],
		"long":                        append(recordValue(5, now, never), 0),
		"NaN tokens":                  recordValue(math.NaN(), now, never),
		"+Inf tokens":                 recordValue(math.Inf(1), now, never),
		"-Inf tokens":                 recordValue(math.Inf(-1), now, never),
		"NaN tokens, expired":         recordValue(math.NaN(), now, now-1),
		"a time 2^60 ms away":         recordValue(5, 1<<60, never),
		"a time 2^60 ms before 1970":  recordValue(5, -1<<60, never),
		"a time past MaxTime":         recordValue(5, driver.MaxTime+1, never),
		"a time before MinRecordTime": recordValue(5, driver.MinRecordTime-1, never),
	} {
		key := boltstore.RecordKey(driver.RecordID{Name: "l", Key: name})
		require.NoError(t, s.DB().Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(boltstore.DefaultBucket)).Put(key, bad)
		}))
		isBad := func(err error, how string) {
			t.Helper()
			require.ErrorIs(t, err, boltstore.ErrBadRecord, "%s: %s", name, how)
			require.ErrorIs(t, err, driver.ErrBadRecord, "%s: %s", name, how)
			require.ErrorContains(t, err, fmt.Sprintf("%q", key), "%s: %s: names the key", name, how)
			require.ErrorContains(t, err, "delete the key", "%s: %s: says what to do", name, how)
		}
		op := func(mode driver.Mode) *driver.Op {
			o := takeOp("l", name, 1, now)
			o.Mode = mode
			o.Items[0].At = now
			return o
		}
		out := make([]driver.Decision, 1)
		for _, mode := range []driver.Mode{driver.ModeLimit, driver.ModeCheck, driver.ModeRefund} {
			isBad(s.Apply(ctx, op(mode), out), fmt.Sprintf("alone, mode %d", mode))
		}
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		err := s.ApplyBatch(ctx, []*driver.Op{op(driver.ModeLimit), takeOp("l", "good "+name, 1, now)}, outs)
		isBad(err, "batched")
		var oe *boltstore.OpError
		require.ErrorAs(t, err, &oe, name)
		require.Equal(t, 0, oe.Index, name)
		require.True(t, outs[1][0].OK, "%s: the other op is decided", name)
		isBad(s.Load(ctx, []driver.RecordID{{Name: "l", Key: "good " + name}, {Name: "l", Key: name}}, make([]driver.Record, 2)), "loaded")
		require.NoError(t, s.DB().View(func(tx *bolt.Tx) error {
			require.Equal(t, bad, tx.Bucket([]byte(boltstore.DefaultBucket)).Get(key), "%s: left as it is", name)
			return nil
		}))
	}

	// At the bounds, and any finite number of tokens: read alike.
	for i, st := range []driver.State{
		{Remaining: -1e300, TS: now},
		{Remaining: 1e300, TS: now},
		{Remaining: 5, TS: driver.MaxTime},
		{Remaining: 5, TS: driver.MinRecordTime},
	} {
		id := driver.RecordID{Name: "l", Key: fmt.Sprint("sound ", i)}
		require.NoError(t, s.DB().Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte(boltstore.DefaultBucket)).Put(boltstore.RecordKey(id), recordValue(st.Remaining, st.TS, never))
		}))
		recs := make([]driver.Record, 1)
		require.NoError(t, s.Load(ctx, []driver.RecordID{id}, recs), "%+v", st)
		require.Equal(t, driver.Record{State: st, Found: true}, recs[0])
		o := takeOp("l", id.Key, 1, now)
		o.Mode = driver.ModeCheck
		require.NoError(t, s.Apply(ctx, o, make([]driver.Decision, 1)), "%+v", st)
	}
}

// DeleteExpired keeps a value where a record belongs that is of another
// size, however late: its expiry is unknown, and without it its limit
// would start full again unseen (it removed it, as it did a settlement's
// mark it could not read). A record that no release writes but whose
// expiry reads goes once expired, as any record.
func TestSweepKeepsBadRecords(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	now := t0.UnixMilli()
	short := boltstore.RecordKey(driver.RecordID{Name: "l", Key: "short"})
	nan := boltstore.RecordKey(driver.RecordID{Name: "l", Key: "nan"})
	require.NoError(t, s.DB().Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(boltstore.DefaultBucket))
		if err := b.Put(short, []byte{1, 2, 3}); err != nil {
			return err
		}
		return b.Put(nan, recordValue(math.NaN(), now, now))
	}))
	n, err := s.DeleteExpired(ctx, t0.Add(1000*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, n, "the expired record")
	require.NoError(t, s.DB().View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(boltstore.DefaultBucket))
		require.Equal(t, []byte{1, 2, 3}, b.Get(short), "kept")
		require.Nil(t, b.Get(nan), "removed")
		return nil
	}))
}

// TestBucketWhereRecordBelongs: a nested bucket at a record's key, or at
// a settlement's mark's key, made there by something else, is no record
// either: every op on it and Load fail with ErrBadRecord, naming the key
// and what to do, and a settlement with ErrBadMark. A limit failed with
// bbolt's bare "incompatible value", naming nothing, while a check and
// Load read the key as a full bucket; and Delete (a Reset) failed with
// the same bare error.
func TestBucketWhereRecordBelongs(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	now := t0.UnixMilli()
	id := driver.RecordID{Name: "l", Key: "nested"}
	settle := [16]byte{0xb0, 0xc4}
	key := boltstore.RecordKey(id)
	require.NoError(t, s.DB().Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(boltstore.DefaultBucket))
		if _, err := b.CreateBucket(key); err != nil {
			return err
		}
		_, err := b.CreateBucket(boltstore.MarkKey(settle))
		return err
	}))
	isBad := func(err error, how string) {
		t.Helper()
		require.ErrorIs(t, err, boltstore.ErrBadRecord, how)
		require.ErrorContains(t, err, fmt.Sprintf("%q", key), "%s: names the key", how)
		require.ErrorContains(t, err, "is a bucket", "%s: says what is there", how)
		require.ErrorContains(t, err, "delete", "%s: says what to do", how)
	}
	out := make([]driver.Decision, 1)
	for _, mode := range []driver.Mode{driver.ModeLimit, driver.ModeCheck, driver.ModeRefund} {
		o := takeOp("l", "nested", 1, now)
		o.Mode, o.Items[0].At = mode, now
		isBad(s.Apply(ctx, o, out), fmt.Sprintf("mode %d", mode))
	}
	isBad(s.Load(ctx, []driver.RecordID{id}, make([]driver.Record, 1)), "loaded")
	isBad(s.Delete(ctx, []driver.RecordID{id}), "deleted")

	o := takeOp("l", "settled", 1, now)
	o.Mode, o.Items[0].At = driver.ModeRefund, now
	o.Settle = &driver.Settlement{ID: settle, Kind: driver.SettleCancel, Until: now + 1000}
	err := s.Apply(ctx, o, out)
	require.ErrorIs(t, err, boltstore.ErrBadMark)
	require.ErrorContains(t, err, "treat it as settled")
	require.False(t, stored(t, s, "l", "settled").Found, "the settlement writes nothing")
}
