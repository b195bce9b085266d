package coalesce

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gate is a destination whose sends block until released, and which
// records every batch it was sent.
type gate struct {
	mu      sync.Mutex
	batches [][]int
	entered chan []int    // each batch, as it is sent
	release chan struct{} // one receive lets one send finish
	err     error
	own     map[int]chan struct{} // a batch whose first call has one waits on it, not release
	active  atomic.Int32
	peak    atomic.Int32
}

func newGate() *gate {
	return &gate{entered: make(chan []int, 100), release: make(chan struct{})}
}

func (g *gate) send(ctx context.Context, reqs []int, res []int) error {
	n := g.active.Add(1)
	defer g.active.Add(-1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			break
		}
	}
	batch := append([]int(nil), reqs...)
	g.mu.Lock()
	g.batches = append(g.batches, batch)
	g.mu.Unlock()
	g.entered <- batch
	release := g.release
	if ch, ok := g.own[reqs[0]]; ok {
		release = ch
	}
	select {
	case <-release:
	case <-ctx.Done():
		return ctx.Err()
	}
	for i, r := range reqs {
		res[i] = r * 10
	}
	return g.err
}

// waitQueued waits until n calls are queued in b.
func waitQueued(t *testing.T, b *Batcher[int, int], n int) {
	t.Helper()
	waitLocked(t, b, func() bool { return len(b.queue) == n })
}

// waitInflight waits until n batches of b are in flight.
func waitInflight(t *testing.T, b *Batcher[int, int], n int) {
	t.Helper()
	waitLocked(t, b, func() bool { return b.inflight == n })
}

// waitLocked waits until cond, called under b's mutex, holds.
func waitLocked(t *testing.T, b *Batcher[int, int], cond func() bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return cond()
	}, 5*time.Second, time.Millisecond)
}

type answer struct {
	res int
	err error
}

func doAsync(b *Batcher[int, int], ctx context.Context, req int) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		res, err := b.Do(ctx, req)
		ch <- answer{res, err}
	}()
	return ch
}

func TestLoneCallGoesAtOnceOnItsGoroutine(t *testing.T) {
	var sawCtx context.Context
	b := New(func(ctx context.Context, reqs, res []int) error {
		sawCtx = ctx
		require.Equal(t, []int{7}, reqs)
		res[0] = 70
		return nil
	}, Options{})
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "caller")
	res, err := b.Do(ctx, 7)
	require.NoError(t, err)
	require.Equal(t, 70, res)
	// Sent with the caller's own context, on the caller's goroutine (the
	// assignment above is race-free only if so).
	require.Equal(t, ctx, sawCtx)
}

func TestCallsArrivingWhileBusyGoTogetherInArrivalOrder(t *testing.T) {
	g := newGate()
	b := New(g.send, Options{})
	ctx := context.Background()
	first := doAsync(b, ctx, 1)
	require.Equal(t, []int{1}, <-g.entered)
	var later []<-chan answer
	for i := 2; i <= 6; i++ {
		later = append(later, doAsync(b, ctx, i))
		waitQueued(t, b, i-1) // one at a time, so that arrival order is known
	}
	g.release <- struct{}{}
	require.Equal(t, answer{10, nil}, <-first)
	require.Equal(t, []int{2, 3, 4, 5, 6}, <-g.entered)
	g.release <- struct{}{}
	for i, ch := range later {
		require.Equal(t, answer{(i + 2) * 10, nil}, <-ch)
	}
	require.Len(t, g.batches, 2)
}

func TestMaxBatchSplitsTheQueue(t *testing.T) {
	g := newGate()
	b := New(g.send, Options{MaxBatch: 3})
	ctx := context.Background()
	first := doAsync(b, ctx, 0)
	<-g.entered
	var rest []<-chan answer
	for i := 1; i <= 7; i++ {
		rest = append(rest, doAsync(b, ctx, i))
		waitQueued(t, b, i)
	}
	go func() {
		for range 4 {
			g.release <- struct{}{}
		}
	}()
	<-first
	for _, ch := range rest {
		a := <-ch
		require.NoError(t, a.err)
	}
	require.Equal(t, [][]int{{0}, {1, 2, 3}, {4, 5, 6}, {7}}, g.batches)
}

func TestMaxInFlightBoundsConcurrentSends(t *testing.T) {
	g := newGate()
	b := New(g.send, Options{MaxInFlight: 2})
	ctx := context.Background()
	a1 := doAsync(b, ctx, 1)
	a2 := doAsync(b, ctx, 2)
	<-g.entered
	<-g.entered // two alone, at once
	a3 := doAsync(b, ctx, 3)
	a4 := doAsync(b, ctx, 4)
	waitQueued(t, b, 2)
	assert.Equal(t, int32(2), g.active.Load())
	g.release <- struct{}{} // one finishes: the queue goes as one batch
	batch := <-g.entered
	assert.ElementsMatch(t, []int{3, 4}, batch)
	g.release <- struct{}{}
	g.release <- struct{}{}
	for _, ch := range []<-chan answer{a1, a2, a3, a4} {
		require.NoError(t, (<-ch).err)
	}
	require.Equal(t, int32(2), g.peak.Load())
}

