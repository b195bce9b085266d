package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Wait that gives up, its context ended, returns the context's error
// (errors.Is finds it) in an error that names the limit and says what
// became of the reservation's tokens. It returned the bare context error,
// "context canceled", which said neither which reservation gave up nor
// whether its tokens had been handed back.
func TestWaitGivingUpSaysWhatBecameOfTheTokens(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// wait runs r's Wait, which gives up, and returns its error.
		wait func(t *testing.T, lim *ratelimit.Limiter, r *ratelimit.Reservation) error
		want error    // the context's error
		says []string // what the message says
		back bool     // the tokens are back in the bucket
	}{{
		name: "the deadline comes before the job's time",
		wait: func(t *testing.T, lim *ratelimit.Limiter, r *ratelimit.Reservation) error {
			dctx, cancel := context.WithDeadline(ctx, r.Time().Add(-time.Second))
			defer cancel()
			return r.Wait(dctx)
		},
		want: context.DeadlineExceeded,
		says: []string{"after the context's deadline", "canceled and its tokens were handed back"},
		back: true,
	}, {
		name: "canceled while waiting",
		wait: func(t *testing.T, lim *ratelimit.Limiter, r *ratelimit.Reservation) error {
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Wait(cctx) }()
			cancel()
			return <-done
		},
		want: context.Canceled,
		says: []string{"ended before the job's time", "canceled and its tokens were handed back"},
		back: true,
	}, {
		name: "a holder of the token canceled it first",
		wait: func(t *testing.T, lim *ratelimit.Limiter, r *ratelimit.Reservation) error {
			require.NoError(t, lim.Refund(ctx, r.Token()))
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			return r.Wait(cctx)
		},
		want: context.Canceled,
		says: []string{"a holder of its token canceled it first"},
		back: true,
	}, {
		name: "a holder of the token used it first",
		wait: func(t *testing.T, lim *ratelimit.Limiter, r *ratelimit.Reservation) error {
			require.NoError(t, lim.Use(ctx, r.Token()))
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			return r.Wait(cctx)
		},
		want: context.Canceled,
		says: []string{"a holder of its token used it first", "the job is the holder's"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
			_, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(10))
			require.NoError(t, err)
			r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4)) // runs in the next window
			require.NoError(t, err)
			require.Positive(t, r.Delay())

			err = tc.wait(t, lim, r)
			require.ErrorIs(t, err, tc.want)
			assert.NotErrorIs(t, err, ratelimit.ErrNotRefunded)
			assert.NotErrorIs(t, err, ratelimit.ErrReservationUsed, "not used by the reservation: its job must not run")
			assert.ErrorContains(t, err, `limit "jobs"`)
			assert.ErrorContains(t, err, "Wait gave up")
			for _, s := range tc.says {
				assert.ErrorContains(t, err, s)
			}
			st, err := lim.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			if tc.back {
				assert.Equal(t, 0.0, st.Remaining, "the tokens are back")
			} else {
				assert.Equal(t, -4.0, st.Remaining, "the tokens are spent")
			}
		})
	}
}

// A Wait that gives up past its token's Expires says that nothing came
// back, not that the tokens were handed back: Cancel returns nil then,
// and hands nothing back (nothing would come back by then).
func TestWaitGivingUpPastExpiresSaysNothingCameBack(t *testing.T) {
	ctx := context.Background()
	lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
	require.NoError(t, err)
	mock.Set(r.Token().Expires().Add(time.Second))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	err = r.Wait(cctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ratelimit.ErrNotRefunded, "nothing is left to do")
	assert.NotContains(t, err.Error(), "handed back")
	assert.ErrorContains(t, err, "expired")
	require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled, "the job does not run")
}

// With WithRefundTimeout(0) and no time left, a Wait that gives up sends
// no refund; but where Cancel needs no store (a reservation of the failure
// policy, which holds no tokens; one canceled meanwhile, whose tokens are
// back) nothing is left to hand back. Wait said the tokens were not handed
// back (ErrNotRefunded) and to call Cancel, and it left the failure
// policy's reservation uncanceled, so that a later Wait let its job run.
func TestWaitGivingUpWithRefundTimeout0NeedsNoStore(t *testing.T) {
	ctx := context.Background()
	t.Run("failure policy", func(t *testing.T) {
		store := &flakyStore{Store: must(memstore.New())}
		lim := must(ratelimit.New(store, ratelimit.Limits{
			"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
		}, ratelimit.WithClock(newMock()), ratelimit.WithRefundTimeout(0)))
		store.fail.Store(true)
		r, err := lim.Reserve(ctx, "jobs", "k")
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		require.True(t, r.Result().Degraded)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		err = r.Wait(cctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.NotErrorIs(t, err, ratelimit.ErrNotRefunded, "it held no tokens")
		assert.ErrorContains(t, err, "it held no tokens")
		require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled, "the job does not run")
	})
	t.Run("canceled meanwhile", func(t *testing.T) {
		clk := timerClock{Mock: newMock(), made: make(chan struct{}, 1)}
		lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{
			"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
		}, ratelimit.WithClock(clk), ratelimit.WithRefundTimeout(0)))
		_, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(10))
		require.NoError(t, err)
		r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4)) // runs in the next window
		require.NoError(t, err)
		require.Positive(t, r.Delay())
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Wait(cctx) }()
		<-clk.made                        // Wait waits for the job's time
		require.NoError(t, r.Cancel(ctx)) // another goroutine's
		cancel()
		err = <-done
		require.ErrorIs(t, err, context.Canceled)
		assert.NotErrorIs(t, err, ratelimit.ErrNotRefunded, "the Cancel handed them back")
		assert.ErrorContains(t, err, "handed back")
		st, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		assert.Equal(t, 0.0, st.Remaining, "handed back once")
	})
}

// timerClock is a mock clock that tells made of each timer it makes.
type timerClock struct {
	*clock.Mock
	made chan struct{}
}

func (c timerClock) Timer(d time.Duration) *clock.Timer {
	t := c.Mock.Timer(d)
	c.made <- struct{}{}
	return t
}
