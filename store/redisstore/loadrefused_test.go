package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestLibraryLostForAUserWithoutLoadNorScripts: a user allowed FCALL and
// TIME but neither FUNCTION LOAD nor scripts, on a server whose library
// was loaded beforehand (by another user's store), fails its calls while
// the server has lost the library (FUNCTION FLUSH, a restart without
// persistence, a new Cluster node), with an error that says what to
// load or allow, and is served again by the function once the library is
// back. The store's refused load sent it to scripts for its life, which
// the user may not call: every call failed with NOPERM for 'evalsha'
// until the process restarted.
func TestLibraryLostForAUserWithoutLoadNorScripts(t *testing.T) {
	ctx := context.Background()
	addr := ownServer(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	user := fmt.Sprintf("ratelimit-test-noload-%d", time.Now().UnixNano())
	require.NoError(t, admin.Do(ctx, "acl", "setuser", user, "on", ">pw", "~*", "+@all",
		"-function|load", "-eval", "-evalsha", "-eval_ro", "-evalsha_ro", "-script").Err())
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 100, Period: 1000, Capacity: 100}

	// The library loaded beforehand, by a store of a user allowed it.
	adminRing := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}})
	t.Cleanup(func() { adminRing.Close() })
	adminStore := newStore(adminRing, uniquePrefix(t, adminRing))
	t.Cleanup(func() { adminStore.Close() })
	load := func() {
		t.Helper()
		require.NoError(t, adminStore.Apply(ctx, oneItemOp(driver.ModeLimit, 1000, "l", "k", 1, p), make([]driver.Decision, 1)))
	}
	load()

	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, Username: user, Password: "pw"})
	t.Cleanup(func() { ring.Close() })
	cnt := &counter{}
	ring.AddHook(cnt)
	s := newStore(ring, uniquePrefix(t, ring), redisstore.WithServerTime())
	t.Cleanup(func() { s.Close() })
	apply := func() error {
		return s.Apply(ctx, oneItemOp(driver.ModeLimit, 1000, "l", "k", 1, p), make([]driver.Decision, 1))
	}
	recordNow := func() error {
		_, err := s.RecordNow(ctx, driver.RecordID{Name: "l", Key: "k"})
		return err
	}
	for name, call := range map[string]func() error{"Apply": apply, "RecordNow": recordNow} {
		require.NoError(t, call(), "%s, the library loaded beforehand", name)
		require.NoError(t, admin.FunctionFlush(ctx).Err())
		err := call()
		require.Error(t, err, "%s, the library lost", name)
		require.ErrorContains(t, err, "NOPERM", "%s: Redis's answer", name)
		require.ErrorContains(t, err, redisstore.FunctionLibrary(), "%s: names the library", name)
		require.ErrorContains(t, err, "FUNCTION LOAD", "%s: says what to load or allow", name)
		load()
		for i := range 2 {
			cnt.names = nil
			require.NoError(t, call(), "%s %d, the library back", name, i)
			require.Equal(t, []string{"fcall"}, cnt.names, "%s %d: by the function, in one round trip", name, i)
		}
	}
}

