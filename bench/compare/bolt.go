package compare

import (
	"context"
	"encoding/binary"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The contenders on bbolt, each on a file of its own, opened with the
// defaults (an fsync per commit). No peer in the comparison has a bbolt
// store; bbolt's own Update and Batch are the floor.
var boltContenders = []Contender{
	{
		Name: "ratelimit boltstore", Code: "lib", Role: Library, Bound: libraryBound,
		New: func(_ context.Context, e *env, l Limit) (Taker, error) { return newLibrary(e.boltStore, l) },
	},
	{
		Name: "bare bbolt Update", Code: "update", Role: Bare, Bound: counterBound,
		New: func(_ context.Context, e *env, l Limit) (Taker, error) {
			return &bareBolt{db: e.boltUpdate, limit: int64(l.Rate), period: l.Period.Milliseconds()}, nil
		},
	},
	{
		// Batch gathers concurrent calls into one transaction, after
		// waiting up to MaxBatchDelay (10 ms by default) for more.
		Name: "bare bbolt Batch", Code: "batch", Role: Bare, Bound: counterBound,
		New: func(_ context.Context, e *env, l Limit) (Taker, error) {
			return &bareBolt{db: e.boltBatch, batch: true, limit: int64(l.Rate), period: l.Period.Milliseconds()}, nil
		},
	},
}

var bareBucket = []byte("bare")

// bareBolt counts each key's calls in fixed windows on the epoch's grid,
// the time read inside the transaction, and grants a call when its window
// has counted at most limit: one read and one write in one transaction.
type bareBolt struct {
	db            *bolt.DB
	batch         bool
	limit, period int64
}

func (b *bareBolt) Take(_ context.Context, key string) (bool, error) {
	var n int64
	fn := func(tx *bolt.Tx) error {
		bk := tx.Bucket(bareBucket)
		win := time.Now().UnixMilli() / b.period
		n = 1
		if v := bk.Get([]byte(key)); len(v) == 16 {
			// A window never restarts, should the clock step back.
			if stored := int64(binary.BigEndian.Uint64(v)); stored >= win {
				win, n = stored, int64(binary.BigEndian.Uint64(v[8:]))+1
			}
		}
		var v [16]byte
		binary.BigEndian.PutUint64(v[:], uint64(win))
		binary.BigEndian.PutUint64(v[8:], uint64(n))
		return bk.Put([]byte(key), v[:])
	}
	var err error
	if b.batch {
		err = b.db.Batch(fn)
	} else {
		err = b.db.Update(fn)
	}
	return err == nil && n <= b.limit, err
}

func openBareBolt(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bareBucket)
		return err
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}
