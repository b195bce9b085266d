package janitor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/janitor"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// expirer is a driver.Expirer that records its calls. Each call takes
// its answer from answers (when set), or returns deleted.
type expirer struct {
	deleted  int
	err      error
	answers  chan func(ctx context.Context) (int, error) // each call runs the next one, when non-nil
	inFlight atomic.Int32
	overlap  atomic.Bool // two calls were under way at once

	mu   sync.Mutex
	nows []time.Time
}

func (e *expirer) DeleteExpired(ctx context.Context, now time.Time) (int, error) {
	if e.inFlight.Add(1) > 1 {
		e.overlap.Store(true)
	}
	defer e.inFlight.Add(-1)
	e.mu.Lock()
	e.nows = append(e.nows, now)
	e.mu.Unlock()
	if e.answers != nil {
		return (<-e.answers)(ctx)
	}
	return e.deleted, e.err
}

func (e *expirer) calls() []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]time.Time(nil), e.nows...)
}

// ownClockExpirer is an expirer whose store keeps its own clock.
type ownClockExpirer struct {
	expirer
	now int64
	err error
}

func (e *ownClockExpirer) OwnClock() bool { return true }

func (e *ownClockExpirer) Now(context.Context) (int64, error) { return e.now, e.err }

var _ driver.TimeSource = (*ownClockExpirer)(nil)

var janitorT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// newJanitor starts a janitor on a mock clock at janitorT0, with a quiet
// logger unless opts set one, and returns it with its sweeps as they end.
func newJanitor(t *testing.T, store driver.Expirer, every time.Duration, opts ...janitor.Option) (*janitor.Janitor, *clock.Mock, <-chan janitor.Result) {
	t.Helper()
	mock := clock.NewMock()
	mock.Set(janitorT0)
	results := make(chan janitor.Result, 100)
	opts = append([]janitor.Option{
		janitor.WithLogger(slog.New(slog.DiscardHandler)),
		janitor.WithClock(mock),
		janitor.WithObserver(func(r janitor.Result) { results <- r }),
	}, opts...)
	j, err := janitor.New(store, every, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { j.Close() })
	return j, mock, results
}

// next returns the next sweep's result. The timer only guards against a
// hang; no assertion depends on it.
func next(t *testing.T, results <-chan janitor.Result) janitor.Result {
	t.Helper()
	select {
	case r := <-results:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no sweep ended")
		return janitor.Result{}
	}
}

func TestNewRejectsBadArguments(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store driver.Expirer
		every time.Duration
		opts  []janitor.Option
		want  string
	}{
		{"nil store", nil, time.Minute, nil, "needs a store"},
		{"zero interval", &expirer{}, 0, nil, "interval 0s is not positive"},
		{"negative interval", &expirer{}, -time.Second, nil, "interval -1s is not positive"},
		{"nil clock", &expirer{}, time.Minute, []janitor.Option{janitor.WithClock(nil)}, "WithClock(nil)"},
		{"nil mock clock", &expirer{}, time.Minute, []janitor.Option{janitor.WithClock((*clock.Mock)(nil))}, "WithClock(*clock.Mock(nil))"},
		// An option variable never set, or a hole in a slice of options,
		// made New panic with a nil dereference that named nothing.
		{"nil option", &expirer{}, time.Minute, []janitor.Option{nil}, "nil Option (option 1)"},
		{"nil option after another", &expirer{}, time.Minute, []janitor.Option{janitor.WithClock(clock.NewMock()), nil}, "nil Option (option 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var j *janitor.Janitor
			var err error
			require.NotPanics(t, func() { j, err = janitor.New(tc.store, tc.every, tc.opts...) })
			require.ErrorIs(t, err, janitor.ErrInvalid)
			assert.ErrorContains(t, err, tc.want)
			assert.Nil(t, j)
		})
	}
}

// valueCheckExpirer implements driver.ZeroChecker by a value method,
// which Go cannot call through a nil *valueCheckExpirer: New, asking it
// of one, panicked.
type valueCheckExpirer struct{ *expirer }

