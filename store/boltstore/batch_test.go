package boltstore_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/coalesce"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// Coalescing off: every call runs its own transaction, one after another,
// and the store is as exact as with coalescing on.
func TestConformanceCoalescingOff(t *testing.T) {
	storetest.Run(t, func(t *testing.T) ratelimit.Store {
		return open(t, filepath.Join(t.TempDir(), "limits.db"), boltstore.WithMaxBatch(1))
	}, storetest.DifferentialRuns(5, 60), storetest.SpoilRecord(spoil))
}

func TestMaxBatchOption(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{0, -1} {
		_, err := boltstore.Open(filepath.Join(dir, "limits.db"), boltstore.WithMaxBatch(n))
		require.ErrorContains(t, err, "must be at least 1", "WithMaxBatch(%d)", n)
	}
	db, err := bolt.Open(filepath.Join(dir, "app.db"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	_, err = boltstore.New(db, boltstore.WithMaxBatch(0))
	require.ErrorContains(t, err, "must be at least 1")

	// 64 goroutines, batches of at most 4 calls.
	ctx := context.Background()
	s := open(t, filepath.Join(dir, "small.db"), boltstore.WithMaxBatch(4))
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 500, Period: time.Hour, Start: time.UnixMilli(0)}},
		ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	// Counted as they begin: those of refused calls alone commit nothing.
	var txs atomic.Int64
	boltstore.SetHooks(s, boltstore.Hooks{InWrite: func(*bolt.Tx) { txs.Add(1) }})
	granted, err := storetest.Hammer(ctx, lim, "l", "hot", 64, 10)
	require.NoError(t, err)
	require.Equal(t, 500, granted)
	require.GreaterOrEqual(t, txs.Load(), int64(640/4), "a transaction decides at most 4 calls")
}

// tb is a token bucket of 10 tokens refilled over a minute.
var tb = driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}

// takeOp takes count tokens of (name, key) in a one-record op at now.
func takeOp(name, key string, count float64, now int64) *driver.Op {
	return &driver.Op{Mode: driver.ModeLimit, Now: now, Items: []driver.Item{
		{Name: name, Key: key, Count: count, Shards: []driver.Shard{{Params: tb}}},
	}}
}

// stored reads (name, key)'s record, shard 0.
func stored(t *testing.T, s *boltstore.Store, name, key string) driver.Record {
	t.Helper()
	recs := make([]driver.Record, 1)
	require.NoError(t, s.Load(context.Background(), []driver.RecordID{{Name: name, Key: key}}, recs))
	return recs[0]
}

// An op that fails on its own in a batch fails alone: the others are
// decided, in order, and committed without it, and its writes are rolled
// back.
func TestApplyBatchOpFailsAlone(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	broken := errors.New("broken")
	boltstore.SetHooks(s, boltstore.Hooks{FailOp: func(op *driver.Op) error {
		if op.Items[0].Key == "bad" {
			return broken
		}
		return nil
	}})
	now := t0.UnixMilli()
	ops := []*driver.Op{
		takeOp("l", "a", 4, now),
		takeOp("l", "bad", 3, now),
		takeOp("l", "a", 4, now), // sees the first op's write
		{Mode: driver.ModeLimit, Now: now, Items: []driver.Item{ // two items of one key
			{Name: "l", Key: "b", Count: 1, Shards: []driver.Shard{{Params: tb}}},
			{Name: "m", Key: "b", Count: 1, Shards: []driver.Shard{{Params: tb}}},
		}},
		takeOp("l", "a", 4, now), // refused: 2 left
	}
	outs := make([][]driver.Decision, len(ops))
	for i, op := range ops {
		outs[i] = make([]driver.Decision, len(op.Items))
	}
	err := s.ApplyBatch(ctx, ops, outs)
	require.ErrorIs(t, err, broken)
	require.Equal(t, []int{1}, storetest.FailedOps(t, err), "the op that failed, alone (the fourth's first item is 'b')")

	require.True(t, outs[0][0].OK)
	require.Equal(t, 6.0, outs[0][0].Remaining)
	require.True(t, outs[2][0].OK)
	require.Equal(t, 2.0, outs[2][0].Remaining)
	require.True(t, outs[3][0].OK)
	require.False(t, outs[4][0].OK)
	require.Equal(t, 2.0, stored(t, s, "l", "a").State.Remaining)
	require.False(t, stored(t, s, "l", "bad").Found, "the failed op's write is rolled back")
	require.Equal(t, 9.0, stored(t, s, "l", "b").State.Remaining)
}

// Through Apply, an op that fails on its own fails its call only.
func TestApplyOpFailure(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	broken := errors.New("broken")
	boltstore.SetHooks(s, boltstore.Hooks{FailOp: func(op *driver.Op) error {
		if op.Items[0].Key == "bad" {
			return broken
		}
		return nil
	}})
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}},
		ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "l", "bad")
	require.ErrorIs(t, err, broken)
	res, err := lim.Limit(ctx, "l", "good")
	require.NoError(t, err)
	require.True(t, res.OK)
	require.False(t, stored(t, s, "l", "bad").Found)
}

