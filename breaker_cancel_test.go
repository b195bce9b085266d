package ratelimit_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

// cancelStalled returns a fail-open Limiter (WithBreaker(3, time.Minute))
// on a hooked store, bound or not, whose calls of the key "k" stall: each
// moves the mock clock on by wait, then cancels its caller's context
// (cancel, set by the caller before the call) and returns its error,
// while the calls of any other key are answered. The store's reads (the
// Limiter's own check) say so on entered, then stall until their context
// ends, or, with answer not nil, answer once the test sends on answer;
// loads counts them.
func cancelStalled(t *testing.T, bound bool, wait time.Duration, answer chan struct{}) (lim *ratelimit.Limiter, mock *clock.Mock, hook *hookStore, cancel *context.CancelFunc, entered chan struct{}, loads *atomic.Int64) {
	t.Helper()
	hook, store := hooked(bound)
	mock = newMock()
	cancel = new(context.CancelFunc)
	entered = make(chan struct{}, 16)
	loads = new(atomic.Int64)
	hook.apply = func(ctx context.Context, key string) error {
		if key != "k" {
			return nil
		}
		mock.Add(wait)
		(*cancel)()
		<-ctx.Done()
		return ctx.Err()
	}
	hook.load = func(ctx context.Context, _ string) error {
		loads.Add(1)
		entered <- struct{}{}
		if answer != nil {
			<-answer
			return nil
		}
		<-ctx.Done()
		return ctx.Err()
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(3, time.Minute))
	require.NoError(t, err)
	return lim, mock, hook, cancel, entered, loads
}

// canceledCall calls lim.Limit for the key "k" with a context that has no
// deadline, which the store cancels (cancelStalled).
func canceledCall(t *testing.T, lim *ratelimit.Limiter, cancel *context.CancelFunc) {
	t.Helper()
	ctx, c := context.WithCancel(context.Background())
	defer c()
	*cancel = c
	_, err := lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, context.Canceled, "the caller's own cancel")
	require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable, "a cancel is no store failure")
}

// awaitCheckDone waits for the Limiter's own check of the store to end.
func awaitCheckDone(lim *ratelimit.Limiter) {
	for ratelimit.Checking(lim) {
		runtime.Gosched()
	}
}

// Callers that set no deadline and are only canceled (an HTTP handler
// whose client went away) open the breaker on a stalled store: a cancel
// that came a quarter of a second or more after the call went, with no
// answer of the store to anyone meanwhile, sends the Limiter's own check,
// as a deadline does, and the check's failure counts. The cancels
// themselves count nothing. Only deadlines sent the check: a stalled store
// never opened the breaker, and a fail-open limit's policy never applied,
// every request waiting until its client gave up.
func TestCanceledCallersOpenTheBreakerOnAStalledStore(t *testing.T) {
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprint("bound=", bound), func(t *testing.T) {
			lim, mock, hook, cancel, entered, _ := cancelStalled(t, bound, 300*time.Millisecond, nil)
			for i := range 3 {
				canceledCall(t, lim, cancel)
				require.True(t, ratelimit.Checking(lim), "call %d: canceled after 300 ms with no answer: the Limiter checks the store", i)
				awaitOrFail(t, entered, "the Limiter's own check of the store")
				mock.Add(250 * time.Millisecond) // the check's quarter of a second, unanswered
				awaitCheckDone(lim)
			}
			asked := hook.calls.Load()
			res, err := lim.Limit(context.Background(), "l", "k") // no deadline, no cancel
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "open: the failure policy decides")
			require.True(t, res.OK && res.Degraded, "the limit fails open")
			require.Equal(t, asked, hook.calls.Load(), "open: the store is not asked")
		})
	}
}

// A cancel that comes sooner than a quarter of a second after the call
// went says nothing of the store, and sends no check: a client that goes
// away at once costs the store nothing more.
func TestEarlyCancelSendsNoCheck(t *testing.T) {
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprint("bound=", bound), func(t *testing.T) {
			lim, _, hook, cancel, _, loads := cancelStalled(t, bound, 249*time.Millisecond, nil)
			for i := range 5 {
				canceledCall(t, lim, cancel)
				require.False(t, ratelimit.Checking(lim), "call %d: canceled before a quarter of a second: no check", i)
			}
			require.Zero(t, loads.Load(), "no check of the store")
			requireAsked(t, lim, hook, "nothing counted: the breaker is closed")
		})
	}
}