func (valueCheckExpirer) CheckZero() error { return nil }

// TestNewRejectsANilStoreOfItsType: a store that is a nil pointer of its
// type (one whose New or Open failed, kept in place of its error) is
// refused as no store is. Taken, it made the janitor's goroutine panic at
// its first sweep, where no caller could recover it, or New itself, when
// it asked the store whether it keeps its own clock.
func TestNewRejectsANilStoreOfItsType(t *testing.T) {
	for _, store := range []driver.Expirer{(*memstore.Store)(nil), (*boltstore.Store)(nil), (*pgstore.Store)(nil), (*ownClockExpirer)(nil),
		(*valueCheckExpirer)(nil)} {
		var j *janitor.Janitor
		var err error
		require.NotPanics(t, func() { j, err = janitor.New(store, time.Minute, janitor.WithClock(clock.NewMock())) }, "%T(nil)", store)
		if j != nil {
			j.Close() // before it sweeps
		}
		require.ErrorIs(t, err, janitor.ErrInvalid, "%T(nil)", store)
		assert.ErrorContains(t, err, fmt.Sprintf("%T(nil)", store))
		assert.Nil(t, j)
	}
}

// TestNewRejectsAZeroStore: New refuses a store that its constructor did
// not make (&boltstore.Store{}), which says so (driver.ZeroChecker), with
// an error that says to build it, rather than start a janitor whose every
// sweep fails; a nil pointer of such a store's type is refused as no
// store, and matches driver.ErrZeroStore too.
func TestNewRejectsAZeroStore(t *testing.T) {
	for _, store := range []driver.Expirer{&memstore.Store{}, &boltstore.Store{}, &pgstore.Store{},
		(*memstore.Store)(nil), (*boltstore.Store)(nil), (*pgstore.Store)(nil)} {
		var j *janitor.Janitor
		var err error
		require.NotPanics(t, func() { j, err = janitor.New(store, time.Minute, janitor.WithClock(clock.NewMock())) }, "%#v", store)
		if j != nil {
			j.Close() // before it sweeps
		}
		require.ErrorIs(t, err, janitor.ErrInvalid, "%#v", store)
		require.ErrorIs(t, err, driver.ErrZeroStore, "%#v", store)
		assert.Nil(t, j)
	}
}

// hiddenExpirer hides every method of its store but DeleteExpired: a
// store that does not say that its constructor did not make it.
type hiddenExpirer struct{ s driver.Expirer }

func (h hiddenExpirer) DeleteExpired(ctx context.Context, now time.Time) (int, error) {
	return h.s.DeleteExpired(ctx, now)
}

// TestJanitorReportsAZeroStore: a janitor over a store that its
// constructor did not make, and that does not say so (no
// driver.ZeroChecker), reports each sweep's error, which says to build the
// store, rather than end the process with a panic on its goroutine.
func TestJanitorReportsAZeroStore(t *testing.T) {
	for _, store := range []driver.Expirer{&memstore.Store{}, &boltstore.Store{}, &pgstore.Store{}} {
		j, mock, results := newJanitor(t, hiddenExpirer{store}, time.Minute)
		mock.Add(time.Minute)
		r := next(t, results)
		require.ErrorIs(t, r.Err, driver.ErrZeroStore, "%T", store)
		assert.Zero(t, r.Deleted)
		var n int
		var err error
		require.NotPanics(t, func() { n, err = j.Sweep(context.Background()) }, "%T", store)
		require.ErrorIs(t, err, driver.ErrZeroStore, "%T", store)
		assert.Zero(t, n)
		next(t, results)
	}
}

