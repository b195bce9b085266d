package redisstore_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Many goroutines at once, their calls gathered into shared calls of the
// function: the store decides them as the pure transition does, in the
// order Redis runs them (storetest.ConcurrentDifferential); and it does
// gather them, so that the coalesced path is the one checked.
func TestCoalescedDifferential(t *testing.T) {
	concurrentDifferential(t, func(t *testing.T) redis.UniversalClient { return client(t) })
}

// The same on a Cluster, whose calls coalesce per master and go as one
// call over the slots of each.
func TestClusterCoalescedDifferential(t *testing.T) {
	addrs := strings.Split(testserver.ClusterAddrs(t), ",")
	concurrentDifferential(t, func(t *testing.T) redis.UniversalClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.Ping(context.Background()).Err())
		return c
	})
}

// concurrentDifferential runs storetest.ConcurrentDifferential on stores
// each on a client of its own (newClient), which the hook of Observed
// stays on.
func concurrentDifferential(t *testing.T, newClient func(t *testing.T) redis.UniversalClient) {
	var batches, ops []*atomic.Int64
	storetest.ConcurrentDifferential(t, func(t *testing.T, decided func(context.Context)) ratelimit.Store {
		c := newClient(t)
		s := newStore(c, uniquePrefix(t, c))
		b, n := redisstore.Observe(s, c, decided, func(what string) { t.Error(what) })
		batches, ops = append(batches, b), append(ops, n)
		return s
	}, 3)
	var b, n int64
	for i := range batches {
		b, n = b+batches[i].Load(), n+ops[i].Load()
	}
	t.Logf("%d ops in %d calls of the function", n, b)
	require.Less(t, b, n*3/4, "calls of the function shared by several ops")
}
