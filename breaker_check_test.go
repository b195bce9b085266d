package ratelimit_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeStalledStore stalls every Apply until its caller's context ends,
// saying so on applied first, and answers every Load: a store whose
// writes stall while its reads do not, as boltstore's do behind a writer
// stuck on its disk (a View does not wait for the Update under way).
type writeStalledStore struct {
	ratelimit.Store
	applied chan struct{}
}

func (s *writeStalledStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	s.applied <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

// The Limiter's own check of the store, sent when a short deadline passed,
// reads a record: its answer says that the caller's deadline was too
// short, not that the calls' path answers anyone. It was recorded as an
// answer of the store, which excused every call of a longer deadline that
// the store kept waiting meanwhile and cleared the failures counted: a
// store whose writes stall and whose reads answer never opened the
// breaker, so long as a client in a hurry came by, each caller paying its
// whole deadline.
func TestBreakerCheckAnswerExcusesNoStalledCall(t *testing.T) {
	store := &writeStalledStore{Store: must(memstore.New()), applied: make(chan struct{}, 4)}
	mock := newMock()
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, time.Minute))
	require.NoError(t, err)
	call := func(d time.Duration) <-chan error {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := mock.WithTimeout(context.Background(), d)
			defer cancel()
			_, err := lim.Limit(ctx, "l", "k")
			done <- err
		}()
		awaitOrFail(t, store.applied, "the call in the store")
		return done
	}
	for i := range 3 {
		long := call(time.Second)
		short := call(time.Millisecond)
		mock.Add(time.Millisecond)
		require.ErrorIs(t, awaitOrFail(t, short, "the call in a hurry"), context.DeadlineExceeded, "round %d", i)
		for ratelimit.Checking(lim) { // the check answers at once
			runtime.Gosched()
		}
		mock.Add(time.Second)
		err := awaitOrFail(t, long, "the call of a second's deadline")
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "round %d: a second with no call answered is the store's failure", i)
	}
	res, err := lim.Limit(context.Background(), "l", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "open: the failure policy decides")
	require.True(t, res.Degraded)
}

// A call that read the clock before the failure that opened the breaker,
// and reaches the breaker only after the cool-down that failure set has
// passed (a goroutine kept off the CPU that long), probes the store as any
// call would then. It was refused by the failure policy, told that the
// breaker was open until a time already past: allow judged it by its early
// reading, though it had read the clock again.
func TestBreakerCallThatReadTheClockBeforeTheCooldownEnded(t *testing.T) {
	ctx := context.Background()
	store, mock, lim := oneFailureFromOpen(t)
	mock.hook = func() {
		// Once the call read the clock, another call's failure opens
		// the breaker 12 s later, the store comes back, and its cool-down
		// passes before the call goes on.
		mock.Add(12 * time.Second)
		_, err := lim.Limit(ctx, "l", "k")
		require.ErrorIs(t, err, errDown)
		store.fail.Store(false)
		mock.Add(6 * time.Second)
	}
	asked := store.calls.Load()
	res, err := lim.Limit(ctx, "l", "k")
	require.NoError(t, err, "the cool-down had passed: the call probes the store")
	require.True(t, res.OK)
	require.False(t, res.Degraded)
	require.Equal(t, asked+2, store.calls.Load(), "the failure, then the probe")
}

// tracedStore is a silentStore whose Load passes on the trace value its
// context carries.
type tracedStore struct {
	*silentStore
	traces chan any
}

func (s *tracedStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	s.traces <- ctx.Value(traceKey{})
	return s.silentStore.Load(ctx, ids, out)
}

// The Limiter's own check of the store, sent when a caller's deadline
// passed, carries the values of that caller's context (a trace's span, a
// store's per-call settings), though not its end: a store's tracing sees
// the read as part of the request that caused it. It went on a context of
// its own, which carried none.
func TestBreakerCheckKeepsTheCallersValues(t *testing.T) {
	mock := newMock()
	store := &tracedStore{
		silentStore: &silentStore{Store: must(memstore.New()), entered: make(chan struct{}, 1), mock: mock},
		traces:      make(chan any, 1),
	}
	store.answer.Store(true)
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	ctx, cancel := mock.WithTimeout(context.WithValue(context.Background(), traceKey{}, "request-7"), time.Millisecond)
	defer cancel()
	_, err = lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, "request-7", awaitOrFail(t, store.traces, "the Limiter's own check of the store"), "the check's context carries the caller's values")
	awaitOrFail(t, store.entered, "the check in the store")
	for ratelimit.Checking(lim) {
		runtime.Gosched()
	}
}

