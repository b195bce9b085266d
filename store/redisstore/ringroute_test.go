package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// ringOfTwo returns a Ring of the local server and one of the test's own.
func ringOfTwo(t *testing.T) (*redis.Ring, [2]string) {
	t.Helper()
	addrs := [2]string{client(t).Options().Addr, ownServer(t)}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addrs[0], "b": addrs[1]}})
	t.Cleanup(func() { ring.Close() })
	return ring, addrs
}

// shardedOp is an op of one item of a limit of two shards.
func shardedOp(key string) *driver.Op {
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 50, Period: 60_000, Capacity: 50}
	return &driver.Op{Mode: driver.ModeLimit, Now: t0.UnixMilli(), Items: []driver.Item{{Name: "l", Key: key, Count: 1, At: t0.UnixMilli(),
		Shards: []driver.Shard{{Index: 0, Params: p}, {Index: 1, Params: p}}}}}
}

// TestRingRecordsLieOnTheirKeysShard: on a Ring, whether its calls go
// alone, coalesced per shard or in an ApplyBatch, every record lies on the
// shard the Ring routes its key to, both records of a sharded limit
// together, and nowhere else: where the Ring's own commands (GET) read it.
func TestRingRecordsLieOnTheirKeysShard(t *testing.T) {
	ctx := context.Background()
	ring, addrs := ringOfTwo(t)
	s := newStore(ring, uniquePrefix(t, ring))
	t.Cleanup(func() { s.Close() })
	const n = 40
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n / 2 { // coalesced
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Apply(ctx, shardedOp(fmt.Sprint("k", i)), make([]driver.Decision, 1))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "key %d", i)
	}
	var ops []*driver.Op
	var outs [][]driver.Decision
	for i := n / 2; i < n; i++ {
		ops, outs = append(ops, shardedOp(fmt.Sprint("k", i))), append(outs, make([]driver.Decision, 1))
	}
	require.NoError(t, s.ApplyBatch(ctx, ops, outs))

	direct := map[string]*redis.Client{}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { c.Close() })
		direct[a] = c
	}
	on := map[string]int{}
	written := 0
	for i := range n {
		for sh := range 2 {
			k := s.Key(driver.RecordID{Name: "l", Key: fmt.Sprint("k", i), Shard: sh})
			c, err := ring.GetShardClientForKey(k)
			require.NoError(t, err)
			want := c.Options().Addr
			on[want]++
			found := 0
			for a, d := range direct {
				n, err := d.Exists(ctx, k).Result()
				require.NoError(t, err)
				found += int(n)
				require.False(t, n == 1 && a != want, "record %q on %s (the Ring routes it to %s)", k, a, want)
			}
			if found > 0 {
				require.NoError(t, ring.Get(ctx, k).Err(), "the Ring's GET of %q", k)
				written++
			}
		}
	}
	require.Len(t, on, 2, "the keys lie on both shards: %v", on)
	require.GreaterOrEqual(t, written, n, "records written")
}

// TestRingShardSetChanges: calls on a Ring whose shards come and go
// (SetAddrs) write their records on the shard the Ring routes their key
// to at the time, where the Ring's GET reads them, whatever shard the
// store coalesced their key's calls for before.
func TestRingShardSetChanges(t *testing.T) {
	ctx := context.Background()
	ring, addrs := ringOfTwo(t)
	s := newStore(ring, uniquePrefix(t, ring))
	for round, set := range []map[string]string{
		{"a": addrs[0], "b": addrs[1]},
		{"a": addrs[0]},
		{"b": addrs[1]},
		{"a": addrs[0], "b": addrs[1]},
		{"b": addrs[1]},
	} {
		ring.SetAddrs(set)
		for i := range 10 {
			key := fmt.Sprint("k", i)
			require.NoError(t, s.Apply(ctx, shardedOp(key), make([]driver.Decision, 1)), "round %d key %d", round, i)
			k := s.Key(driver.RecordID{Name: "l", Key: key})
			c, err := ring.GetShardClientForKey(k)
			require.NoError(t, err)
			require.NoError(t, c.Get(ctx, k).Err(), "round %d: record %q on %s", round, k, c.Options().Addr)
		}
	}
	require.NoError(t, s.Close())
}

// closeOnFCall takes its shard out of the Ring (SetAddrs, which closes the
// shard's client) as a call of the function is about to go to it, once
// armed: the Ring has routed the call to a shard no longer in it.
type closeOnFCall struct {
	armed  *atomic.Bool
	remove func()
}

func (h closeOnFCall) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h closeOnFCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "fcall" && h.armed.CompareAndSwap(true, false) {
			h.remove()
		}
		return next(ctx, cmd)
	}
}

func (h closeOnFCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRingShardRemovedUnderACall: a call that the Ring routed to a shard
// that leaves the Ring (SetAddrs closes its client) before the call was
// sent did not run: it goes again, to the shard the Ring routes its key to
// now, rather than fail as if the store's client had been closed
// (driver.ErrClosed, which says to close the client after the store's
// last call).
func TestRingShardRemovedUnderACall(t *testing.T) {
	ctx := context.Background()
	addrs := [2]string{client(t).Options().Addr, ownServer(t)}
	var armed atomic.Bool
	var ring *redis.Ring
	ring = redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addrs[0], "b": addrs[1]},
		NewClient: func(opt *redis.Options) *redis.Client {
			c := redis.NewClient(opt)
			if opt.Addr == addrs[1] {
				c.AddHook(closeOnFCall{&armed, func() { ring.SetAddrs(map[string]string{"a": addrs[0]}) }})
			}
			return c
		}})
	t.Cleanup(func() { ring.Close() })
	s := newStore(ring, uniquePrefix(t, ring))
	t.Cleanup(func() { s.Close() })
	on := func(addr string) string { return keyOn(t, s, ring, addr) }
	ka, kb := on(addrs[0]), on(addrs[1])
	for _, k := range []string{ka, kb} { // loads the library on both shards
		require.NoError(t, s.Apply(ctx, shardedOp(k), make([]driver.Decision, 1)))
	}
	armed.Store(true)
	require.NoError(t, s.Apply(ctx, shardedOp(kb), make([]driver.Decision, 1)), "the call whose shard left the Ring")
	require.False(t, armed.Load(), "the shard left the Ring under the call")
	k := s.Key(driver.RecordID{Name: "l", Key: kb})
	require.NoError(t, ring.Get(ctx, k).Err(), "the record, on the shard the Ring routes its key to now")
}
