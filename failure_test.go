package ratelimit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flakyStore wraps a store, fails on demand, and counts the calls that
// reached it.
type flakyStore struct {
	ratelimit.Store
	fail  atomic.Bool
	calls atomic.Int64
}

var errDown = errors.New("connection refused")

func (s *flakyStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	s.calls.Add(1)
	if s.fail.Load() {
		return errDown
	}
	return s.Store.Apply(ctx, op, out)
}

func (s *flakyStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	s.calls.Add(1)
	if s.fail.Load() {
		return errDown
	}
	return s.Store.Load(ctx, ids, out)
}

func TestFailurePolicy(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	var logs bytes.Buffer
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"closed": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
		"open":   {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
	}, ratelimit.WithClock(newMock()), ratelimit.WithBreaker(0, 0),
		ratelimit.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	store.fail.Store(true)

	res, err := lim.Limit(ctx, "closed", "k")
	requireFailedClosed(t, res, err, "closed")

	res, err = lim.Limit(ctx, "open", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	assert.True(t, res.OK)
	assert.True(t, res.Degraded)

	res, err = lim.LimitAll(ctx, "k", []string{"open", "closed"})
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	assert.False(t, res.OK, "several limits fail open only if all do")

	assert.Contains(t, logs.String(), "store failed")
	assert.NotContains(t, logs.String(), `"k"`, "keys are not logged")

	store.fail.Store(false)
	res, err = lim.Limit(ctx, "closed", "k")
	require.NoError(t, err)
	assert.True(t, res.OK)
	assert.False(t, res.Degraded)
}

// A LimitAll the failure policy decides is refused by its first limit
// that fails closed, and its Result names that limit and holds each
// limit's own answer in All, as when the store decides. It named the
// first limit, here one that fails open and would have allowed, and had
// no All.
func TestDegradedLimitAllNamesTheFailClosedLimit(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"closed": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
		"open":   {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
		"open2":  {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, FailOpen: true},
	}, ratelimit.WithClock(newMock()), ratelimit.WithBreaker(0, 0))
	require.NoError(t, err)
	store.fail.Store(true)

	res, err := lim.LimitAll(ctx, "k", []string{"open", "closed", "open2"}, ratelimit.Count(2))
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	assert.False(t, res.OK)
	assert.True(t, res.Degraded)
	assert.Equal(t, "closed", res.Name, "the refusal is the fail-closed limit's")
	require.Len(t, res.All, 3, "LimitAll's Result holds each limit's own answer")
	for i, want := range []struct {
		name string
		ok   bool
	}{{"open", true}, {"closed", false}, {"open2", true}} {
		r := res.All[i]
		assert.Equal(t, want.name, r.Name)
		assert.Equal(t, want.ok, r.OK, r.Name)
		assert.True(t, r.Degraded, r.Name)
		assert.Equal(t, "k", r.Key)
		assert.Equal(t, 2.0, r.Count)
		if want.ok {
			assert.Zero(t, r.RetryAfter, "%s allows outright", r.Name)
		} else {
			assert.Equal(t, res.RetryAfter, r.RetryAfter)
		}
	}
	assert.Greater(t, res.RetryAfter, time.Duration(0))

	res, err = lim.LimitAll(ctx, "k", []string{"open", "open2"})
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	assert.True(t, res.OK, "every limit fails open")
	assert.Zero(t, res.RetryAfter)
	assert.Equal(t, "open", res.Name)
	require.Len(t, res.All, 2)
	assert.True(t, res.All[0].OK && res.All[1].OK)
}

// requireFailedClosed checks the answer of a call of the limit name, which
// fails closed, while the store fails with errDown.
func requireFailedClosed(t *testing.T, res ratelimit.Result, err error, name string) {
	t.Helper()
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.ErrorIs(t, err, errDown, "the store's error stays visible")
	var se *ratelimit.StoreError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, name, se.Name)
	assert.False(t, res.OK)
	assert.True(t, res.Degraded)
	assert.Greater(t, res.RetryAfter, time.Duration(0))
}

func TestBreaker(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	mock := newMock()
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, 5*time.Second))
	require.NoError(t, err)
	store.fail.Store(true)

	for range 3 {
		_, err := lim.Limit(ctx, "l", "k")
		require.ErrorIs(t, err, errDown)
	}
	require.EqualValues(t, 3, store.calls.Load())
	// Open: calls are decided by the policy without asking the store.
	for range 10 {
		res, err := lim.Limit(ctx, "l", "k")
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		var se *ratelimit.StoreError
		require.ErrorAs(t, err, &se)
		assert.Nil(t, se.Err)
		assert.Equal(t, mock.Now().Add(5*time.Second), se.Until)
		assert.False(t, res.OK)
		assert.Equal(t, 5*time.Second, res.RetryAfter, "a refusal during the cool-down lasts until the probe")
	}
	require.EqualValues(t, 3, store.calls.Load(), "an open breaker does not ask the store")

	// After the cool-down one probe goes through; it fails: open again.
	mock.Add(5 * time.Second)
	_, err = lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, errDown)
	require.EqualValues(t, 4, store.calls.Load())
	_, err = lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.EqualValues(t, 4, store.calls.Load())

	// The store recovers: the next probe closes the breaker.
	store.fail.Store(false)
	mock.Add(5 * time.Second)
	for range 3 {
		res, err := lim.Limit(ctx, "l", "k")
		require.NoError(t, err)
		assert.True(t, res.OK)
	}
	require.EqualValues(t, 7, store.calls.Load())
}

