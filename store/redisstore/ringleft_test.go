package redisstore_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// leaveOn takes its shard out of the Ring (leave, which calls SetAddrs,
// closing the shard's client) as a command named name is about to go to
// it, alone or in a pipeline, once armed: the Ring has routed the command
// to a shard no longer in it.
type leaveOn struct {
	name  string
	armed *atomic.Bool
	leave func()
}

func (h leaveOn) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h leaveOn) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == h.name && h.armed.CompareAndSwap(true, false) {
			h.leave()
		}
		return next(ctx, cmd)
	}
}

func (h leaveOn) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == h.name && h.armed.CompareAndSwap(true, false) {
				h.leave()
			}
		}
		return next(ctx, cmds)
	}
}

// leavingRing is a Ring of the shards "a" and "b" at addrs, whose shard
// "b" leaves it, replaced by the shards of then (SetAddrs), as a command
// named name is about to go to it, once armed.
type leavingRing struct {
	*redis.Ring
	armed atomic.Bool
}

func newLeavingRing(t *testing.T, addrs [2]string, name string, then map[string]string) *leavingRing {
	return newLeavingRingOf(t, &redis.RingOptions{}, addrs, name, then)
}

// newLeavingRingOf is newLeavingRing with the options o besides.
func newLeavingRingOf(t *testing.T, o *redis.RingOptions, addrs [2]string, name string, then map[string]string) *leavingRing {
	r := &leavingRing{}
	o.Addrs = map[string]string{"a": addrs[0], "b": addrs[1]}
	o.NewClient = func(opt *redis.Options) *redis.Client {
		c := redis.NewClient(opt)
		if opt.Addr == addrs[1] {
			c.AddHook(leaveOn{name, &r.armed, func() { r.SetAddrs(then) }})
		}
		return c
	}
	r.Ring = redis.NewRing(o)
	t.Cleanup(func() { r.Close() })
	return r
}

// keyOn returns a key whose records live on the shard of ring at addr.
func keyOn(t *testing.T, s *redisstore.Store, ring *redis.Ring, addr string) string {
	t.Helper()
	for i := 0; ; i++ {
		k := fmt.Sprint("k", i)
		c, err := ring.GetShardClientForKey(s.Key(driver.RecordID{Name: "l", Key: k}))
		require.NoError(t, err)
		if c.Options().Addr == addr {
			return k
		}
	}
}

// TestRingShardRemovedUnderALoad: a read of records (Load) that the Ring
// routed to a shard that leaves it (SetAddrs closes its client) before it
// was sent did not run: it goes again, to the shard the Ring routes the
// key to now, as a call of the function does, rather than fail as if the
// store's client had been closed (driver.ErrClosed).
func TestRingShardRemovedUnderALoad(t *testing.T) {
	ctx := context.Background()
	addrs := [2]string{client(t).Options().Addr, ownServer(t)}
	ring := newLeavingRing(t, addrs, "get", map[string]string{"a": addrs[0]})
	s := newStore(ring.Ring, uniquePrefix(t, ring.Ring))
	t.Cleanup(func() { s.Close() })
	ka, kb := keyOn(t, s, ring.Ring, addrs[0]), keyOn(t, s, ring.Ring, addrs[1])
	ids := []driver.RecordID{{Name: "l", Key: ka}, {Name: "l", Key: kb}}
	// The record of kb, where the Ring routes it once b has left.
	require.NoError(t, client(t).Set(ctx, s.Key(ids[1]), "5 1700000000000", 0).Err())
	ring.armed.Store(true)
	out := make([]driver.Record, 2)
	require.NoError(t, s.Load(ctx, ids, out), "the read whose shard left the Ring")
	require.False(t, ring.armed.Load(), "the shard left the Ring under the read")
	require.Equal(t, []driver.Record{{}, {State: driver.State{Remaining: 5, TS: 1_700_000_000_000}, Found: true}}, out)
}

// TestRingShardRemovedUnderADelete: a Delete that the Ring routed to a
// shard that leaves it before it was sent goes again, to the shard the
// Ring routes the key to now, and deletes the record there, rather than
// fail with driver.ErrClosed.
func TestRingShardRemovedUnderADelete(t *testing.T) {
	ctx := context.Background()
	addrs := [2]string{client(t).Options().Addr, ownServer(t)}
	ring := newLeavingRing(t, addrs, "del", map[string]string{"a": addrs[0]})
	s := newStore(ring.Ring, uniquePrefix(t, ring.Ring))
	t.Cleanup(func() { s.Close() })
	kb := keyOn(t, s, ring.Ring, addrs[1])
	id := driver.RecordID{Name: "l", Key: kb}
	require.NoError(t, client(t).Set(ctx, s.Key(id), "5 1700000000000", 0).Err())
	ring.armed.Store(true)
	require.NoError(t, s.Delete(ctx, []driver.RecordID{id}), "the delete whose shard left the Ring")
	require.False(t, ring.armed.Load(), "the shard left the Ring under the delete")
	n, err := client(t).Exists(ctx, s.Key(id)).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the record on the shard the Ring routes its key to now")
}

