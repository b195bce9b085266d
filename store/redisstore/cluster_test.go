package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"strings"
	"sync"
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

// fcalls records the function calls a client sends and their errors.
type fcalls struct {
	mu   sync.Mutex
	n    int
	errs []string
}

func (f *fcalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *fcalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		f.record(cmd)
		return err
	}
}

func (f *fcalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			f.record(cmd)
		}
		return err
	}
}

func (f *fcalls) record(cmd redis.Cmder) {
	if cmd.Name() != "fcall" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	if err := cmd.Err(); err != nil {
		f.errs = append(f.errs, err.Error())
	}
}

func (f *fcalls) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n, f.errs = 0, nil
}

func (f *fcalls) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func (f *fcalls) errors() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.errs, "\n")
}

// loadEverywhere sends ops through a store of a prefix of its own, so
// that the function is loaded on every master they reach before a test
// counts calls: a master that has not loaded it yet answers the first call
// with an error, and the store loads it and calls again.
func loadEverywhere(t *testing.T, c *redis.ClusterClient, ops []*driver.Op) {
	t.Helper()
	outs := make([][]driver.Decision, len(ops))
	for i, op := range ops {
		outs[i] = make([]driver.Decision, len(op.Items))
	}
	require.NoError(t, newStore(c, uniquePrefix(t, c)).ApplyBatch(context.Background(), ops, outs))
}

// TestClusterOneCallPerMaster: a batch over many keys makes one call of
// the function per master, not one per key, and decides as Model does.
func TestClusterOneCallPerMaster(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ",")})
	t.Cleanup(func() { c.Close() })
	store := newStore(c, uniquePrefix(t, c))
	model := storetest.NewModel()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
	masters := map[string]bool{}
	var ops []*driver.Op
	for i := range 40 {
		key := fmt.Sprint("k-", i%30) // some keys twice
		node, err := c.MasterForKey(ctx, store.Key(driver.RecordID{Name: "l", Key: key}))
		require.NoError(t, err)
		masters[node.Options().Addr] = true
		ops = append(ops, &driver.Op{Now: t0.UnixMilli() + int64(i), Items: []driver.Item{
			{Name: "l", Key: key, Count: float64(1 + i%7), Shards: []driver.Shard{{Params: p}}}}})
	}
	loadEverywhere(t, c, ops)
	require.NoError(t, store.ApplyBatch(ctx, ops[:1], [][]driver.Decision{make([]driver.Decision, 1)}))
	require.NoError(t, model.Apply(ctx, ops[0], make([]driver.Decision, 1)))
	calls := &fcalls{}
	c.AddHook(calls)
	got := make([][]driver.Decision, len(ops))
	for i := range got {
		got[i] = make([]driver.Decision, 1)
	}
	require.NoError(t, store.ApplyBatch(ctx, ops, got))
	require.Equal(t, len(masters), calls.count(), "one call per master")
	require.Empty(t, calls.errors())
	for i, op := range ops {
		want := make([]driver.Decision, 1)
		require.NoError(t, model.Apply(ctx, op, want))
		require.Equal(t, want, got[i], "op %d", i)
	}
}

