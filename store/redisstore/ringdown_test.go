package redisstore_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A batch on a Ring whose shard is down (nothing listens at its address)
// fails with the connection's error, wrapped (errors.Is finds the refused
// connection), alone or in a pipeline, not with "the function answered"
// (decode), which a call whose command go-redis left without an error or
// a reply would give: go-redis sets the error of every command of a pipeline it could
// not send, when the pipeline holds one it may not send again, as the
// store's calls are (command: onceCmd).
func TestRingShardDown(t *testing.T) {
	ctx := context.Background()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { ring.Close() })
	s := newStore(ring, "ratelimit-test:ringdown:")
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	op := func(key string) *driver.Op {
		return &driver.Op{Now: 1_700_000_000_000, Items: []driver.Item{{Name: "l", Key: key, Count: 1, Shards: []driver.Shard{{Params: p}}}}}
	}
	for _, n := range []int{1, 3} {
		ops := make([]*driver.Op, n)
		outs := make([][]driver.Decision, n)
		for i := range ops {
			ops[i] = op(string(rune('a' + i)))
			outs[i] = make([]driver.Decision, 1)
		}
		err := s.ApplyBatch(ctx, ops, outs)
		require.Error(t, err, "%d ops", n)
		require.NotContains(t, err.Error(), "the function answered", "%d ops", n)
		require.ErrorIs(t, err, syscall.ECONNREFUSED, "%d ops: %v", n, err)
	}
}
