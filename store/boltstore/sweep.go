package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// defaultSweepBatch is the most keys one transaction of DeleteExpired
// visits: a call that waits for the writer behind a sweep waits for one
// such transaction at most.
const defaultSweepBatch = 1000

// DeleteExpired removes every record whose bucket has been full again for
// driver.ExpiryGrace (a minute) at now, taken within ±driver.MaxTime, and
// returns how many it removed. The grace keeps exact the calls in flight,
// judged at a now read a moment before. Such records read as a full
// bucket whether kept or not; removing them keeps the file's size
// proportional to the keys active recently. Call it periodically (say every few minutes) from one
// goroutine. It removes the marks of settlements once they have expired
// too, but keeps a mark it cannot read (ErrBadMark): its expiry is
// unknown, and without it its token could be settled again. Delete such
// a key through DB once its token has expired. It keeps as well a value
// of another size than a record's where a record belongs (ErrBadRecord):
// its limit would start full again unseen.
//
// It sweeps the bucket in small steps, resuming where the last stopped:
// each reads a thousand keys in a read transaction, then removes those
// expired in a write transaction of their own, so that a call waits at
// most one small transaction for the writer, however large the bucket.
// When ctx ends, it stops between steps and returns what it removed with
// ctx's error (once the store is closed, with driver.ErrClosed); if ctx
// ends during a step, it returns at once (see Deadlines in the package
// doc), and the step's write, left in the background, rolls back, unless
// it was committing: then its records are removed, and not counted.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time) (int, error) {
	if err := s.usable(ctx, "DeleteExpired"); err != nil {
		return 0, err
	}
	cutoff := driver.ClampMilli(now) - driver.ExpiryGrace
	var after []byte // the last key visited
	n := 0
	for {
		if err := ctx.Err(); err != nil {
			return n, fmt.Errorf("boltstore: delete expired: stopped after %d records: %w", n, err)
		}
		// Closed meanwhile: a store made by New would go on reading the
		// application's database, which Close leaves open.
		if s.closed.Load() {
			return n, errClosed
		}
		expired, last, err := s.scan(ctx, after, cutoff)
		if err == nil && len(expired) > 0 {
			if s.hooks.scanned != nil {
				s.hooks.scanned()
			}
			var d int
			d, err = s.deleteExpired(ctx, expired, cutoff)
			n += d
		}
		switch {
		case err == nil:
		case ctx.Err() != nil && errors.Is(err, ctx.Err()):
			return n, fmt.Errorf("boltstore: delete expired: stopped after %d records: %w", n, err)
		case errors.Is(err, driver.ErrClosed) || errors.Is(err, berrors.ErrDatabaseNotOpen):
			return n, errClosed
		default:
			return n, fmt.Errorf("boltstore: delete expired: %w", err)
		}
		if last == nil {
			return n, nil
		}
		after = last
	}
}

// expiredAt reports whether the value v of the key k says it may be
// removed at cutoff (now less ExpiryGrace). A value that does not decode
// may not: its expiry is unknown, and without it a record's limit would
// start full again unseen (ErrBadRecord), a settlement's token could be
// settled again (ErrBadMark). Nor may a mark of no kind of settlement. A
// record that no release writes but whose expiry reads goes once expired,
// as any record.
func expiredAt(k, v []byte, cutoff int64) bool {
	if len(k) == markLen && k[0] == tagMark {
		_, _, expires, ok := decodeMark(v)
		return ok && expires <= cutoff
	}
	_, expires, ok := decodeValue(v)
	return ok && expires <= cutoff
}

// scan reads up to sweepBatch keys after after (from the first if nil),
// and returns copies of those expired at cutoff, and the last key read;
// nil when it read to the end of the bucket. It returns ctx's error once
// ctx ends, without waiting for its read transaction to begin (view).
func (s *Store) scan(ctx context.Context, after []byte, cutoff int64) ([][]byte, []byte, error) {
	// The read may be left behind: it fills variables of its own, read
	// only once it has returned.
	var expired [][]byte
	var last []byte
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b, err := s.bucketOf(tx)
		if err != nil {
			return err
		}
		c := b.Cursor()
		k, v := c.First()
		if after != nil {
			k, v = c.Seek(after)
			if bytes.Equal(k, after) {
				k, v = c.Next()
			}
		}
		for i := 0; k != nil && i < s.sweepBatch; i++ {
			// v is nil for a nested bucket, which is none of the store's.
			if v != nil && expiredAt(k, v, cutoff) {
				expired = append(expired, bytes.Clone(k))
			}
			last = k
			k, v = c.Next()
		}
		if k == nil {
			last = nil
		} else {
			last = bytes.Clone(last)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return expired, last, nil
}

// deleteExpired removes, in one write transaction, those of keys still
// expired at cutoff: a call may have written one since it was read. A
// transaction that removes none is rolled back (errNoWrite).
func (s *Store) deleteExpired(ctx context.Context, keys [][]byte, cutoff int64) (int, error) {
	n := 0
	err := s.update(ctx, func(tx *bolt.Tx) error {
		n = 0
		b, err := s.bucketOf(tx)
		if err != nil {
			return err
		}
		if s.hooks.inSweep != nil {
			s.hooks.inSweep(tx)
		}
		for _, k := range keys {
			if v := b.Get(k); v == nil || !expiredAt(k, v, cutoff) {
				continue
			}
			if err := b.Delete(k); err != nil {
				return err
			}
			n++
		}
		if n == 0 {
			return errNoWrite // every key written since it was read
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}