// TestClusterSlotsDifferential drives batches of random mixed ops (limit,
// check, refund, reserving or not, several limits, two-shard items, the
// same records several times) over keys of several slots of one master,
// which go as one call of the function, and requires Model's answers and
// records, bit for bit.
func TestClusterSlotsDifferential(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ",")})
	t.Cleanup(func() { c.Close() })
	store := newStore(c, uniquePrefix(t, c))
	// Five keys of different slots on the master of the first.
	var keys []string
	var master string
	slots := map[int64]bool{}
	for i := 0; len(keys) < 5; i++ {
		k := fmt.Sprint("d-", i)
		rk := store.Key(driver.RecordID{Name: "a", Key: k})
		node, err := c.MasterForKey(ctx, rk)
		require.NoError(t, err)
		slot, err := c.ClusterKeySlot(ctx, rk).Result()
		require.NoError(t, err)
		if master == "" {
			master = node.Options().Addr
		}
		if node.Options().Addr == master && !slots[slot] {
			slots[slot] = true
			keys = append(keys, k)
		}
	}
	loadEverywhere(t, c, []*driver.Op{{Now: t0.UnixMilli(), Items: []driver.Item{{Name: "a", Key: keys[0], Count: 1,
		Shards: []driver.Shard{{Params: driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}}}}}}})
	calls := &fcalls{}
	c.AddHook(calls)
	for seed := range 8 {
		model := storetest.NewModel()
		prefix := uniquePrefix(t, c)
		store := newStore(c, prefix)
		rng := rand.New(rand.NewPCG(uint64(seed), 0x5107))
		limits := map[string]driver.Params{}
		for _, name := range []string{"a", "b", "c"} {
			p := driver.Params{Kind: ratelimit.Kind(1 + rng.IntN(2)), Rate: []float64{1, 2.5, 1.0 / 3, 7}[rng.IntN(4)],
				Period: []int64{7, 1000, 60_000}[rng.IntN(3)]}
			p.Capacity = p.Rate * (1 + rng.Float64()*3)
			if rng.IntN(2) == 0 {
				p.MaxReserved = p.Capacity * 2
			}
			limits[name] = p
		}
		now := t0.UnixMilli()
		for step := range 12 {
			now += rng.Int64N(3000)
			var ops []*driver.Op
			for range 1 + rng.IntN(30) {
				op := &driver.Op{Now: now + rng.Int64N(7) - 3, Reserve: rng.IntN(3) == 0, Mode: driver.Mode(rng.IntN(4) % 3)}
				key := keys[rng.IntN(len(keys))]
				for _, name := range []string{"a", "b", "c"}[:1+rng.IntN(3)] {
					p := limits[name]
					p.Phase = int64(len(key)+len(name)) % p.Period
					it := driver.Item{Name: name, Key: key, Count: rng.Float64() * p.Capacity * 1.5,
						Shards: []driver.Shard{{Index: 0, Params: p}}}
					if op.Mode != driver.ModeRefund && rng.IntN(3) == 0 {
						it.Shards = append(it.Shards, driver.Shard{Index: 1, Params: p})
					}
					op.Items = append(op.Items, it)
				}
				ops = append(ops, op)
			}
			got := make([][]driver.Decision, len(ops))
			for i, op := range ops {
				got[i] = make([]driver.Decision, len(op.Items))
			}
			calls.reset()
			require.NoError(t, store.ApplyBatch(ctx, ops, got))
			require.Equal(t, 1, calls.count(), "seed %d step %d: one call", seed, step)
			for i, op := range ops {
				want := make([]driver.Decision, len(op.Items))
				require.NoError(t, model.Apply(ctx, op, want))
				require.Equal(t, want, got[i], "seed %d step %d op %d", seed, step, i)
			}
		}
		var ids []driver.RecordID
		for _, k := range keys {
			for _, name := range []string{"a", "b", "c"} {
				ids = append(ids, driver.RecordID{Name: name, Key: k}, driver.RecordID{Name: name, Key: k, Shard: 1})
			}
		}
		gotRecs := make([]driver.Record, len(ids))
		wantRecs := make([]driver.Record, len(ids))
		require.NoError(t, store.Load(ctx, ids, gotRecs))
		require.NoError(t, model.Load(ctx, ids, wantRecs))
		require.Equal(t, wantRecs, gotRecs, "seed %d: records", seed)
	}
}

// TestClusterBadRecordFailsOnlyItsOp: oneBadRecord on a Cluster, with
// the good and the bad key in two slots of one master, whose ops go as one
// call over both slots.
func TestClusterBadRecordFailsOnlyItsOp(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ",")})
	t.Cleanup(func() { c.Close() })
	store := newStore(c, uniquePrefix(t, c))
	where := func(key string) (string, int64) {
		rk := store.Key(driver.RecordID{Name: "l", Key: key})
		node, err := c.MasterForKey(ctx, rk)
		require.NoError(t, err)
		slot, err := c.ClusterKeySlot(ctx, rk).Result()
		require.NoError(t, err)
		return node.Options().Addr, slot
	}
	master, slot := where("good")
	bad := ""
	for i := 0; bad == ""; i++ {
		k := fmt.Sprint("bad-", i)
		if m, s := where(k); m == master && s != slot {
			bad = k
		}
	}
	calls := &fcalls{}
	c.AddHook(calls)
	oneBadRecord(t, c, store, "good", bad)
	require.Contains(t, calls.errors(), "BADRECORD", "the batch went as one call, which failed")
}