func TestCallerCancelIsNoStoreFailure(t *testing.T) {
	store := &flakyStore{Store: canceler{}}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithBreaker(1, time.Hour))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	store.Store = canceler{cancel: cancel}
	_, err = lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	store.Store = must(memstore.New())
	res, err := lim.Limit(context.Background(), "l", "k")
	require.NoError(t, err, "a caller giving up must not open the breaker")
	assert.True(t, res.OK)
}

// canceler cancels the caller's context while the call is in the store.
type canceler struct {
	ratelimit.Store
	cancel context.CancelFunc
}

func (c canceler) Apply(ctx context.Context, _ *driver.Op, _ []driver.Decision) error {
	c.cancel()
	<-ctx.Done()
	return ctx.Err()
}

// hookStore runs functions of the test before the store's Apply (and,
// through hookBinder, a BoundLimit's Decide) and Load, given the call's
// context and its first key: an error is the call's answer, nil lets the
// wrapped store answer.
type hookStore struct {
	ratelimit.Store
	calls atomic.Int64                                // of Apply and Decide
	apply func(ctx context.Context, key string) error // nil: the wrapped store decides
	load  func(ctx context.Context, key string) error // nil: the wrapped store loads
}

func (s *hookStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	s.calls.Add(1)
	if s.apply != nil {
		if err := s.apply(ctx, firstKey(op.Items)); err != nil {
			return err
		}
	}
	return s.Store.Apply(ctx, op, out)
}

func (s *hookStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	if s.load != nil && len(ids) > 0 {
		if err := s.load(ctx, ids[0].Key); err != nil {
			return err
		}
	}
	return s.Store.Load(ctx, ids, out)
}

// firstKey returns the key of an op's first item, or "" if it has none.
func firstKey(items []driver.Item) string {
	if len(items) == 0 {
		return ""
	}
	return items[0].Key
}

// A probe whose caller hangs up leaves the breaker to the next call: it
// used to stay marked in flight, so that no call asked the store again.
func TestBreakerCanceledProbe(t *testing.T) {
	ctx := context.Background()
	store := &hookStore{Store: must(memstore.New())}
	mock := newMock()
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 1000, Period: time.Second, FailOpen: true},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, time.Second))
	require.NoError(t, err)
	store.apply = func(context.Context, string) error { return errDown }
	for range 3 {
		_, err := lim.Limit(ctx, "l", "k")
		require.ErrorIs(t, err, errDown)
	}
	mock.Add(time.Second)
	// The store is back, but the probe's caller leaves first.
	probeCtx, cancel := context.WithCancel(ctx)
	store.apply = func(context.Context, string) error { cancel(); return context.Canceled }
	_, err = lim.Limit(probeCtx, "l", "k")
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	store.apply = nil
	asked := store.calls.Load()
	for i := range 100 {
		res, err := lim.Limit(ctx, "l", fmt.Sprint("fresh-", i))
		require.NoError(t, err)
		require.False(t, res.Degraded)
	}
	require.Equal(t, asked+100, store.calls.Load(), "every call after recovery is decided by the store")
}

// A caller's own short deadline says nothing of the store: a handful of
// them must not open the breaker for everyone. A 1-per-minute fail-open
// limit used to grant 1,000 of 1,000 calls after five of them.
func TestCallerDeadlineIsNoStoreFailure(t *testing.T) {
	ctx := context.Background()
	store := &hookStore{Store: must(memstore.New())}
	mock := newMock()
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute, FailOpen: true},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(5, time.Minute))
	require.NoError(t, err)
	// The store takes a few milliseconds; the callers give it one.
	store.apply = func(ctx context.Context, _ string) error {
		mock.Add(time.Millisecond)
		<-ctx.Done()
		return ctx.Err()
	}
	for range 10 {
		dctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		_, err := lim.Limit(dctx, "l", "k")
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	}
	store.apply = nil
	granted := 0
	for range 1000 {
		res, err := lim.Limit(ctx, "l", "k")
		require.NoError(t, err)
		require.False(t, res.Degraded)
		if res.OK {
			granted++
		}
	}
	require.Equal(t, 1, granted, "the store decides: one call per minute")
}

// manualCtx is a context whose deadline the test ends by hand, so that
// no real time passes.
type manualCtx struct {
	context.Context
	done chan struct{}
	err  atomic.Value
}

func newManualCtx() *manualCtx {
	return &manualCtx{Context: context.Background(), done: make(chan struct{})}
}

func (c *manualCtx) Deadline() (time.Time, bool) { return t0.Add(time.Hour), true }
func (c *manualCtx) Done() <-chan struct{}       { return c.done }
func (c *manualCtx) Err() error {
	if e, ok := c.err.Load().(error); ok {
		return e
	}
	return nil
}
func (c *manualCtx) expire() { c.err.Store(context.DeadlineExceeded); close(c.done) }

// gateStore holds each Apply in the store until the test releases
// it; a "slow" key waits for its caller's context instead.
type gateStore struct {
	ratelimit.Store
	entered chan string
	release chan struct{}
}

func (s *gateStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	key := op.Items[0].Key
	s.entered <- key
	if key == "slow" {
		<-ctx.Done()
		return ctx.Err()
	}
	<-s.release
	return s.Store.Apply(ctx, op, out)
}