func TestOverlapKeepsTheSecondSlotForLargeBatches(t *testing.T) {
	g := newGate()
	b := New(g.send, Options{MaxInFlight: 2, Overlap: 3})
	ctx := context.Background()
	first := doAsync(b, ctx, 1)
	require.Equal(t, []int{1}, <-g.entered)
	// A second slot is free, but a call that finds one in flight queues.
	var queued []<-chan answer
	for i := 2; i <= 3; i++ {
		queued = append(queued, doAsync(b, ctx, i))
		waitQueued(t, b, i-1)
	}
	assert.Equal(t, int32(1), g.active.Load(), "a call went beside the batch in flight before Overlap calls waited")
	// The third queued call makes Overlap: the three go beside the first.
	queued = append(queued, doAsync(b, ctx, 4))
	require.Equal(t, []int{2, 3, 4}, <-g.entered)
	assert.Equal(t, int32(2), g.active.Load())
	// Two calls queue behind the two in flight; when the first is
	// answered, another batch is in flight, and fewer than Overlap wait:
	// the first's slot is freed, and the second batch sends them when it
	// is answered.
	for i := 5; i <= 6; i++ {
		queued = append(queued, doAsync(b, ctx, i))
		waitQueued(t, b, i-4)
	}
	g.release <- struct{}{}
	require.Equal(t, answer{10, nil}, <-first)
	waitInflight(t, b, 1)
	waitQueued(t, b, 2)
	g.release <- struct{}{}
	require.Equal(t, []int{5, 6}, <-g.entered)
	g.release <- struct{}{}
	for i, ch := range queued {
		require.Equal(t, answer{(i + 2) * 10, nil}, <-ch)
	}
	require.Equal(t, [][]int{{1}, {2, 3, 4}, {5, 6}}, g.batches)
	require.Equal(t, int32(2), g.peak.Load())
}

func TestShareGivesEachSlotAFairShareOfTheCalls(t *testing.T) {
	g := newGate()
	g.own = map[int]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}
	b := New(g.send, Options{MaxInFlight: 3, Share: true})
	ctx := context.Background()
	var answers []<-chan answer
	// A few callers go at once, each alone, as without Share.
	for i := 1; i <= 3; i++ {
		answers = append(answers, doAsync(b, ctx, i))
		require.Equal(t, []int{i}, <-g.entered)
	}
	for i := 4; i <= 7; i++ {
		answers = append(answers, doAsync(b, ctx, i))
		waitQueued(t, b, i-3)
	}
	g.own[1] <- struct{}{} // the first is answered: its slot sends the queue
	require.Equal(t, []int{4, 5, 6, 7}, <-g.entered)
	g.own[2] <- struct{}{} // the second: nothing queued, its slot is freed
	waitInflight(t, b, 2)
	// Five calls in flight and a slot free, which without Share the next
	// call would take alone. Calls queue until they are a third of the
	// calls in flight and queued (3 of 8), then go together.
	for i := 8; i <= 9; i++ {
		answers = append(answers, doAsync(b, ctx, i))
		waitQueued(t, b, i-7)
	}
	assert.Equal(t, int32(2), g.active.Load(), "a call went in the free slot before a fair share of the calls waited")
	answers = append(answers, doAsync(b, ctx, 10))
	require.Equal(t, []int{8, 9, 10}, <-g.entered)
	for range 3 {
		g.release <- struct{}{}
	}
	for i, ch := range answers {
		require.Equal(t, answer{(i + 1) * 10, nil}, <-ch)
	}
	require.Equal(t, int32(3), g.peak.Load())
}

// queuedBehindOne makes a Batcher whose send waits at g, with call 1 in
// flight (first) and calls 2 (gone, whose context cancel ends) and 3
// (stays) queued behind it, in that order.
func queuedBehindOne(t *testing.T) (g *gate, b *Batcher[int, int], first, gone, stays <-chan answer, cancel context.CancelFunc) {
	t.Helper()
	g = newGate()
	b = New(g.send, Options{})
	bg := context.Background()
	first = doAsync(b, bg, 1)
	<-g.entered
	ctx, cancel := context.WithCancel(bg)
	gone = doAsync(b, ctx, 2)
	waitQueued(t, b, 1)
	stays = doAsync(b, bg, 3)
	waitQueued(t, b, 2)
	return g, b, first, gone, stays, cancel
}

func TestCallerLeavingTheQueueIsNeverSent(t *testing.T) {
	g, b, first, gone, stays, cancel := queuedBehindOne(t)
	cancel()
	require.ErrorIs(t, (<-gone).err, context.Canceled)
	waitQueued(t, b, 1)
	g.release <- struct{}{}
	<-first
	require.Equal(t, []int{3}, <-g.entered)
	g.release <- struct{}{}
	require.Equal(t, answer{30, nil}, <-stays)
	for _, batch := range g.batches {
		require.NotContains(t, batch, 2, "a call whose caller left the queue was sent")
	}
}

// A queued call whose context ends just as its batch is taken, its caller
// not yet back (waiting for the Batcher's lock), is not sent: its caller
// hears its context's error, and the call must not have taken effect. It
// was sent, as though its context had ended once it was in flight.
func TestCallerLeavingAsItsBatchIsTakenIsNeverSent(t *testing.T) {
	g, b, first, gone, stays, cancel := queuedBehindOne(t)

	// The first send returns and takes the queue (next, in landed), while
	// the leaving caller waits for the lock.
	b.mu.Lock()
	cancel()
	calls, bt, bctx := b.take()
	b.inflight++
	b.mu.Unlock()
	require.Len(t, calls, 1)
	go b.run(calls, bt, bctx, false)
	require.Equal(t, []int{3}, <-g.entered)
	require.ErrorIs(t, (<-gone).err, context.Canceled)
	g.release <- struct{}{}
	g.release <- struct{}{}
	require.Equal(t, answer{10, nil}, <-first)
	require.Equal(t, answer{30, nil}, <-stays)
	for _, batch := range g.batches {
		require.NotContains(t, batch, 2, "a call whose context ended while it was queued was sent")
	}
	waitInflight(t, b, 0)
}

func TestCallerLeavingAfterSendReturnsAtOnce(t *testing.T) {
	g := newGate()
	b := New(g.send, Options{})
	bg := context.Background()
	first := doAsync(b, bg, 1)
	<-g.entered
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	waiting := doAsync(b, ctx, 2)
	waitQueued(t, b, 1)
	other := doAsync(b, bg, 3)
	waitQueued(t, b, 2)
	g.release <- struct{}{}
	<-first
	require.Equal(t, []int{2, 3}, <-g.entered)
	// The batch is in flight and stays there; the caller with a deadline
	// returns when its deadline passes, without waiting for it.
	select {
	case a := <-waiting:
		require.ErrorIs(t, a.err, context.DeadlineExceeded)
	case <-time.After(5 * time.Second):
		t.Fatal("the caller waited for a batch in flight past its deadline")
	}
	g.release <- struct{}{}
	require.Equal(t, answer{30, nil}, <-other)
}