// master is one master of the local Cluster.
type master struct {
	id     string
	addr   string
	client *redis.Client
}

// TestClusterSlotMoves moves the slot of a ratelimit key to another
// master while the store uses it, as resharding does: half-way first (the
// slot MIGRATING, its records moved: the old master answers ASK), then for
// good (MOVED), on a master that lacks the function library. Every
// decision must continue the records exactly. The slot chosen holds no
// other key, and is given back at the end.
func TestClusterSlotMoves(t *testing.T) {
	ctx := context.Background()
	addrs := strings.Split(testserver.ClusterAddrs(t), ",")
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { c.Close() })
	var masters []master
	for _, addr := range addrs {
		n := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { n.Close() })
		id, err := n.ClusterMyID(ctx).Result()
		require.NoError(t, err)
		masters = append(masters, master{id: id, addr: addr, client: n})
	}
	require.GreaterOrEqual(t, len(masters), 2)
	// ownerID returns the master that n says serves slot.
	ownerID := func(n redis.Cmdable, slot int) string {
		shards, err := n.ClusterShards(ctx).Result()
		require.NoError(t, err)
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start <= int64(slot) && int64(slot) <= r.End {
					for _, nd := range sh.Nodes {
						if nd.Role == "master" {
							return nd.ID
						}
					}
				}
			}
		}
		t.Fatalf("no master serves slot %d", slot)
		return ""
	}
	owner := func(slot int) master {
		id := ownerID(c, slot)
		for _, m := range masters {
			if m.id == id {
				return m
			}
		}
		t.Fatalf("slot %d is on %s, not one of %s", slot, id, addrs)
		return master{}
	}

	prefix := uniquePrefix(t, c)
	store := newStore(c, prefix)
	// A key whose slot holds nothing yet: moving it disturbs no one.
	var key string
	var slot int
	var src master
	for i := 0; key == ""; i++ {
		k := fmt.Sprint("moving-", i)
		s, err := c.ClusterKeySlot(ctx, store.Key(driver.RecordID{Name: "l", Key: k})).Result()
		require.NoError(t, err)
		m := owner(int(s))
		if n, err := m.client.ClusterCountKeysInSlot(ctx, int(s)).Result(); err == nil && n == 0 {
			key, slot, src = k, int(s), m
		}
	}
	dst := masters[0]
	if dst.id == src.id {
		dst = masters[1]
	}
	// move migrates the slot's keys (ours only) from one master to
	// another and hands it over; half stops once the keys have moved.
	move := func(from, to master, half bool) {
		t.Helper()
		require.NoError(t, to.client.Do(ctx, "cluster", "setslot", slot, "importing", from.id).Err())
		require.NoError(t, from.client.Do(ctx, "cluster", "setslot", slot, "migrating", to.id).Err())
		keys, err := from.client.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
		require.NoError(t, err)
		host, port, _ := net.SplitHostPort(to.addr)
		for _, k := range keys {
			require.True(t, strings.HasPrefix(k, prefix), "slot %d holds a key of someone else: %q", slot, k)
			require.NoError(t, from.client.Migrate(ctx, host, port, k, 0, 5*time.Second).Err())
		}
		if half {
			return
		}
		for _, m := range append([]master{to, from}, masters...) {
			require.NoError(t, m.client.Do(ctx, "cluster", "setslot", slot, "node", to.id).Err())
		}
	}
	t.Cleanup(func() {
		// Give the slot back to its master, emptied of the test's keys,
		// by the same protocol: its master's SETSLOT NODE first, which
		// bumps that master's epoch so that its claim wins.
		for _, m := range masters {
			for _, k := range m.client.ClusterGetKeysInSlot(ctx, slot, 1000).Val() {
				if strings.HasPrefix(k, prefix) {
					_, _ = m.client.Pipelined(ctx, func(p redis.Pipeliner) error {
						p.Do(ctx, "asking")
						p.Del(ctx, k)
						return nil
					})
				}
			}
		}
		if cur := owner(slot); cur.id != src.id {
			require.NoError(t, src.client.Do(ctx, "cluster", "setslot", slot, "importing", cur.id).Err())
			require.NoError(t, cur.client.Do(ctx, "cluster", "setslot", slot, "migrating", src.id).Err())
		}
		for _, m := range append([]master{src}, masters...) {
			require.NoError(t, m.client.Do(ctx, "cluster", "setslot", slot, "node", src.id).Err())
		}
		for _, m := range masters {
			require.NoError(t, m.client.Do(ctx, "cluster", "setslot", slot, "stable").Err())
		}
		for _, m := range masters {
			require.Equal(t, src.id, ownerID(m.client, slot), "%s: slot %d is back on its master", m.addr, slot)
		}
	})

	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l":     {Kind: ratelimit.FixedWindow, Rate: 1000, Period: time.Hour},
		"other": {Kind: ratelimit.TokenBucket, Rate: 1000, Period: time.Hour, Shards: 4},
	}, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	spent := 0.0
	limit := func(where string, n float64, names ...string) {
		t.Helper()
		res, err := lim.LimitAll(ctx, key, names, ratelimit.Count(n))
		require.NoError(t, err, where)
		require.True(t, res.OK, where)
		spent += n
		if len(res.All) > 0 {
			res = res.All[0]
		}
		require.Equal(t, 1000-spent, res.Remaining, "%s: the record of l carried over", where)
	}
	limit("before", 10, "l", "other")
	// The new master lacks the library.
	if err := dst.client.FunctionDelete(ctx, redisstore.FunctionLibrary()).Err(); err != nil {
		require.ErrorContains(t, err, "Library not found")
	}

	// Before the client has learned of the move: a batch over the moved
	// slot and another of the old master goes as one call there, which
	// Redis refuses, unchanged, at the moved key; its ops go again one
	// call per key, routed anew.
	var other string
	for i := 0; other == ""; i++ {
		k := fmt.Sprint("other-", i)
		node, err := c.MasterForKey(ctx, store.Key(driver.RecordID{Name: "l", Key: k}))
		require.NoError(t, err)
		if s, _ := c.ClusterKeySlot(ctx, store.Key(driver.RecordID{Name: "l", Key: k})).Result(); node.Options().Addr == src.addr && int(s) != slot {
			other = k
		}
	}
	calls := &fcalls{}
	unaware := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { unaware.Close() })
	unaware.AddHook(calls)
	ustore := newStore(unaware, prefix)
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 1000, Period: time.Hour.Milliseconds(), Capacity: 1000,
		Phase: t0.UnixMilli() % time.Hour.Milliseconds()}
	batch := func(where string, store *redisstore.Store) {
		t.Helper()
		ops := []*driver.Op{
			{Now: t0.UnixMilli(), Items: []driver.Item{{Name: "l", Key: other, Count: 1, Shards: []driver.Shard{{Params: p}}}}},
			{Now: t0.UnixMilli(), Items: []driver.Item{{Name: "l", Key: key, Count: 5, Shards: []driver.Shard{{Params: p}}}}},
		}
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		require.NoError(t, store.ApplyBatch(ctx, ops, outs), where)
		spent += 5
		require.Equal(t, 1000-spent, outs[1][0].Remaining, where)
	}

	// Half-way, an op whose records have all moved follows ASK. (One
	// whose records are partly on each side, or not yet created, is
	// refused with TRYAGAIN until the move completes, as Redis refuses any
	// command on several keys then.)
	// The same through a client whose first two sends of the call are
	// answered LOADING, so that the slot's refusal comes third.
	ref := &refuser{reply: "-LOADING Redis is loading the dataset in memory\r\n"}
	refused := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Dialer: ref.dial})
	t.Cleanup(func() { refused.Close() })
	refused.AddHook(calls)
	rstore := newStore(refused, prefix)

	move(src, dst, true)
	limit("migrating (ASK)", 20, "l")
	// The ASK has c reload its map of the slots in the background, and
	// that reload may run after the move below: the batch goes through
	// another client, which loads its map now and has no reason to reload
	// it before the batch.
	require.NoError(t, unaware.Ping(ctx).Err())
	require.NoError(t, refused.Ping(ctx).Err())
	move(src, dst, false)
	calls.reset()
	batch("moved, the client unaware", ustore)
	require.Contains(t, calls.errors(), "non local key", "the call over two slots was refused")
	calls.reset()
	ref.armed.Store(2)
	batch("moved, the client unaware, after two sends refused", rstore)
	require.Zero(t, ref.armed.Load(), "the refusals happened")
	require.Contains(t, calls.errors(), "non local key", "the call over two slots was refused")
	limit("moved (MOVED)", 30, "l", "other")

	// Many callers at once, coalesced, on the slot's new master.
	var wg sync.WaitGroup
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := lim.Limit(ctx, "l", key)
			require.NoError(t, err)
			require.True(t, res.OK)
		}()
	}
	wg.Wait()
	spent += 40
	st, err := lim.Value(ctx, "l", key)
	require.NoError(t, err)
	require.Equal(t, 1000-spent, st.Remaining)
	require.Equal(t, dst.id, owner(slot).id)
}

