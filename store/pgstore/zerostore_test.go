package pgstore_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// TestZeroStore: a store that pgstore's constructor did not make fails
// every call with an error that says to make it, rather than panic.
func TestZeroStore(t *testing.T) {
	t.Run("Zero", func(t *testing.T) { storetest.ZeroStore(t, &pgstore.Store{}) })
	t.Run("Nil", func(t *testing.T) { storetest.ZeroStore(t, (*pgstore.Store)(nil)) })
	require.False(t, (*pgstore.Store)(nil).OwnClock())
}
