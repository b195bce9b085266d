package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// testExpirer checks DeleteExpired of a store that keeps records until
// told (driver.Expirer): it drops a record only once its bucket has been
// full again for driver.ExpiryGrace, drops every such record, counts what
// it dropped, and a dropped record reads as a full bucket.
func testExpirer(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	s := newStore(t)
	exp := s.(driver.Expirer)
	mock := newMock(epoch)
	lim, err := ratelimit.New(s, ratelimit.Limits{
		"fw": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: time.UnixMilli(0)},
		"tb": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	const keys = 20
	for i := range keys {
		_, err := lim.Limit(ctx, "fw", fmt.Sprint("user-", i), ratelimit.Count(5))
		require.NoError(t, err)
	}
	_, err = lim.Limit(ctx, "tb", "k", ratelimit.Count(10))
	require.NoError(t, err)

	n, err := exp.DeleteExpired(ctx, mock.Now())
	require.NoError(t, err)
	require.Zero(t, n, "no bucket is full yet")
	// The fixed windows are full at the next window start; the bucket a
	// minute after its call.
	grace := time.Duration(driver.ExpiryGrace) * time.Millisecond
	nextWindow := time.UnixMilli(epoch.UnixMilli()/60_000*60_000 + 60_000)
	n, err = exp.DeleteExpired(ctx, nextWindow)
	require.NoError(t, err)
	require.Zero(t, n, "full again, but not for ExpiryGrace yet")
	n, err = exp.DeleteExpired(ctx, nextWindow.Add(grace))
	require.NoError(t, err)
	require.Equal(t, keys, n, "the fixed windows, full since the next window")
	st, err := lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.True(t, st.Shards[0].Stored, "the bucket is kept until it is full")
	n, err = exp.DeleteExpired(ctx, mock.Now().Add(time.Minute+grace))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st, err = lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.False(t, st.Shards[0].Stored)
	require.Equal(t, 10.0, st.Remaining, "a dropped record reads as a full bucket")

	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = exp.DeleteExpired(done, mock.Now())
	require.ErrorIs(t, err, context.Canceled, "DeleteExpired leaves on its context")
}
