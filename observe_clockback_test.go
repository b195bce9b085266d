package ratelimit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An observer never sees a negative Latency: a decision during which the
// Limiter's clock stepped back (a step of NTP, a clock given to WithClock
// set back) took 0, not minus the step. Latency was the clock's Now less
// the decision's start, unfloored, and the step reached every observer's
// histograms (a Prometheus sum read as a counter drops, which is a reset).
func TestObserverLatencyClockStepsBack(t *testing.T) {
	ctx := context.Background()
	for _, bound := range []bool{false, true} {
		mock := newMock()
		hook, store := hooked(bound)
		var (
			mu     sync.Mutex
			events []ratelimit.Event
		)
		lim := must(ratelimit.New(store, ratelimit.Limits{
			"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, MaxReserved: 10},
			"open": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
		}, ratelimit.WithClock(mock), ratelimit.WithBreaker(0, 0),
			ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) {
				mu.Lock()
				events = append(events, e)
				mu.Unlock()
			}))))
		var fail error
		hook.apply = func(context.Context, string) error {
			mock.Set(mock.Now().Add(-time.Minute))
			return fail
		}
		_, err := lim.Limit(ctx, "jobs", "k")
		require.NoError(t, err)
		_, err = lim.Check(ctx, "jobs", "k")
		require.NoError(t, err)
		_, err = lim.LimitAll(ctx, "k", []string{"jobs", "open"})
		require.NoError(t, err)
		_, err = lim.Reserve(ctx, "jobs", "k")
		require.NoError(t, err)
		fail = errors.New("store down")
		res, _ := lim.Limit(ctx, "open", "k")
		require.True(t, res.Degraded)
		res, _ = lim.Limit(ctx, "jobs", "k")
		require.True(t, res.Degraded)

		mu.Lock()
		require.Len(t, events, 7, "bound %v", bound)
		for _, e := range events {
			assert.Equal(t, time.Duration(0), e.Latency, "bound %v: %s %v", bound, e.Result.Name, e.Outcome)
		}
		mu.Unlock()
	}
}