// TestJanitorSweepsEveryInterval: t0 start; t0+59s nothing; t0+60s the
// first sweep; t0+120s the second, each passed the clock's time.
func TestJanitorSweepsEveryInterval(t *testing.T) {
	store := &expirer{deleted: 3}
	j, mock, results := newJanitor(t, store, time.Minute)
	assert.Equal(t, time.Minute, j.Every())

	mock.Add(59 * time.Second)
	mock.Add(time.Second)
	r := next(t, results)
	assert.Equal(t, janitorT0.Add(time.Minute), r.Now, "the first sweep is one interval after the start, not before")
	assert.Equal(t, 3, r.Deleted)
	assert.NoError(t, r.Err)
	assert.False(t, r.Manual)

	mock.Add(time.Minute)
	r = next(t, results)
	assert.Equal(t, janitorT0.Add(2*time.Minute), r.Now)
	assert.Equal(t, []time.Time{janitorT0.Add(time.Minute), janitorT0.Add(2 * time.Minute)}, store.calls())
}

// TestJanitorCountsTheIntervalFromTheEnd: a sweep that takes 10s (t0+60s
// to t0+70s) puts the next at t0+130s, not t0+120s.
func TestJanitorCountsTheIntervalFromTheEnd(t *testing.T) {
	store := &expirer{answers: make(chan func(context.Context) (int, error), 2)}
	_, mock, results := newJanitor(t, store, time.Minute)
	entered, release := make(chan struct{}), make(chan struct{})
	store.answers <- func(context.Context) (int, error) {
		close(entered)
		<-release
		return 1, nil
	}
	store.answers <- func(context.Context) (int, error) { return 2, nil }

	mock.Add(time.Minute)
	<-entered
	mock.Add(10 * time.Second) // while the sweep is under way
	close(release)
	r := next(t, results)
	assert.Equal(t, janitorT0.Add(time.Minute), r.Now)
	assert.Equal(t, 10*time.Second, r.Duration)

	mock.Add(50 * time.Second) // t0+120s
	mock.Add(10 * time.Second) // t0+130s
	r = next(t, results)
	assert.Equal(t, janitorT0.Add(130*time.Second), r.Now)
	assert.Equal(t, 2, r.Deleted)
}

// TestJanitorCountsTheIntervalFromASweepCall: the interval runs from the
// end of the last sweep, a Sweep call's too: after one at t0+50s, the
// timer's next sweep is at t0+110s, not t0+60s, ten seconds after it.
func TestJanitorCountsTheIntervalFromASweepCall(t *testing.T) {
	store := &expirer{deleted: 1}
	j, mock, results := newJanitor(t, store, time.Minute)
	mock.Add(50 * time.Second)
	_, err := j.Sweep(context.Background())
	require.NoError(t, err)
	require.True(t, next(t, results).Manual)

	mock.Add(10 * time.Second) // t0+60s: an interval after New
	mock.Add(50 * time.Second) // t0+110s: an interval after the Sweep call
	r := next(t, results)
	assert.False(t, r.Manual)
	assert.Equal(t, janitorT0.Add(110*time.Second), r.Now, "the timer's sweep an interval after the Sweep call ended")
}

