package redisstore_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestClusterMasterKilled: a Cluster master is killed (SIGKILL) and its
// replica takes its place. A client that loaded the map of the slots
// before, and whose own reload (ClusterStateReloadInterval) is far off,
// sends the first call after the failover to the dead master's address,
// refused; that call has the client reload its map, and the next call
// reaches the new master. The client went on sending every call of the
// slot to the dead address until its reload interval passed (10 s by
// default): nothing else makes go-redis reload it. So for a call of the
// function (Apply), a read (Load) and the time of a key's server
// (RecordNow), each through a client of its own. The record continues on
// the new master: every call refused ran nowhere.
func TestClusterMasterKilled(t *testing.T) {
	ctx := context.Background()
	nodes := ownClusterOf(t, 1, "--cluster-node-timeout", "500")
	var addrs []string
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: time.Hour, DialerRetries: 1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	const prefix = "killed:"
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour.Milliseconds(), Capacity: 10}
	id := driver.RecordID{Name: "l", Key: "k"}
	op := func() *driver.Op { return oneItemOp(driver.ModeLimit, t0.UnixMilli(), id.Name, id.Key, 1, p) }
	stores := map[string]*redisstore.Store{}
	clients := map[string]*redis.ClusterClient{}
	for _, call := range []string{"Apply", "Load", "RecordNow"} {
		clients[call] = newClient()
		stores[call] = newStore(clients[call], prefix)
	}
	// Each client learns the map, and the record is written.
	for _, call := range []string{"Load", "RecordNow", "Apply"} {
		_, err := stores[call].RecordNow(ctx, id)
		require.NoError(t, err)
	}
	out := make([]driver.Decision, 1)
	require.NoError(t, stores["Apply"].Apply(ctx, op(), out))
	require.Equal(t, 9.0, out[0].Remaining)

	var one *redis.Client
	for _, n := range nodes {
		one = n
		break
	}
	key := stores["Apply"].Key(id)
	slot := int(one.ClusterKeySlot(ctx, key).Val())
	owner := func(n *redis.Client) string { // the address of the slot's master as n sees it, online
		shards, err := n.ClusterShards(ctx).Result()
		if err != nil {
			return ""
		}
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start <= int64(slot) && int64(slot) <= r.End {
					for _, node := range sh.Nodes {
						if node.Role == "master" && node.Health == "online" {
							return net.JoinHostPort(node.IP, strconv.FormatInt(node.Port, 10))
						}
					}
				}
			}
		}
		return ""
	}
	master := nodes[owner(one)]
	require.NotNil(t, master)
	// Until the replica has the record (WAIT counts the writes of its
	// own connection only).
	for i := 0; ; i++ {
		repl := master.InfoMap(ctx, "replication").Val()["Replication"]
		if strings.Contains(repl["slave0"], ",offset="+repl["master_repl_offset"]+",") {
			break
		}
		require.Less(t, i, 500, "the replica lags: %v", repl)
		time.Sleep(10 * time.Millisecond)
	}
	pid, err := strconv.Atoi(master.InfoMap(ctx, "server").Val()["Server"]["process_id"])
	require.NoError(t, err)
	proc, err := os.FindProcess(pid)
	require.NoError(t, err)
	require.NoError(t, proc.Kill())
	dead := master.Options().Addr

	// Until every node serves the slot from the replica.
	for i := 0; ; i++ {
		moved := true
		for addr, n := range nodes {
			if addr != dead {
				moved = moved && owner(n) != "" && owner(n) != dead
			}
		}
		if moved {
			break
		}
		require.Less(t, i, 600, "no replica took the slot over")
		time.Sleep(50 * time.Millisecond)
	}

	for _, call := range []string{"Load", "RecordNow", "Apply"} {
		s := stores[call]
		do := func() error {
			switch call {
			case "Apply":
				return s.Apply(ctx, op(), out)
			case "Load":
				rec := make([]driver.Record, 1)
				err := s.Load(ctx, []driver.RecordID{id}, rec)
				if err == nil {
					require.True(t, rec[0].Found)
					require.Equal(t, 9.0, rec[0].State.Remaining, "the record, replicated")
				}
				return err
			}
			_, err := s.RecordNow(ctx, id)
			return err
		}
		err := do()
		if err == nil {
			continue // the client's retries found the new master
		}
		require.ErrorIs(t, err, syscall.ECONNREFUSED, "%s: to the dead master only", call)
		// The client reloads its map in the background.
		c := clients[call]
		for i := 0; ; i++ {
			node, err := c.MasterForKey(ctx, key)
			require.NoError(t, err)
			if node.Options().Addr != dead {
				break
			}
			require.Less(t, i, 500, "%s: the client still takes the dead master for the slot's", call)
			time.Sleep(10 * time.Millisecond)
		}
		require.NoError(t, do(), "%s: once the client has reloaded its map", call)
	}
	require.Equal(t, 8.0, out[0].Remaining, "the record continued once")
}

// TestClusterNoReloadOnATimeout: a Cluster client reloads its map of the
// slots after a call that a node refused or dropped
// (TestClusterMasterKilled), not after one that its caller's deadline or
// the client's ReadTimeout ended: a slow node, or a caller in a hurry,
// says nothing of where the slots are, and must not have every client of
// a busy Cluster ask a node for the map at each call past its deadline.
func TestClusterNoReloadOnATimeout(t *testing.T) {
	addr, drop := testserver.Silent(t)
	var loads atomic.Int32
	c := redis.NewClusterClient(&redis.ClusterOptions{ReadTimeout: 100 * time.Millisecond, ContextTimeoutEnabled: true,
		MaxRedirects: -1, DialerRetries: 1, ClusterStateReloadInterval: time.Hour,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			loads.Add(1)
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
		}})
	t.Cleanup(func() {
		drop()
		c.Close()
	})
	s := newStore(c, "ratelimit-test:noreload:")
	// The calls whose caller's deadline ends them first, then those the
	// read timeout ends, which leave time for the reloads any earlier
	// call would have asked for.
	for _, deadline := range []bool{true, false} {
		for _, sc := range storeCalls {
			if sc.name == "CheckServer" {
				continue // it asks for the map itself (ForEachMaster)
			}
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if deadline {
				ctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
			}
			err := sc.call(ctx, s)
			cancel()
			require.Error(t, err, sc.name)
			if deadline {
				require.ErrorIs(t, err, context.DeadlineExceeded, sc.name)
			}
		}
	}
	require.EqualValues(t, 1, loads.Load(), "the map was loaded once, before the first call, and not again after a timeout")

	drop() // refused from now on
	require.Error(t, s.Apply(context.Background(), silentOp(), make([]driver.Decision, 1)))
	require.Eventually(t, func() bool { return loads.Load() == 2 }, 10*time.Second, 5*time.Millisecond,
		"a refused call has the client reload its map: loads %d", loads.Load())
}