// A caller whose deadline passes counts as a store failure only when the
// store answered no other call meanwhile (docs/production.md). Call A,
// asked before B, is answered while B waits: B's deadline is its own.
// The breaker once recorded the start of an answered call, not the time
// of its answer, so that A's answer looked older than B and B, counted
// as a failure, opened the breaker.
func TestAnswerDuringWaitIsNoStoreFailure(t *testing.T) {
	mock := newMock()
	store := &gateStore{Store: must(memstore.New()), entered: make(chan string), release: make(chan struct{})}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(1, time.Minute))
	require.NoError(t, err)

	aDone := make(chan error)
	go func() {
		_, err := lim.Limit(context.Background(), "l", "a")
		aDone <- err
	}()
	require.Equal(t, "a", <-store.entered) // A is in the store since t0

	mock.Add(10 * time.Millisecond)
	bctx := newManualCtx()
	bDone := make(chan error)
	go func() {
		_, err := lim.Limit(bctx, "l", "slow")
		bDone <- err
	}()
	require.Equal(t, "slow", <-store.entered) // B is in the store since t0+10ms

	mock.Add(290 * time.Millisecond) // t0+300ms: the store answers A
	close(store.release)
	require.NoError(t, <-aDone)

	mock.Add(100 * time.Millisecond) // t0+400ms: B's deadline passes
	bctx.expire()
	berr := <-bDone
	require.ErrorIs(t, berr, context.DeadlineExceeded)
	require.NotErrorIs(t, berr, ratelimit.ErrStoreUnavailable,
		"the store answered A while B waited: B's deadline is its own, not a store failure")
}

// A store slow for everyone still opens the breaker, deadlines or not:
// calls that waited for it long, while it answered nobody, are failures.
//
// So does it after the wall clock went back.
func TestSlowStoreOpensTheBreaker(t *testing.T) {
	for _, back := range []bool{false, true} {
		t.Run(map[bool]string{false: "clock steady", true: "clock set back"}[back], func(t *testing.T) {
			ctx := context.Background()
			store := &hookStore{Store: must(memstore.New())}
			mock := newMock()
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
			}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, time.Minute))
			require.NoError(t, err)
			if back {
				// The time of the store's latest answer, by which a caller's
				// deadline is told from a stalled store, is wall-clock time,
				// which may go back (a step of NTP, or a clock given to
				// WithClock set back). An answer timed before the step looked
				// newer than every call after it, each deadline the caller's
				// own: a store stalled for everyone never opened the breaker,
				// for as long as the step. Once a stalled call finds the latest
				// answer ahead of its clock, it forgets it.
				mock.Add(time.Hour)
				_, err = lim.Limit(ctx, "l", "k") // answered an hour ahead
				require.NoError(t, err)
				mock.Set(t0)
			}
			store.apply = func(ctx context.Context, _ string) error {
				mock.Add(time.Second) // stalled
				<-ctx.Done()
				return ctx.Err()
			}
			call := func() error {
				dctx, cancel := mock.WithTimeout(ctx, time.Millisecond) // on the mock clock: no real deadline to pass before the store is asked
				defer cancel()
				_, err := lim.Limit(dctx, "l", "k")
				return err
			}
			for range 3 {
				require.ErrorIs(t, call(), ratelimit.ErrStoreUnavailable)
			}
			asked := store.calls.Load()
			res, err := lim.Limit(ctx, "l", "k")
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
			require.True(t, res.Degraded)
			require.Equal(t, asked, store.calls.Load(), "open: the store is not asked")

			// A call that waited long while the store answered others is the
			// caller's own: it does not count.
			store.apply = nil
			mock.Add(time.Minute)
			res, err = lim.Limit(ctx, "l", "k") // the probe closes the breaker
			require.NoError(t, err)
			require.True(t, res.OK)
			var stall func(ctx context.Context, _ string) error
			stall = func(ctx context.Context, _ string) error {
				mock.Add(time.Second)
				store.apply = nil // meanwhile, the store answers another caller
				_, err := lim.Limit(context.Background(), "l", "other")
				require.NoError(t, err)
				store.apply = stall
				<-ctx.Done()
				return ctx.Err()
			}
			store.apply = stall
			for range 5 {
				dctx, cancel := mock.WithTimeout(ctx, time.Millisecond)
				_, err = lim.Limit(dctx, "l", "k")
				cancel()
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable)
			}
			store.apply = nil
			res, err = lim.Limit(ctx, "l", "k")
			require.NoError(t, err)
			require.False(t, res.Degraded)
		})
	}
}

// flakyBinder is a flakyStore that binds its limits, so that the Limiter
// decides a single limit's calls through BoundLimits, which fail with it.
type flakyBinder struct {
	flakyStore
	decides atomic.Int64
}

func (s *flakyBinder) Bind(name string, p driver.Params, phase func(string) int64) driver.BoundLimit {
	return &flakyBound{BoundLimit: s.Store.(driver.Binder).Bind(name, p, phase), s: s}
}

type flakyBound struct {
	driver.BoundLimit
	s *flakyBinder
}

func (b *flakyBound) Decide(ctx context.Context, key string, mode driver.Mode, now int64, count float64, reserve bool) (driver.Verdict, error) {
	b.s.calls.Add(1)
	b.s.decides.Add(1)
	if b.s.fail.Load() {
		return driver.Verdict{}, errDown
	}
	return b.BoundLimit.Decide(ctx, key, mode, now, count, reserve)
}

