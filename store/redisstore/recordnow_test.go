package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestRecordNowThroughTheClientsHooks: RecordNow, on a Ring or a Cluster,
// reads the time through the store's client, as every other call of the
// store goes: the hooks added to the client (AddHook: tracing, metrics,
// a test's) see it, and the client routes it, by the record's key, to the
// server that holds it. It went to the server's own client, past the
// Ring's or the Cluster's hooks.
func TestRecordNowThroughTheClientsHooks(t *testing.T) {
	run := func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		cnt := &counter{}
		c.AddHook(cnt)
		s := newStore(c, uniquePrefix(t, c), redisstore.WithServerTime())
		t.Cleanup(func() { s.Close() })
		before := time.Now()
		for _, key := range []string{"k1", "k2", "k3"} {
			now, err := s.RecordNow(ctx, driver.RecordID{Name: "l", Key: key})
			require.NoError(t, err, key)
			require.InDelta(t, before.UnixMilli(), now, float64(time.Minute.Milliseconds()), "%s: the server's time", key)
		}
		require.Positive(t, cnt.cmds.Load(), "the commands that read the time, seen by the client's hooks")
		require.True(t, slices.ContainsFunc(cnt.names, func(n string) bool { return n == "evalsha" || n == "eval" }), "%v", cnt.names)
	}
	t.Run("ring", func(t *testing.T) {
		ring, _ := ringOfTwo(t)
		run(t, ring)
	})
	t.Run("cluster", func(t *testing.T) { run(t, clusterClientT(t)) })
}

// TestRingShardRemovedUnderRecordNow: a read of the time that the Ring
// routed to a shard that leaves it before it was sent goes again, to the
// shard that holds the key now, as a call of the function does.
func TestRingShardRemovedUnderRecordNow(t *testing.T) {
	ctx := context.Background()
	addrs := [2]string{client(t).Options().Addr, ownServer(t)}
	ring := newLeavingRing(t, addrs, "evalsha", map[string]string{"a": addrs[0]})
	s := newStore(ring.Ring, uniquePrefix(t, ring.Ring), redisstore.WithServerTime())
	t.Cleanup(func() { s.Close() })
	kb := keyOn(t, s, ring.Ring, addrs[1])
	ring.armed.Store(true)
	now, err := s.RecordNow(ctx, driver.RecordID{Name: "l", Key: kb})
	require.NoError(t, err, "the read whose shard left the Ring")
	require.False(t, ring.armed.Load(), "the shard left the Ring under the read")
	require.InDelta(t, time.Now().UnixMilli(), now, float64(time.Minute.Milliseconds()))
}

// TestRecordNowOfAUserWithoutScripts: a user whose ACL allows the store's
// function and TIME, but no script (EVALSHA, EVAL), reads a record's time
// on a Ring or a Cluster as before RecordNow went through a script: by
// TIME on the key's server. It failed with NOPERM for 'evalsha', a command
// the store's user had no reason to allow, every Value and settlement of
// a Limiter WithServerTime with it.
func TestRecordNowOfAUserWithoutScripts(t *testing.T) {
	ctx := context.Background()
	user := fmt.Sprintf("ratelimit-test-noscript-%d", time.Now().UnixNano())
	setUser := func(t *testing.T, c *redis.Client) {
		require.NoError(t, c.Do(ctx, "acl", "setuser", user, "on", ">pw", "~*", "+@all", "-eval", "-evalsha", "-eval_ro", "-evalsha_ro", "-script").Err())
		t.Cleanup(func() { c.Do(context.Background(), "acl", "deluser", user) })
	}
	run := func(t *testing.T, c redis.UniversalClient) {
		s := newStore(c, uniquePrefix(t, c), redisstore.WithServerTime())
		t.Cleanup(func() { s.Close() })
		for _, key := range []string{"k1", "k2", "k3"} {
			now, err := s.RecordNow(ctx, driver.RecordID{Name: "l", Key: key})
			require.NoError(t, err, key)
			require.InDelta(t, time.Now().UnixMilli(), now, float64(time.Minute.Milliseconds()), "%s: the server's time", key)
		}
	}
	t.Run("ring", func(t *testing.T) {
		addr := ownServer(t)
		admin := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { admin.Close() })
		setUser(t, admin)
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, Username: user, Password: "pw"})
		t.Cleanup(func() { ring.Close() })
		run(t, ring)
	})
	t.Run("cluster", func(t *testing.T) {
		admin := clusterClientT(t)
		require.NoError(t, admin.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			setUser(t, c)
			return nil
		}))
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ","), Username: user, Password: "pw"})
		t.Cleanup(func() { c.Close() })
		run(t, c)
	})
}
