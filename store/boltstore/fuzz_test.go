package boltstore_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	bolt "go.etcd.io/bbolt"
)

// FuzzStoredValues writes any bytes where a record belongs and where a
// settlement's mark belongs, as a damaged file or another writer into the
// bucket may leave them, and calls the store on both: Load, an op of each
// mode, a refund that settles against the mark, and a sweep. None may
// panic; a value the store cannot read is an error matching
// driver.ErrBadRecord, never read as another.
func FuzzStoredValues(f *testing.F) {
	now := t0.UnixMilli()
	f.Add(recordValue(5, now, math.MaxInt64))
	f.Add(recordValue(5, now, now-1))
	f.Add(markValue(2))
	f.Add(append(markValue(1), "settler of sixteen"[:16]...))
	for _, n := range []int{0, 1, 7, 8, 23, 25, 39, 40, 41, 48} {
		f.Add(make([]byte, n))
	}
	ctx := context.Background()
	s, err := boltstore.Open(filepath.Join(f.TempDir(), "limits.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	id := driver.RecordID{Name: "l", Key: "fuzzed"}
	settle := [16]byte{'f', 'u', 'z', 'z'}
	put := func(t *testing.T, v []byte) {
		t.Helper()
		if err := s.DB().Update(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte(boltstore.DefaultBucket))
			if err := b.Put(boltstore.RecordKey(id), v); err != nil {
				return err
			}
			return b.Put(boltstore.MarkKey(settle), v)
		}); err != nil {
			t.Fatal(err)
		}
	}
	readable := func(t *testing.T, err error, how string) {
		t.Helper()
		if err != nil && !errors.Is(err, driver.ErrBadRecord) {
			t.Errorf("%s: got %v, want nil or an error matching driver.ErrBadRecord", how, err)
		}
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		put(t, v)
		recs := make([]driver.Record, 1)
		err := s.Load(ctx, []driver.RecordID{id}, recs)
		readable(t, err, "Load")
		if err == nil && recs[0].Found {
			if err := driver.CheckState(recs[0].State); err != nil {
				t.Errorf("Load read a state no release writes: %v", err)
			}
		}
		for _, mode := range []driver.Mode{driver.ModeLimit, driver.ModeCheck, driver.ModeRefund} {
			put(t, v) // as the last call may have written it
			op := takeOp(id.Name, id.Key, 1, now)
			op.Mode, op.Items[0].At = mode, now
			readable(t, s.Apply(ctx, op, make([]driver.Decision, 1)), "Apply")
		}
		put(t, v)
		op := takeOp(id.Name, id.Key, 1, now)
		op.Mode, op.Items[0].At = driver.ModeRefund, now
		op.Settle = &driver.Settlement{ID: settle, Kind: driver.SettleCancel, Until: now + 60_000}
		readable(t, s.Apply(ctx, op, make([]driver.Decision, 1)), "a settling refund")
		put(t, v)
		if _, err := s.DeleteExpired(ctx, t0.Add(1000*time.Hour)); err != nil {
			t.Errorf("DeleteExpired: %v", err)
		}
	})
}
