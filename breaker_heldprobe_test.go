package ratelimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A probe that the store holds without end does not hold the breaker
// open for every key: a caller without a deadline, whose key's row a
// stuck transaction locks (pgstore waits for a row lock as long as its
// context allows), kept every call of every key refused by the failure
// policy, the store answering all of them meanwhile. A cool-down after
// it went, the probe counts as failed; a cool-down after that, the next
// call probes, and its answer closes the breaker. The held probe's
// answer, when it comes, is a late call's. On Apply's path and a
// BoundLimit's alike.
func TestBreakerHeldProbeDoesNotHoldItOpen(t *testing.T) {
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprint("bound=", bound), func(t *testing.T) {
			ctx := context.Background()
			lim, mock, probe, free := heldProbe(t, bound)

			mock.Add(time.Second)
			res, err := lim.Limit(ctx, "l", "k")
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "a cool-down after the probe went, it counts as failed")
			assert.Equal(t, time.Second, res.RetryAfter, "the next probe goes a cool-down after that")

			mock.Add(time.Second)
			res, err = lim.Limit(ctx, "l", "k")
			require.NoError(t, err, "the next call probes, the held probe still in the store")
			assert.False(t, res.Degraded)
			res, err = lim.Limit(ctx, "l", "other")
			require.NoError(t, err, "its answer closed the breaker")
			assert.False(t, res.Degraded)

			free()
			require.NoError(t, <-probe)
		})
	}
}

// A clock given to WithClock set back while the probe is held: the probe
// counts as failed a cool-down from the first call after the step, not
// the step's length more.
func TestBreakerHeldProbeClockSetBack(t *testing.T) {
	ctx := context.Background()
	lim, mock, probe, free := heldProbe(t, false)

	mock.Set(mock.Now().Add(-time.Hour))
	_, err := lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "the probe is in the store")
	mock.Add(time.Second)
	res, err := lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "a cool-down after the step, the probe counts as failed")
	assert.Equal(t, time.Second, res.RetryAfter)
	mock.Add(time.Second)
	res, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err, "the next call probes, an hour before the held probe went")
	assert.False(t, res.Degraded)

	free()
	require.NoError(t, <-probe)
}

// heldProbe returns a Limiter on a store (hooked, bound or not) whose
// breaker opened on a failure (WithBreaker(1, time.Second)) and whose
// probe, a cool-down later, is held in the store on the key "locked",
// without a deadline, until free; the store answers every other call
// meanwhile. probe gets the held probe's error once it is freed.
func heldProbe(t *testing.T, bound bool) (lim *ratelimit.Limiter, mock *clock.Mock, probe chan error, free func()) {
	t.Helper()
	ctx := context.Background()
	hook, store := hooked(bound)
	var down atomic.Bool
	down.Store(true)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	free = func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	hook.apply = func(_ context.Context, key string) error {
		if key == "locked" {
			entered <- struct{}{}
			<-release
		}
		if down.Load() {
			return errDown
		}
		return nil
	}
	mock = newMock()
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(1, time.Second))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, errDown, "the failure that opens the breaker")
	mock.Add(time.Second)
	probe = make(chan error, 1)
	go func() {
		_, err := lim.Limit(ctx, "l", "locked") // no deadline
		probe <- err
	}()
	<-entered
	down.Store(false) // the store is back, but for the locked row
	return lim, mock, probe, free
}

// A call sent before the breaker opened that fails while a probe is held
// holds the next probe back a cool-down from its failure, as it does when
// the probe is not held. When the held probe counted as failed after
// that failure, the next probe was set a cool-down after that instead,
// over the later time the failure had set, and went half a cool-down
// after the failure here. On Apply's path and a BoundLimit's alike.
func TestBreakerHeldProbeKeepsALateFailuresCooldown(t *testing.T) {
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprint("bound=", bound), func(t *testing.T) {
			ctx := context.Background()
			hook, store := hooked(bound)
			var down atomic.Bool
			down.Store(true)
			entered := make(chan string)
			hold := map[string]chan struct{}{"late": make(chan struct{}), "locked": make(chan struct{})}
			hook.apply = func(_ context.Context, key string) error {
				if h, ok := hold[key]; ok {
					entered <- key
					<-h
					return errDown
				}
				if down.Load() {
					return errDown
				}
				return nil
			}
			mock := newMock()
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
			}, ratelimit.WithClock(mock), ratelimit.WithBreaker(1, time.Second))
			require.NoError(t, err)
			call := func(key string) chan error {
				done := make(chan error, 1)
				go func() {
					_, err := lim.Limit(ctx, "l", key) // no deadline
					done <- err
				}()
				require.Equal(t, key, <-entered)
				return done
			}

			late := call("late") // t0: in the store before the breaker opens
			_, err = lim.Limit(ctx, "l", "k")
			require.ErrorIs(t, err, errDown, "t0: the failure that opens the breaker")
			mock.Add(time.Second)
			probe := call("locked") // t1: the probe, held
			down.Store(false)

			mock.Add(1500 * time.Millisecond) // t2.5: no call since the probe went
			close(hold["late"])
			require.ErrorIs(t, <-late, errDown, "t2.5: the late call fails")
			res, err := lim.Limit(ctx, "l", "k")
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "t2.5: the probe counts as failed")
			assert.Equal(t, time.Second, res.RetryAfter, "t2.5: the next probe goes a cool-down after the late failure")

			mock.Add(500 * time.Millisecond) // t3
			res, err = lim.Limit(ctx, "l", "k")
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "t3: half a cool-down after the late failure, no probe")
			assert.Equal(t, 500*time.Millisecond, res.RetryAfter)

			mock.Add(500 * time.Millisecond) // t3.5
			res, err = lim.Limit(ctx, "l", "k")
			require.NoError(t, err, "t3.5: a cool-down after the late failure, the next call probes")
			assert.False(t, res.Degraded)

			close(hold["locked"])
			require.ErrorIs(t, <-probe, errDown, "the held probe's failure, a late call's")
		})
	}
}