// TestRingShardRemovedUnderCheckServer: CheckServer checks the shards of
// the Ring as it is when it ends: a shard that leaves the Ring under the
// check (SetAddrs closes its client) is not checked, and a shard that
// joined it meanwhile is, rather than the check failing with
// driver.ErrClosed, as if the store's client had been closed.
func TestRingShardRemovedUnderCheckServer(t *testing.T) {
	ctx := context.Background()
	addrs := [2]string{client(t).Options().Addr, ownServer(t)}
	joined := ownServer(t) // without persistence, as every ownServer: CheckServer warns of it
	ring := newLeavingRing(t, addrs, "config", map[string]string{"a": addrs[0], "c": joined})
	s := newStore(ring.Ring, uniquePrefix(t, ring.Ring))
	t.Cleanup(func() { s.Close() })
	ring.armed.Store(true)
	ws, err := s.CheckServer(ctx)
	require.NoError(t, err)
	require.False(t, ring.armed.Load(), "the shard left the Ring under the check")
	var servers []string
	for _, w := range ws {
		servers = append(servers, w.Server)
	}
	require.Contains(t, servers, joined, "the shard that joined the Ring under the check: %v", ws)
}

// TestRingShardRemovedUnderALibraryLoad: the store loads its library on
// the shards of the Ring as it is when the load ends: a shard that leaves
// the Ring as the library goes to it (SetAddrs closes its client) is
// left, and a shard that joined it meanwhile is given the library; the
// call that needed the library goes on, rather than fail with
// driver.ErrClosed, as if the store's client had been closed.
func TestRingShardRemovedUnderALibraryLoad(t *testing.T) {
	ctx := context.Background()
	addrs := [2]string{ownServer(t), ownServer(t)} // without the library
	joined := ownServer(t)
	ring := newLeavingRing(t, addrs, "function", map[string]string{"a": addrs[0], "c": joined})
	s := newStore(ring.Ring, uniquePrefix(t, ring.Ring))
	t.Cleanup(func() { s.Close() })
	ka := keyOn(t, s, ring.Ring, addrs[0])
	ring.armed.Store(true)
	require.NoError(t, s.Apply(ctx, shardedOp(ka), make([]driver.Decision, 1)), "the call whose library load lost a shard")
	require.False(t, ring.armed.Load(), "the shard left the Ring under the load")
	c := redis.NewClient(&redis.Options{Addr: joined})
	t.Cleanup(func() { c.Close() })
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: redisstore.FunctionLibrary()}).Result()
	require.NoError(t, err)
	require.Len(t, libs, 1, "the library on the shard that joined the Ring under the load")
}

// timeShift moves the time its server's client reads with TIME, or with
// a function or a script that returns TIME's answer (the store's
// RecordNow), by d,
// unless the server is home's: a server whose clock is d ahead. The
// function's own TIME, read in the server, is not moved.
type timeShift struct {
	addr string
	home *atomic.Pointer[string]
	d    time.Duration
}

func (h timeShift) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h timeShift) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil || h.addr == *h.home.Load() {
			return err
		}
		switch c := cmd.(type) {
		case *redis.TimeCmd:
			c.SetVal(c.Val().Add(h.d))
		case *redis.Cmd:
			if v, ok := c.Val().([]any); ok && len(v) == 2 && (c.Name() == "fcall" || c.Name() == "evalsha" || c.Name() == "eval") {
				sec, err := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
				if err != nil {
					return err
				}
				c.SetVal([]any{strconv.FormatInt(sec+int64(h.d/time.Second), 10), v[1]})
			}
		}
		return nil
	}
}