func TestBatchContextEndsWhenEveryCallerHasLeft(t *testing.T) {
	g := newGate()
	b := New(g.send, Options{})
	bg := context.Background()
	first := doAsync(b, bg, 1)
	<-g.entered
	ctx, cancel := context.WithCancel(bg)
	a := doAsync(b, ctx, 2)
	c := doAsync(b, ctx, 3)
	waitQueued(t, b, 2)
	g.release <- struct{}{}
	<-first
	<-g.entered
	cancel()
	require.ErrorIs(t, (<-a).err, context.Canceled)
	require.ErrorIs(t, (<-c).err, context.Canceled)
	// The gate's send returns when its context ends; the batcher is free.
	require.Eventually(t, func() bool { return g.active.Load() == 0 }, 5*time.Second, time.Millisecond)
	go func() { g.release <- struct{}{} }()
	res, err := b.Do(bg, 4)
	require.NoError(t, err)
	require.Equal(t, 40, res)
}

func TestBatchContextHasTheLatestDeadline(t *testing.T) {
	var got []time.Time
	var mu sync.Mutex
	release := make(chan struct{})
	b := New(func(ctx context.Context, reqs, res []int) error {
		dl, _ := ctx.Deadline()
		mu.Lock()
		got = append(got, dl)
		mu.Unlock()
		if reqs[0] == 0 {
			<-release
		}
		return nil
	}, Options{})
	bg := context.Background()
	first := doAsync(b, bg, 0)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1 }, 5*time.Second, time.Millisecond)
	d1 := time.Now().Add(time.Hour)
	d2 := time.Now().Add(2 * time.Hour)
	c1, cancel1 := context.WithDeadline(bg, d1)
	defer cancel1()
	c2, cancel2 := context.WithDeadline(bg, d2)
	defer cancel2()
	a1 := doAsync(b, c1, 1)
	waitQueued(t, b, 1)
	a2 := doAsync(b, c2, 2)
	waitQueued(t, b, 2)
	close(release)
	<-first
	<-a1
	<-a2
	require.Len(t, got, 2)
	require.True(t, got[1].Equal(d2), "batch deadline %v, want %v", got[1], d2)
}

// TestBatchContextOfAMockDeadline: callers' deadlines may be of another
// clock than the wall's, as a test's mock.WithTimeout makes them. The
// batch's context reports the latest of them, and ends once every caller
// has left, by their clock: a context.WithDeadline of a mock deadline
// that the wall clock was past ended at once, and failed the batch with
// context.DeadlineExceeded, though no caller's context had ended.
func TestBatchContextOfAMockDeadline(t *testing.T) {
	mock := clock.NewMock() // 1970: the wall clock is past its deadlines
	type sent struct {
		err error
		dl  time.Time
	}
	got := make(chan sent, 2)
	release := make(chan struct{})
	b := New(func(ctx context.Context, reqs, res []int) error {
		dl, _ := ctx.Deadline()
		got <- sent{ctx.Err(), dl}
		if reqs[0] == 0 {
			<-release
			return nil
		}
		if reqs[0] == 3 {
			<-ctx.Done() // in flight until its callers have left
		}
		return ctx.Err()
	}, Options{})
	bg := context.Background()
	first := doAsync(b, bg, 0)
	<-got
	c1, cancel1 := mock.WithTimeout(bg, time.Hour)
	defer cancel1()
	c2, cancel2 := mock.WithTimeout(bg, 2*time.Hour)
	defer cancel2()
	a1 := doAsync(b, c1, 1)
	waitQueued(t, b, 1)
	a2 := doAsync(b, c2, 2)
	waitQueued(t, b, 2)
	close(release)
	require.NoError(t, (<-first).err)
	batch := <-got
	require.NoError(t, batch.err, "the batch was sent with a context ended")
	require.True(t, batch.dl.Equal(mock.Now().Add(2*time.Hour)), "batch deadline %v, want the latest caller's", batch.dl)
	require.NoError(t, (<-a1).err)
	require.NoError(t, (<-a2).err)

	// A batch in flight ends once the mock passes every caller's deadline.
	release = make(chan struct{})
	first = doAsync(b, bg, 0)
	<-got
	c3, cancel3 := mock.WithTimeout(bg, time.Hour)
	defer cancel3()
	a3 := doAsync(b, c3, 3)
	waitQueued(t, b, 1)
	a4 := doAsync(b, c3, 4)
	waitQueued(t, b, 2)
	close(release)
	<-first
	require.NoError(t, (<-got).err)
	mock.Add(time.Hour)
	require.ErrorIs(t, (<-a3).err, context.DeadlineExceeded)
	require.ErrorIs(t, (<-a4).err, context.DeadlineExceeded)
	waitInflight(t, b, 0)
}

func TestSendErrorFailsTheWholeBatch(t *testing.T) {
	g := newGate()
	g.err = errors.New("server gone")
	b := New(g.send, Options{})
	bg := context.Background()
	first := doAsync(b, bg, 1)
	<-g.entered
	a := doAsync(b, bg, 2)
	c := doAsync(b, bg, 3)
	waitQueued(t, b, 2)
	g.release <- struct{}{}
	<-g.entered
	g.release <- struct{}{}
	require.EqualError(t, (<-first).err, "server gone")
	require.EqualError(t, (<-a).err, "server gone")
	require.EqualError(t, (<-c).err, "server gone")
}