func TestApplyBatchArguments(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	err := s.ApplyBatch(ctx, []*driver.Op{takeOp("l", "a", 1, t0.UnixMilli())}, nil)
	require.ErrorContains(t, err, "1 ops and 0 outs")
	require.NoError(t, s.ApplyBatch(ctx, nil, nil))
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	err = s.ApplyBatch(canceled, []*driver.Op{takeOp("l", "a", 1, t0.UnixMilli())}, make([][]driver.Decision, 1))
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, s.Close())
	err = s.ApplyBatch(ctx, nil, nil)
	require.ErrorIs(t, err, driver.ErrClosed)
}

// waitQueued waits until n calls wait for s's next write transaction: a
// call is in the queue only once its Apply has put it there, which its
// goroutine may not have done yet when it is started, or has asked its
// context anything.
func waitQueued(t *testing.T, s *boltstore.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for boltstore.Queued(s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, not %d", boltstore.Queued(s), n)
		}
		runtime.Gosched()
	}
}

// A call queued for the next transaction leaves when its context ends,
// and its op is never decided.
func TestQueuedCallLeaves(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	now := t0.UnixMilli()
	inFirst, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	boltstore.SetHooks(s, boltstore.Hooks{InWrite: func(*bolt.Tx) {
		once.Do(func() { close(inFirst); <-release })
	}})
	first := make(chan error, 1)
	go func() {
		first <- s.Apply(ctx, takeOp("l", "first", 1, now), make([]driver.Decision, 1))
	}()
	<-inFirst // the first call's transaction is under way, and holds on

	cctx, cancel := context.WithCancel(ctx)
	queued := make(chan error, 1)
	go func() {
		queued <- s.Apply(cctx, takeOp("l", "queued", 1, now), make([]driver.Decision, 1))
	}()
	waitQueued(t, s, 1) // queued behind the first
	cancel()
	require.ErrorIs(t, <-queued, context.Canceled, "the queued call left while the transaction was under way")

	close(release)
	require.NoError(t, <-first)
	// Another call, which would have shared a transaction with the queued
	// one had it stayed.
	require.NoError(t, s.Apply(ctx, takeOp("l", "after", 1, now), make([]driver.Decision, 1)))
	require.True(t, stored(t, s, "l", "first").Found)
	require.True(t, stored(t, s, "l", "after").Found)
	require.False(t, stored(t, s, "l", "queued").Found, "the call that left was not decided")
}

// A lone call whose context ends before its transaction commits rolls it
// back: nothing is charged.
func TestLoneCallRollsBackWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	boltstore.SetHooks(s, boltstore.Hooks{InWrite: func(*bolt.Tx) { cancel() }})
	err := s.Apply(ctx, takeOp("l", "k", 1, t0.UnixMilli()), make([]driver.Decision, 1))
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, stored(t, s, "l", "k").Found)
}

// A panic while a lone call's op is decided, with a context that cannot
// end, goes on to its caller, on whose goroutine the transaction runs:
// bbolt rolls the transaction back, and a caller that recovers (as
// net/http does for a handler) finds the store usable.
func TestLonePanicLeavesTheStoreUsable(t *testing.T) {
	ctx := context.Background()
	s := panicsOnBad(t)
	now := t0.UnixMilli()
	out := make([]driver.Decision, 1)
	func() {
		defer func() { require.Equal(t, "decide failed", recover()) }()
		_ = s.Apply(ctx, takeOp("l", "bad", 1, now), out)
	}()
	require.False(t, stored(t, s, "l", "bad").Found, "the transaction is rolled back")

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, s.Apply(wctx, takeOp("l", "good", 1, now), out), "Apply after a recovered panic")
	require.True(t, out[0].OK)
	require.True(t, stored(t, s, "l", "good").Found)
}

// With a context that can end, a lone call's transaction runs on another
// goroutine, so that its caller may leave: a panic there, where its
// caller could not recover it, fails the call with an error, as a
// group's does; bbolt rolls the transaction back, and the store goes on.
func TestDetachedPanicFailsItsCall(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := panicsOnBad(t)
	now := t0.UnixMilli()
	out := make([]driver.Decision, 1)
	err := s.Apply(ctx, takeOp("l", "bad", 1, now), out)
	require.EqualError(t, err, "boltstore: a batch's send panicked: decide failed")
	var pe *coalesce.PanicError
	require.ErrorAs(t, err, &pe)
	require.False(t, stored(t, s, "l", "bad").Found, "the transaction is rolled back")

	require.NoError(t, s.Apply(ctx, takeOp("l", "good", 1, now), out), "Apply after a panic")
	require.True(t, out[0].OK)
	require.True(t, stored(t, s, "l", "good").Found)
}

