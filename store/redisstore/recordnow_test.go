package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
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
// server that holds it: a call of the store's library's time function
// (FCALL), which the store's user may call as it calls the library's
// other. It went to the server's own client, past the Ring's or the
// Cluster's hooks; then, as a script (EVALSHA), which a user allowed the
// function alone could not run.
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
		require.True(t, slices.Contains(cnt.names, "fcall"), "%v", cnt.names)
		require.False(t, slices.ContainsFunc(cnt.names, func(n string) bool { return n == "evalsha" || n == "eval" || n == "time" }), "%v", cnt.names)
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
	ring := newLeavingRing(t, addrs, "fcall", map[string]string{"a": addrs[0]})
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
// functions (FCALL, FUNCTION LOAD) and TIME, which the functions call, but
// no script (EVALSHA, EVAL) reads a record's time on a Ring or a Cluster
// by the library's time function, on a server that has the library
// already or not, through the client, whose hooks see it. The script was
// refused (NOPERM for 'evalsha'), and the store sent TIME to the key's
// server's own client, past the Ring's or the Cluster's hooks and
// redirections, for the store's life. (A user not allowed TIME cannot
// have it read by a function or a script either: Redis checks the
// commands they call against the user's ACL; nor can it have its calls
// decided WithServerTime, whose function reads TIME.)
func TestRecordNowOfAUserWithoutScripts(t *testing.T) {
	ctx := context.Background()
	user := fmt.Sprintf("ratelimit-test-noscript-%d", time.Now().UnixNano())
	setUser := func(t *testing.T, c *redis.Client) {
		require.NoError(t, c.Do(ctx, "acl", "setuser", user, "on", ">pw", "~*", "+@all",
			"-eval", "-evalsha", "-eval_ro", "-evalsha_ro", "-script").Err())
		t.Cleanup(func() { c.Do(context.Background(), "acl", "deluser", user) })
	}
	run := func(t *testing.T, c redis.UniversalClient) {
		cnt := &counter{}
		c.AddHook(cnt)
		s := newStore(c, uniquePrefix(t, c), redisstore.WithServerTime())
		t.Cleanup(func() { s.Close() })
		for _, key := range []string{"k1", "k2", "k3"} {
			cnt.names = nil
			now, err := s.RecordNow(ctx, driver.RecordID{Name: "l", Key: key})
			require.NoError(t, err, key)
			require.InDelta(t, time.Now().UnixMilli(), now, float64(time.Minute.Milliseconds()), "%s: the server's time", key)
			require.Equal(t, "fcall", cnt.names[len(cnt.names)-1], "%s: the read of the time, seen by the client's hooks: %v", key, cnt.names)
		}
	}
	t.Run("ring", func(t *testing.T) {
		addr := ownServer(t) // without the library: RecordNow loads it
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

// TestRecordNowOfAUserWithoutFunctions: a user not allowed the store's
// functions (FCALL, FUNCTION) reads a record's time as it has its calls
// decided, by the store's script (EVALSHA), as on a server without
// Functions (TestUserWithoutFunctions); a user allowed neither functions
// nor scripts, which no call of the store can serve, is told so, with
// what to allow, rather than read the time past the client's hooks by
// TIME on the key's server. A user not allowed TIME, which the function
// calls, is told to allow it.
func TestRecordNowOfAUserWithoutFunctions(t *testing.T) {
	ctx := context.Background()
	addr := ownServer(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	recordNow := func(t *testing.T, acl ...string) (int64, []string, error) {
		user := fmt.Sprintf("ratelimit-test-nofcall-%d", time.Now().UnixNano())
		args := append([]any{"acl", "setuser", user, "on", ">pw", "~*", "+@all"}, toAny(acl)...)
		require.NoError(t, admin.Do(ctx, args...).Err())
		t.Cleanup(func() { admin.Do(context.Background(), "acl", "deluser", user) })
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, Username: user, Password: "pw"})
		t.Cleanup(func() { ring.Close() })
		cnt := &counter{}
		ring.AddHook(cnt)
		s := newStore(ring, uniquePrefix(t, ring), redisstore.WithServerTime())
		t.Cleanup(func() { s.Close() })
		now, err := s.RecordNow(ctx, driver.RecordID{Name: "l", Key: "k"})
		return now, cnt.names, err
	}
	t.Run("scripts allowed", func(t *testing.T) {
		now, names, err := recordNow(t, "-fcall", "-fcall_ro", "-function")
		require.NoError(t, err)
		require.InDelta(t, time.Now().UnixMilli(), now, float64(time.Minute.Milliseconds()))
		require.True(t, slices.Contains(names, "evalsha"), "%v", names)
	})
	t.Run("no scripts", func(t *testing.T) {
		_, names, err := recordNow(t, "-fcall", "-fcall_ro", "-function", "-eval", "-evalsha", "-eval_ro", "-evalsha_ro", "-script")
		require.Error(t, err)
		require.ErrorContains(t, err, "NOPERM", "Redis's answer")
		require.ErrorContains(t, err, "FCALL "+redisstore.FunctionLibrary()+"_time", "names the function")
		require.ErrorContains(t, err, "+fcall", "says what to allow")
		require.False(t, slices.Contains(names, "time"), "%v: TIME past the store's function and script", names)
	})
	t.Run("no TIME", func(t *testing.T) {
		_, _, err := recordNow(t, "-time")
		require.Error(t, err)
		require.ErrorContains(t, err, redisstore.FunctionLibrary()+"_time", "Redis's answer names the function")
		require.ErrorContains(t, err, "+time", "says what to allow")
	})
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestRecordNowBesideAPreviousLibrary: a server that holds the library of
// the previous release, which registered the decision function alone,
// from the same ratelimit.lua, under a name of the digest of that file
// alone, keeps it, and the store of this release loads its own beside it
// and reads a record's time by it: a release that runs during a rollout
// beside the one before it on the same servers breaks neither. Had the
// library kept the name of the file's digest, the store's load would have
// found the previous library under it ("already exists"), without the
// time function.
func TestRecordNowBesideAPreviousLibrary(t *testing.T) {
	ctx := context.Background()
	addr := ownServer(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	prev, code := redisstore.PreviousLibrary()
	require.NoError(t, c.FunctionLoad(ctx, code).Err())
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}})
	t.Cleanup(func() { ring.Close() })
	s := newStore(ring, uniquePrefix(t, ring), redisstore.WithServerTime())
	t.Cleanup(func() { s.Close() })
	now, err := s.RecordNow(ctx, driver.RecordID{Name: "l", Key: "k"})
	require.NoError(t, err)
	require.InDelta(t, time.Now().UnixMilli(), now, float64(time.Minute.Milliseconds()))
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 100, Period: 1000, Capacity: 100}
	require.NoError(t, s.Apply(ctx, oneItemOp(driver.ModeLimit, 1000, "l", "k", 1, p), make([]driver.Decision, 1)))
	for _, name := range []string{prev, redisstore.FunctionLibrary()} {
		libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: name}).Result()
		require.NoError(t, err)
		require.Len(t, libs, 1, "the library %s", name)
	}
}