// ownCluster starts a Redis Cluster of three masters for the test alone,
// on free loopback ports, which the test may reshard as it likes, and
// returns a client of each node by its address.
func ownCluster(t *testing.T) map[string]*redis.Client {
	t.Helper()
	return ownClusterOf(t, 0)
}

// ownClusterOf starts, as ownCluster does, a Redis Cluster of three
// masters with replicas of each, its nodes started with args besides, and
// returns a client of each node by its address, once every node has the
// Cluster up and knows every other, and every replica has the data of its
// master.
func ownClusterOf(t *testing.T, replicas int, args ...string) map[string]*redis.Client {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			testserver.Unreachable(t, bin, "PATH", err)
		}
	}
	nodes := map[string]*redis.Client{}
	var addrs []string
	for range 3 * (1 + replicas) {
		addr := ownServer(t, append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"}, args...)...)
		n := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { n.Close() })
		nodes[addr] = n
		addrs = append(addrs, addr)
	}
	require.NoError(t, clusterCreate(addrs, replicas, clusterCreateLimit))
	ctx := context.Background()
	for _, n := range nodes {
		for i := 0; ; i++ {
			info := n.ClusterInfo(ctx).Val()
			repl := n.Info(ctx, "replication").Val()
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", len(nodes))) &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
				break
			}
			require.Less(t, i, 200, "%s: the cluster is not up", n.Options().Addr)
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes
}