func TestJanitorSweepNow(t *testing.T) {
	store := &expirer{deleted: 7}
	j, mock, results := newJanitor(t, store, time.Hour)
	mock.Add(time.Minute)

	n, err := j.Sweep(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 7, n)
	r := next(t, results)
	assert.True(t, r.Manual)
	assert.Equal(t, janitorT0.Add(time.Minute), r.Now)
	assert.Equal(t, []time.Time{janitorT0.Add(time.Minute)}, store.calls())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = j.Sweep(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Len(t, store.calls(), 1, "a canceled Sweep does not call the store")
}

// TestJanitorReportsFailures: a failed sweep is logged at Warn and
// reported with what it deleted; the next sweep runs as planned.
func TestJanitorReportsFailures(t *testing.T) {
	boom := errors.New("disk on fire")
	store := &expirer{deleted: 4, err: boom}
	var logs bytes.Buffer
	j, mock, results := newJanitor(t, store, time.Minute,
		janitor.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	mock.Add(time.Minute)
	r := next(t, results)
	require.ErrorIs(t, r.Err, boom)
	assert.Equal(t, 4, r.Deleted)
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "disk on fire")

	n, err := j.Sweep(context.Background())
	require.ErrorIs(t, err, boom)
	assert.Equal(t, 4, n)
	next(t, results)

	mock.Add(time.Minute)
	assert.Equal(t, janitorT0.Add(2*time.Minute), next(t, results).Now)
}

// TestJanitorUsesTheStoreClock: a store with its own clock is swept at its
// time, since its records carry it.
func TestJanitorUsesTheStoreClock(t *testing.T) {
	storeNow := janitorT0.Add(-time.Hour)
	store := &ownClockExpirer{now: storeNow.UnixMilli()}
	j, _, results := newJanitor(t, store, time.Minute)
	_, err := j.Sweep(context.Background())
	require.NoError(t, err)
	calls := store.calls()
	require.Len(t, calls, 1)
	assert.True(t, calls[0].Equal(storeNow), "swept at %v, want the store's %v", calls[0], storeNow)
	assert.True(t, next(t, results).Now.Equal(storeNow))

	store.err = errors.New("no connection")
	_, err = j.Sweep(context.Background())
	require.ErrorIs(t, err, store.err)
	assert.ErrorContains(t, err, "reading the store's clock")
	assert.Len(t, store.calls(), 1, "no sweep without the store's time")
}

// TestJanitorCloseDuringSweep: Close interrupts the timer's sweep under
// way and returns only once it has returned.
func TestJanitorCloseDuringSweep(t *testing.T) {
	store := &expirer{answers: make(chan func(context.Context) (int, error), 1)}
	entered, canceled, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var returned atomic.Bool
	store.answers <- func(ctx context.Context) (int, error) {
		close(entered)
		<-ctx.Done()
		close(canceled)
		<-release
		returned.Store(true)
		return 5, ctx.Err()
	}
	j, mock, results := newJanitor(t, store, time.Minute)
	mock.Add(time.Minute)
	<-entered

	closed := make(chan struct{})
	go func() {
		j.Close()
		close(closed)
	}()
	<-canceled
	select {
	case <-closed:
		t.Fatal("Close returned while the sweep was under way")
	default:
	}
	close(release)
	<-closed
	assert.True(t, returned.Load())

	r := next(t, results)
	assert.ErrorIs(t, r.Err, context.Canceled)
	assert.Equal(t, 5, r.Deleted)

	_, err := j.Sweep(context.Background())
	require.ErrorIs(t, err, janitor.ErrClosed)
	mock.Add(time.Hour)
	assert.Len(t, store.calls(), 1, "no sweep after Close")
	require.NoError(t, j.Close(), "Close again")
}

// TestJanitorCloseDuringManualSweep: Close interrupts a Sweep call too.
func TestJanitorCloseDuringManualSweep(t *testing.T) {
	store := &expirer{answers: make(chan func(context.Context) (int, error), 1)}
	entered := make(chan struct{})
	var returned atomic.Bool
	store.answers <- func(ctx context.Context) (int, error) {
		close(entered)
		<-ctx.Done()
		returned.Store(true)
		return 0, fmt.Errorf("stopped: %w", ctx.Err())
	}
	j, _, _ := newJanitor(t, store, time.Minute)
	swept := make(chan error, 1)
	go func() {
		_, err := j.Sweep(context.Background())
		swept <- err
	}()
	<-entered
	require.NoError(t, j.Close())
	assert.True(t, returned.Load(), "Close returned before the Sweep it interrupted")
	assert.ErrorIs(t, <-swept, context.Canceled)
}

// TestJanitorManualSweepStoppedByItsCaller: a Sweep whose caller's
// context ends mid-sweep returns its error, and is not logged as a failed
// sweep (Warn): the store did not fail. It is logged at Debug.
func TestJanitorManualSweepStoppedByItsCaller(t *testing.T) {
	store := &expirer{answers: make(chan func(ctx context.Context) (int, error), 1)}
	store.answers <- func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 2, ctx.Err()
	}
	var logs bytes.Buffer
	j, _, results := newJanitor(t, store, time.Hour,
		janitor.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := j.Sweep(ctx)
		done <- err
	}()
	require.Eventually(t, func() bool { return len(store.calls()) == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	r := next(t, results)
	assert.ErrorIs(t, r.Err, context.Canceled)
	assert.Equal(t, 2, r.Deleted)
	assert.NotContains(t, logs.String(), "level=WARN", "the caller's own cancel logged as a failed sweep")
	assert.Contains(t, logs.String(), "level=DEBUG")
}

// TestJanitorNeverSweepsTwiceAtOnce: Sweep calls from many goroutines and
// the timer's ticks, all at once; the store never sees two at a time.
func TestJanitorNeverSweepsTwiceAtOnce(t *testing.T) {
	store := &expirer{deleted: 1}
	var reports atomic.Int32
	j, mock, _ := newJanitor(t, store, time.Second,
		janitor.WithObserver(func(janitor.Result) { reports.Add(1) }))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				_, err := j.Sweep(context.Background())
				assert.NoError(t, err)
			}
		}()
	}
	for range 50 {
		mock.Add(time.Second)
	}
	wg.Wait()
	require.NoError(t, j.Close())
	assert.False(t, store.overlap.Load(), "two sweeps overlapped")
	calls := len(store.calls())
	assert.GreaterOrEqual(t, calls, 8*20)
	assert.Equal(t, calls, int(reports.Load()), "one report per sweep")
}

