package redisstore_test

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/goroutines"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Close ends the goroutines that send the store's calls in the background
// (one per server, per master of a Cluster): they lived on, parked, for as
// long as the store was reachable, which a check for leaked goroutines
// reports. A call after Close fails with driver.ErrClosed.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		c := client(t)
		closeLeavesNoGoroutine(t, c)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ",")})
		t.Cleanup(func() { c.Close() })
		closeLeavesNoGoroutine(t, c)
	})
}

func closeLeavesNoGoroutine(t *testing.T, c redis.UniversalClient) {
	others := goroutines.Running(goroutines.CoalesceWorker)
	s := newStore(c, uniquePrefix(t, c))
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}})
	require.NoError(t, err)
	// A context that can end: its calls are sent in the background.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for i := range 20 {
		_, err := lim.Limit(ctx, "l", "k"+string(rune('a'+i)))
		require.NoError(t, err)
	}
	var mine []string
	for _, g := range goroutines.Running(goroutines.CoalesceWorker) {
		if !slices.Contains(others, g) {
			mine = append(mine, g)
		}
	}
	require.NotEmpty(t, mine, "the store runs a worker")
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
	require.Eventually(t, func() bool {
		now := goroutines.Running(goroutines.CoalesceWorker)
		for _, g := range mine {
			if slices.Contains(now, g) {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "the store's workers outlive Close")
	_, err = lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, driver.ErrClosed)
	runtime.KeepAlive(s)
}
