package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// A debt is granted back at Rate a window, whatever the Capacity, as the
// semantics' min(value + Rate·k, Capacity) − count gives: Capacity caps
// what a bucket holds, not what a window grants. With Capacity 5 below a
// Rate of 10, two reservations of 5 made once the bucket is empty both
// run in the next window, 10 tokens of jobs in a window, as
// docs/reservations.md says.
func TestDebtIsGrantedAtRateBeyondCapacity(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim := must(ratelimit.New(must(memstore.New()),
		ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Capacity: 5, Period: time.Second, Start: t0}},
		ratelimit.WithClock(mock)))
	res, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(5))
	require.NoError(t, err)
	require.True(t, res.OK)
	next := t0.Add(time.Second)
	for i := range 2 {
		r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(5))
		require.NoError(t, err)
		require.True(t, r.OK(), "reservation %d", i)
		require.Equal(t, next, r.Time(), "reservation %d runs in the next window", i)
	}
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(5))
	require.NoError(t, err)
	require.Equal(t, t0.Add(2*time.Second), r.Time(), "a third waits a window more")
}
