package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

// The Limiter's clock steps back between reservations and their cancels.
// A fixed window of 2 a second from t0, all used: A, B and C run at 1 s,
// 1 s and 2 s. The clock then steps back 10 s. A cancel of A, whose place
// B and C stand behind, gives nothing back; a cancel of C, the tail, gives
// its place back, and D, reserved on the clock 10 s behind, takes C's
// window (2 s), not one before it. A plain call on the lagging clock is
// refused while the record owes tokens. For a token bucket of 2 a second,
// capacity 2, the same at 500 ms, 1 s and 1.5 s.
func TestCancelsOnAClockSteppedBack(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		cfg     ratelimit.Config
		a, b, c time.Duration
	}{
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Second, Start: t0}, time.Second, time.Second, 2 * time.Second},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Second}, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond},
	} {
		t.Run(tc.cfg.Kind.String(), func(t *testing.T) {
			lim, mock := newReserveLimiter(t, tc.cfg)
			_, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(2))
			require.NoError(t, err)
			var rs []*ratelimit.Reservation
			for _, want := range []time.Duration{tc.a, tc.b, tc.c} {
				r, err := lim.Reserve(ctx, "jobs", "k")
				require.NoError(t, err)
				require.True(t, r.OK())
				require.Equal(t, t0.Add(want), r.Time())
				rs = append(rs, r)
			}
			before, err := lim.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			mock.Add(-10 * time.Second)

			require.NoError(t, rs[0].Cancel(ctx))
			st, err := lim.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			require.Equal(t, before.Remaining, st.Remaining, "A's place is stood behind: nothing comes back")

			res, err := lim.Limit(ctx, "jobs", "k")
			require.NoError(t, err)
			require.False(t, res.OK, "a plain call on the lagging clock, while the record owes tokens")

			require.NoError(t, rs[2].Cancel(ctx))
			d, err := lim.Reserve(ctx, "jobs", "k")
			require.NoError(t, err)
			require.True(t, d.OK())
			require.Equal(t, rs[2].Time(), d.Time(), "D takes the canceled tail's place, on the clock 10 s behind")
			require.Equal(t, 10*time.Second+tc.c, d.Delay())
		})
	}
}