// A janitor sweeps a boltstore file every few minutes; here, a mock clock
// stands in for the wait, and Sweep runs one sweep at once.
func ExampleNew() {
	dir, err := os.MkdirTemp("", "ratelimit-janitor")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	store, err := boltstore.Open(filepath.Join(dir, "limits.db"))
	if err != nil {
		panic(err)
	}
	defer store.Close()

	ctx := context.Background()
	mock := clock.NewMock()
	mock.Set(time.Date(2024, 1, 1, 9, 0, 0, 0, time.UTC))
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"sendMessage": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 3},
	}, ratelimit.WithClock(mock))
	if err != nil {
		panic(err)
	}
	for _, user := range []string{"user-1", "user-2"} {
		if _, err := lim.Limit(ctx, "sendMessage", user); err != nil {
			panic(err)
		}
	}

	j, err := janitor.New(store, 5*time.Minute, janitor.WithClock(mock))
	if err != nil {
		panic(err)
	}
	defer j.Close()

	// Both buckets are full again 6s later; the store drops them a minute
	// (driver.ExpiryGrace) after that.
	mock.Add(10 * time.Second)
	n, err := j.Sweep(ctx)
	fmt.Println("after 10s:", n, "deleted", err)
	mock.Add(time.Minute)
	n, err = j.Sweep(ctx)
	fmt.Println("after 70s:", n, "deleted", err)
	// Output:
	// after 10s: 0 deleted <nil>
	// after 70s: 2 deleted <nil>
}

// steppedClock is a mock clock whose wall clock (Now) can be stepped apart
// from the time elapsed (Since), as a real clock's reading is by a step of
// the system's clock, which its monotonic reading does not see.
type steppedClock struct {
	*clock.Mock
	step atomic.Int64 // how far Now is stepped, in ns
}

func (c *steppedClock) Now() time.Time { return c.Mock.Now().Add(time.Duration(c.step.Load())) }

// Since is the time elapsed since t, a time of Now before any step.
func (c *steppedClock) Since(t time.Time) time.Duration { return c.Mock.Now().Sub(t) }

