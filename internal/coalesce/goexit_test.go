package coalesce

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// within returns the answer on ch, or fails the test if none comes in
// time: a caller left waiting forever.
func within(t *testing.T, ch <-chan answer, what string) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer after 10s", what)
		return answer{}
	}
}

// endingFirst returns a Batcher of opts whose send, for a batch that
// begins with call 1, says it entered (entered), waits for release to
// close and ends by end (a panic, runtime.Goexit); for any other batch, it
// answers each call ten times its request.
func endingFirst(end func(), opts Options) (b *Batcher[int, int], entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	b = New(func(ctx context.Context, reqs, res []int) error {
		if reqs[0] == 1 {
			entered <- struct{}{}
			<-release
			end()
		}
		for i, r := range reqs {
			res[i] = r * 10
		}
		return nil
	}, opts)
	return b, entered, release
}

// A send that ends its goroutine with runtime.Goexit in the background
// (t.FailNow in a test's send does) fails every call of its batch with
// ErrGoexit, as a panic fails it with a *PanicError: the callers of the
// batch waited forever, and the Batcher, its slot never freed, queued
// every later call for ever.
func TestBackgroundSendGoexitFailsItsBatch(t *testing.T) {
	backgroundSendEnds(t, runtime.Goexit, func(t *testing.T, got answer) {
		require.ErrorIs(t, got.err, ErrGoexit)
	})
}

// A batch whose send exits goes on with the calls queued behind it,
// which arrived while it was in flight.
func TestBackgroundSendGoexitSendsTheCallsQueuedBehind(t *testing.T) {
	entered := make(chan int, 10)
	release := map[int]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}
	b := New(heldThenGoexit(entered, release), Options{})
	bg := context.Background()
	first := doAsync(b, bg, 1)
	require.Equal(t, 1, <-entered)
	exits := doAsync(b, bg, 2)
	waitQueued(t, b, 1)
	close(release[1])
	require.Equal(t, answer{10, nil}, within(t, first, "call 1"))
	require.Equal(t, 2, <-entered)
	behind := doAsync(b, bg, 3)
	waitQueued(t, b, 1)
	close(release[2])
	require.ErrorIs(t, within(t, exits, "call 2").err, ErrGoexit)
	require.Equal(t, answer{30, nil}, within(t, behind, "the call queued behind"))
	waitInflight(t, b, 0)
}

// A detached lone call whose send exits on the worker fails with
// ErrGoexit at once, not when its context ends; the worker is gone with
// its goroutine, and the next detached call starts another. The calls
// queued behind it are sent.
func TestDetachedSendGoexitFailsItsCall(t *testing.T) {
	b, entered, release := endingFirst(runtime.Goexit, Options{Detach: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exits := doAsync(b, ctx, 1)
	<-entered
	behind := doAsync(b, ctx, 2)
	waitQueued(t, b, 1)
	close(release)
	got := within(t, exits, "the detached call")
	require.ErrorIs(t, got.err, ErrGoexit)
	require.EqualError(t, got.err, ErrGoexit.Error())
	require.Equal(t, answer{20, nil}, within(t, behind, "the call queued behind"))
	waitLocked(t, b, func() bool { return b.inflight == 0 && !b.busy })

	res, err := b.Do(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, 30, res)
	waitLocked(t, b, func() bool { return b.worker != nil && !b.busy })
	b.Close()
	waitLocked(t, b, func() bool { return b.worker == nil })
}

// A lone call sent on its caller's goroutine exits with it, as a panic
// goes on to it; the Batcher goes on, with the calls queued behind it.
func TestLoneSendGoexitEndsItsCallerAndTheBatcherGoesOn(t *testing.T) {
	b, entered, release := endingFirst(runtime.Goexit, Options{})
	bg := context.Background()
	exited := make(chan bool, 1)
	go func() {
		returned := false
		defer func() { exited <- returned }()
		_, _ = b.Do(bg, 1)
		returned = true
	}()
	<-entered
	queued := doAsync(b, bg, 2)
	waitQueued(t, b, 1)
	close(release)
	require.False(t, <-exited, "the caller's goroutine exited with its send")
	require.Equal(t, answer{20, nil}, within(t, queued, "the call queued behind"))
	waitInflight(t, b, 0)
}

// With coalescing off, a detached call goes on the worker, or, while the
// worker is busy, on a goroutine of its own: a send that exits on either
// fails its call with ErrGoexit, and the Batcher goes on.
func TestDetachOffSendGoexitFailsItsCall(t *testing.T) {
	entered, release := make(chan struct{}, 2), make(chan struct{})
	b := New(func(ctx context.Context, reqs, res []int) error {
		if reqs[0] < 3 {
			entered <- struct{}{}
			<-release
			runtime.Goexit()
		}
		res[0] = reqs[0] * 10
		return nil
	}, Options{MaxBatch: 1, Detach: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	onWorker := doAsync(b, ctx, 1)
	<-entered
	onItsOwn := doAsync(b, ctx, 2)
	<-entered
	waitInflight(t, b, 2)
	close(release)
	require.ErrorIs(t, within(t, onWorker, "the call on the worker").err, ErrGoexit)
	require.ErrorIs(t, within(t, onItsOwn, "the call on a goroutine of its own").err, ErrGoexit)
	waitLocked(t, b, func() bool { return b.inflight == 0 && !b.busy })
	require.Equal(t, answer{30, nil}, within(t, doAsync(b, ctx, 3), "a call after"))
	b.Close()
}

// Detached returns ErrGoexit when fn calls runtime.Goexit on the
// goroutine of its own, as a detached lone call of a Batcher fails: the
// caller got a panic with nil (a *runtime.PanicNilError) that nobody
// raised. Run on the caller's goroutine, fn ends it.
func TestDetachedGoexit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var err error
	require.NotPanics(t, func() {
		err = Detached(ctx, func() error { runtime.Goexit(); return nil })
	})
	require.ErrorIs(t, err, ErrGoexit)

	returned := make(chan bool, 1)
	go func() {
		ok := false
		defer func() { returned <- ok }()
		_ = Detached(context.Background(), func() error { runtime.Goexit(); return nil })
		ok = true
	}()
	require.False(t, <-returned, "fn ran on the caller's goroutine, and ended it")
}

// heldThenGoexit returns a send that reports the first request of each
// batch on entered, waits for release's channel of that request if it has
// one, ends its goroutine by runtime.Goexit on request 2, and answers any
// other request r with r*10.
func heldThenGoexit(entered chan<- int, release map[int]chan struct{}) SendFunc[int, int] {
	return func(ctx context.Context, reqs, res []int) error {
		entered <- reqs[0]
		if ch, ok := release[reqs[0]]; ok {
			<-ch
		}
		if reqs[0] == 2 {
			runtime.Goexit()
		}
		for i, r := range reqs {
			res[i] = r * 10
		}
		return nil
	}
}
