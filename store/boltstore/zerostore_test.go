package boltstore_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// TestZeroStore: a store that neither Open nor New made fails every call,
// Close included (which blocked for ever on the zero Store), with an
// error that says to make it, rather than panic.
func TestZeroStore(t *testing.T) {
	t.Run("Zero", func(t *testing.T) { storetest.ZeroStore(t, &boltstore.Store{}) })
	t.Run("Nil", func(t *testing.T) { storetest.ZeroStore(t, (*boltstore.Store)(nil)) })
	require.Nil(t, (*boltstore.Store)(nil).DB())
	require.Nil(t, (&boltstore.Store{}).DB())
}