// clusterCreateLimit is how long redis-cli may take to create a test
// Cluster: a few seconds where the nodes answer.
const clusterCreateLimit = time.Minute

// clusterCreate runs redis-cli --cluster create on the nodes at addrs,
// with replicas of each master, and ends it after limit: a node that
// accepts connections and never answers held it, and the test, until the
// test binary's own timeout, which named no cause.
func clusterCreate(addrs []string, replicas int, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", fmt.Sprint(replicas), "--cluster-yes")
	cmd := exec.CommandContext(ctx, "redis-cli", args...)
	cmd.WaitDelay = time.Second // its output's pipe, should a child hold it
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return fmt.Errorf("creating the cluster: redis-cli %s did not finish within %v, and was ended: is a node not answering? "+
			"Its output: %q", strings.Join(args, " "), limit, out)
	}
	if err != nil {
		return fmt.Errorf("creating the cluster: redis-cli %s: %w; its output: %q", strings.Join(args, " "), err, out)
	}
	return nil
}

// TestClusterCreateEnds: the creation of a test Cluster on a node that
// never answers ends at its time limit, with an error that says so.
func TestClusterCreateEnds(t *testing.T) {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		testserver.Unreachable(t, "redis-cli", "PATH", err)
	}
	addrs := []string{mute(t), mute(t), mute(t)}
	err := clusterCreate(addrs, 0, 300*time.Millisecond)
	require.Error(t, err)
	require.ErrorContains(t, err, "did not finish within 300ms")
}

