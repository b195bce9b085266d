// Package boltstore is a ratelimit.Store in an embedded bbolt file: the
// persistent default that needs no server.
//
// Every record is one key of one bbolt bucket. Apply reads the records an
// op touches, runs ratelimit.Evaluate and writes the updates in one write
// transaction, so it is atomic and, bbolt's file being copy-on-write with
// an fsync per commit, durable: a process killed in the middle of a write
// leaves a file that opens with the last committed state, holding no grant
// that was not made.
//
// bbolt has a single writer, and each commit pays an fsync. Concurrent
// callers are therefore coalesced into shared transactions (bbolt's
// DB.Batch), while a caller alone runs its own transaction at once, so
// that it does not wait for the batching delay.
//
// A bbolt file is opened by one process at a time. For a fleet of
// processes sharing limits, use store/redisstore or store/pgstore.
package boltstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// DefaultBucket is the bucket that holds the records unless WithBucket
// names another.
const DefaultBucket = "ratelimit"

// DefaultTimeout is how long Open waits for another process to release the
// file's lock.
const DefaultTimeout = 5 * time.Second

// DefaultBatchDelay is the MaxBatchDelay that Open gives its database:
// how long a batch of concurrent writes waits for more callers before it
// commits. bbolt's own default, 10 ms, is tuned for throughput of large
// batches; a rate limiter sits on request paths, where 1 ms keeps most
// of the saving (64 callers: 26 µs a call instead of 174 µs at 10 ms) at a
// tenth of the wait. New leaves a caller's database as it is.
const DefaultBatchDelay = time.Millisecond

// Store is a ratelimit.Store in a bbolt database, safe for concurrent use.
// Build it with Open or New.
type Store struct {
	db     *bolt.DB
	bucket []byte
	owned  bool // Close closes db

	inflight  atomic.Int32 // Applies under way, to choose Update or Batch
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ ratelimit.Store = (*Store)(nil)

// Option configures a Store in Open or New.
type Option func(*options)

type options struct {
	bucket  string
	timeout time.Duration
}

// WithBucket sets the bucket that holds the records (default
// DefaultBucket), so that several stores may share one database.
func WithBucket(name string) Option { return func(o *options) { o.bucket = name } }

// WithTimeout sets how long Open waits for the file's lock when another
// process holds it (default DefaultTimeout).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

func newOptions(opts []Option) options {
	o := options{bucket: DefaultBucket, timeout: DefaultTimeout}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Open opens the bbolt file at path, creating it if needed, and returns a
// store that owns it: Close releases the file.
func Open(path string, opts ...Option) (*Store, error) {
	o := newOptions(opts)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: o.timeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("boltstore: open %s: another process holds the file; a bbolt file serves one process at a time (use redisstore or pgstore for a fleet): %w", path, err)
		}
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	s, err := newStore(db, o)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.owned = true
	db.MaxBatchDelay = DefaultBatchDelay
	return s, nil
}

// New returns a store in db, a database the caller already has and keeps
// owning: Close does not close it.
func New(db *bolt.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("boltstore: New needs a *bbolt.DB: pass an open database, or use Open")
	}
	return newStore(db, newOptions(opts))
}

func newStore(db *bolt.DB, o options) (*Store, error) {
	if o.bucket == "" {
		return nil, errors.New("boltstore: the bucket name is empty: pass a name to WithBucket")
	}
	s := &Store{db: db, bucket: []byte(o.bucket)}
	err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(s.bucket)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("boltstore: create bucket %q: %w", o.bucket, err)
	}
	return s, nil
}

// Close releases the file when the store owns it (Open). It is idempotent;
// the store's methods return ratelimit.ErrClosed afterwards.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.owned {
			s.closeErr = s.db.Close()
		}
	})
	return s.closeErr
}

// DB returns the underlying database.
func (s *Store) DB() *bolt.DB { return s.db }

func (s *Store) usable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return fmt.Errorf("boltstore: %w", ratelimit.ErrClosed)
	}
	return nil
}

// write runs fn in a write transaction: its own when the caller is alone,
// a shared batch when others are writing too. fn may run more than once.
func (s *Store) write(fn func(*bolt.Tx) error) error {
	defer s.inflight.Add(-1)
	if s.inflight.Add(1) == 1 {
		return s.db.Update(fn)
	}
	return s.db.Batch(fn)
}

func (s *Store) bucketOf(tx *bolt.Tx) (*bolt.Bucket, error) {
	b := tx.Bucket(s.bucket)
	if b == nil {
		return nil, fmt.Errorf("boltstore: bucket %q is missing: was it deleted behind the store's back?", s.bucket)
	}
	return b, nil
}

