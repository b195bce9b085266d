package boltstore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

const (
	oldRecords = 5_000
	sweepBatch = 1_000 // the store's own bound
)

// sweepStore returns a store holding oldRecords records taken at t0,
// which may all be removed at sweepAt, and a Limiter over it.
func sweepStore(t *testing.T) (s *boltstore.Store, lim *ratelimit.Limiter, sweepAt time.Time) {
	ctx := context.Background()
	s = open(t, filepath.Join(t.TempDir(), "limits.db"))
	ops := make([]*driver.Op, oldRecords)
	outs := make([][]driver.Decision, oldRecords)
	for i := range ops {
		ops[i] = takeOp("old", fmt.Sprint(i), 1, t0.UnixMilli())
		outs[i] = make([]driver.Decision, 1)
	}
	require.NoError(t, s.ApplyBatch(ctx, ops, outs))
	// One token refills in 6 s; then the grace.
	sweepAt = t0.Add(6*time.Second + time.Duration(driver.ExpiryGrace)*time.Millisecond)
	lim, err := ratelimit.New(s, ratelimit.Limits{"new": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}},
		ratelimit.WithClock(newMock(sweepAt)))
	require.NoError(t, err)
	return s, lim, sweepAt
}

// A call that arrives while DeleteExpired sweeps a large bucket waits for
// one of the sweep's transactions at most, not for the sweep: started in
// the sweep's first write transaction, it commits before the second.
func TestSweepLetsCallsIn(t *testing.T) {
	ctx := context.Background()
	s, lim, sweepAt := sweepStore(t)
	newKey := boltstore.RecordKey(driver.RecordID{Name: "new", Key: "k"})

	var sweeps atomic.Int32
	waiting := make(chan struct{}, 1)
	limited := make(chan error, 1)
	seen := false // the call's write, as the sweep's second transaction reads
	boltstore.SetHooks(s, boltstore.Hooks{
		WaitWriter: func() {
			select {
			case waiting <- struct{}{}:
			default:
			}
		},
		InSweep: func(tx *bolt.Tx) {
			switch sweeps.Add(1) {
			case 1:
				go func() {
					// A deadline as a request would have; the check below
					// is that the call had its turn, not how fast.
					dctx, cancel := context.WithTimeout(ctx, time.Minute)
					defer cancel()
					res, err := lim.Limit(dctx, "new", "k")
					if err == nil && !res.OK {
						err = fmt.Errorf("refused: %+v", res)
					}
					limited <- err
				}()
				select { // the call waits for the writer, held by this transaction
				case <-waiting:
				case err := <-limited:
					t.Errorf("the call returned without waiting for the writer: %v", err)
					limited <- err
				}
			case 2:
				seen = tx.Bucket([]byte(boltstore.DefaultBucket)).Get(newKey) != nil
			}
		},
	})
	n, err := s.DeleteExpired(ctx, sweepAt)
	require.NoError(t, err)
	require.Equal(t, oldRecords, n)
	require.NoError(t, <-limited)
	require.True(t, seen, "the call committed between the sweep's first and second transactions")
	require.Equal(t, int32(oldRecords/sweepBatch), sweeps.Load(), "write transactions of the sweep")
	n, err = s.DeleteExpired(ctx, sweepAt)
	require.NoError(t, err)
	require.Zero(t, n)
}

// A call waiting for the writer leaves when its context ends.
func TestCallWaitingForWriterLeaves(t *testing.T) {
	ctx := context.Background()
	s, lim, sweepAt := sweepStore(t)
	waiting := make(chan struct{}, 1)
	var sweeps atomic.Int32
	boltstore.SetHooks(s, boltstore.Hooks{
		WaitWriter: func() {
			select {
			case waiting <- struct{}{}:
			default:
			}
		},
		InSweep: func(*bolt.Tx) {
			if sweeps.Add(1) != 1 {
				return
			}
			cctx, cancel := context.WithCancel(ctx)
			limited := make(chan error, 1)
			go func() {
				_, err := lim.Limit(cctx, "new", "k")
				limited <- err
			}()
			select {
			case <-waiting:
			case err := <-limited:
				require.Fail(t, "the call returned without waiting for the writer", "%v", err)
			}
			cancel()
			// The call returns while this transaction holds the writer.
			require.ErrorIs(t, <-limited, context.Canceled)
		},
	})
	_, err := s.DeleteExpired(ctx, sweepAt)
	require.NoError(t, err)
	require.False(t, stored(t, s, "new", "k").Found, "the call that left was not decided")
}