// TestClusterSlotHalfMoved: a batch over several slots of one master, one
// of them migrating to another master with the records of one key moved
// and those of another key not yet: that key's slot the same, or another
// slot moving to the same master. Each op must continue its own record
// wherever it lies, and write none on the new master before its record
// has moved there, which would stop the move (MIGRATE: BUSYKEY).
func TestClusterSlotHalfMoved(t *testing.T) {
	ctx := context.Background()
	nodes := ownCluster(t)
	var addrs []string
	ids := map[string]string{}
	for addr, n := range nodes {
		addrs = append(addrs, addr)
		ids[addr] = n.ClusterMyID(ctx).Val()
	}
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour.Milliseconds(), Capacity: 100}
	now := t0.UnixMilli()
	for i, sameSlot := range []bool{true, false} {
		// A client of its own, which knows where the last round left the
		// slots.
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { c.Close() })
		store := newStore(c, fmt.Sprintf("half-%d:", i))
		rec := func(key string) string { return store.Key(driver.RecordID{Name: "l", Key: key}) }
		slot := func(key string) int { return int(c.ClusterKeySlot(ctx, rec(key)).Val()) }
		master := func(key string) string {
			n, err := c.MasterForKey(ctx, rec(key))
			require.NoError(t, err)
			return n.Options().Addr
		}
		moved, stays := fmt.Sprint("k-", i), "" // a slot not moved before
		for j := 2; stays == ""; j++ {
			k := fmt.Sprint("k-", j)
			if master(k) == master(moved) && (slot(k) == slot(moved)) == sameSlot {
				stays = k
			}
		}
		batch := func(want float64) {
			t.Helper()
			ops := []*driver.Op{oneItemOp(driver.ModeLimit, now, "l", moved, 10, p), oneItemOp(driver.ModeLimit, now, "l", stays, 10, p)}
			outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
			require.NoError(t, store.ApplyBatch(ctx, ops, outs))
			require.Equal(t, want, outs[0][0].Remaining, "same slot %v: the moved record carried on", sameSlot)
			require.Equal(t, want, outs[1][0].Remaining, "same slot %v: the record not yet moved carried on", sameSlot)
		}
		batch(90)

		src, dst := master(moved), ""
		for addr := range nodes {
			if addr != src {
				dst = addr
			}
		}
		host, port, _ := net.SplitHostPort(dst)
		slots := []int{slot(moved)}
		if !sameSlot {
			slots = append(slots, slot(stays))
		}
		for _, s := range slots {
			require.NoError(t, nodes[dst].Do(ctx, "cluster", "setslot", s, "importing", ids[src]).Err())
			require.NoError(t, nodes[src].Do(ctx, "cluster", "setslot", s, "migrating", ids[dst]).Err())
		}
		require.NoError(t, nodes[src].Migrate(ctx, host, port, rec(moved), 0, 5*time.Second).Err())
		batch(80)
		require.NoError(t, nodes[src].Migrate(ctx, host, port, rec(stays), 0, 5*time.Second).Err(),
			"same slot %v: the record not yet moved moves", sameSlot)
		for _, s := range slots {
			for _, n := range nodes {
				require.NoError(t, n.Do(ctx, "cluster", "setslot", s, "node", ids[dst]).Err())
			}
		}
		batch(70)
	}
}

// clusterClientT returns a client of the test Cluster, closed at cleanup.
func clusterClientT(t *testing.T) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ",")})
	t.Cleanup(func() { c.Close() })
	return c
}
