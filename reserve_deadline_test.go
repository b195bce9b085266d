package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

// Wait at the edges of its deadline, and with the Limiter's clock stepped
// back or forward between Reserve and Wait. A fixed window of 10 a second
// from t0, Capacity 30, all used: a reservation of 4 runs at t0+1s.
//
//	deadline         step     Wait
//	t0+1s − 1ms      -        context.DeadlineExceeded at once, tokens back
//	t0+1s            -        nil or DeadlineExceeded (both come at once);
//	                          given up at the job's time, the refund finds
//	                          the tokens granted since, and hands nothing back
//	t0+1s + 1ms      -        nil at t0+1s, tokens spent
//	t0+5s            −10s     nil once the clock is back at t0+1s, not before
//	t0+5s            +2s      nil at once, tokens spent
//	t0+1s            +2s      DeadlineExceeded at once: the deadline passed;
//	                          nothing comes back, as at the job's time
func TestWaitAtTheEdgesOfItsDeadline(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		deadline time.Duration // from t0
		step     time.Duration // the clock's step after Reserve
		want     string        // "ran", "gave up", "either"
	}{
		{"deadline a millisecond before", time.Second - time.Millisecond, 0, "gave up"},
		{"deadline at the job's time", time.Second, 0, "either"},
		{"deadline a millisecond after", time.Second + time.Millisecond, 0, "ran"},
		{"clock stepped back", 5 * time.Second, -10 * time.Second, "ran"},
		{"clock stepped forward past the job's time", 5 * time.Second, 2 * time.Second, "ran"},
		{"clock stepped forward past the deadline", time.Second, 2 * time.Second, "gave up"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Capacity: 30, Start: t0})
			_, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(30))
			require.NoError(t, err)
			r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
			require.NoError(t, err)
			require.Equal(t, t0.Add(time.Second), r.Time())
			dctx, cancel := mock.WithDeadline(ctx, t0.Add(tc.deadline))
			defer cancel()
			mock.Add(tc.step)
			done := make(chan error, 1)
			var ranAt time.Time
			go func() {
				err := r.Wait(dctx)
				ranAt = mock.Now()
				done <- err
			}()
			if mock.Now().Before(r.Time()) && !t0.Add(tc.deadline).Before(r.Time()) {
				// Wait waits on the mock: bring it to the job's time. A
				// Wait that reads the clock only then may run at once.
				mock.Set(r.Time().Add(-time.Millisecond))
				mock.Add(time.Millisecond)
			}
			var werr error
			for got := false; !got; {
				select {
				case werr = <-done:
					got = true
				default:
					mock.Add(0) // fire a timer registered as the clock moved
				}
			}
			st, err := lim.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			ran := werr == nil
			// The record by the windows granted since t0: less the 4
			// reserved unless a refund in the reservation's own window
			// handed them back.
			granted := min(30, 10*float64(mock.Now().Sub(t0)/time.Second))
			switch tc.want {
			case "ran":
				require.NoError(t, werr)
			case "gave up":
				require.ErrorIs(t, werr, context.DeadlineExceeded)
			case "either":
				if !ran {
					require.ErrorIs(t, werr, context.DeadlineExceeded)
				}
			}
			if ran {
				require.False(t, ranAt.Before(r.Time()), "the job ran at %v, before its time %v", ranAt, r.Time())
				require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed)
				require.Equal(t, granted-4, st.Remaining, "the tokens are spent")
				require.ErrorIs(t, lim.Refund(ctx, r.Token()), ratelimit.ErrReservationUsed)
				return
			}
			require.NotErrorIs(t, werr, ratelimit.ErrNotRefunded)
			require.ErrorContains(t, werr, "its tokens were handed back")
			if mock.Now().Before(r.Time()) {
				require.Equal(t, granted, st.Remaining, "the tokens are back")
			} else {
				require.Equal(t, granted-4, st.Remaining, "the tokens were granted since: nothing comes back")
			}
			require.NoError(t, r.Cancel(ctx))
			require.True(t, errors.Is(lim.Use(ctx, r.Token()), ratelimit.ErrReservationCanceled))
		})
	}
}