// TestRecordNowOfAForeignLibraryUnderItsName: a library of other code
// loaded under the library's name, without its time function, fails
// RecordNow with an error that names the library and says to delete it,
// as it fails the store's other calls (TestForeignLibraryUnderItsName).
func TestRecordNowOfAForeignLibraryUnderItsName(t *testing.T) {
	ctx := context.Background()
	addr := ownServer(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	name := redisstore.FunctionLibrary()
	require.NoError(t, c.FunctionLoad(ctx, "#!lua name="+name+"\nredis.register_function('other', function() return 1 end)\n").Err())
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}})
	t.Cleanup(func() { ring.Close() })
	s := newStore(ring, uniquePrefix(t, ring), redisstore.WithServerTime())
	t.Cleanup(func() { s.Close() })
	_, err := s.RecordNow(ctx, driver.RecordID{Name: "l", Key: "k"})
	require.Error(t, err)
	require.ErrorContains(t, err, "Function not found", "Redis's answer")
	require.ErrorContains(t, err, "FUNCTION DELETE "+name, "names the library and says what to do")

	require.NoError(t, c.FunctionDelete(ctx, name).Err())
	_, err = s.RecordNow(ctx, driver.RecordID{Name: "l", Key: "k"})
	require.NoError(t, err, "the store loads its own library")
}
