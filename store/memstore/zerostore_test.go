package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// TestZeroStore: a store that New did not make fails every call with an
// error that says to call New, rather than panic ("maphash: use of
// uninitialized Seed"), and holds nothing.
func TestZeroStore(t *testing.T) {
	t.Run("Zero", func(t *testing.T) { storetest.ZeroStore(t, &memstore.Store{}) })
	t.Run("Nil", func(t *testing.T) { storetest.ZeroStore(t, (*memstore.Store)(nil)) })
	t.Run("Var", func(t *testing.T) {
		// New refuses it, saying to call memstore.New, rather than build
		// a Limiter whose every call fails (of a limit that fails open,
		// granted by the failure policy, before).
		var s memstore.Store
		limits := ratelimit.Limits{"a": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 1, FailOpen: true}}
		lim, err := ratelimit.New(&s, limits)
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
		require.ErrorIs(t, err, driver.ErrZeroStore)
		require.ErrorContains(t, err, "memstore.New")
		require.Nil(t, lim)
		err = s.Load(context.Background(), nil, nil)
		require.ErrorIs(t, err, driver.ErrZeroStore)
		require.Zero(t, s.Len())
		require.Zero(t, (*memstore.Store)(nil).Len())
	})
}