// A cancel while the store answers counts nothing: neither when the store
// answered another call during the canceled one's wait (no check then),
// nor when it answered no call but answers the check.
func TestCancelWhileTheStoreAnswersCountsNothing(t *testing.T) {
	for _, bound := range []bool{false, true} {
		for _, how := range []string{"answered another call", "answered the check"} {
			t.Run(fmt.Sprint("bound=", bound, "/", how), func(t *testing.T) {
				var answer chan struct{}
				if how == "answered the check" {
					answer = make(chan struct{})
				}
				lim, mock, hook, cancel, entered, loads := cancelStalled(t, bound, 300*time.Millisecond, answer)
				if how == "answered another call" {
					stall := hook.apply
					hook.apply = func(ctx context.Context, key string) error {
						if key == "k" {
							mock.Add(time.Millisecond)
							_, err := lim.Limit(context.Background(), "l", "other") // answered meanwhile
							require.NoError(t, err)
						}
						return stall(ctx, key)
					}
				}
				for i := range 5 {
					canceledCall(t, lim, cancel)
					if how == "answered another call" {
						require.False(t, ratelimit.Checking(lim), "call %d: the store answered meanwhile: no check", i)
						continue
					}
					require.True(t, ratelimit.Checking(lim), "call %d: canceled after 300 ms with no answer: the Limiter checks the store", i)
					awaitOrFail(t, entered, "the Limiter's own check of the store")
					answer <- struct{}{}
					awaitCheckDone(lim)
				}
				if how == "answered another call" {
					require.Zero(t, loads.Load(), "no check of the store")
				} else {
					require.EqualValues(t, 5, loads.Load(), "one check a cancel")
				}
				requireAsked(t, lim, hook, "nothing counted: the breaker is closed")
			})
		}
	}
}

// A probe whose caller cancels after a quarter of a second with no answer
// of the store decides nothing: the cancel is no failure, the next call
// probes at once, and its answer closes the breaker; the check the cancel
// sent, whatever it finds, does not open it again alone.
func TestCanceledProbeSendsACheckAndFreesItsPlace(t *testing.T) {
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprint("bound=", bound), func(t *testing.T) {
			lim, mock, hook, cancel, entered, loads := cancelStalled(t, bound, 300*time.Millisecond, nil)
			for range 3 { // open the breaker, as in TestCanceledCallersOpenTheBreakerOnAStalledStore
				canceledCall(t, lim, cancel)
				awaitOrFail(t, entered, "the Limiter's own check of the store")
				mock.Add(250 * time.Millisecond)
				awaitCheckDone(lim)
			}
			_, err := lim.Limit(context.Background(), "l", "other")
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "open")

			mock.Add(time.Minute)
			canceledCall(t, lim, cancel) // the probe, canceled
			require.True(t, ratelimit.Checking(lim), "canceled after 300 ms with no answer: the Limiter checks the store")
			awaitOrFail(t, entered, "the Limiter's own check of the store")
			requireAsked(t, lim, hook, "the canceled probe freed its place: this call probes")

			mock.Add(250 * time.Millisecond) // the check's quarter of a second, unanswered
			awaitCheckDone(lim)
			require.EqualValues(t, 4, loads.Load(), "one check a late cancel")
			res, err := lim.Limit(context.Background(), "l", "other")
			require.NoError(t, err, "the breaker stays closed")
			require.False(t, res.Degraded)
		})
	}
}

// requireAsked requires a call on another key, with no deadline, to be
// decided by the store, the breaker closed (or the probe's place free):
// no error (why says why), not Degraded, and one call more to the store.
func requireAsked(t *testing.T, lim *ratelimit.Limiter, hook *hookStore, why string) {
	t.Helper()
	asked := hook.calls.Load()
	res, err := lim.Limit(context.Background(), "l", "other")
	require.NoError(t, err, why)
	require.False(t, res.Degraded)
	require.Equal(t, asked+1, hook.calls.Load(), "the store is asked")
}