// A lone call's send that panics passes the panic on to its caller, on
// whose goroutine it runs; a caller that recovers (as net/http does for a
// handler) finds the Batcher usable: the call is out of flight, and the
// calls queued behind it are sent.
func TestLoneSendPanicReachesItsCallerAndTheBatcherGoesOn(t *testing.T) {
	b, entered, release := endingFirst(func() { panic("boom") }, Options{})
	bg := context.Background()
	recovered := make(chan any, 1)
	go func() {
		defer func() { recovered <- recover() }()
		_, _ = b.Do(bg, 1)
	}()
	<-entered
	queued := doAsync(b, bg, 2)
	waitQueued(t, b, 1)
	close(release)
	require.Equal(t, "boom", <-recovered)
	select {
	case a := <-queued:
		require.Equal(t, answer{20, nil}, a)
	case <-time.After(10 * time.Second):
		t.Fatal("the call queued behind the panicked send was never sent")
	}
	waitInflight(t, b, 0)

	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	res, err := b.Do(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, 30, res)
}

// A send that panics in the background, where no caller could recover
// it, fails every call of its batch with a *PanicError instead of ending
// the process, and the Batcher goes on.
func TestBackgroundSendPanicFailsItsBatch(t *testing.T) {
	backgroundSendEnds(t, func() { panic("boom") }, func(t *testing.T, got answer) {
		var pe *PanicError
		require.ErrorAs(t, got.err, &pe)
		require.Equal(t, "boom", pe.Value)
		require.Contains(t, string(pe.Stack), "panic")
		require.EqualError(t, got.err, "a batch's send panicked: boom")
	})
}

// backgroundSendEnds runs a batch of two calls, queued behind a first
// call in flight, whose send ends by end (a panic, runtime.Goexit) in the
// background: the first call is answered, each call of the batch gets a
// zero result and an error that check judges, and the Batcher goes on.
func backgroundSendEnds(t *testing.T, end func(), check func(t *testing.T, got answer)) {
	t.Helper()
	entered, release := make(chan struct{}), make(chan struct{})
	b := New(func(ctx context.Context, reqs, res []int) error {
		switch reqs[0] {
		case 1:
			entered <- struct{}{}
			<-release
		case 2:
			res[0] = 20 // dropped: the batch failed
			end()
		}
		for i, r := range reqs {
			res[i] = r * 10
		}
		return nil
	}, Options{})
	bg := context.Background()
	first := doAsync(b, bg, 1)
	<-entered
	a := doAsync(b, bg, 2)
	waitQueued(t, b, 1)
	c := doAsync(b, bg, 3)
	waitQueued(t, b, 2)
	close(release)
	require.Equal(t, answer{10, nil}, within(t, first, "call 1"))
	for i, ch := range []<-chan answer{a, c} {
		got := within(t, ch, "a call of the batch that ended")
		require.Zero(t, got.res, "call %d", i)
		check(t, got)
	}
	waitInflight(t, b, 0)
	require.Equal(t, answer{40, nil}, within(t, doAsync(b, bg, 4), "a call after"))
}

