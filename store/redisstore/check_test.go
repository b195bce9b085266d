package redisstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// configure sets the settings CheckServer reads on c's server, and
// restores them at cleanup. Only the failover server may be changed.
func configure(t *testing.T, c *redis.Client) func(kv ...string) {
	t.Helper()
	require.Equal(t, failoverAddr, c.Options().Addr, "change the settings of the test's own server only")
	ctx := context.Background()
	orig := map[string]string{}
	for _, n := range []string{"save", "appendonly", "maxmemory", "maxmemory-policy"} {
		v, err := c.ConfigGet(ctx, n).Result()
		require.NoError(t, err)
		orig[n] = v[n]
	}
	t.Cleanup(func() {
		for n, v := range orig {
			require.NoError(t, c.ConfigSet(ctx, n, v).Err())
		}
	})
	return func(kv ...string) {
		t.Helper()
		for i := 0; i < len(kv); i += 2 {
			require.NoError(t, c.ConfigSet(ctx, kv[i], kv[i+1]).Err(), "%s %s", kv[i], kv[i+1])
		}
	}
}

func TestCheckServer(t *testing.T) {
	testserver.LockServer(t, "redis-failover") // it changes the server's settings
	testserver.RequireReachable(t, "failover", failoverAddr)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: failoverAddr})
	t.Cleanup(func() { c.Close() }) // after configure's restore
	set := configure(t, c)
	s := must(redisstore.New(c))
	for _, tc := range []struct {
		name string
		conf []string
		want []string // the settings warned about
	}{
		{"no persistence", []string{"save", "", "appendonly", "no", "maxmemory", "0", "maxmemory-policy", "noeviction"},
			[]string{"save, appendonly"}},
		{"snapshots", []string{"save", "3600 1"}, nil},
		{"allkeys eviction", []string{"maxmemory", "1gb", "maxmemory-policy", "allkeys-lru"}, []string{"maxmemory-policy"}},
		{"volatile eviction", []string{"maxmemory-policy", "volatile-ttl"}, []string{"maxmemory-policy"}},
		{"noeviction", []string{"maxmemory-policy", "noeviction"}, nil},
		{"a policy without maxmemory evicts nothing", []string{"maxmemory", "0", "maxmemory-policy", "allkeys-lru"}, nil},
		{"both", []string{"save", "", "maxmemory", "1gb", "maxmemory-policy", "volatile-lru"},
			[]string{"save, appendonly", "maxmemory-policy"}},
	} {
		set(tc.conf...)
		ws, err := s.CheckServer(ctx)
		require.NoError(t, err, tc.name)
		var got []string
		for _, w := range ws {
			require.Equal(t, failoverAddr, w.Server, tc.name)
			got = append(got, w.Setting)
		}
		require.Equal(t, tc.want, got, "%s: %v", tc.name, ws)
	}
	ws, err := s.CheckServer(ctx)
	require.NoError(t, err)
	require.Equal(t, `redis 127.0.0.1:6390: save, appendonly "", no: no persistence: a restart forgets every record, and every limit starts full again; `+
		`turn on appendonly (appendfsync everysec loses at most a second of writes) or RDB snapshots (save)`, ws[0].String())
	require.Contains(t, ws[1].String(), "maxmemory-policy volatile-lru (maxmemory 1073741824): when memory is full")
}

func TestCheckServerRefused(t *testing.T) {
	testserver.RequireReachable(t, "failover", failoverAddr)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: failoverAddr})
	t.Cleanup(func() { admin.Close() })
	configure(t, admin)("save", "", "appendonly", "no") // a warning, if it could be read
	// A user that may not run CONFIG, as on a managed service.
	user := fmt.Sprint("ratelimit-test-", time.Now().UnixNano())
	require.NoError(t, admin.Do(ctx, "acl", "setuser", user, "on", ">secret", "~*", "&*", "+@all", "-config").Err())
	t.Cleanup(func() { admin.Do(ctx, "acl", "deluser", user) })
	c := redis.NewClient(&redis.Options{Addr: failoverAddr, Username: user, Password: "secret"})
	defer c.Close()
	require.Error(t, c.ConfigGet(ctx, "save").Err(), "the user may not read the settings")

	ws, err := must(redisstore.New(c)).CheckServer(ctx)
	require.NoError(t, err)
	require.Empty(t, ws)

	_, err = must(redisstore.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}))).CheckServer(ctx)
	require.Error(t, err, "an unreachable server is an error")
}

