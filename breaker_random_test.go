package ratelimit_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

var breakerSeed = flag.Uint64("breaker.seed", 0, "the seed of the breaker's randomized tests (0: the time)")

// The breaker of the randomized tests: three failures open it for a
// second.
const (
	randThreshold = 3
	randCooldown  = time.Second
)

// cancelKey is the key of the cancel function of a call's context, which
// the store calls in a call of mode "cancel".
type cancelKey struct{}

// testClock is a clock that a test moves: clock.Mock, or safeClock.
type testClock interface {
	clock.Clock
	Add(d time.Duration)
	Set(t time.Time)
}

// safeClock is a mock clock of what the Limiter's calls use of it (Now,
// WithTimeout, WithDeadline), which several goroutines may read and move
// at once. clock.Mock (v1.3.0) may not be moved while another goroutine
// makes a context or a timer of it: its Add and its AfterFunc race.
type safeClock struct {
	clock.Clock // nil: the Limiter's calls use no other method
	mu          sync.Mutex
	now         time.Time
	waiting     []*deadlineCtx
}

func (c *safeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *safeClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c *safeClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

func (c *safeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.set(c.now.Add(d))
}

func (c *safeClock) Set(t time.Time) {
	c.mu.Lock()
	c.set(t)
}

// set sets the time with c.mu held, and ends, without it, the contexts
// whose deadline it reached.
func (c *safeClock) set(t time.Time) {
	c.now = t
	var ended []*deadlineCtx
	kept := c.waiting[:0]
	for _, ctx := range c.waiting {
		if ctx.deadline.After(t) {
			kept = append(kept, ctx)
		} else {
			ended = append(ended, ctx)
		}
	}
	c.waiting = kept
	c.mu.Unlock()
	for _, ctx := range ended {
		ctx.end(context.DeadlineExceeded)
	}
}

func (c *safeClock) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return c.WithDeadline(parent, c.Now().Add(d))
}

// WithDeadline returns a context that keeps parent's values and ends at
// deadline on c; not parent's end (the Limiter gives it none).
func (c *safeClock) WithDeadline(parent context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	ctx := &deadlineCtx{Context: parent, deadline: deadline, done: make(chan struct{})}
	c.mu.Lock()
	if !deadline.After(c.now) {
		c.mu.Unlock()
		ctx.end(context.DeadlineExceeded)
	} else {
		c.waiting = append(c.waiting, ctx)
		c.mu.Unlock()
	}
	return ctx, func() { ctx.end(context.Canceled) }
}

// deadlineCtx is a context of safeClock.
type deadlineCtx struct {
	context.Context
	deadline time.Time
	done     chan struct{}
	once     sync.Once
	err      atomic.Value
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *deadlineCtx) Done() <-chan struct{}       { return c.done }
func (c *deadlineCtx) Err() error {
	if err, ok := c.err.Load().(error); ok {
		return err
	}
	return nil
}
func (c *deadlineCtx) end(err error) {
	c.once.Do(func() { c.err.Store(err); close(c.done) })
}

