package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// The example of docs/reservations.md: a cancel of a reservation that
// spanned two windows hands back the tokens it took of the earlier one,
// and the reservation behind it, still run in the later window, stands on
// them: that window runs its Rate of plain calls beside B's job, more than
// its share by at most the canceled job's count less one.
func TestCancelOfASpanningReservationLendsItsEarlierTokens(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim := must(ratelimit.New(must(memstore.New()),
		ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Start: t0}},
		ratelimit.WithClock(mock)))
	for range 6 {
		res, err := lim.Limit(ctx, "jobs", "k")
		require.NoError(t, err)
		require.True(t, res.OK)
	}
	a, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(8))
	require.NoError(t, err)
	b, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(3))
	require.NoError(t, err)
	next := t0.Add(time.Second)
	require.True(t, a.OK() && b.OK())
	require.Equal(t, next, a.Time(), "A takes the window's last 4 and owes 4 of the next")
	require.Equal(t, next, b.Time(), "B owes 3 more of the next window")

	require.NoError(t, a.Cancel(ctx))
	v, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	require.Equal(t, 1.0, v.Remaining, "−7 and A's 8 back")

	mock.Set(next)
	granted := 0
	for range 20 {
		res, err := lim.Limit(ctx, "jobs", "k")
		require.NoError(t, err)
		if res.OK {
			granted++
		}
	}
	require.Equal(t, 10, granted, "the next window grants its 10 plain calls beside B's 3")
}

// The tokens a canceled reservation took of the earlier window are fewer
// than its count, but need not be whole: at Rate 7.5 a window leaves 2.5
// after 5 calls, and A of 3 takes them. A canceled, the next window runs
// 7 plain calls beside B's 3: 2.5 beyond its Rate, more than A's count
// less one (docs/reservations.md).
func TestCancelOfASpanningReservationLendsAFractionOfATokenMore(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim := must(ratelimit.New(must(memstore.New()),
		ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 7.5, Period: time.Second, MaxReserved: 4, Start: t0}},
		ratelimit.WithClock(mock)))
	for range 5 {
		res, err := lim.Limit(ctx, "jobs", "k")
		require.NoError(t, err)
		require.True(t, res.OK)
	}
	a, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(3))
	require.NoError(t, err)
	b, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(3))
	require.NoError(t, err)
	next := t0.Add(time.Second)
	require.True(t, a.OK() && b.OK())
	require.Equal(t, next, a.Time(), "A takes the window's last 2.5 and owes 0.5 of the next")
	require.Equal(t, next, b.Time(), "B owes 3 more of the next window")

	require.NoError(t, a.Cancel(ctx))
	mock.Set(next)
	granted := 0
	for range 20 {
		res, err := lim.Limit(ctx, "jobs", "k")
		require.NoError(t, err)
		if res.OK {
			granted++
		}
	}
	require.Equal(t, 7, granted, "the next window grants 7 plain calls beside B's 3: 10, Rate 7.5 and 2.5")
}