func (b *flakyBound) Store() ratelimit.Store { return b.s }

// A store that fails on the bound path (a call without options, or with
// a count) is answered by the failure policy and counted by the breaker,
// as on Apply's.
func TestFailureThroughBinder(t *testing.T) {
	ctx := context.Background()
	store := &flakyBinder{flakyStore: flakyStore{Store: must(memstore.New())}}
	mock := newMock()
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"closed": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
		"open":   {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, 5*time.Second))
	require.NoError(t, err)

	res, err := lim.Limit(ctx, "closed", "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	require.EqualValues(t, 1, store.decides.Load(), "the call went through the BoundLimit")

	store.fail.Store(true)
	res, err = lim.Limit(ctx, "closed", "k")
	requireFailedClosed(t, res, err, "closed")

	res, err = lim.Limit(ctx, "open", "k", ratelimit.Count(2))
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	assert.True(t, res.OK)
	assert.True(t, res.Degraded)
	assert.Equal(t, 2.0, res.Count)
	require.EqualValues(t, 3, store.decides.Load())

	// A done context is the caller's, not a failure: the breaker does
	// not count it.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = lim.Check(cctx, "closed", "k")
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable)

	// The third failure opens the breaker: the store is not asked again.
	_, err = lim.Check(ctx, "closed", "k")
	require.ErrorIs(t, err, errDown)
	calls := store.calls.Load()
	for range 5 {
		_, err = lim.Limit(ctx, "closed", "k")
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	}
	require.Equal(t, calls, store.calls.Load(), "an open breaker does not ask the store")

	// After the cool-down the store answers again.
	store.fail.Store(false)
	mock.Add(5 * time.Second)
	res, err = lim.Limit(ctx, "closed", "k")
	require.NoError(t, err)
	assert.True(t, res.OK)
	assert.False(t, res.Degraded)
}

// invalidOpStore refuses every op of the limit "bad" as invalid, as a store
// does (driver.CheckOp) an op that a bug made: a refusal of that op alone,
// made before the store is asked anything.
type invalidOpStore struct{ *memstore.Store }

func (s invalidOpStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if len(op.Items) > 0 && op.Items[0].Name == "bad" {
		return fmt.Errorf("teststore: %w: item 0 (%q) is of a bug", driver.ErrInvalidOp, op.Items[0].Name)
	}
	return s.Store.Apply(ctx, op, out)
}

// An op the store refuses as invalid (driver.ErrInvalidOp) says nothing of
// the store's health: it is answered by its limit's failure policy, but
// does not count toward the breaker, which would otherwise open for every
// limit and key on the calls of one limit.
func TestInvalidOpIsNoStoreFailure(t *testing.T) {
	ctx := context.Background()
	store := invalidOpStore{must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"bad":  {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
		"good": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(newMock()), ratelimit.WithBreaker(2, time.Hour))
	require.NoError(t, err)
	for range 5 {
		res, err := lim.Limit(ctx, "bad", "k")
		require.ErrorIs(t, err, driver.ErrInvalidOp)
		require.True(t, res.OK, "the failure policy answers: fail open")
		require.True(t, res.Degraded)
	}
	res, err := lim.Limit(ctx, "good", "k")
	require.NoError(t, err, "the breaker opened on invalid ops")
	require.True(t, res.OK)
	require.False(t, res.Degraded)
}

// A record the store cannot read (driver.ErrBadRecord: one key's damage,
// or a foreign value under the store's prefix) says nothing of the store's
// health either: the failure policy answers the call, but the breaker does
// not count it, or one damaged hot key would open it for every limit and
// key. The same holds on the bound fast path.
func TestBadRecordIsNoStoreFailure(t *testing.T) {
	ctx := context.Background()
	bad := fmt.Errorf("teststore: key %q: %w", "k", driver.ErrBadRecord)
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprintf("bound=%v", bound), func(t *testing.T) {
			hook, store := hooked(bound)
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
			}, ratelimit.WithClock(newMock()), ratelimit.WithBreaker(2, time.Hour))
			require.NoError(t, err)
			hook.apply = func(context.Context, string) error { return bad }
			for range 5 {
				res, err := lim.Limit(ctx, "l", "k")
				require.ErrorIs(t, err, driver.ErrBadRecord)
				require.True(t, res.OK, "the failure policy answers: fail open")
				require.True(t, res.Degraded)
			}
			hook.apply = nil
			calls := hook.calls.Load()
			res, err := lim.Limit(ctx, "l", "other")
			require.NoError(t, err, "the breaker opened on bad records")
			require.True(t, res.OK)
			require.False(t, res.Degraded)
			require.Equal(t, calls+1, hook.calls.Load(), "the store was asked")
		})
	}
}

// A probe whose store panics, with a caller that recovers (as net/http
// does for a handler), leaves the breaker to the next call: it stayed
// marked in flight, and the breaker open for good, every call decided by
// the failure policy however long the store had been back.
func TestBreakerPanickingProbe(t *testing.T) {
	ctx := context.Background()
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprintf("bound=%v", bound), func(t *testing.T) {
			hook, store := hooked(bound)
			mock := newMock()
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"l": {Kind: ratelimit.TokenBucket, Rate: 1000, Period: time.Second},
			}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, time.Second))
			require.NoError(t, err)
			hook.apply = func(context.Context, string) error { return errDown }
			for range 3 {
				_, err := lim.Limit(ctx, "l", "k")
				require.ErrorIs(t, err, errDown)
			}
			mock.Add(time.Second)
			hook.apply = func(context.Context, string) error { panic("store bug") }
			require.PanicsWithValue(t, "store bug", func() { _, _ = lim.Limit(ctx, "l", "k") })

			hook.apply = nil
			mock.Add(time.Second) // past any cool-down
			res, err := lim.Limit(ctx, "l", "k")
			require.NoError(t, err, "the breaker stayed open")
			require.True(t, res.OK)
			require.False(t, res.Degraded)
		})
	}
}