// TestLibraryBackForAUserWithoutLoad: a user allowed FCALL and scripts
// but not FUNCTION LOAD, on a server that lost the library loaded
// beforehand, goes by script while it is missing, and by the function
// again within probeEvery calls once it is loaded again. Every call is
// decided once: the probe that finds the library missing did not run,
// and goes by script; none loads the library again. The store went by
// script for its life: more costly per call, and on a Cluster one call
// per hash tag, not per master.
func TestLibraryBackForAUserWithoutLoad(t *testing.T) {
	const every = 8
	ctx := context.Background()
	addr := ownServer(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	user := fmt.Sprintf("ratelimit-test-noload-%d", time.Now().UnixNano())
	require.NoError(t, admin.Do(ctx, "acl", "setuser", user, "on", ">pw", "~*", "+@all", "-function|load").Err())
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 100, Period: 1000, Capacity: 1000}
	op := func() *driver.Op { return oneItemOp(driver.ModeLimit, 1000, "l", "k", 1, p) }

	adminStore := newStore(admin, uniquePrefix(t, admin))
	t.Cleanup(func() { adminStore.Close() })
	load := func() {
		t.Helper()
		require.NoError(t, adminStore.Apply(ctx, op(), make([]driver.Decision, 1)))
	}

	for _, name := range []string{"Apply", "RecordNow"} {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, admin.FunctionFlush(ctx).Err())
			require.NoError(t, admin.ScriptFlush(ctx).Err())
			load()
			// Every command the store sends, FUNCTION LOAD too, goes
			// through its shard's client.
			cnt := &calls{}
			ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, Username: user, Password: "pw",
				NewClient: func(o *redis.Options) *redis.Client {
					c := redis.NewClient(o)
					c.AddHook(cnt)
					return c
				}})
			t.Cleanup(func() { ring.Close() })
			s := newStore(ring, uniquePrefix(t, ring))
			redisstore.SetProbeEvery(s, every)
			t.Cleanup(func() { s.Close() })
			id := driver.RecordID{Name: "l", Key: "k"}
			n := 0
			call := func() []string {
				t.Helper()
				cnt.take()
				if name == "RecordNow" {
					_, err := s.RecordNow(ctx, id)
					require.NoError(t, err, "call %d", n)
					return cnt.take()
				}
				out := make([]driver.Decision, 1)
				require.NoError(t, s.Apply(ctx, op(), out), "call %d", n)
				n++
				require.True(t, out[0].OK, "call %d", n)
				require.Equal(t, float64(1000-n), out[0].Remaining, "call %d: charged once each", n)
				return cnt.take()
			}

			require.Equal(t, []string{"fcall"}, call(), "the library loaded beforehand")
			require.NoError(t, admin.FunctionFlush(ctx).Err())
			names := call()
			require.Equal(t, []string{"fcall", "function"}, names[:2], "the library lost: its load refused")
			require.Equal(t, "evalsha", names[2], "then by script")
			probes := 0
			for i := range 2 * every {
				names := call()
				if names[0] == "fcall" {
					probes++
					require.Equal(t, []string{"fcall", "evalsha"}, names, "%d: tried the function, missing: by script, no load", i)
				} else {
					require.Equal(t, []string{"evalsha"}, names, "%d: by script", i)
				}
			}
			require.Equal(t, 2, probes, "tries of the function in %d calls", 2*every)

			load()
			back := false
			for i := 0; i < every && !back; i++ {
				names := call()
				back = slices.Equal(names, []string{"fcall"})
				require.True(t, back || slices.Equal(names, []string{"evalsha"}), "%d: %v", i, names)
			}
			require.True(t, back, "by the function within %d calls of the library loaded again", every)
			for i := range 2 * every {
				require.Equal(t, []string{"fcall"}, call(), "%d: by the function from then on", i)
			}
			if name == "Apply" {
				recs := make([]driver.Record, 1)
				require.NoError(t, s.Load(ctx, []driver.RecordID{id}, recs))
				require.Equal(t, float64(1000-n), recs[0].State.Remaining, "the record: each of %d calls charged once", n)
			}
		})
	}
}

// TestRecordNowFailedLoadReadsAgain: RecordNow on a Ring, whose server
// lost the library, reads the time once the library is loaded when the
// load failed for a passing reason (no connection free: nothing sent),
// within the client's MaxRetries, as Apply's calls do
// (TestFailedLoadSendsTheCallAgain); it failed with the load's error. A
// load refused for what it is still fails it at once.
func TestRecordNowFailedLoadReadsAgain(t *testing.T) {
	addr := ownServer(t) // a server of its own: no library loaded
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	for _, tc := range []struct {
		name     string
		err      error
		fails    int
		ok       bool
		fcalls   int
		maxRetry int
	}{
		{name: "pool timeout", err: redis.ErrPoolTimeout, fails: 2, ok: true, fcalls: 4, maxRetry: 3},
		{name: "pool timeout, no tries left", err: redis.ErrPoolTimeout, fails: 2, fcalls: 2, maxRetry: 1},
		{name: "refused", err: refusal("ERR the load broke"), fails: 1, fcalls: 1, maxRetry: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, admin.FunctionFlush(ctx).Err())
			h := &failLoads{err: tc.err, n: tc.fails}
			ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, MaxRetries: tc.maxRetry,
				NewClient: func(o *redis.Options) *redis.Client {
					c := redis.NewClient(o)
					c.AddHook(h)
					return c
				}})
			t.Cleanup(func() { ring.Close() })
			s := newStore(ring, uniquePrefix(t, ring))
			t.Cleanup(func() { s.Close() })
			_, err := s.RecordNow(ctx, driver.RecordID{Name: "l", Key: "k"})
			h.mu.Lock()
			defer h.mu.Unlock()
			if tc.ok {
				require.NoError(t, err, "a read of the time failed with the library's load, which might pass")
				require.Equal(t, 1, h.loads, "loads sent")
			} else {
				require.ErrorIs(t, err, tc.err)
				require.ErrorContains(t, err, "loading the function library")
			}
			require.Equal(t, tc.fcalls, h.fcalls, "FCALLs sent")
		})
	}
}

