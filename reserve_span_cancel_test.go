package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// The examples of docs/reservations.md: a cancel of a reservation A that
// spanned two windows hands back the tokens it took of the earlier one,
// and the reservation B behind it, still run in the later window, stands
// on them: that window runs its plain calls beside B's job, beyond its
// Rate by what A took of the earlier window, fewer than A's count. At 10 a
// window: 6 plain calls, A of 8 takes the last 4; the next window grants
// 10 plain calls beside B's 3. Those tokens need not be whole: at Rate
// 7.5, 5 calls leave 2.5 and A of 3 takes them; the next window grants 7
// plain calls beside B's 3, 2.5 beyond its Rate, more than A's count less
// one.
func TestCancelOfASpanningReservationLendsItsEarlierTokens(t *testing.T) {
	for _, tt := range []struct {
		name          string
		rate, reserve float64
		plain, a, b   int
		left          float64
		granted       int
	}{
		{name: "whole", rate: 10, plain: 6, a: 8, b: 3, left: 1, granted: 10},
		{name: "a fraction", rate: 7.5, reserve: 4, plain: 5, a: 3, b: 3, left: -0.5, granted: 7},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			mock := newMock()
			lim := must(ratelimit.New(must(memstore.New()),
				ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: tt.rate, Period: time.Second, MaxReserved: tt.reserve, Start: t0}},
				ratelimit.WithClock(mock)))
			for range tt.plain {
				res, err := lim.Limit(ctx, "jobs", "k")
				require.NoError(t, err)
				require.True(t, res.OK)
			}
			a, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(float64(tt.a)))
			require.NoError(t, err)
			b, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(float64(tt.b)))
			require.NoError(t, err)
			next := t0.Add(time.Second)
			require.True(t, a.OK() && b.OK())
			require.Equal(t, next, a.Time(), "A takes the window's last tokens and owes the rest of the next")
			require.Equal(t, next, b.Time(), "B owes its tokens of the next window")

			require.NoError(t, a.Cancel(ctx))
			v, err := lim.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			require.Equal(t, tt.left, v.Remaining, "the debt less A's count")

			mock.Set(next)
			granted := 0
			for range 20 {
				res, err := lim.Limit(ctx, "jobs", "k")
				require.NoError(t, err)
				if res.OK {
					granted++
				}
			}
			require.Equal(t, tt.granted, granted, "the plain calls of the next window beside B's %d", tt.b)
		})
	}
}