// hooked returns a hookStore over a memstore and the Store to give the
// Limiter: the hookStore itself, or, if bound, a hookBinder of it, so
// that the calls of a single limit go through BoundLimits.
func hooked(bound bool) (*hookStore, ratelimit.Store) {
	hook := &hookStore{Store: must(memstore.New())}
	if bound {
		return hook, &hookBinder{hook}
	}
	return hook, hook
}

// hookBinder is a hookStore whose limits are bound: its BoundLimits run
// the hook too.
type hookBinder struct{ *hookStore }

func (s *hookBinder) Bind(name string, p driver.Params, phase func(string) int64) driver.BoundLimit {
	return &hookBound{BoundLimit: s.Store.(driver.Binder).Bind(name, p, phase), s: s}
}

type hookBound struct {
	driver.BoundLimit
	s *hookBinder
}

func (b *hookBound) Decide(ctx context.Context, key string, mode driver.Mode, now int64, count float64, reserve bool) (driver.Verdict, error) {
	b.s.calls.Add(1)
	if b.s.apply != nil {
		if err := b.s.apply(ctx, key); err != nil {
			return driver.Verdict{}, err
		}
	}
	return b.BoundLimit.Decide(ctx, key, mode, now, count, reserve)
}

func (b *hookBound) Store() ratelimit.Store { return b.s }

// A breaker that opens after some failures must stay open for a while:
// WithBreaker(3, 0), or a negative cool-down, was taken and left a
// breaker that never held, every call asking the store again, with
// nothing to tell the caller why. It is refused, as other bad arguments
// are; WithBreaker(0, 0) still disables the breaker.
func TestWithBreakerRefusesACooldownNotAbove0(t *testing.T) {
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}}
	for _, cooldown := range []time.Duration{0, -time.Second} {
		_, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithBreaker(3, cooldown))
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "WithBreaker(3, %v)", cooldown)
		assert.Contains(t, err.Error(), "WithBreaker")
	}
	for _, failures := range []int{0, -1} {
		_, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithBreaker(failures, 0))
		require.NoError(t, err, "WithBreaker(%d, 0) disables the breaker", failures)
	}
}

// A refusal of the failure policy tells the caller to come back when the
// breaker lets a probe through, however far off: a cool-down too long to
// round up to whole milliseconds (WithBreaker(n, math.MaxInt64), "never
// ask again") is told as the longest wait a decision reports,
// driver.MaxRetryAfter. Its rounding overflowed, and every refusal said
// to retry in 1 ms.
func TestBreakerHugeCooldownRetryAfter(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	mock := newMock()
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(1, math.MaxInt64))
	require.NoError(t, err)
	store.fail.Store(true)
	longest := time.Duration(driver.MaxRetryAfter) * time.Millisecond
	for _, what := range []string{"the failure that opens the breaker", "a call while it is open"} {
		res, err := lim.Limit(ctx, "l", "k")
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, what)
		require.False(t, res.OK, what)
		assert.Equal(t, longest, res.RetryAfter, what)
	}
	require.EqualValues(t, 1, store.calls.Load(), "open: the store is not asked")
}

// A clock set back while the breaker is open (the real clock's monotonic
// reading cannot go back, but one given to WithClock may) keeps it open
// one cool-down from then, not the step's length more: it stayed open,
// and told callers to retry, an hour and a cool-down later. A step
// shorter than a cool-down did that too (open a cool-down and a half
// after a step of half a cool-down): a step within one cool-down looked
// like a call that read the clock before the failure that opened the
// breaker.
func TestBreakerClockSetBack(t *testing.T) {
	for _, back := range []time.Duration{time.Hour, 5 * time.Second, 2500 * time.Millisecond, time.Millisecond} {
		t.Run(back.String(), func(t *testing.T) {
			ctx := context.Background()
			store := &flakyStore{Store: must(memstore.New())}
			mock := newMock()
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
			}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, 5*time.Second))
			require.NoError(t, err)
			mock.Add(time.Hour)
			store.fail.Store(true)
			for range 3 {
				_, err := lim.Limit(ctx, "l", "k")
				require.ErrorIs(t, err, errDown)
			}
			store.fail.Store(false)

			mock.Set(mock.Now().Add(-back))
			stepped := mock.Now()
			res, err := lim.Limit(ctx, "l", "k")
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
			assert.True(t, res.Degraded)
			assert.Equal(t, 5*time.Second, res.RetryAfter, "open one cool-down from now")
			var se *ratelimit.StoreError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, stepped.Add(5*time.Second), se.Until)

			mock.Add(5 * time.Second)
			res, err = lim.Limit(ctx, "l", "k") // the probe
			require.NoError(t, err, "the breaker stayed open past its cool-down")
			assert.True(t, res.OK)
			assert.False(t, res.Degraded)
		})
	}
}