// calls is a client's hook that keeps the names of the calls of the
// library, by function or script, and of its loads, in order, pipelined
// or not.
type calls struct {
	mu    sync.Mutex
	names []string
}

func (c *calls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *calls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.record(cmd)
		return next(ctx, cmd)
	}
}

func (c *calls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.record(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *calls) record(cmd redis.Cmder) {
	switch name := cmd.Name(); name {
	case "fcall", "evalsha", "eval", "function":
		c.mu.Lock()
		c.names = append(c.names, name)
		c.mu.Unlock()
	}
}

// take returns the names kept, and forgets them.
func (c *calls) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := c.names
	c.names = nil
	return names
}

// TestClusterBackToOneCallPerMaster: on a Cluster, a user allowed FCALL
// and scripts but not FUNCTION LOAD goes by script, one call per hash tag,
// while the library is missing, and, once it is loaded again, back to the
// function within probeEvery calls: one call per master for a batch over
// several slots of one master. Every op is charged once throughout.
func TestClusterBackToOneCallPerMaster(t *testing.T) {
	const every, keys = 8, 4
	ctx := context.Background()
	nodes := ownCluster(t)
	var addrs []string
	user := fmt.Sprintf("ratelimit-test-noload-%d", time.Now().UnixNano())
	for addr, n := range nodes {
		addrs = append(addrs, addr)
		require.NoError(t, n.Do(ctx, "acl", "setuser", user, "on", ">pw", "~*", "+@all", "-function|load").Err())
	}
	flush := func() {
		t.Helper()
		for _, n := range nodes {
			require.NoError(t, n.FunctionFlush(ctx).Err())
		}
	}
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 100, Period: 1000, Capacity: 1000}
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { admin.Close() })
	adminStore := newStore(admin, uniquePrefix(t, admin))
	t.Cleanup(func() { adminStore.Close() })
	load := func() { // on every master: the first call finds it missing
		t.Helper()
		require.NoError(t, adminStore.Apply(ctx, oneItemOp(driver.ModeLimit, 1000, "l", "k", 1, p), make([]driver.Decision, 1)))
	}
	load()

	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: user, Password: "pw"})
	t.Cleanup(func() { c.Close() })
	s := newStore(c, uniquePrefix(t, c))
	redisstore.SetProbeEvery(s, every)
	t.Cleanup(func() { s.Close() })
	// Keys of as many slots of one master.
	var ks []string
	slots := map[int64]bool{}
	master := func(k string) string {
		n, err := c.MasterForKey(ctx, s.Key(driver.RecordID{Name: "l", Key: k}))
		require.NoError(t, err)
		return n.Options().Addr
	}
	for i := 0; len(ks) < keys; i++ {
		k := fmt.Sprint("k-", i)
		slot := c.ClusterKeySlot(ctx, s.Key(driver.RecordID{Name: "l", Key: k})).Val()
		if !slots[slot] && (len(ks) == 0 || master(k) == master(ks[0])) {
			slots[slot] = true
			ks = append(ks, k)
		}
	}
	cnt := &calls{}
	c.AddHook(cnt)
	n := 0
	batch := func() []string {
		t.Helper()
		cnt.take()
		ops := make([]*driver.Op, keys)
		outs := make([][]driver.Decision, keys)
		for i, k := range ks {
			ops[i], outs[i] = oneItemOp(driver.ModeLimit, 1000, "l", k, 1, p), make([]driver.Decision, 1)
		}
		require.NoError(t, s.ApplyBatch(ctx, ops, outs), "batch %d", n)
		n++
		for i, k := range ks {
			require.True(t, outs[i][0].OK, "batch %d, %s", n, k)
			require.Equal(t, float64(1000-n), outs[i][0].Remaining, "batch %d, %s: charged once each", n, k)
		}
		return cnt.take()
	}
	count := func(names []string, name string) int {
		k := 0
		for _, n := range names {
			if n == name {
				k++
			}
		}
		return k
	}

	require.Equal(t, []string{"fcall"}, batch(), "one call per master")
	flush()
	// The library lost: its load refused, the call over several slots
	// goes again as it was, by script: Redis lets a script without flags
	// (no shebang) reach keys it does not declare, of several slots of
	// its node, as the function's allow-cross-slot-keys does. By script
	// from then on.
	names := batch()
	require.Equal(t, 1, count(names, "evalsha"), "one call per master, by script: %v", names)
	require.Equal(t, 1, count(names, "fcall"), "%v", names)
	probes := 0
	for i := range 2 * every {
		names := batch()
		probes += count(names, "fcall")
		require.Equal(t, keys, count(names, "evalsha"), "%d: by script, one call per hash tag: %v", i, names)
		require.Zero(t, count(names, "function"), "%d: no load: %v", i, names)
	}
	require.Equal(t, 2*keys, probes, "tries of the function in %d calls", 2*every*keys)

	load()
	back := false
	for i := 0; i < every && !back; i++ {
		back = slices.Equal(batch(), []string{"fcall"})
	}
	require.True(t, back, "by the function within %d calls of the library loaded again", every)
	for i := range every {
		require.Equal(t, []string{"fcall"}, batch(), "%d: one call per master from then on", i)
	}
	recs := make([]driver.Record, keys)
	ids := make([]driver.RecordID, keys)
	for i, k := range ks {
		ids[i] = driver.RecordID{Name: "l", Key: k}
	}
	require.NoError(t, s.Load(ctx, ids, recs))
	for i, k := range ks {
		require.Equal(t, float64(1000-n), recs[i].State.Remaining, "%s: each of %d calls charged once", k, n)
	}
}