func (h timeShift) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestServerTimeOfTheKeysServer: on a Ring or a Cluster, a Limiter of a
// store WithServerTime judges a key's records and tokens (Value, a
// settlement) at the time of the server that holds the key, at which the
// function judged its calls, whatever the other servers' clocks say. It
// read the time of a server at random: here, often of one a day ahead, at
// which the key's bucket was full again and every token expired.
func TestServerTimeOfTheKeysServer(t *testing.T) {
	var home atomic.Pointer[string]
	home.Store(new(string))
	newClient := func(opt *redis.Options) *redis.Client {
		c := redis.NewClient(opt)
		c.AddHook(timeShift{opt.Addr, &home, 24 * time.Hour})
		return c
	}
	run := func(t *testing.T, c redis.UniversalClient, server func(key string) string) {
		ctx := context.Background()
		s := newStore(c, uniquePrefix(t, c), redisstore.WithServerTime())
		t.Cleanup(func() { s.Close() })
		lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Hour}})
		require.NoError(t, err)
		const key = "k"
		addr := server(s.Key(driver.RecordID{Name: "l", Key: key}))
		home.Store(&addr)
		for i := range 20 { // a server at random would be another at least once, but for one time in 2^20
			res, err := lim.Limit(ctx, "l", key, ratelimit.WithReceipt())
			require.NoError(t, err)
			require.True(t, res.OK, "call %d", i)
			st, err := lim.Value(ctx, "l", key)
			require.NoError(t, err)
			require.InDelta(t, 9, st.Remaining, 0.1, "call %d: the value at the time of the key's server", i)
			require.NoError(t, lim.Refund(ctx, res.Token), "call %d: a refund of a token just made", i)
		}
	}
	t.Run("ring", func(t *testing.T) {
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": client(t).Options().Addr, "b": ownServer(t)},
			NewClient: newClient})
		t.Cleanup(func() { ring.Close() })
		run(t, ring, func(key string) string {
			c, err := ring.GetShardClientForKey(key)
			require.NoError(t, err)
			return c.Options().Addr
		})
	})
	t.Run("cluster", func(t *testing.T) {
		cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ","),
			NewClient: newClient})
		t.Cleanup(func() { cluster.Close() })
		run(t, cluster, func(key string) string {
			c, err := cluster.MasterForKey(context.Background(), key)
			require.NoError(t, err)
			return c.Options().Addr
		})
	})
}

// TestRingShardLeftEveryTry: a call whose shard left the Ring under it
// each time it was sent, as often as the client's MaxRetries allow (here
// none), fails with an error that says so, not one matching
// driver.ErrClosed, which says that the store's client was closed: the
// Ring is open, and a call made again goes to the shards it has then.
func TestRingShardLeftEveryTry(t *testing.T) {
	ctx := context.Background()
	addrs := [2]string{client(t).Options().Addr, ownServer(t)}
	ring := newLeavingRingOf(t, &redis.RingOptions{MaxRetries: -1}, addrs, "fcall", map[string]string{"a": addrs[0]})
	s := newStore(ring.Ring, uniquePrefix(t, ring.Ring))
	t.Cleanup(func() { s.Close() })
	kb := keyOn(t, s, ring.Ring, addrs[1])
	ring.armed.Store(true)
	err := s.Apply(ctx, shardedOp(kb), make([]driver.Decision, 1))
	require.False(t, ring.armed.Load(), "the shard left the Ring under the call")
	require.Error(t, err)
	require.NotErrorIs(t, err, driver.ErrClosed)
	require.ErrorIs(t, err, redis.ErrClosed)
	require.ErrorContains(t, err, "left the Ring")
	require.NoError(t, s.Apply(ctx, shardedOp(kb), make([]driver.Decision, 1)), "the call made again")
}

// goneOnce is a Ring's consistent hash over names, which answers, once
// armed, a name the Ring does not have, as a name that left the Ring
// (SetAddrs) between the Ring's choice of it for a key and its look-up,
// as a Ring's pipeline makes the two apart.
type goneOnce struct {
	names []string
	armed *atomic.Bool
}

func (h goneOnce) Get(key string) string {
	if h.armed.CompareAndSwap(true, false) {
		return "gone"
	}
	f := fnv.New32a()
	f.Write([]byte(key))
	return h.names[int(f.Sum32()%uint32(len(h.names)))]
}

// TestRingShardGoneFromItsPipeline: the commands of a Ring's pipeline
// whose shard left the Ring between the Ring's choice of the shard's name
// for their keys and its look-up of the name did not run (go-redis fails
// them with "the shard is not in the ring"): they go again, to the shard
// that holds their key now, as those whose shard's client closed, in a
// read (Load), a Delete, or a batch of calls of the function. They failed
// with go-redis's error, as if the server had.
func TestRingShardGoneFromItsPipeline(t *testing.T) {
	ctx := context.Background()
	var armed atomic.Bool
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": client(t).Options().Addr, "b": ownServer(t)},
		NewConsistentHash: func(names []string) redis.ConsistentHash {
			names = slices.Clone(names)
			slices.Sort(names)
			return goneOnce{names, &armed}
		}})
	t.Cleanup(func() { ring.Close() })
	s := newStore(ring, uniquePrefix(t, ring))
	t.Cleanup(func() { s.Close() })
	ops := []*driver.Op{shardedOp("k1"), shardedOp("k2")}
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	require.NoError(t, s.ApplyBatch(ctx, ops, outs)) // loads the library where it goes
	ids := []driver.RecordID{{Name: "l", Key: "k1"}, {Name: "l", Key: "k2"}}
	for name, call := range map[string]func() error{
		"apply batch": func() error { return s.ApplyBatch(ctx, ops, outs) },
		"load":        func() error { return s.Load(ctx, ids, make([]driver.Record, 2)) },
		"delete":      func() error { return s.Delete(ctx, ids) },
	} {
		armed.Store(true)
		require.NoError(t, call(), name)
		require.False(t, armed.Load(), "%s: a shard's name looked up in vain", name)
	}
}