// A step of the wall clock forward does not move the time of a sweep on
// with it: the janitor takes the time elapsed since New (the monotonic
// clock's, which no step moves) on from the wall clock's reading at New,
// and sweeps at the earlier of that and the wall clock. Before, it swept at
// the wall clock, and a step forward of an hour dropped, in a store
// shared with processes whose clocks did not step (pgstore) or once the
// clock was stepped back, the records of buckets not yet full again. A
// step back is taken at once: it only drops less.
func TestJanitorIgnoresAStepForward(t *testing.T) {
	store := &expirer{}
	mock := clock.NewMock()
	mock.Set(janitorT0)
	c := &steppedClock{Mock: mock}
	j, err := janitor.New(store, time.Hour, janitor.WithLogger(slog.New(slog.DiscardHandler)), janitor.WithClock(c))
	require.NoError(t, err)
	t.Cleanup(func() { j.Close() })

	mock.Add(time.Minute)
	c.step.Store(int64(time.Hour))
	_, err = j.Sweep(context.Background())
	require.NoError(t, err)
	c.step.Store(int64(-time.Hour))
	_, err = j.Sweep(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []time.Time{janitorT0.Add(time.Minute), janitorT0.Add(time.Minute - time.Hour)}, store.calls())
}

// TestJanitorStartsNoSweepOnceClosing: a tick due while the janitor is
// busy (here, its observer of the last sweep), found together with Close
// by the timer's loop, starts no sweep: Close only waits for the sweep
// under way. Before, the loop chose between the two at random and, half
// the time, swept once more with the context Close had canceled, calling
// the store and handing the observer a sweep that never ran.
func TestJanitorStartsNoSweepOnceClosing(t *testing.T) {
	for i := range 20 {
		store := &expirer{}
		inObserver, release := make(chan struct{}, 1), make(chan struct{})
		var reports atomic.Int32
		j, mock, _ := newJanitor(t, store, time.Minute, janitor.WithObserver(func(janitor.Result) {
			if reports.Add(1) == 1 {
				inObserver <- struct{}{}
				<-release
			}
		}))
		mock.Add(time.Minute)
		<-inObserver
		mock.Add(time.Minute) // the next tick, due while the loop is in the observer

		// A Sweep call waiting for the sweep under way returns once Close
		// has begun.
		swept := make(chan error, 1)
		go func() {
			_, err := j.Sweep(context.Background())
			swept <- err
		}()
		closed := make(chan struct{})
		go func() {
			j.Close()
			close(closed)
		}()
		require.ErrorIs(t, <-swept, janitor.ErrClosed)
		close(release)
		<-closed
		require.Len(t, store.calls(), 1, "round %d: the store was swept again once Close had begun", i)
		require.Equal(t, int32(1), reports.Load(), "round %d: the observer heard of a sweep begun after Close", i)
	}
}