// A detached lone call's send panics on the worker: its caller gets a
// *PanicError, which wraps the panic's value when that is an error, and
// the worker takes the next call.
func TestDetachedSendPanicFailsItsCall(t *testing.T) {
	boom := errors.New("boom")
	b := New(func(ctx context.Context, reqs, res []int) error {
		if reqs[0] == 1 {
			panic(boom)
		}
		res[0] = reqs[0] * 10
		return nil
	}, Options{Detach: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := b.Do(ctx, 1)
	var pe *PanicError
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, boom)
	waitLocked(t, b, func() bool { return b.inflight == 0 && !b.busy })
	res, err := b.Do(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, 20, res)
}

func TestOffSendsEveryCallAloneAtOnce(t *testing.T) {
	g := newGate()
	b := New(g.send, Off)
	bg := context.Background()
	var answers []<-chan answer
	for i := range 5 {
		answers = append(answers, doAsync(b, bg, i))
	}
	for range 5 {
		require.Len(t, <-g.entered, 1)
	}
	require.Equal(t, int32(5), g.active.Load(), "all five in flight at once")
	for range 5 {
		g.release <- struct{}{}
	}
	for _, ch := range answers {
		require.NoError(t, (<-ch).err)
	}
}

// stuck is a send that ignores its context, as a network client that
// bounds a read by its own timeout only: it returns when released.
type stuck struct {
	entered chan sent
	release chan struct{}
	done    chan struct{} // one value per send that returned
}

type sent struct {
	ctx  context.Context
	reqs []int
}

func newStuck() *stuck {
	return &stuck{entered: make(chan sent, 10), release: make(chan struct{}), done: make(chan struct{}, 10)}
}

func (s *stuck) send(ctx context.Context, reqs, res []int) error {
	s.entered <- sent{ctx, append([]int(nil), reqs...)}
	<-s.release
	for i, r := range reqs {
		res[i] = r * 10
	}
	s.done <- struct{}{}
	return nil
}

// leaves requires the answer on ch to be err, in time: the caller left
// without waiting for a send that is still blocked.
func leaves(t *testing.T, ch <-chan answer, err error) {
	t.Helper()
	select {
	case a := <-ch:
		require.ErrorIs(t, a.err, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the caller waited for its send past its context's end")
	}
}

func TestDetachedLoneCallerLeavesOnTime(t *testing.T) {
	s := newStuck()
	b := New(s.send, Options{Detach: true})
	bg := context.Background()

	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	lone := doAsync(b, ctx, 1)
	first := <-s.entered
	require.Equal(t, []int{1}, first.reqs)
	sendCtx := first.ctx
	require.Equal(t, ctx, sendCtx, "a batch of one is sent with its caller's context")
	leaves(t, lone, context.DeadlineExceeded)
	require.Error(t, sendCtx.Err(), "the send's context ends once its caller has left")

	// The abandoned send is still in flight: a new call waits for it.
	c2, cancel2 := context.WithCancel(bg)
	next := doAsync(b, c2, 2)
	waitQueued(t, b, 1)
	s.release <- struct{}{}
	<-s.done
	require.Equal(t, []int{2}, (<-s.entered).reqs)
	s.release <- struct{}{}
	require.Equal(t, answer{20, nil}, <-next)
	cancel2()

	// A cancel, rather than a deadline, lets the caller leave too.
	c3, cancel3 := context.WithCancel(bg)
	canceled := doAsync(b, c3, 3)
	<-s.entered
	cancel3()
	leaves(t, canceled, context.Canceled)
	s.release <- struct{}{}
	<-s.done
}

func TestDetachedLoneCallsGoToOneWorkerThatEndsWithItsBatcher(t *testing.T) {
	var senders sync.Map // the goroutines that sent, by a stack's first line
	b := New(func(ctx context.Context, reqs, res []int) error {
		senders.Store(goroutineID(), true)
		res[0] = reqs[0] * 10
		return nil
	}, Options{Detach: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 5 {
		res, err := b.Do(ctx, i)
		require.NoError(t, err)
		require.Equal(t, i*10, res)
	}
	n := 0
	senders.Range(func(any, any) bool { n++; return true })
	require.Equal(t, 1, n, "one after another, the lone calls went to the one worker")

	worker := b.worker
	b = nil //nolint:ineffassign // dropped, so that it may be collected
	require.Eventually(t, func() bool {
		runtime.GC()
		select {
		case _, open := <-worker:
			return !open
		default:
			return false
		}
	}, 10*time.Second, 10*time.Millisecond, "the worker's channel is closed once its Batcher is collected")
}

// Close ends the worker: at once when it is idle, and, when it is busy,
// once it has sent what it is sending; a detached lone call after Close
// still goes, on a goroutine of its own, and starts no worker again.
func TestCloseEndsTheWorker(t *testing.T) {
	closed := func(ch chan *call[int, int]) bool {
		select {
		case _, open := <-ch:
			return !open
		default:
			return false
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	entered, release := make(chan struct{}), make(chan struct{})
	b := New(func(ctx context.Context, reqs, res []int) error {
		if reqs[0] < 0 {
			entered <- struct{}{}
			<-release
		}
		res[0] = reqs[0] * 10
		return nil
	}, Options{Detach: true})

	res, err := b.Do(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, 10, res)
	worker := b.worker
	require.NotNil(t, worker)
	b.Close()
	require.True(t, closed(worker), "an idle worker ends at Close")
	b.Close() // idempotent

	res, err = b.Do(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, 20, res, "a call after Close is sent")
	require.Nil(t, b.worker, "and starts no worker")

	// A busy worker ends once it has sent.
	b = New(b.send, Options{Detach: true})
	done := make(chan error, 1)
	go func() { _, err := b.Do(ctx, -1); done <- err }()
	<-entered
	b.mu.Lock()
	worker = b.worker
	b.mu.Unlock()
	b.Close()
	require.False(t, closed(worker), "a busy worker goes on")
	close(release)
	require.NoError(t, <-done)
	require.True(t, closed(worker), "and ends once it has sent")
}

// goroutineID returns the first line of the calling goroutine's stack,
// which names it.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	line, _, _ := strings.Cut(string(buf), "[")
	return line
}

func TestDetachKeepsContextFreeCallsOnTheirGoroutine(t *testing.T) {
	var sawCtx context.Context
	b := New(func(ctx context.Context, reqs, res []int) error {
		sawCtx = ctx
		res[0] = reqs[0] * 10
		return nil
	}, Options{Detach: true})
	ctx := context.Background() // cannot end: nothing to leave for
	res, err := b.Do(ctx, 7)
	require.NoError(t, err)
	require.Equal(t, 70, res)
	require.Equal(t, ctx, sawCtx, "sent on the caller's goroutine, with its context")
}

func TestDetachWithCoalescingOff(t *testing.T) {
	s := newStuck()
	b := New(s.send, Options{MaxBatch: 1, Detach: true})
	ctx, cancel := context.WithCancel(context.Background())
	a := doAsync(b, ctx, 1)
	c := doAsync(b, ctx, 2)
	<-s.entered
	<-s.entered // both in flight at once: no coalescing, no bound
	cancel()
	leaves(t, a, context.Canceled)
	leaves(t, c, context.Canceled)
	s.release <- struct{}{}
	s.release <- struct{}{}
	<-s.done
	<-s.done
	// A send reports done before the Batcher takes it out of flight.
	waitInflight(t, b, 0)
}

func TestDoneContextIsRefusedBeforeSending(t *testing.T) {
	sent := false
	b := New(func(context.Context, []int, []int) error { sent = true; return nil }, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.Do(ctx, 1)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, sent)
}

// Under load, every call gets its own answer, and the calls share far
// fewer sends than there are calls.
func TestManyCallersShareFewSends(t *testing.T) {
	var sends, calls atomic.Int64
	b := New(func(ctx context.Context, reqs, res []int) error {
		sends.Add(1)
		calls.Add(int64(len(reqs)))
		time.Sleep(200 * time.Microsecond) // a round trip
		for i, r := range reqs {
			res[i] = r + 1
		}
		return nil
	}, Options{MaxBatch: 16})
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				req := g*1000 + i
				res, err := b.Do(context.Background(), req)
				assert.NoError(t, err)
				assert.Equal(t, req+1, res)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(64*50), calls.Load())
	require.Less(t, sends.Load(), int64(64*50/4), "calls per send: %v", float64(calls.Load())/float64(sends.Load()))
}

func TestGroupBatchesPerDestination(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]int{}
	g := NewGroup(func(ctx context.Context, dest string, reqs, res []int) error {
		mu.Lock()
		seen[dest] = append(seen[dest], reqs...)
		mu.Unlock()
		return nil
	}, Options{})
	ctx := context.Background()
	_, err := g.Do(ctx, "a", 1)
	require.NoError(t, err)
	_, err = g.Do(ctx, "b", 2)
	require.NoError(t, err)
	_, err = g.Do(ctx, "a", 3)
	require.NoError(t, err)
	require.Equal(t, map[string][]int{"a": {1, 3}, "b": {2}}, seen)
}

// TestQueueShrinksAfterABurst: the queue's array, grown by a burst of
// callers, is let go once they have gone, whether answered or left.
func TestQueueShrinksAfterABurst(t *testing.T) {
	for _, leave := range []bool{false, true} {
		g := newGate()
		b := New(g.send, Options{MaxBatch: 8})
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		do := func(req int) {
			defer wg.Done()
			_, _ = b.Do(ctx, req)
		}
		wg.Add(1)
		go do(0)
		<-g.entered
		const burst = 1000
		for i := range burst {
			wg.Add(1)
			go do(i + 1)
		}
		waitQueued(t, b, burst)
		stop := make(chan struct{})
		go func() { // lets every batch go
			for {
				select {
				case <-g.entered:
					select {
					case g.release <- struct{}{}:
					case <-stop:
						return
					}
				case <-stop:
					return
				}
			}
		}()
		if leave {
			cancel()
		} else {
			g.release <- struct{}{}
		}
		wg.Wait()
		close(stop)
		cancel()
		b.mu.Lock()
		assert.LessOrEqual(t, cap(b.queue), 4*8, "leave %v: the queue's array after the burst", leave)
		b.mu.Unlock()
	}
}

// TestGroupDropsDestinationsGone: a Group whose destinations come and go
// (a Cluster's masters replaced one by one) keeps the Batchers of those
// called lately, not one for every destination it was ever given; the
// destinations in use keep theirs.
func TestGroupDropsDestinationsGone(t *testing.T) {
	g := NewGroup(func(ctx context.Context, dest int, reqs, res []int) error { return nil }, Options{Detach: true})
	ctx := t.Context()
	live := []int{-1, -2, -3}
	for _, d := range live {
		_, err := g.Do(ctx, d, 0)
		require.NoError(t, err)
	}
	g.mu.Lock()
	first := g.batchers[-1]
	g.mu.Unlock()
	for gone := range 1000 {
		_, err := g.Do(ctx, gone, 0)
		require.NoError(t, err)
		for _, d := range live {
			_, err := g.Do(ctx, d, 0)
			require.NoError(t, err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	assert.LessOrEqual(t, len(g.batchers), len(live)+2, "batchers kept")
	assert.Same(t, first, g.batchers[-1], "a destination in use kept its Batcher")
}

// A Batcher the Group drops, its destination gone, is closed: its worker
// ends then, not once the Batcher is collected, which a caller that took
// it before the drop may put off for as long as it holds it; and the
// Group's Close, which reaches only the Batchers it keeps, left it
// running. The Batcher stays usable.
func TestGroupClosesTheBatchersItDrops(t *testing.T) {
	g := NewGroup(func(ctx context.Context, dest int, reqs, res []int) error {
		res[0] = dest + reqs[0]
		return nil
	}, Options{Detach: true})
	ctx := t.Context()
	_, err := g.Do(ctx, 1, 0)
	require.NoError(t, err)
	g.mu.Lock()
	held := g.batchers[1] // as a caller that took it before the drop
	g.mu.Unlock()
	held.mu.Lock()
	worker := held.worker
	held.mu.Unlock()
	require.NotNil(t, worker, "a detached call started a worker")
	for d := 2; ; d++ { // new destinations, until 1's Batcher is dropped
		_, err := g.Do(ctx, d, 0)
		require.NoError(t, err)
		g.mu.Lock()
		_, kept := g.batchers[1]
		g.mu.Unlock()
		if !kept {
			break
		}
	}
	g.Close()
	select {
	case _, open := <-worker:
		require.False(t, open, "the worker's channel carries nothing")
	default:
		t.Fatal("the worker of a dropped Batcher outlives the Group's Close")
	}
	res, err := held.Do(ctx, 5)
	require.NoError(t, err, "a dropped Batcher stays usable")
	require.Equal(t, 6, res)
	runtime.KeepAlive(held)
}

// A Group's Close ends the workers of its Batchers, and a destination
// first called after Close gets a Batcher that starts none.
func TestGroupCloseEndsTheWorkers(t *testing.T) {
	g := NewGroup(func(ctx context.Context, dest int, reqs, res []int) error {
		res[0] = dest + reqs[0]
		return nil
	}, Options{Detach: true})
	ctx := t.Context()
	for d := range 3 {
		res, err := g.Do(ctx, d, 10)
		require.NoError(t, err)
		require.Equal(t, d+10, res)
	}
	g.mu.Lock()
	var workers []chan *call[int, int]
	for _, b := range g.batchers {
		b.mu.Lock()
		require.NotNil(t, b.worker, "a detached call started a worker")
		workers = append(workers, b.worker)
		b.mu.Unlock()
	}
	g.mu.Unlock()
	g.Close()
	g.Close() // idempotent
	for _, w := range workers {
		select {
		case _, open := <-w:
			require.False(t, open, "the worker's channel carries nothing")
		default:
			t.Fatal("a worker outlives the Group's Close")
		}
	}
	res, err := g.Do(ctx, 7, 1)
	require.NoError(t, err)
	require.Equal(t, 8, res, "a call after Close is sent")
	g.mu.Lock()
	defer g.mu.Unlock()
	for d, b := range g.batchers {
		b.mu.Lock()
		assert.Nil(t, b.worker, "destination %d has a worker after Close", d)
		b.mu.Unlock()
	}
}

func TestGroupSharesSlotsAmongItsDestinations(t *testing.T) {
	gates := map[string]*gate{"a": newGate(), "b": newGate()}
	gr := NewGroup(func(ctx context.Context, dest string, reqs, res []int) error {
		return gates[dest].send(ctx, reqs, res)
	}, Options{MaxInFlight: 2, Share: true})
	ctx := context.Background()
	doAt := func(dest string, req int) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			res, err := gr.Do(ctx, dest, req)
			ch <- answer{res, err}
		}()
		return ch
	}
	answers := []<-chan answer{doAt("a", 1)}
	require.Equal(t, []int{1}, <-gates["a"].entered)
	gr.mu.Lock()
	ba := gr.batchers["a"] // made by the call being sent
	gr.mu.Unlock()
	answers = append(answers, doAt("b", 2))
	require.Equal(t, []int{2}, <-gates["b"].entered)
	// a has a slot free, but the Group has two calls in flight: a's
	// second slot waits for half of the Group's calls, as one Batcher's
	// would for half of its own.
	answers = append(answers, doAt("a", 3))
	waitQueued(t, ba, 1)
	assert.Equal(t, int32(1), gates["a"].active.Load(), "a call went in a's free slot before a fair share of the Group's calls waited")
	answers = append(answers, doAt("a", 4))
	require.Equal(t, []int{3, 4}, <-gates["a"].entered)
	gates["a"].release <- struct{}{}
	gates["a"].release <- struct{}{}
	gates["b"].release <- struct{}{}
	for _, ch := range answers {
		require.NoError(t, (<-ch).err)
	}
	require.Equal(t, int32(2), gates["a"].peak.Load())
}

// Under load, with callers leaving at random (queued, or in flight), a
// Group that shares its slots answers every caller that stays, and ends
// with nothing counted in flight or queued.
func TestShareCountsEveryCallOut(t *testing.T) {
	for _, detach := range []bool{false, true} {
		gr := NewGroup(func(ctx context.Context, dest int, reqs, res []int) error {
			select {
			case <-time.After(100 * time.Microsecond): // a round trip
			case <-ctx.Done():
				return ctx.Err()
			}
			for i, r := range reqs {
				res[i] = r + 1
			}
			return nil
		}, Options{MaxBatch: 8, MaxInFlight: 3, Share: true, Detach: detach})
		var wg sync.WaitGroup
		for g := range 48 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 60 {
					req := g*1000 + i
					ctx, cancel := context.WithCancel(context.Background())
					if i%5 == 0 {
						go cancel() // leaves queued, in flight, or not at all
					}
					res, err := gr.Do(ctx, g%3, req)
					cancel()
					switch {
					case err == nil:
						assert.Equal(t, req+1, res)
					case errors.Is(err, context.Canceled):
						if i%5 != 0 {
							t.Errorf("call %d failed without its caller leaving: %v", req, err)
						}
					default:
						t.Errorf("call %d: %v", req, err)
					}
				}
			}()
		}
		wg.Wait()
		require.Eventually(t, func() bool {
			return gr.share.sent.Load() == 0 && gr.share.queued.Load() == 0
		}, 5*time.Second, time.Millisecond, "detach %v: %d counted in flight, %d queued",
			detach, gr.share.sent.Load(), gr.share.queued.Load())
		for _, b := range gr.batchers {
			b.mu.Lock()
			assert.Zero(t, b.inflight)
			assert.Empty(t, b.queue)
			b.mu.Unlock()
		}
	}
}

// TestDetached: a call with a context that can end runs on another
// goroutine and returns when the context ends, leaving the call to finish
// in the background; its panic goes on to the caller still waiting; with
// a context that cannot end, it runs on the caller's goroutine.
func TestDetached(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	finished := make(chan struct{})
	started := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		res <- Detached(ctx, func() error {
			close(started)
			<-release
			close(finished)
			return nil
		})
	}()
	<-started
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("Detached returned %v when its context ended, want context.Canceled", err)
	}
	close(release)
	<-finished // the call went on in the background

	boom := errors.New("boom")
	require.Equal(t, boom, Detached(context.Background(), func() error { return boom }))
	for _, ctx := range []context.Context{context.Background(), t.Context()} {
		func() {
			defer func() { require.Equal(t, "hook failed", recover()) }()
			_ = Detached(ctx, func() error { panic("hook failed") })
			t.Fatal("the panic did not reach the caller")
		}()
	}
}