// A panic while an op of a batch is decided, in the background, fails
// every call of the batch (bbolt rolls the transaction back: nothing is
// written), and the store goes on.
func TestBatchPanicFailsItsCalls(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	now := t0.UnixMilli()
	inFirst, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	boltstore.SetHooks(s, boltstore.Hooks{
		InWrite: func(*bolt.Tx) { once.Do(func() { close(inFirst); <-release }) },
		FailOp: func(op *driver.Op) error {
			if op.Items[0].Key == "bad" {
				panic("decide failed")
			}
			return nil
		},
	})
	queued := 0
	apply := func(key string) <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- s.Apply(ctx, takeOp("l", key, 1, now), make([]driver.Decision, 1)) }()
		queued++
		waitQueued(t, s, queued)
		return ch
	}
	first := make(chan error, 1)
	go func() { first <- s.Apply(ctx, takeOp("l", "first", 1, now), make([]driver.Decision, 1)) }()
	<-inFirst // the first call's transaction is under way, and holds on
	// Queued behind it, in this order.
	good, bad := apply("good"), apply("bad")
	close(release)
	require.NoError(t, <-first)
	for _, ch := range []<-chan error{good, bad} {
		err := <-ch
		require.EqualError(t, err, "boltstore: a batch's send panicked: decide failed")
	}
	require.False(t, stored(t, s, "l", "good").Found, "the batch's transaction is rolled back")
	require.False(t, stored(t, s, "l", "bad").Found)

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(wctx, takeOp("l", "after", 1, now), out))
	require.True(t, out[0].OK)
}

// panicsOnBad opens a store whose decision of an op of the key "bad"
// panics with "decide failed".
func panicsOnBad(t *testing.T) *boltstore.Store {
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	boltstore.SetHooks(s, boltstore.Hooks{FailOp: func(op *driver.Op) error {
		if op.Items[0].Key == "bad" {
			panic("decide failed")
		}
		return nil
	}})
	return s
}

// Many goroutines at once, their calls gathered into shared transactions:
// the store decides them as the pure transition does, in the order it
// decides them (storetest.ConcurrentDifferential); and it does gather
// them, so that the coalesced path is the one checked.
func TestCoalescedDifferential(t *testing.T) {
	var txs, ops atomic.Int64
	storetest.ConcurrentDifferential(t, func(t *testing.T, decided func(context.Context)) ratelimit.Store {
		s := open(t, filepath.Join(t.TempDir(), "limits.db"))
		boltstore.SetHooks(s, boltstore.Hooks{
			InWrite: func(*bolt.Tx) { txs.Add(1) },
			Decided: func(ctx context.Context) { ops.Add(1); decided(ctx) },
		})
		return s
	}, 3)
	t.Logf("%d ops in %d transactions", ops.Load(), txs.Load())
	require.Less(t, txs.Load(), ops.Load()/2, "transactions shared by several calls")
}

// A transaction in which no op writes (every op refused, a check, a
// settlement made before) is rolled back rather than committed: it
// committed, and paid bbolt's two fsyncs, for a call that changed
// nothing, so that refused calls, the many of a key under attack, cost
// what grants do. Their answers are those of the committed records.
func TestWritelessTransactionsDoNotCommit(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	now := t0.UnixMilli()
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(context.Background(), takeOp("l", "k", 10, now), out))
	require.True(t, out[0].OK)
	settle := &driver.Op{Mode: driver.ModeRefund, Now: now, Items: []driver.Item{{Name: "l", Key: "k", Count: 1, At: now, Shards: []driver.Shard{{Params: tb}}}},
		Settle: &driver.Settlement{ID: [16]byte{1}, Kind: driver.SettleCancel, Until: now + 60_000}}
	require.NoError(t, s.Apply(context.Background(), settle, out))
	require.True(t, out[0].OK)
	require.NoError(t, s.Apply(context.Background(), takeOp("l", "k", 1, now), out)) // the token handed back
	require.True(t, out[0].OK)

	before := lastTx(t, s.DB())
	for _, ctx := range []context.Context{context.Background(), cctx} {
		require.NoError(t, s.Apply(ctx, takeOp("l", "k", 1, now), out))
		require.False(t, out[0].OK, "the bucket is empty")
		require.NoError(t, s.Apply(ctx, settle, out))
		require.Equal(t, driver.SettleCancel, out[0].Settled, "settled before")
		check := takeOp("l", "k", 1, now)
		check.Mode = driver.ModeCheck
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1), make([]driver.Decision, 1)}
		require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{takeOp("l", "k", 1, now), check, settle}, outs))
		require.False(t, outs[0][0].OK)
		require.False(t, outs[1][0].OK)
		require.Equal(t, driver.SettleCancel, outs[2][0].Settled)
	}
	require.Equal(t, before, lastTx(t, s.DB()), "a transaction that wrote nothing committed")
	require.Zero(t, stored(t, s, "l", "k").State.Remaining)

	// A write commits as before.
	require.NoError(t, s.Apply(context.Background(), takeOp("l", "k", 1, now+6_000), out))
	require.True(t, out[0].OK)
	require.Equal(t, before+1, lastTx(t, s.DB()))
}
