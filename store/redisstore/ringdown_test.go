package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
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

// ringStarts signals each call of the function a Ring sends, as it goes.
type ringStarts chan struct{}

func (h ringStarts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h ringStarts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "fcall" {
			h <- struct{}{}
		}
		return next(ctx, cmd)
	}
}

func (h ringStarts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRingStalledShardHoldsOnlyItsCalls: the calls of a Ring coalesce per
// shard, as a Cluster's per master, with three round trips in flight to
// each: a shard that stopped answering, with three calls in flight,
// holds none of the calls to another shard. They coalesced over the
// whole Ring, and waited behind the stalled shard's round trips until
// go-redis's read timeout.
func TestRingStalledShardHoldsOnlyItsCalls(t *testing.T) {
	ctx := context.Background()
	p := newStallProxy(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:6379", "b": p.addr()},
		ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { ring.Close() })
	t.Cleanup(p.unstall) // first: the calls left in flight end, then the client closes
	s := newStore(ring, uniquePrefix(t, client(t)))
	t.Cleanup(func() { s.Close() })
	on := func(addr string) string { return keyOn(t, s, ring, addr) }
	ka, kb := on("127.0.0.1:6379"), on(p.addr())
	params := driver.Params{Kind: ratelimit.TokenBucket, Rate: 100, Period: 60_000, Capacity: 100}
	call := func(key string) error {
		return s.Apply(ctx, oneItemOp(driver.ModeLimit, t0.UnixMilli(), "l", key, 1, params), make([]driver.Decision, 1))
	}
	require.NoError(t, call(ka)) // loads the library on both shards
	require.NoError(t, call(kb))

	started := make(ringStarts, 3)
	ring.AddHook(started)
	p.stall()
	var stalledDone atomic.Int32
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = call(kb)
			stalledDone.Add(1)
		}()
	}
	for range 3 {
		<-started // three round trips in flight to the stalled shard
	}
	go func() { // the call to the other shard, and any more, go on
		for range started {
		}
	}()
	require.NoError(t, call(ka))
	require.Zero(t, stalledDone.Load(), "the call to the shard that answers waited for the stalled shard's calls to end")
	p.unstall()
	wg.Wait()
	close(started)
}