// Apply implements ratelimit.Store.
func (s *Store) Apply(ctx context.Context, op *ratelimit.Op, out []ratelimit.Decision) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	ids := op.AppendRecordIDs(nil)
	keys := make([][]byte, len(ids))
	for i, id := range ids {
		keys[i] = recordKey(id)
	}
	prev := make([]ratelimit.Record, len(ids))
	next := make([]ratelimit.Update, len(ids))
	decide := func(tx *bolt.Tx) error {
		b, err := s.bucketOf(tx)
		if err != nil {
			return err
		}
		for i, k := range keys {
			prev[i] = get(b, k, op.Now)
		}
		ratelimit.Evaluate(op, prev, out, next)
		return nil
	}
	if op.Mode == ratelimit.ModeCheck {
		if err := s.db.View(decide); err != nil {
			return fmt.Errorf("boltstore: %w", err)
		}
		return nil
	}
	params := opParams(op)
	err := s.write(func(tx *bolt.Tx) error {
		if err := decide(tx); err != nil {
			return err
		}
		b := tx.Bucket(s.bucket)
		for i, u := range next {
			if !u.Write {
				continue
			}
			if err := b.Put(keys[i], encodeValue(u.State, ratelimit.FullAt(params[i], u.State))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("boltstore: %w", err)
	}
	return nil
}

// opParams lists the params of op's records, in the order of
// AppendRecordIDs.
func opParams(op *ratelimit.Op) []ratelimit.Params {
	ps := make([]ratelimit.Params, 0, op.NumRecords())
	for i := range op.Items {
		for _, sh := range op.Items[i].Shards {
			ps = append(ps, sh.Params)
		}
	}
	return ps
}

// get reads a record; one whose bucket is full again by now reads as
// missing, which is the same full bucket.
func get(b *bolt.Bucket, k []byte, now int64) ratelimit.Record {
	v := b.Get(k)
	if v == nil {
		return ratelimit.Record{}
	}
	st, expires, ok := decodeValue(v)
	if !ok || expires <= now {
		return ratelimit.Record{}
	}
	return ratelimit.Record{State: st, Found: true}
}

// Load implements ratelimit.Store.
func (s *Store) Load(ctx context.Context, ids []ratelimit.RecordID, out []ratelimit.Record) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		b, err := s.bucketOf(tx)
		if err != nil {
			return err
		}
		for i, id := range ids {
			out[i] = get(b, recordKey(id), math.MinInt64)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("boltstore: %w", err)
	}
	return nil
}

// Delete implements ratelimit.Store.
func (s *Store) Delete(ctx context.Context, ids []ratelimit.RecordID) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	keys := make([][]byte, len(ids))
	for i, id := range ids {
		keys[i] = recordKey(id)
	}
	err := s.write(func(tx *bolt.Tx) error {
		b, err := s.bucketOf(tx)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("boltstore: %w", err)
	}
	return nil
}

// DeleteExpired removes every record whose bucket has been full again for
// ratelimit.ExpiryGrace (a minute) at now, and returns how many it
// removed. The grace keeps exact the calls in flight, judged at a now read
// a moment before. Such records read as a full bucket
// whether kept or not; removing them keeps the file's size proportional
// to the keys active recently. It scans the bucket in one write
// transaction: call it periodically (say every few minutes) from one
// goroutine.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time) (int, error) {
	if err := s.usable(ctx); err != nil {
		return 0, err
	}
	ms := now.UnixMilli()
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		n = 0
		b, err := s.bucketOf(tx)
		if err != nil {
			return err
		}
		c := b.Cursor()
		for k, v := c.First(); k != nil; {
			if _, expires, ok := decodeValue(v); ok && expires > ms-ratelimit.ExpiryGrace {
				k, v = c.Next()
				continue
			}
			k = append([]byte(nil), k...)
			if err := c.Delete(); err != nil {
				return err
			}
			n++
			// Seek to the deleted key lands on the one after it.
			k, v = c.Seek(k)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("boltstore: delete expired: %w", err)
	}
	return n, nil
}

// Key encoding: a tag byte, then ratelimit.RecordID.AppendKey, which no
// two ids share. bbolt keys are at most 32 KiB, so an encoding longer than
// maxRawKey is replaced by its SHA-256 digest; the tag keeps raw and
// digested keys apart.
const (
	maxRawKey = 512
	tagRaw    = 0
	tagDigest = 1
)

func recordKey(id ratelimit.RecordID) []byte {
	raw := make([]byte, 1, 1+2*binary.MaxVarintLen64+len(id.Name)+len(id.Key))
	raw[0] = tagRaw
	raw = id.AppendKey(raw)
	if len(raw) <= maxRawKey {
		return raw
	}
	sum := sha256.Sum256(raw[1:])
	return append([]byte{tagDigest}, sum[:]...)
}

// Value encoding: value (float64 bits), ts, expires (Unix ms from which
// the bucket is full again), each 8 bytes big-endian.
const valueLen = 24

func encodeValue(st ratelimit.State, expires int64) []byte {
	v := make([]byte, valueLen)
	binary.BigEndian.PutUint64(v[0:], math.Float64bits(st.Value))
	binary.BigEndian.PutUint64(v[8:], uint64(st.TS))
	binary.BigEndian.PutUint64(v[16:], uint64(expires))
	return v
}

func decodeValue(v []byte) (st ratelimit.State, expires int64, ok bool) {
	if len(v) != valueLen {
		return st, 0, false
	}
	st.Value = math.Float64frombits(binary.BigEndian.Uint64(v[0:]))
	st.TS = int64(binary.BigEndian.Uint64(v[8:]))
	return st, int64(binary.BigEndian.Uint64(v[16:])), true
}
