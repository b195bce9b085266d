package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

// StoreFailure checks a Limiter over store through a real outage: stop
// must take store's server down, start bring it back. While it is down,
// every call returns within its context's deadline, decided by its limit's
// failure policy (one limit fails open, one closed), marked Degraded, with
// an error matching ratelimit.ErrStoreUnavailable that carries the
// server's own error; after three failures the breaker stops asking the
// server. Once the server is back and the cool-down has passed, the
// Limiter recovers by itself, with the same store and client.
func StoreFailure(t *testing.T, store ratelimit.Store, stop, start func(t *testing.T)) {
	ctx := context.Background()
	mock := newMock(epoch)
	const failures, cooldown = 3, 10 * time.Second
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"open":   {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Minute, FailOpen: true},
		"closed": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Minute},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(failures, cooldown))
	require.NoError(t, err)
	key := fmt.Sprint("failure-", time.Now().UnixNano())
	names := []string{"open", "closed"}
	for _, name := range names {
		res, err := lim.Limit(ctx, name, key)
		require.NoError(t, err)
		require.True(t, res.OK)
		require.False(t, res.Degraded)
	}

	stop(t)
	for i := range 2 * failures {
		for j, name := range names {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			res, err := lim.Limit(cctx, name, key)
			require.NoError(t, cctx.Err(), "call %d of %s outlived its deadline", i, name)
			cancel()
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "call %d of %s", i, name)
			require.True(t, res.Degraded)
			require.Equal(t, name == "open", res.OK, "call %d: the %s policy decides", i, name)
			var serr *ratelimit.StoreError
			require.ErrorAs(t, err, &serr)
			if 2*i+j < failures {
				require.Error(t, serr.Err, "call %d of %s: the server's own error is visible", i, name)
			} else {
				require.NoError(t, serr.Err, "call %d of %s: the breaker is open, the server must not be asked", i, name)
			}
		}
	}

	start(t)
	// Within the cool-down, the policy still decides without asking.
	res, err := lim.Limit(ctx, "closed", key)
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.False(t, res.OK)
	// After it, one probe goes to the server. Connections the outage broke
	// may fail a probe or two before the client dials anew: allow a few
	// cool-downs.
	for range 10 {
		mock.Add(cooldown + time.Millisecond)
		if res, err = lim.Limit(ctx, "closed", key); err == nil {
			break
		}
	}
	require.NoError(t, err, "the Limiter did not recover once the server was back")
	require.True(t, res.OK)
	require.False(t, res.Degraded)
	res, err = lim.Limit(ctx, "open", key)
	require.NoError(t, err)
	require.False(t, res.Degraded)
}
