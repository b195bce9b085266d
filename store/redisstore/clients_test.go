package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestRingLoadsEveryShard runs a Limiter on a Ring of two servers, each
// without the library: the library must be loaded on the shard each key
// lives on, not on one shard picked at random.
func TestRingLoadsEveryShard(t *testing.T) {
	testserver.LockServer(t, "redis-failover") // its library is deleted
	testserver.RequireReachable(t, "failover", failoverAddr)
	ctx := context.Background()
	addrs := map[string]string{"a": "127.0.0.1:6379", "b": failoverAddr}
	ring := redis.NewRing(&redis.RingOptions{Addrs: addrs})
	t.Cleanup(func() { ring.Close() })
	s := newStore(ring, uniquePrefix(t, ring))
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: 1e9}})
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, ring.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			// Not there yet, the first time, on a server no store of
			// this version has used, or one whose functions another
			// test flushed.
			if err := c.FunctionDelete(ctx, redisstore.FunctionLibrary()).Err(); err != nil && !strings.Contains(err.Error(), "Library not found") {
				return err
			}
			return nil
		}))
		for i := range 20 {
			_, err := lim.Limit(ctx, "l", fmt.Sprint("k", i))
			require.NoError(t, err, "key %d", i)
		}
	}
}

// TestNewRefusesOtherClients: New takes the clients it routes for, and
// refuses a nil one of those, or a client of another kind, with an error
// that says what to pass.
func TestNewRefusesOtherClients(t *testing.T) {
	for name, c := range map[string]redis.UniversalClient{
		"nil client":  (*redis.Client)(nil),
		"nil cluster": (*redis.ClusterClient)(nil),
		"nil ring":    (*redis.Ring)(nil),
		"wrapper":     wrapped{client(t)},
	} {
		_, err := redisstore.New(c)
		require.Error(t, err, name)
		require.ErrorContains(t, err, "redis.NewClient", name)
	}
}

type wrapped struct{ *redis.Client }

// TestUserWithoutFunctions: a user that may not run FCALL nor FUNCTION
// (an ACL of -fcall -function), as some managed services give, is
// answered NOPERM: the store keeps to scripts, as on a server without
// Functions, rather than fail every call.
func TestUserWithoutFunctions(t *testing.T) {
	ctx := context.Background()
	admin := client(t)
	user := fmt.Sprintf("ratelimit-test-nofcall-%d", time.Now().UnixNano())
	require.NoError(t, admin.Do(ctx, "acl", "setuser", user, "on", ">pw", "~*", "+@all", "-fcall", "-fcall_ro", "-function").Err())
	t.Cleanup(func() { admin.Do(context.Background(), "acl", "deluser", user) })
	opt := *admin.Options()
	opt.Username, opt.Password = user, "pw"
	c := redis.NewClient(&opt)
	t.Cleanup(func() { c.Close() })
	cnt := &counter{}
	c.AddHook(cnt)
	lim, err := ratelimit.New(newStore(c, uniquePrefix(t, admin)), ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute}})
	require.NoError(t, err)
	for i, want := range []bool{true, true, false} {
		res, err := lim.Limit(ctx, "l", "k")
		require.NoError(t, err, "call %d", i)
		require.Equal(t, want, res.OK, "call %d", i)
	}
	cnt.names = nil
	_, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.Equal(t, []string{"evalsha"}, cnt.names)
}

// TestUserWithoutFunctionsNorScripts: a user allowed neither the store's
// functions (FCALL) nor scripts (EVALSHA), whom no call of the store can
// serve, is told so by Apply and ApplyBatch, with the function's name and
// what to allow, as RecordNow tells it (TestRecordNowOfAUserWithoutFunctions);
// each op fails undecided (*driver.OpError). The error was Redis's answer
// to the script alone ("no permissions to run the 'evalsha' command"),
// which said nothing of the function refused first, nor what to allow.
func TestUserWithoutFunctionsNorScripts(t *testing.T) {
	ctx := context.Background()
	admin := client(t)
	user := fmt.Sprintf("ratelimit-test-nofcall-noscript-%d", time.Now().UnixNano())
	require.NoError(t, admin.Do(ctx, "acl", "setuser", user, "on", ">pw", "~*", "+@all", "-fcall", "-fcall_ro", "-function",
		"-eval", "-evalsha", "-eval_ro", "-evalsha_ro", "-script").Err())
	t.Cleanup(func() { admin.Do(context.Background(), "acl", "deluser", user) })
	opt := *admin.Options()
	opt.Username, opt.Password = user, "pw"
	c := redis.NewClient(&opt)
	t.Cleanup(func() { c.Close() })
	s := newStore(c, uniquePrefix(t, admin))
	t.Cleanup(func() { s.Close() })
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 100, Period: 1000, Capacity: 100}
	check := func(err error) {
		t.Helper()
		require.Error(t, err)
		require.ErrorContains(t, err, "NOPERM", "Redis's answer")
		require.ErrorContains(t, err, "FCALL "+redisstore.FunctionLibrary(), "names the function")
		require.ErrorContains(t, err, "+fcall", "says what to allow")
		require.ErrorContains(t, err, "+evalsha", "says what to allow")
	}
	for i := range 2 { // the first call finds FCALL refused, the second goes by script at once
		err := s.Apply(ctx, oneItemOp(driver.ModeLimit, 1000, "l", "k", 1, p), make([]driver.Decision, 1))
		check(err)
		t.Logf("call %d: %v", i, err)
	}
	err := s.ApplyBatch(ctx, []*driver.Op{oneItemOp(driver.ModeLimit, 1000, "l", "k", 1, p)}, [][]driver.Decision{make([]driver.Decision, 1)})
	check(err)
	require.Equal(t, []int{0}, storetest.FailedOps(t, err), "the op was not decided: %v", err)
}