// hookClock is a mock clock that runs hook, once, at the next reading
// after it is set: that reading is the time before the hook ran.
type hookClock struct {
	*clock.Mock
	hook func()
}

func (c *hookClock) Now() time.Time {
	now := c.Mock.Now()
	if h := c.hook; h != nil {
		c.hook = nil
		h()
	}
	return now
}

// oneFailureFromOpen makes a Limiter of limit "l" whose breaker opens
// at the third failure in a row, with a cool-down of 5 s, on a failing
// store that failed two calls already, and a clock whose hook runs once a
// call read it.
func oneFailureFromOpen(t *testing.T) (*flakyStore, *hookClock, *ratelimit.Limiter) {
	t.Helper()
	store := &flakyStore{Store: must(memstore.New())}
	mock := &hookClock{Mock: newMock()}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, 5*time.Second))
	require.NoError(t, err)
	store.fail.Store(true)
	for range 2 {
		_, err := lim.Limit(context.Background(), "l", "k")
		require.ErrorIs(t, err, errDown)
	}
	return store, mock, lim
}

// A call that read the clock before the failure that opened the breaker,
// and asks it only after, is no clock set back: it must not shorten the
// cool-down. One that read it more than a cool-down before (a goroutine
// kept off the CPU that long) moved the breaker's probe to a cool-down
// after its own reading, already past: the next call probed at once.
func TestBreakerCallThatReadTheClockEarly(t *testing.T) {
	ctx := context.Background()
	store, mock, lim := oneFailureFromOpen(t)
	read := mock.Now()
	mock.hook = func() {
		// Once the call read the clock, the time passes and another call's
		// failure opens the breaker.
		mock.Add(12 * time.Second)
		_, err := lim.Limit(ctx, "l", "k")
		require.ErrorIs(t, err, errDown)
	}
	res, err := lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	var se *ratelimit.StoreError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, read.Add(17*time.Second), se.Until, "the probe a cool-down after the failure")
	assert.Equal(t, 17*time.Second, res.RetryAfter)
	asked := store.calls.Load()

	_, err = lim.Limit(ctx, "l", "k") // 12 s after the call read the clock
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "still open")
	require.Equal(t, asked, store.calls.Load(), "open: the store is not asked")
}

// heldStore fails every call; a call of a key in hold first waits in the
// store until the test closes the key's channel.
type heldStore struct {
	ratelimit.Store
	calls   atomic.Int64
	entered chan string
	hold    map[string]chan struct{}
}

func (s *heldStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	s.calls.Add(1)
	key := op.Items[0].Key
	if h, ok := s.hold[key]; ok {
		s.entered <- key
		<-h
	}
	return errDown
}

// One call at a time probes the store. A call that started before the
// breaker opened and failed while the probe was under way let a second
// probe through at the end of the next cool-down, the first still in
// the store: a failure freed the probe's place, whether or not it was
// the probe's.
func TestBreakerLateFailureDuringTheProbe(t *testing.T) {
	ctx := context.Background()
	store := &heldStore{Store: must(memstore.New()), entered: make(chan string),
		hold: map[string]chan struct{}{"late": make(chan struct{}), "probe": make(chan struct{})}}
	mock := newMock()
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(1, time.Second))
	require.NoError(t, err)
	call := func(key string) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := lim.Limit(ctx, "l", key)
			done <- err
		}()
		require.Equal(t, key, <-store.entered)
		return done
	}

	late := call("late") // in the store before the breaker opens
	_, err = lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, errDown, "the failure that opens the breaker")
	mock.Add(time.Second)
	probe := call("probe")
	close(store.hold["late"])
	require.ErrorIs(t, <-late, errDown)

	probeHoldsItsPlace(t, lim, mock, &store.calls, store.hold["probe"], probe)
}

// An answer to a call that went to the store before the breaker opened
// closes it, even while a probe is in the store. If the breaker opens
// again and a new probe goes, the old probe's failure is a late call's:
// it freed the new probe's place, and a third call probed with the
// second still in the store; so did the old probe's caller leaving. On
// Apply's path and a BoundLimit's alike.
func TestBreakerOldProbeEndsDuringTheNewOne(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		bound, leaves bool // the old probe's caller leaves, or the store fails it
	}{{false, false}, {false, true}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("bound=%v,leaves=%v", c.bound, c.leaves), func(t *testing.T) {
			hook, store := hooked(c.bound)
			mock := newMock()
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
			}, ratelimit.WithClock(mock), ratelimit.WithBreaker(1, time.Second))
			require.NoError(t, err)
			// call starts a call of key that waits in the store until
			// its channel is closed, then answers with err.
			entered := make(chan struct{})
			call := func(ctx context.Context, key string, err error) (release chan struct{}, done chan error) {
				release, done = make(chan struct{}), make(chan error, 1)
				hook.apply = func(context.Context, string) error {
					entered <- struct{}{}
					<-release
					return err
				}
				go func() {
					_, err := lim.Limit(ctx, "l", key)
					done <- err
				}()
				<-entered
				hook.apply = func(context.Context, string) error { return errDown }
				return release, done
			}

			lateRelease, late := call(ctx, "late", nil) // before the breaker opens
			_, err = lim.Limit(ctx, "l", "k")
			require.ErrorIs(t, err, errDown, "the failure that opens the breaker")
			mock.Add(time.Second)
			oldCtx, leave := context.WithCancel(ctx)
			defer leave()
			oldErr := errDown
			if c.leaves {
				oldErr = context.Canceled
			}
			oldRelease, old := call(oldCtx, "old", oldErr) // the first probe
			close(lateRelease)
			require.NoError(t, <-late, "the late answer closes the breaker")
			_, err = lim.Limit(ctx, "l", "k")
			require.ErrorIs(t, err, errDown, "the failure that opens the breaker again")
			mock.Add(time.Second)
			newRelease, probe := call(ctx, "new", errDown) // the second probe
			if c.leaves {
				leave()
			}
			close(oldRelease)
			require.ErrorIs(t, <-old, oldErr)

			probeHoldsItsPlace(t, lim, mock, &hook.calls, newRelease, probe)
		})
	}
}