// Callers of random deadlines, cancellations and sends (slow, failing,
// panicking) in every mode: every call returns, promptly once its context
// ends; no batch carries more than MaxBatch calls nor goes beside more than
// MaxInFlight-1 others; a call answered was sent once, and one that left
// at most once; and the Batcher ends idle, its worker gone once closed.
func TestRandomInterleavings(t *testing.T) {
	modes := map[string]Options{
		"default":   {},
		"small":     {MaxBatch: 3},
		"two slots": {MaxBatch: 4, MaxInFlight: 2},
		"overlap":   {MaxBatch: 4, MaxInFlight: 3, Overlap: 2},
		"share":     {MaxBatch: 4, MaxInFlight: 2, Share: true},
		"detach":    {MaxBatch: 4, Detach: true},
		"detach 2":  {MaxBatch: 4, MaxInFlight: 2, Detach: true, Share: true},
		"off":       Off,
	}
	for name, opts := range modes {
		t.Run(name, func(t *testing.T) {
			goroutines := runtime.NumGoroutine()
			var (
				mu     sync.Mutex
				sent   = map[int]int{}
				active atomic.Int32
			)
			errSend := errors.New("send failed")
			b := New(func(ctx context.Context, reqs, res []int) error {
				n := active.Add(1)
				defer active.Add(-1)
				if opts.MaxBatch != 1 {
					assert.LessOrEqual(t, int(n), opts.withDefaults().MaxInFlight, "batches in flight")
				}
				assert.LessOrEqual(t, len(reqs), opts.withDefaults().MaxBatch, "calls in a batch")
				mu.Lock()
				for _, r := range reqs {
					sent[r]++
				}
				mu.Unlock()
				switch reqs[0] % 7 {
				case 0:
					runtime.Gosched()
				case 1:
					time.Sleep(50 * time.Microsecond)
				case 2:
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(200 * time.Microsecond):
					}
				case 3:
					if reqs[0]%5 == 0 {
						panic("send panicked")
					}
					return errSend
				}
				for i, r := range reqs {
					res[i] = r + 1
				}
				return nil
			}, opts)
			const callers, calls = 16, 1_000_000
			var answered, left sync.Map
			var wg sync.WaitGroup
			deadline := time.Now().Add(300 * time.Millisecond)
			for g := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < calls && time.Now().Before(deadline); i++ {
						req := g*calls + i // one per call
						ctx, cancel := context.Background(), context.CancelFunc(func() {})
						switch i % 4 {
						case 1:
							ctx, cancel = context.WithTimeout(ctx, time.Duration(i%3)*100*time.Microsecond)
						case 2:
							ctx, cancel = context.WithCancel(ctx)
							go func() { runtime.Gosched(); cancel() }()
						}
						start := time.Now()
						res, err := func() (res int, err error) {
							defer func() {
								if v := recover(); v != nil {
									err = fmt.Errorf("panic: %v", v)
								}
							}()
							return b.Do(ctx, req)
						}()
						switch {
						case err == nil:
							assert.Equal(t, req+1, res)
							answered.Store(req, true)
						case ctx.Err() != nil && errors.Is(err, ctx.Err()):
							left.Store(req, true)
							if dl, ok := ctx.Deadline(); ok {
								assert.Less(t, time.Since(dl), time.Second, "a caller left long after its deadline (started %v)", start)
							}
						}
						cancel()
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("callers hung")
			}
			mu.Lock()
			answered.Range(func(k, _ any) bool {
				assert.Equal(t, 1, sent[k.(int)], "sends of call %d, answered", k)
				return true
			})
			left.Range(func(k, _ any) bool {
				assert.LessOrEqual(t, sent[k.(int)], 1, "sends of call %d, left", k)
				return true
			})
			for r, n := range sent {
				assert.Equal(t, 1, n, "sends of call %d", r)
			}
			mu.Unlock()
			waitLocked(t, b, func() bool { return b.inflight == 0 && len(b.queue) == 0 && !b.busy })
			if b.share != nil {
				assert.Zero(t, b.share.sent.Load())
				assert.Zero(t, b.share.queued.Load())
			}
			b.Close()
			// Polled here: require.Eventually runs a goroutine of its own.
			for end := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > goroutines; time.Sleep(time.Millisecond) {
				require.True(t, time.Now().Before(end), "goroutines: %d, before: %d", runtime.NumGoroutine(), goroutines)
			}
		})
	}
}