// TestRefusedLoadKeepsItsCallOnScripts: a call that found the library
// missing, and its load refused, goes by script, whatever another call
// does meanwhile: here, one that finds the library on another server (a
// Cluster's master that has it) and sends the store's calls by the
// function again (leaveScripts), between the refused load and the call's
// next send. The call read the store's choice again, went by the
// function, found the library missing once more, and failed, saying the
// store had loaded the library, though it had not. Apply's call and
// RecordNow's read of the time are each decided once, by script.
func TestRefusedLoadKeepsItsCallOnScripts(t *testing.T) {
	ctx := context.Background()
	addr := ownServer(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	user := fmt.Sprintf("ratelimit-test-noload-%d", time.Now().UnixNano())
	require.NoError(t, admin.Do(ctx, "acl", "setuser", user, "on", ">pw", "~*", "+@all", "-function|load").Err())
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 100, Period: 1000, Capacity: 1000}
	for _, name := range []string{"Apply", "RecordNow"} {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, admin.FunctionFlush(ctx).Err())
			cnt := &calls{}
			ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, Username: user, Password: "pw",
				NewClient: func(o *redis.Options) *redis.Client {
					c := redis.NewClient(o)
					c.AddHook(cnt)
					return c
				}})
			t.Cleanup(func() { ring.Close() })
			s := newStore(ring, uniquePrefix(t, ring))
			t.Cleanup(func() { s.Close() })
			left := false
			redisstore.OnLoad(s, func() { left = redisstore.LeaveScripts(s) })
			if name == "RecordNow" {
				_, err := s.RecordNow(ctx, driver.RecordID{Name: "l", Key: "k"})
				require.NoError(t, err)
			} else {
				out := make([]driver.Decision, 1)
				require.NoError(t, s.Apply(ctx, oneItemOp(driver.ModeLimit, 1000, "l", "k", 1, p), out))
				require.True(t, out[0].OK)
				require.Equal(t, float64(999), out[0].Remaining, "charged once")
			}
			require.True(t, left, "the store's calls sent by the function again meanwhile")
			names := cnt.take()
			require.Equal(t, []string{"fcall", "function"}, names[:2], "the library missing, its load refused")
			require.Contains(t, []string{"evalsha", "eval"}, names[len(names)-1], "then by script: %v", names)
			require.NotContains(t, names[2:], "fcall", "not by the function again: %v", names)
		})
	}
}