// probeHoldsItsPlace checks a Limiter whose breaker, of a one-second
// cool-down, has a probe in the store, held there until release is
// closed, that fails (done reports its error): a cool-down later, no
// other call probes (calls counts the store's calls); once the probe has
// failed, the next call probes a cool-down after it.
func probeHoldsItsPlace(t *testing.T, lim *ratelimit.Limiter, mock *clock.Mock, calls *atomic.Int64, release chan struct{}, done chan error) {
	t.Helper()
	ctx := context.Background()
	mock.Add(time.Second)
	asked := calls.Load()
	for range 3 {
		_, err := lim.Limit(ctx, "l", "k")
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	}
	require.Equal(t, asked, calls.Load(), "the probe is still in the store: nobody else probes")

	close(release)
	require.ErrorIs(t, <-done, errDown)
	mock.Add(time.Second)
	_, err := lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, errDown, "the probe failed: the next probe goes through a cool-down later")
	require.Equal(t, asked+1, calls.Load())
}

// The breaker's opening is logged once, as its closing is: the calls in
// the store when it opened, failing after it, are store failures (Warn)
// but open nothing. Each logged the opening again, at error level: a busy
// server whose store went down logged it once per request in flight.
// A probe that fails opens the breaker again, and says so.
func TestBreakerOpeningIsLoggedOnce(t *testing.T) {
	ctx := context.Background()
	held := make(chan struct{})
	store := &heldStore{Store: must(memstore.New()), entered: make(chan string),
		hold: map[string]chan struct{}{"a": held, "b": held, "c": held, "d": held}}
	mock := newMock()
	var logs bytes.Buffer
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(2, time.Second),
		ratelimit.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	done := make(chan error)
	for _, key := range []string{"a", "b", "c", "d"} {
		go func() {
			_, err := lim.Limit(ctx, "l", key)
			done <- err
		}()
		<-store.entered
	}
	close(held)
	for range 4 {
		require.ErrorIs(t, <-done, errDown)
	}
	opening := "store failing repeatedly"
	assert.Equal(t, 4, strings.Count(logs.String(), "store failed;"), "each failure is logged")
	assert.Equal(t, 1, strings.Count(logs.String(), opening), "the opening is logged once:\n%s", &logs)

	mock.Add(time.Second)
	_, err = lim.Limit(ctx, "l", "k") // the probe fails
	require.ErrorIs(t, err, errDown)
	assert.Equal(t, 2, strings.Count(logs.String(), opening), "a failed probe opens the breaker again")
}

// At the end of the cool-down, calls arriving together let exactly one of
// them probe the store, on Apply's path and on a BoundLimit's alike; the
// others are answered by the policy at once, and its success closes the
// breaker for all.
func TestBreakerOneProbeAmongMany(t *testing.T) {
	ctx := context.Background()
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprintf("bound=%v", bound), func(t *testing.T) {
			hook, store := hooked(bound)
			mock := newMock()
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"l": {Kind: ratelimit.TokenBucket, Rate: 1000, Period: time.Second, FailOpen: true},
			}, ratelimit.WithClock(mock), ratelimit.WithBreaker(2, time.Second))
			require.NoError(t, err)
			hook.apply = func(context.Context, string) error { return errDown }
			for range 2 {
				_, err := lim.Limit(ctx, "l", "k")
				require.ErrorIs(t, err, errDown)
			}
			mock.Add(time.Second)
			const callers = 32
			entered, release := make(chan struct{}, callers), make(chan struct{})
			hook.apply = func(context.Context, string) error {
				entered <- struct{}{}
				<-release
				return nil
			}
			var wg sync.WaitGroup
			var degraded atomic.Int64
			probe := make(chan ratelimit.Result, callers)
			for i := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := lim.Limit(ctx, "l", fmt.Sprint("k", i))
					if res.Degraded {
						assert.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
						degraded.Add(1)
						return
					}
					assert.NoError(t, err)
					probe <- res
				}()
			}
			// Each caller is either answered by the policy or in the store.
			for degraded.Load()+int64(len(entered)) < callers {
				runtime.Gosched()
			}
			assert.Len(t, entered, 1, "one call probes")
			close(release)
			wg.Wait()
			require.Len(t, probe, 1, "one call probed")
			require.True(t, (<-probe).OK)
			require.EqualValues(t, 2+1, hook.calls.Load(), "the others did not ask the store")

			hook.apply = nil
			res, err := lim.Limit(ctx, "l", "k")
			require.NoError(t, err, "the probe closed the breaker")
			require.False(t, res.Degraded)
		})
	}
}