// A queued call that goes alone, a batch of one, is sent with its
// caller's context, as SendFunc says, like a lone call that goes at once:
// its send sees the context's own end and cause. It was sent with a
// batch's context, which ended only once its caller had left, with
// context.Canceled whatever the caller's cause or deadline.
func TestQueuedCallSentAloneHasItsCallersContext(t *testing.T) {
	entered := make(chan context.Context, 2)
	causes := make(chan error, 1)
	release := make(chan struct{})
	b := New(func(ctx context.Context, reqs, res []int) error {
		entered <- ctx
		if reqs[0] == 1 {
			<-release
			return nil
		}
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}, Options{})
	bg := context.Background()
	first := doAsync(b, bg, 1)
	<-entered
	ctx, cancel := context.WithCancelCause(bg)
	second := doAsync(b, ctx, 2)
	waitQueued(t, b, 1)
	close(release)
	require.Equal(t, answer{0, nil}, <-first)
	sent := <-entered
	require.True(t, sent == ctx, "a batch of one was sent with a context of its own, not its caller's")
	cause := errors.New("the caller gave up")
	cancel(cause)
	require.ErrorIs(t, (<-second).err, context.Canceled)
	require.Equal(t, cause, <-causes)
	waitInflight(t, b, 0)
}

// A queued call sent alone, whose caller leaves while its send, which
// does not watch the context, is in flight, and whose send then ends its
// goroutine (runtime.Goexit): the calls queued behind it go on in its
// slot, each answered, and the Batcher ends with nothing in flight. The
// call's batch of one is its own (start): it must count its one caller,
// and outlive its caller's leaving, until the send is answered.
func TestQueuedLoneCallerLeavesAndItsSendExits(t *testing.T) {
	entered := make(chan int, 10)
	release := map[int]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}
	b := New(heldThenGoexit(entered, release), Options{})
	bg := context.Background()
	first := doAsync(b, bg, 1)
	require.Equal(t, 1, <-entered)
	ctx, cancel := context.WithCancel(bg)
	second := doAsync(b, ctx, 2)
	waitQueued(t, b, 1)
	close(release[1])
	require.Equal(t, answer{10, nil}, within(t, first, "call 1"))
	require.Equal(t, 2, <-entered)
	cancel() // call 2's caller leaves mid-send
	require.ErrorIs(t, within(t, second, "call 2").err, context.Canceled)
	third, fourth := doAsync(b, bg, 3), doAsync(b, bg, 4)
	waitQueued(t, b, 2)
	close(release[2])
	require.Equal(t, answer{30, nil}, within(t, third, "call 3"))
	require.Equal(t, answer{40, nil}, within(t, fourth, "call 4"))
	waitInflight(t, b, 0)
	b.mu.Lock()
	queued := len(b.queue)
	b.mu.Unlock()
	require.Zero(t, queued)
	require.Equal(t, answer{50, nil}, within(t, doAsync(b, bg, 5), "a call after"))
}

// TestGroupDropsADestinationGoneWithNoneNew: a destination no longer
// called (a Ring's shard that left it, with none in its place) loses its
// Batcher, and its worker, within 2×DropEvery calls of the others, though
// no new destination comes. Its Batcher was kept as long as the Group.
func TestGroupDropsADestinationGoneWithNoneNew(t *testing.T) {
	g := NewGroup(func(ctx context.Context, dest int, reqs, res []int) error { return nil }, Options{Detach: true})
	ctx := t.Context()
	for _, d := range []int{1, 2} {
		_, err := g.Do(ctx, d, 0)
		require.NoError(t, err)
	}
	g.mu.Lock()
	kept := g.batchers[1]
	g.mu.Unlock()
	require.Equal(t, 2, g.Len())
	for range 2 * DropEvery {
		_, err := g.Do(ctx, 1, 0)
		require.NoError(t, err)
	}
	require.Equal(t, 1, g.Len(), "the Batchers kept, 2 gone")
	g.mu.Lock()
	defer g.mu.Unlock()
	assert.Same(t, kept, g.batchers[1], "the destination in use kept its Batcher")
}