// deafStore stalls every Apply until its caller's context ends, moving
// the mock clock on a millisecond first, and holds every Load until the
// test releases it, whatever its context: a broken store, which ignores
// its context's end.
type deafStore struct {
	ratelimit.Store
	mock     testClock
	release  chan struct{}
	loads    atomic.Int64
	inFlight atomic.Int64
	most     atomic.Int64
}

func (s *deafStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	s.mock.Add(time.Millisecond)
	<-ctx.Done()
	return ctx.Err()
}

func (s *deafStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	s.loads.Add(1)
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
	}
	<-s.release
	return errors.New("deaf store: too late")
}

// A store that ignores its context holds the Limiter's own check for as
// long as it does not return, but never more than that one: the callers
// in a hurry who come by meanwhile send none, and no goroutine piles up.
// Once the store returns, the check ends, and the next caller in a hurry
// may send another.
func TestBreakerCheckOneAtATimeOnAStoreThatIgnoresItsContext(t *testing.T) {
	mock := &safeClock{now: t0} // moved by callers at once
	store := &deafStore{Store: must(memstore.New()), mock: mock, release: make(chan struct{})}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(1000, time.Minute))
	require.NoError(t, err)
	hurried := func(n int) {
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := mock.WithTimeout(context.Background(), time.Millisecond)
				defer cancel()
				_, err := lim.Limit(ctx, "l", "k")
				assert.ErrorIs(t, err, context.DeadlineExceeded)
			}()
		}
		wg.Wait()
	}
	hurried(1)
	for store.loads.Load() == 0 {
		runtime.Gosched()
	}
	before := runtime.NumGoroutine()
	for range 10 {
		hurried(20)
		mock.Add(time.Second) // the check's quarter of a second passes; the store ignores it
	}
	require.Equal(t, int64(1), store.loads.Load(), "one check, held by the store")
	require.Equal(t, int64(1), store.most.Load(), "one check in the store at a time")
	require.True(t, ratelimit.Checking(lim))
	require.LessOrEqual(t, runtime.NumGoroutine(), before+2, "no goroutine piles up")

	close(store.release)
	for ratelimit.Checking(lim) {
		runtime.Gosched()
	}
	hurried(1)
	for store.loads.Load() < 2 {
		runtime.Gosched()
	}
	require.Equal(t, int64(1), store.most.Load(), "one check in the store at a time")
	for ratelimit.Checking(lim) {
		runtime.Gosched()
	}
}

// Callers in a hurry open the breaker on a stalled store after the wall
// clock went back too (a step of NTP, or a clock given to WithClock set
// back). The time of the store's latest answer, from before the step, was
// ahead of every call after it, which took it for an answer since the
// call began, and sent no check: each caller paid its deadline, for as
// long as the step, and the breaker never opened.
func TestShortDeadlinesOpenTheBreakerAfterTheClockWentBack(t *testing.T) {
	mock := newMock()
	store := &silentStore{Store: must(memstore.New()), entered: make(chan struct{}, 16), mock: mock}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, time.Minute))
	require.NoError(t, err)
	mock.Add(time.Hour)
	store.applies.Store(true)
	_, err = lim.Limit(context.Background(), "l", "k") // answered an hour ahead
	require.NoError(t, err)
	store.applies.Store(false)
	mock.Set(t0)

	call := func() (ratelimit.Result, error) {
		dctx, cancel := mock.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		return lim.Limit(dctx, "l", "k")
	}
	for i := range 3 {
		_, err := call()
		require.ErrorIs(t, err, context.DeadlineExceeded, "the caller's own deadline")
		require.True(t, ratelimit.Checking(lim), "call %d: the answer timed an hour ahead is no answer since the call began: the Limiter checks the store", i)
		awaitOrFail(t, store.entered, "the Limiter's own check of the store")
		mock.Add(250 * time.Millisecond)
		for ratelimit.Checking(lim) {
			runtime.Gosched()
		}
	}
	asked := store.calls.Load()
	res, err := call()
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "open: the failure policy decides")
	require.True(t, res.OK && res.Degraded)
	require.Equal(t, asked, store.calls.Load(), "open: the store is not asked")
}
