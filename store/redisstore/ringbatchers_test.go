package redisstore_test

import (
	"context"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/coalesce"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/stretchr/testify/require"
)

// TestRingShardLeftLosesItsBatcher: the store keeps a batcher (and its
// goroutine) per shard it calls; a shard that leaves the Ring (SetAddrs),
// with none in its place, loses its batcher once the store has made
// enough calls to the others (2×coalesce.DropEvery), rather than keep it
// as long as the store.
func TestRingShardLeftLosesItsBatcher(t *testing.T) {
	ctx := context.Background()
	ring, addrs := ringOfTwo(t)
	s := newStore(ring, uniquePrefix(t, ring))
	t.Cleanup(func() { s.Close() })
	ka, kb := keyOn(t, s, ring, addrs[0]), keyOn(t, s, ring, addrs[1])
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, shardedOp(ka), out))
	require.NoError(t, s.Apply(ctx, shardedOp(kb), out))
	require.Equal(t, 2, redisstore.Batchers(s), "a batcher per shard called")
	ring.SetAddrs(map[string]string{"a": addrs[0]})
	for i := range 2 * coalesce.DropEvery {
		require.NoError(t, s.Apply(ctx, shardedOp(ka), out), "call %d", i)
	}
	require.Equal(t, 1, redisstore.Batchers(s), "the batchers kept, shard b gone")
}