// DeleteExpired stops between transactions when its context ends, and
// says how many records it removed; the rest go at the next sweep.
func TestSweepStopsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, _, sweepAt := sweepStore(t)
	var sweeps atomic.Int32
	boltstore.SetHooks(s, boltstore.Hooks{InSweep: func(*bolt.Tx) {
		if sweeps.Add(1) == 2 {
			cancel() // in the second transaction, which is then rolled back
		}
	}})
	n, err := s.DeleteExpired(ctx, sweepAt)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, fmt.Sprintf("stopped after %d records", sweepBatch))
	require.Equal(t, sweepBatch, n)
	require.Equal(t, int32(2), sweeps.Load())

	n, err = s.DeleteExpired(context.Background(), sweepAt)
	require.NoError(t, err)
	require.Equal(t, oldRecords-sweepBatch, n)
}

// Records written between a sweep's read and its write are kept: the
// sweep removes only what is still expired in its write transaction.
func TestSweepKeepsRecordsWrittenSince(t *testing.T) {
	ctx := context.Background()
	s, _, sweepAt := sweepStore(t)
	var sweeps atomic.Int32
	boltstore.SetHooks(s, boltstore.Hooks{InSweep: func(tx *bolt.Tx) {
		if sweeps.Add(1) != 1 {
			return
		}
		// A call on an old record, committed after the sweep read it:
		// written here, in the sweep's transaction, before its deletes.
		b := tx.Bucket([]byte(boltstore.DefaultBucket))
		k := boltstore.RecordKey(driver.RecordID{Name: "old", Key: "0"})
		v := append([]byte(nil), b.Get(k)...)
		for i := range 8 { // expires: far away
			v[16+i] = 0x0f
		}
		require.NoError(t, b.Put(k, v))
	}})
	n, err := s.DeleteExpired(ctx, sweepAt)
	require.NoError(t, err)
	require.Equal(t, oldRecords-1, n)
	require.True(t, stored(t, s, "old", "0").Found)
}

// closingCtx is a context whose Err closes the store s at its calls'
// at-th, the way a Close from another goroutine would land there.
type closingCtx struct {
	context.Context
	s     *boltstore.Store
	at    int32
	calls atomic.Int32
}

func (c *closingCtx) Err() error {
	if c.calls.Add(1) == c.at {
		c.s.Close()
	}
	return c.Context.Err()
}

// A sweep of a store made by New on the application's database stops at
// its next step once the store is closed, with ErrClosed: it went on
// reading the whole bucket through the database, which Close leaves open,
// and said it had swept it, unless a step after found a record to remove.
func TestSweepStopsWhenClosed(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "app.db"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	s, err := boltstore.New(db)
	require.NoError(t, err)
	for i := range 10 {
		require.NoError(t, s.Apply(context.Background(), takeOp("l", fmt.Sprint(i), 1, t0.UnixMilli()), make([]driver.Decision, 1)))
	}
	boltstore.SetSweepBatch(s, 2)
	// Closed between the sweep's first step and its second; nothing has
	// expired.
	ctx := &closingCtx{Context: context.Background(), s: s, at: 2}
	n, err := s.DeleteExpired(ctx, t0)
	require.ErrorIs(t, err, driver.ErrClosed)
	require.Zero(t, n)
	require.Equal(t, int32(2), ctx.calls.Load(), "the sweep went on after Close")
}

// A sweep's step whose records were all written again between its read
// and its write deletes nothing, and is rolled back rather than committed:
// it committed, and paid bbolt's two fsyncs, for nothing. A step that
// deletes commits, and the records are gone from the file.
func TestSweepOfNothingDoesNotCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	s := open(t, path)
	const keys = 3
	take := func(at time.Time) {
		for i := range keys {
			require.NoError(t, s.Apply(context.Background(), takeOp("old", fmt.Sprint(i), 1, at.UnixMilli()), make([]driver.Decision, 1)))
		}
	}
	take(t0)
	// One token refills in 6 s; then the grace.
	expiry := 6*time.Second + time.Duration(driver.ExpiryGrace)*time.Millisecond
	sweepAt := t0.Add(expiry)
	rewrite := true
	var written int // the last commit, once the step's records are written again
	boltstore.SetHooks(s, boltstore.Hooks{Scanned: func() {
		if rewrite {
			take(sweepAt)
			written = lastTx(t, s.DB())
		}
	}})
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ctx := range []context.Context{context.Background(), cctx} {
		n, err := s.DeleteExpired(ctx, sweepAt)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, written, lastTx(t, s.DB()), "a sweep's step that deleted nothing committed")
	}

	rewrite = false
	for i, ctx := range []context.Context{context.Background(), cctx} {
		before := lastTx(t, s.DB())
		take(sweepAt)
		n, err := s.DeleteExpired(ctx, sweepAt.Add(time.Hour)) // full again long since
		require.NoError(t, err)
		require.Equal(t, keys, n, "sweep %d", i)
		require.Equal(t, before+keys+1, lastTx(t, s.DB()), "a sweep's step that deleted records commits")
		require.NoError(t, s.Close())
		s = open(t, path)
		for k := range keys {
			require.False(t, stored(t, s, "old", fmt.Sprint(k)).Found, "deleted, committed")
		}
	}
}