// While the probe is in the store, a fail-closed refusal says to come
// back a cool-down later, when another probe may go if this one fails
// (it closes the breaker sooner if it succeeds), and its StoreError's
// Until is that time. It said to retry in 1 ms, with an Until already
// past, for as long as the probe took (up to its caller's deadline on a
// stalled store): every refused client was told to call again at once.
func TestBreakerRefusalDuringTheProbe(t *testing.T) {
	ctx := context.Background()
	store := &heldStore{Store: must(memstore.New()), entered: make(chan string),
		hold: map[string]chan struct{}{"probe": make(chan struct{})}}
	mock := newMock()
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(1, 5*time.Second))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, errDown, "the failure that opens the breaker")
	mock.Add(5 * time.Second)
	probe := make(chan error)
	go func() {
		_, err := lim.Limit(ctx, "l", "probe")
		probe <- err
	}()
	require.Equal(t, "probe", <-store.entered)

	mock.Add(2 * time.Second) // the probe waits
	res, err := lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.False(t, res.OK)
	assert.Equal(t, 5*time.Second, res.RetryAfter, "a cool-down: the earliest another probe may go")
	var se *ratelimit.StoreError
	require.ErrorAs(t, err, &se)
	assert.Nil(t, se.Err, "the store was not asked")
	assert.Equal(t, mock.Now().Add(5*time.Second), se.Until)

	close(store.hold["probe"])
	require.ErrorIs(t, <-probe, errDown)
	res, err = lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	assert.Equal(t, 5*time.Second, res.RetryAfter, "the probe failed: open a cool-down from its failure")
}

// silentStore stalls every Apply until its caller's context ends, unless
// applies is set, and every Load too unless answer is set; a Load says so
// on entered first (buffered: a test that need not wait for a Load does
// not read it).
type silentStore struct {
	ratelimit.Store
	calls   atomic.Int64
	applies atomic.Bool
	answer  atomic.Bool
	entered chan struct{}
	// mock, when set, moves on a millisecond as a call comes in, which
	// passes the deadline of a caller's context on it.
	mock *clock.Mock
}

func (s *silentStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	s.calls.Add(1)
	if s.applies.Load() {
		return s.Store.Apply(ctx, op, out)
	}
	if s.mock != nil {
		s.mock.Add(time.Millisecond)
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *silentStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	s.entered <- struct{}{}
	if s.answer.Load() {
		return s.Store.Load(ctx, ids, out)
	}
	<-ctx.Done()
	return ctx.Err()
}

// warnings is a slog handler that passes the message of every record at
// warn level or above to a channel.
type warnings chan string

func (w warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w warnings) Handle(_ context.Context, r slog.Record) error {
	w <- r.Message
	return nil
}
func (w warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w warnings) WithGroup(string) slog.Handler      { return w }

// A stalled store opens the breaker even when every caller's deadline is
// shorter than the quarter of a second that makes a deadline count:
// the Limiter checks the store itself, giving it that long. Callers of
// 1 ms deadlines used to pay their deadline for as long as the store
// stalled, and get context.DeadlineExceeded, never the failure policy.
// A store that answers the check is healthy, the deadlines the callers'.
func TestShortDeadlinesOpenTheBreakerOnAStalledStore(t *testing.T) {
	for _, healthy := range []bool{false, true} {
		t.Run(map[bool]string{false: "stalled", true: "healthy"}[healthy], func(t *testing.T) {
			mock := newMock()
			store := &silentStore{Store: must(memstore.New()), entered: make(chan struct{}, 16), mock: mock}
			store.answer.Store(healthy)
			logged := make(warnings, 16)
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
			}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, time.Minute), ratelimit.WithLogger(slog.New(logged)))
			require.NoError(t, err)
			call := func() (ratelimit.Result, error) {
				// A deadline on the mock clock, which the store passes: a
				// real millisecond could pass before the store is asked.
				dctx, cancel := mock.WithTimeout(context.Background(), time.Millisecond)
				defer cancel()
				return lim.Limit(dctx, "l", "k")
			}
			for range 3 {
				_, err := call()
				require.ErrorIs(t, err, context.DeadlineExceeded, "the caller's own deadline")
				if healthy {
					mock.Add(time.Millisecond)
					continue
				}
				awaitOrFail(t, store.entered, "the Limiter's own check of the store")
				mock.Add(250 * time.Millisecond)
				require.Equal(t, "ratelimit: store failed; the failure policy decides", <-logged)
			}
			asked := store.calls.Load()
			res, err := call()
			if healthy {
				require.ErrorIs(t, err, context.DeadlineExceeded, "a store that answers the check: the breaker stays closed")
				require.Equal(t, asked+1, store.calls.Load())
				return
			}
			require.Equal(t, "ratelimit: store failing repeatedly; not asking it during the cool-down", <-logged)
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "open: the failure policy decides")
			require.True(t, res.OK && res.Degraded)
			require.Equal(t, asked, store.calls.Load(), "open: the store is not asked")
		})
	}
}

// awaitOrFail waits for a value on ch; should none come before the test
// binary's deadline (go test -timeout) is near, the test fails, naming
// what it waited for, rather than the binary ending in a dump of every
// goroutine.
func awaitOrFail[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	var near <-chan time.Time
	if d, ok := t.Deadline(); ok {
		timer := time.NewTimer(time.Until(d) * 9 / 10)
		defer timer.Stop()
		near = timer.C
	}
	select {
	case v := <-ch:
		return v
	case <-near:
		t.Fatalf("waited in vain for %s", what)
		panic("unreachable")
	}
}