// TestJanitorSurvivesAStorePanic: a store that panics in the timer's
// sweep, on the janitor's own goroutine where no caller could recover it,
// fails that sweep (logged at Error, an Err that says so and wraps the
// panic's error) and the next sweep runs an interval later. Before, the
// panic ended the process. A panic in a Sweep call goes on to its caller,
// and the janitor stays usable.
func TestJanitorSurvivesAStorePanic(t *testing.T) {
	boom := errors.New("index out of range in the store")
	store := &expirer{answers: make(chan func(context.Context) (int, error), 4)}
	store.answers <- func(context.Context) (int, error) { panic(boom) }
	store.answers <- func(context.Context) (int, error) { return 3, nil }
	store.answers <- func(context.Context) (int, error) { panic("a bare value") }
	store.answers <- func(context.Context) (int, error) { return 4, nil }
	var logs bytes.Buffer // written before the observer hears, read after
	j, mock, results := newJanitor(t, store, time.Minute,
		janitor.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	mock.Add(time.Minute)
	r := next(t, results)
	require.ErrorIs(t, r.Err, boom)
	assert.ErrorContains(t, r.Err, "the store (*janitor_test.expirer) panicked")
	var pe *janitor.PanicError
	require.ErrorAs(t, r.Err, &pe)
	assert.Equal(t, boom, pe.Value)
	assert.Contains(t, string(pe.Stack), "janitor_test.TestJanitorSurvivesAStorePanic", "the stack of the panic, the store's frames in it")
	assert.False(t, r.Manual)
	assert.Contains(t, logs.String(), "level=ERROR")
	assert.Contains(t, logs.String(), "index out of range in the store")
	assert.Contains(t, logs.String(), "stack=", "the stack logged, for the store's authors")

	mock.Add(time.Minute)
	r = next(t, results)
	require.NoError(t, r.Err)
	assert.Equal(t, 3, r.Deleted)
	assert.Equal(t, janitorT0.Add(2*time.Minute), r.Now, "the next sweep an interval after the one that panicked")

	assert.PanicsWithValue(t, "a bare value", func() { _, _ = j.Sweep(context.Background()) })
	n, err := j.Sweep(context.Background())
	require.NoError(t, err, "a Sweep after one that panicked")
	assert.Equal(t, 4, n)
	assert.True(t, next(t, results).Manual)
}

// closeWithin closes j, failing the test if Close does not return.
func closeWithin(t *testing.T, j *janitor.Janitor) {
	t.Helper()
	done := make(chan struct{})
	go func() { j.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
}

// TestJanitorSurvivesAStoreGoexit: a store that calls runtime.Goexit in
// the timer's sweep (a test's fake store calling t.FailNow does) ends the
// janitor's goroutine, whatever it defers. That sweep fails with
// ErrGoexit, logged at Error, and the next runs an interval later; Sweep
// and Close work on. Before, the goroutine left the sweep's semaphore
// held: the observer never heard, no sweep ran again, and Close hung.
func TestJanitorSurvivesAStoreGoexit(t *testing.T) {
	store := &expirer{answers: make(chan func(context.Context) (int, error), 3)}
	store.answers <- func(context.Context) (int, error) { runtime.Goexit(); return 0, nil }
	store.answers <- func(context.Context) (int, error) { return 3, nil }
	store.answers <- func(context.Context) (int, error) { return 4, nil }
	var logs bytes.Buffer // written before the observer hears, read after
	j, mock, results := newJanitor(t, store, time.Minute,
		janitor.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	mock.Add(time.Minute)
	r := next(t, results)
	require.ErrorIs(t, r.Err, janitor.ErrGoexit)
	assert.False(t, r.Manual)
	assert.Equal(t, janitorT0.Add(time.Minute), r.Now)
	assert.Contains(t, logs.String(), "level=ERROR")

	mock.Add(time.Minute)
	r = next(t, results)
	require.NoError(t, r.Err)
	assert.Equal(t, 3, r.Deleted)
	assert.Equal(t, janitorT0.Add(2*time.Minute), r.Now, "the next sweep an interval after the one that ended so")

	n, err := j.Sweep(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.True(t, next(t, results).Manual)
	closeWithin(t, j)
}

// TestJanitorSurvivesAnObserverGoexit: an observer that calls
// runtime.Goexit on the janitor's goroutine ends it, as it hears of a
// sweep that ended so, of the store's Goexit, or of one that went well;
// the sweeps go on, and Close returns. Before, Close hung on the
// semaphore the goroutine held.
func TestJanitorSurvivesAnObserverGoexit(t *testing.T) {
	store := &expirer{answers: make(chan func(context.Context) (int, error), 3)}
	store.answers <- func(context.Context) (int, error) { runtime.Goexit(); return 0, nil }
	store.answers <- func(context.Context) (int, error) { return 2, nil }
	store.answers <- func(context.Context) (int, error) { return 3, nil }
	results := make(chan janitor.Result, 10)
	var calls atomic.Int32
	j, mock, _ := newJanitor(t, store, time.Minute, janitor.WithObserver(func(r janitor.Result) {
		results <- r
		if calls.Add(1) <= 2 {
			runtime.Goexit()
		}
	}))
	mock.Add(time.Minute)
	require.ErrorIs(t, next(t, results).Err, janitor.ErrGoexit)
	mock.Add(time.Minute)
	r := next(t, results)
	require.NoError(t, r.Err)
	assert.Equal(t, 2, r.Deleted)
	mock.Add(time.Minute)
	r = next(t, results)
	require.NoError(t, r.Err)
	assert.Equal(t, 3, r.Deleted)
	assert.Equal(t, janitorT0.Add(3*time.Minute), r.Now)
	closeWithin(t, j)
}