// apply does what the mode of key says of a call's store call before the
// store answers: nil to answer, or the call's error.
func (r *breakerRun) apply(ctx context.Context, key string) error {
	mode, _, _ := strings.Cut(key, "/")
	switch mode {
	case "ok":
		return nil
	case "err":
		return errDown
	case "cancel":
		ctx.Value(cancelKey{}).(context.CancelFunc)()
	case "short", "long":
		// To the caller's deadline; again, should another goroutine
		// have set the clock back meanwhile.
		dl, _ := ctx.Deadline()
		for ctx.Err() == nil {
			r.mock.Add(max(r.mock.Until(dl), time.Millisecond))
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

// load does what the mode of key says of the Limiter's own check of the
// store before the store answers: nil to answer, or the check's error.
func (r *breakerRun) load(ctx context.Context, key string) error {
	_, mode, _ := strings.Cut(key, "/")
	switch mode {
	case "err":
		return errDown
	case "stall":
		r.stalled <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// breakerRun is one Limiter of the randomized tests, on a hookStore that
// does what the key of each call says, "apply/load": its Apply (or
// Decide) answers ("ok"), fails ("err"), cancels its caller's context and
// waits for it ("cancel"), or moves the mock clock on to its caller's
// deadline, 1 ms ("short") or 300 ms ("long") away (breakerRun.apply);
// its Load (the Limiter's own check) answers ("ok"), fails ("err"), or
// says so on stalled and waits for its context's end ("stall")
// (breakerRun.load).
type breakerRun struct {
	t       *testing.T
	rng     *rand.Rand
	mock    testClock
	store   *hookStore
	stalled chan struct{} // a check stalls
	lim     *ratelimit.Limiter
}

// newBreakerRun makes a breakerRun of seed on the clock mock; bound: the
// Limiter decides the calls through BoundLimits (the path of memstore).
func newBreakerRun(t *testing.T, seed uint64, bound bool, mock testClock) *breakerRun {
	store, given := hooked(bound)
	r := &breakerRun{t: t, rng: rand.New(rand.NewPCG(seed, seed)), mock: mock, store: store, stalled: make(chan struct{}, 64)}
	store.apply, store.load = r.apply, r.load
	lim, err := ratelimit.New(given, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 1e6, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(randThreshold, randCooldown))
	require.NoError(t, err)
	r.lim = lim
	return r
}

// call makes a call of key, whose mode says what the store does (see
// breakerRun.apply and load), and reports its answer and whether it
// reached the store.
func (r *breakerRun) call(key string) (ratelimit.Result, error, bool) {
	ctx := context.Background()
	mode, _, _ := strings.Cut(key, "/")
	switch mode {
	case "cancel":
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		ctx = context.WithValue(ctx, cancelKey{}, cancel)
	case "short", "long":
		var cancel context.CancelFunc
		ctx, cancel = r.mock.WithTimeout(ctx, map[string]time.Duration{"short": time.Millisecond, "long": 300 * time.Millisecond}[mode])
		defer cancel()
	}
	asked := r.store.calls.Load()
	res, err := r.lim.Limit(ctx, "l", key)
	return res, err, r.store.calls.Load() > asked
}

// settle waits for the Limiter's own check of the store to end, moving
// the mock clock past its quarter of a second if the store stalls it.
func (r *breakerRun) settle() {
	for ratelimit.Checking(r.lim) {
		select {
		case <-r.stalled:
			r.mock.Add(250 * time.Millisecond)
		default:
			runtime.Gosched()
		}
	}
}

// step makes a call of a random mode, checking its answer against the
// mode, and lets the check it sent, if any, end.
func (r *breakerRun) step(modes []string) string {
	t := r.t
	key := modes[r.rng.IntN(len(modes))]
	res, err, asked := r.call(key)
	defer r.settle()
	refused := err != nil && !asked && res.Degraded
	mode, _, _ := strings.Cut(key, "/")
	switch {
	case refused:
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "%s: refused by the breaker", key)
	case mode == "ok":
		require.NoError(t, err, key)
		require.False(t, res.Degraded, key)
	case mode == "err":
		require.ErrorIs(t, err, errDown, key)
		require.True(t, res.Degraded, key)
	case mode == "cancel":
		require.ErrorIs(t, err, context.Canceled, key)
		require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable, "%s: a caller's cancellation is no store failure", key)
	case mode == "short":
		require.ErrorIs(t, err, context.DeadlineExceeded, key)
		require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable, "%s: a deadline of 1 ms is the caller's own", key)
	case mode == "long":
		// A quarter of a second and more with no answer: the store's
		// failure; but an answer timed a little after the call's start,
		// before the clock was set back, excuses it (callerGaveUp).
		require.ErrorIs(t, err, context.DeadlineExceeded, key)
	}
	return key
}

// clockStep moves the mock clock on, mostly less than a cool-down, now
// and then more, and sets it back now and then.
func (r *breakerRun) clockStep() {
	switch n := r.rng.IntN(10); {
	case n == 0:
		r.mock.Set(r.mock.Now().Add(-time.Duration(r.rng.Int64N(int64(time.Hour)))))
	case n == 1:
		r.mock.Add(time.Duration(r.rng.Int64N(int64(3 * randCooldown))))
	default:
		r.mock.Add(time.Duration(r.rng.Int64N(int64(randCooldown / 4))))
	}
}

// recovers checks that the breaker does not stick open: a cool-down
// after whatever came before, a store that answers is asked, and closes
// the breaker. Unless the clock was set back while it was open: then the
// first call stays open one cool-down from its reading
// (TestBreakerClockSetBack), and the next cool-down on, the store is
// asked.
func (r *breakerRun) recovers(history []string) {
	r.mock.Add(randCooldown + time.Millisecond)
	res, err, asked := r.call("ok/ok")
	if !asked {
		var se *ratelimit.StoreError
		require.ErrorAs(r.t, err, &se, "a cool-down after %v", history)
		require.Equal(r.t, r.mock.Now().Add(randCooldown), se.Until, "a cool-down after %v: only a clock set back keeps the breaker open, one cool-down from now", history)
		r.mock.Add(randCooldown)
	}
	for i := range 2 {
		res, err, asked = r.call("ok/ok")
		require.True(r.t, asked, "call %d a cool-down after %v: the store is asked", i, history)
		require.NoError(r.t, err, "call %d after %v", i, history)
		require.False(r.t, res.Degraded)
	}
}

// opensOnADeadStore checks that a store that fails every call opens the
// breaker, whatever came before: a cool-down on, the failures of
// randThreshold calls leave it open.
func (r *breakerRun) opensOnADeadStore(history []string) {
	r.mock.Add(randCooldown + time.Millisecond)
	for range randThreshold {
		_, err, _ := r.call("err/err")
		require.ErrorIs(r.t, err, ratelimit.ErrStoreUnavailable)
	}
	res, err, asked := r.call("ok/ok")
	require.False(r.t, asked, "after %d failures in a row, the store is not asked; before them: %v", randThreshold, history)
	require.ErrorIs(r.t, err, ratelimit.ErrStoreUnavailable)
	require.True(r.t, res.Degraded)
}

// opensOnAStalledStore checks that a store that keeps every call
// waiting, and every check too, opens the breaker, whatever came before,
// though each caller's deadline is a millisecond: a cool-down on, the
// checks that randThreshold callers in a hurry send leave it open.
func (r *breakerRun) opensOnAStalledStore(history []string) {
	r.mock.Add(randCooldown + time.Millisecond)
	for range randThreshold {
		_, err, asked := r.call("short/stall")
		if asked {
			require.ErrorIs(r.t, err, context.DeadlineExceeded)
		} else {
			require.ErrorIs(r.t, err, ratelimit.ErrStoreUnavailable, "open already: the failures counted before")
		}
		r.settle()
	}
	res, err, asked := r.call("ok/ok")
	require.False(r.t, asked, "after %d callers in a hurry on a stalled store, the store is not asked; before them: %v", randThreshold, history)
	require.ErrorIs(r.t, err, ratelimit.ErrStoreUnavailable)
	require.True(r.t, res.Degraded)
}

// countsNoCallersOwn checks that calls whose callers gave up (canceled,
// or a deadline too short while the store answers the check) count no
// failure, however many and whatever the clock does: after them,
// randThreshold-1 failures leave the breaker closed.
func (r *breakerRun) countsNoCallersOwn(history []string) {
	r.recovers(history)
	var own []string
	for range r.rng.IntN(20) {
		if r.rng.IntN(3) == 0 {
			r.clockStep()
			if ratelimit.Checking(r.lim) {
				r.settle()
			}
			own = append(own, "clock")
			continue
		}
		own = append(own, r.step([]string{"cancel/ok", "short/ok", "ok/ok"}))
	}
	for i := range randThreshold - 1 {
		_, err, asked := r.call("err/err")
		require.True(r.t, asked, "failure %d after %v: the breaker is closed", i, own)
		require.ErrorIs(r.t, err, errDown)
	}
	res, err, asked := r.call("ok/ok")
	require.True(r.t, asked, "after %v and %d failures: the breaker is closed", own, randThreshold-1)
	require.NoError(r.t, err)
	require.False(r.t, res.Degraded)
}

var breakerModes = []string{
	"ok/ok", "err/err", "cancel/ok", "short/ok", "short/err", "short/stall", "long/ok",
}

// Random timelines of answers, failures, cancellations, deadlines short
// and long, checks that answer, fail or stall, and a clock that moves on
// and back, one call at a time, through Apply or BoundLimits: the
// breaker never sticks open, a store that fails or stalls every call
// always opens it (callers in a hurry or not), and no caller's own
// cancellation or short deadline counts as a failure of the store.
func TestBreakerRandomTimelines(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if *breakerSeed != 0 {
		seed = *breakerSeed
	}
	for run := range 16 {
		seed := seed + uint64(run)
		bound := run%2 == 1
		t.Run(fmt.Sprintf("%d/bound=%v", seed, bound), func(t *testing.T) {
			r := newBreakerRun(t, seed, bound, newMock())
			var history []string
			for range 60 {
				switch n := r.rng.IntN(21); {
				case n < 4:
					r.clockStep()
					history = append(history, "clock")
				case n == 4:
					r.recovers(history)
					history = append(history, "recovers")
				case n == 5:
					r.opensOnADeadStore(history)
					history = append(history, "dead")
				case n == 6:
					r.countsNoCallersOwn(history)
					history = append(history, "own")
				case n == 7:
					r.opensOnAStalledStore(history)
					history = append(history, "stalled")
				default:
					history = append(history, r.step(breakerModes))
				}
			}
			r.recovers(history)
			r.opensOnADeadStore(history)
			r.recovers(history)
			r.opensOnAStalledStore(history)
		})
	}
}

// Random calls of every mode from several goroutines at once, while the
// clock moves on and back (a safeClock: clock.Mock may not): run under
// -race, it looks for data races of the breaker; then the breaker
// recovers, and a store that fails or stalls every call opens it.
func TestBreakerRandomConcurrent(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if *breakerSeed != 0 {
		seed = *breakerSeed
	}
	t.Logf("seed %d", seed)
	r := newBreakerRun(t, seed, seed%2 == 1, &safeClock{now: t0})
	// Answers the most, so that the breaker is closed often enough for
	// the calls to reach the store.
	modes := []string{"ok/ok", "ok/ok", "ok/ok", "ok/ok", "ok/ok", "ok/ok", "err/err", "cancel/ok", "short/ok", "short/err", "short/stall", "long/ok"}
	// The callers move the clock too, on or back.
	step := func(rng *rand.Rand) {
		select {
		case <-r.stalled:
		default:
		}
		if rng.IntN(50) == 0 {
			r.mock.Set(r.mock.Now().Add(-time.Duration(rng.Int64N(int64(time.Minute)))))
		} else {
			r.mock.Add(time.Duration(rng.Int64N(int64(randCooldown))))
		}
	}
	const calls = 4 * 1500
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)+2))
			for range calls / 4 {
				if rng.IntN(3) == 0 {
					step(rng)
				}
				key := modes[rng.IntN(len(modes))]
				_, err, _ := r.call(key)
				if strings.HasPrefix(key, "ok/") && err != nil && !errors.Is(err, ratelimit.ErrStoreUnavailable) {
					t.Errorf("%s: %v", key, err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d of %d calls reached the store", r.store.calls.Load(), calls)
	for ratelimit.Checking(r.lim) { // a stalled check may have said so to a caller's step
		r.mock.Add(250 * time.Millisecond)
		runtime.Gosched()
	}
	r.recovers([]string{"concurrent"})
	r.opensOnADeadStore([]string{"concurrent"})
	r.recovers([]string{"concurrent"})
	r.opensOnAStalledStore([]string{"concurrent"})
}
