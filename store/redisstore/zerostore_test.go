package redisstore_test

import (
	"context"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// TestZeroStore: a store that redisstore's constructor did not make fails
// every call with an error that says to make it, rather than panic; its
// methods without an error do not panic either.
func TestZeroStore(t *testing.T) {
	t.Run("Zero", func(t *testing.T) { storetest.ZeroStore(t, &redisstore.Store{}) })
	t.Run("Nil", func(t *testing.T) { storetest.ZeroStore(t, (*redisstore.Store)(nil)) })
	for _, s := range []*redisstore.Store{{}, nil} {
		_, err := s.CheckServer(context.Background())
		require.ErrorIs(t, err, driver.ErrZeroStore, "CheckServer of %#v", s)
		require.False(t, s.OwnClock())
		id := driver.RecordID{Name: "n", Key: "k"}
		require.Equal(t, (&redisstore.Store{}).Key(id), s.Key(id))
	}
}
