package ratelimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A clock set back by more than driver.ExpiryGrace after the store dropped
// a record as expired, by the time the clock had reached (memstore's
// sweep, a janitor, Redis' expiry): the store has no record and grants a
// full bucket. The deny cache refused the call on the record it held,
// from before, until the clock came back to the step's time. Past a
// grace behind the latest time it has seen, it leaves the call to the
// store. On Apply's path and a BoundLimit's alike.
func TestDenyCacheClockBackPastTheGrace(t *testing.T) {
	ctx := context.Background()
	for _, bound := range []bool{false, true} {
		t.Run(fmt.Sprint("bound=", bound), func(t *testing.T) {
			mem := must(memstore.New())
			var store ratelimit.Store = &flakyStore{Store: mem}
			if bound {
				store = mem
			}
			mock := &stepClock{Mock: newMock(), now: t0}
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second},
			}, ratelimit.WithClock(mock), ratelimit.WithDenyCache(100))
			require.NoError(t, err)
			res, err := lim.Limit(ctx, "l", "k")
			require.NoError(t, err)
			require.True(t, res.OK)
			res, err = lim.Limit(ctx, "l", "k")
			require.NoError(t, err)
			require.False(t, res.OK, "refused by the store, and learnt")

			mock.now = t0.Add(time.Hour)
			_, err = lim.Limit(ctx, "l", "other")
			require.NoError(t, err)
			n, err := mem.DeleteExpired(ctx, mock.now)
			require.NoError(t, err)
			require.Positive(t, n, "the record of k is gone")

			mock.now = t0.Add(100 * time.Millisecond) // back an hour
			res, err = lim.Limit(ctx, "l", "k")
			require.NoError(t, err)
			assert.True(t, res.OK, "the store grants a full bucket")
			assert.False(t, res.Local)
		})
	}
}