func TestCheckServerCluster(t *testing.T) {
	ctx := context.Background()
	addrs := strings.Split(testserver.ClusterAddrs(t), ",")
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer c.Close()
	// What each master says, read here directly.
	want := map[string]bool{}
	var mu sync.Mutex
	require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		save, err := n.ConfigGet(ctx, "save").Result()
		if err != nil {
			return err
		}
		aof, err := n.ConfigGet(ctx, "appendonly").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		want[n.Options().Addr] = save["save"] == "" && aof["appendonly"] == "no"
		return nil
	}))
	ws, err := must(redisstore.New(c)).CheckServer(ctx)
	require.NoError(t, err)
	got := map[string]bool{}
	for addr := range want {
		got[addr] = false
	}
	for _, w := range ws {
		if w.Setting == "save, appendonly" {
			got[w.Server] = true
		}
	}
	require.Equal(t, want, got)
}

// records is a slog.Handler that hands each record to a channel.
type records chan slog.Record

func (r records) Enabled(context.Context, slog.Level) bool        { return true }
func (r records) Handle(_ context.Context, rec slog.Record) error { r <- rec; return nil }
func (r records) WithAttrs([]slog.Attr) slog.Handler              { return r }
func (r records) WithGroup(string) slog.Handler                   { return r }

func TestStoreWarnsOnItsLogger(t *testing.T) {
	testserver.RequireReachable(t, "failover", failoverAddr)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: failoverAddr})
	t.Cleanup(func() { c.Close() })
	configure(t, c)("save", "", "appendonly", "no", "maxmemory", "0")
	logged := make(records, 10)
	lim, err := ratelimit.New(must(redisstore.New(c, redisstore.WithPrefix(uniquePrefix(t, c)), redisstore.WithLogger(slog.New(logged)))),
		ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}})
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	select {
	case rec := <-logged:
		require.Equal(t, slog.LevelWarn, rec.Level)
		require.Contains(t, rec.Message, "no persistence")
		attrs := map[string]string{}
		rec.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		require.Equal(t, map[string]string{"server": failoverAddr, "setting": "save, appendonly", "value": `"", no`}, attrs)
	case <-time.After(30 * time.Second):
		t.Fatal("no warning logged")
	}
}

// TestCheckServerRingWithoutShards: CheckServer on a Ring that has no
// shard to check, closed or with none up, fails as on a server that
// could not be reached, rather than report no warnings: go-redis's
// ForEachShard skips the shards it took for down, and has none once
// the Ring is closed.
func TestCheckServerRingWithoutShards(t *testing.T) {
	ctx := context.Background()
	closed := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:6379"}})
	require.NoError(t, closed.Close())
	_, err := must(redisstore.New(closed, redisstore.WithLogger(nil))).CheckServer(ctx)
	require.ErrorIs(t, err, driver.ErrClosed, "a closed Ring")
	require.ErrorIs(t, err, redis.ErrClosed, "a closed Ring: go-redis's own error")

	none := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:6379"}})
	t.Cleanup(func() { none.Close() })
	none.SetAddrs(map[string]string{}) // no shard left, as when every one is down
	_, err = must(redisstore.New(none, redisstore.WithLogger(nil))).CheckServer(ctx)
	require.ErrorContains(t, err, "shards are down", "a Ring without a shard up")
}

// ownSentinel starts a Redis Sentinel of the test's own on a free
// loopback port, which monitors the master at addr under the name
// "ratelimit-test", and returns its address once it answers.
func ownSentinel(t *testing.T, master string) (addr string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr = l.Addr().String()
	require.NoError(t, l.Close())
	_, port, _ := net.SplitHostPort(addr)
	host, mport, _ := net.SplitHostPort(master)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf") // Sentinel rewrites it
	require.NoError(t, os.WriteFile(conf, []byte(strings.Join([]string{
		"bind 127.0.0.1", "port " + port, "dir " + dir,
		"sentinel monitor ratelimit-test " + host + " " + mport + " 1", ""}, "\n")), 0o600))
	sentinel := exec.Command("redis-server", conf, "--sentinel")
	require.NoError(t, sentinel.Start())
	t.Cleanup(func() {
		_ = sentinel.Process.Kill()
		_ = sentinel.Wait()
	})
	testserver.WaitReachable(t, addr, true)
	return addr
}

// TestCheckServerSentinel: on a client of Sentinel (redis.NewFailoverClient),
// a Warning names the master's address, where the client's options say
// "FailoverClient".
func TestCheckServerSentinel(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		testserver.Unreachable(t, "redis-server", "PATH", err)
	}
	ctx := context.Background()
	master := ownServer(t) // keeps nothing on disk: a warning
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "ratelimit-test", SentinelAddrs: []string{ownSentinel(t, master)}})
	t.Cleanup(func() { c.Close() })
	ws, err := must(redisstore.New(c, redisstore.WithLogger(nil))).CheckServer(ctx)
	require.NoError(t, err)
	require.Len(t, ws, 1)
	require.Equal(t, "save, appendonly", ws[0].Setting)
	require.Equal(t, master, ws[0].Server, "the master's address")
}
