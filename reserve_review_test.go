package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

// A Wait or an AfterFunc of a reservation canceled before says so and what
// to do, beside ErrReservationCanceled: reserve again. It said only
// `ratelimit: limit "jobs": ratelimit: reservation canceled`. The
// reservation is sharded, canceled by Cancel, a Wait that gave up, or the
// stop of an AfterFunc.
func TestWaitOnACanceledReservationSaysWhatToDo(t *testing.T) {
	ctx := context.Background()
	for _, how := range []string{"Cancel", "Wait gave up", "stop"} {
		t.Run(how, func(t *testing.T) {
			lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 4, Period: time.Second, Shards: 2, Start: t0})
			_, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(4))
			require.NoError(t, err)
			r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(2))
			require.NoError(t, err)
			require.True(t, r.OK())
			switch how {
			case "Cancel":
				require.NoError(t, r.Cancel(ctx))
			case "Wait gave up":
				dctx, cancel := mock.WithTimeout(ctx, time.Millisecond)
				defer cancel()
				require.ErrorIs(t, r.Wait(dctx), context.DeadlineExceeded)
			case "stop":
				stop, err := r.AfterFunc(func() { t.Error("the job ran") })
				require.NoError(t, err)
				require.True(t, stop(ctx))
			}
			for _, err := range []error{r.Wait(ctx), func() error { _, err := r.AfterFunc(func() {}); return err }()} {
				require.ErrorIs(t, err, ratelimit.ErrReservationCanceled)
				require.ErrorContains(t, err, "reserve again to run it")
			}
		})
	}
}
