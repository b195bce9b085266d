package compare

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/goroutines"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tiny is a matrix small enough for a test: seconds, not minutes.
func tiny() Options {
	o := DefaultOptions()
	o.Goroutines = []int{1, 8}
	o.Keys = []int{1, 100}
	o.Rounds = 1
	o.Slice = 20 * time.Millisecond
	return o
}

// cheater grants every call.
var cheater = Contender{
	Name: "cheater", Code: "cheat", Role: Peer, Bound: gcraBound,
	New: func(context.Context, *env, Limit) (Taker, error) {
		return TakeFunc(func(context.Context, string) (bool, error) { return true, nil }), nil
	},
}

// requireRan checks that every contender of every cell made calls and
// granted some, and that the library and the bare baselines failed no call
// and granted nothing beyond their bound.
func requireRan(t *testing.T, rep *Report) {
	t.Helper()
	for _, m := range rep.Media {
		require.Empty(t, m.Skipped, m.Name)
		require.NoError(t, m.Cleanup, m.Name)
		require.Len(t, m.Cells, len(rep.Options.Goroutines)*len(rep.Options.Keys), m.Name)
		for _, c := range m.Cells {
			require.Len(t, c.Results, len(m.Contenders))
			for _, res := range c.Results {
				name := res.Contender.Name
				assert.Positivef(t, res.Calls, "%s, %s: no calls", m.Name, name)
				if res.Contender.Role != Peer {
					// A peer may fail calls under contention (throttled
					// gives up after 10 compare-and-swaps); ours may not.
					assert.Zerof(t, res.Errors, "%s, %s: %v", m.Name, name, res.Err)
				}
				assert.Positivef(t, res.Median, "%s, %s", m.Name, name)
				assert.Positivef(t, res.Check.Grants, "%s, %s: no grants", m.Name, name)
				switch {
				case !res.Check.Violated():
				case res.Contender.Role == Peer:
					// Not ours to fix (x/time/rate does, see
					// TestXRateOutOfOrderTimes); the checker's soundness
					// is the business of check_test.go.
					t.Logf("%s, %s, %s: %s", m.Name, c, name, res.Check.Worst)
				default:
					t.Errorf("%s, %s, %s: %s", m.Name, c, name, res.Check.Worst)
				}
			}
		}
	}
}

func TestRunInProcess(t *testing.T) {
	o := tiny()
	o.Media = []string{"memory", "bolt"}
	o.extra = map[string][]Contender{"memory": {cheater}}
	rep, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireRan(t, rep)

	// The cheater is caught in every cell with a hot key.
	for _, c := range rep.Media[0].Cells {
		res := c.Results[len(c.Results)-1]
		require.Equal(t, "cheater", res.Contender.Name)
		if c.Keys == 1 {
			assert.True(t, res.Check.Violated(), "%d goroutines: %s", c.Goroutines, res.Check.Worst)
		}
	}
	var out bytes.Buffer
	require.NoError(t, rep.WriteMarkdown(&out))
	assert.Regexp(t, regexp.MustCompile(`(?m)^- \*\*cheater\*\* \(memory, 1 goroutine, 1 key\) granted more than it allows`), out.String())
	assert.Contains(t, out.String(), "| ratelimit boltstore | bare bbolt Update | ÷ bbolt Update | bare bbolt Batch | ÷ bbolt Batch |")
	t.Log("\n" + out.String())

	// The bbolt files are gone.
	require.Contains(t, rep.Media[1].Addr, filepath.Join(os.TempDir(), rep.Prefix))
	left, err := filepath.Glob(filepath.Join(os.TempDir(), rep.Prefix+"*"))
	require.NoError(t, err)
	assert.Empty(t, left)
}

func TestRunRedis(t *testing.T) {
	u, err := url.Parse(testserver.RedisURL(t))
	require.NoError(t, err)
	o := tiny()
	o.Media = []string{"redis"}
	o.RedisAddr = u.Host
	rep, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireRan(t, rep)

	var out bytes.Buffer
	require.NoError(t, rep.WriteMarkdown(&out))
	assert.Contains(t, out.String(), "| goroutines | keys | ratelimit redisstore | best peer | ÷ best peer | bare INCR+PEXPIRE script | ÷ INCR+PEXPIRE script |")
	t.Log("\n" + out.String())

	// No key of the run is left.
	c := redis.NewClient(&redis.Options{Addr: u.Host})
	defer c.Close()
	// The whole keyspace: one page of a SCAN may miss keys on a server
	// that other tests fill.
	var keys []string
	iter := c.Scan(context.Background(), 0, "*"+rep.Prefix+"*", 10_000).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	require.NoError(t, iter.Err())
	assert.Empty(t, keys)
}

// TestRedisWarnsOnce requires each warning about the Redis server's
// settings (a server without persistence) to be said once in a run, with
// the progress: the library's store of every cell logged it again, a line
// per cell.
func TestRedisWarnsOnce(t *testing.T) {
	u, err := url.Parse(testserver.RedisURL(t))
	require.NoError(t, err)
	c := redis.NewClient(&redis.Options{Addr: u.Host})
	defer c.Close()
	s, err := redisstore.New(c, redisstore.WithLogger(nil))
	require.NoError(t, err)
	defer s.Close()
	ws, err := s.CheckServer(context.Background())
	require.NoError(t, err)
	if len(ws) == 0 {
		t.Skipf("the Redis server at %s has nothing to warn of", u.Host)
	}

	var logs syncBuffer
	o := tiny()
	o.Media = []string{"redis"}
	o.RedisAddr = u.Host
	o.Match = regexp.MustCompile("^ratelimit")
	o.Goroutines = []int{1}
	o.Keys = []int{1, 2, 3, 4}
	o.Slice = time.Millisecond
	o.Progress = &logs
	_, err = Run(context.Background(), o)
	require.NoError(t, err)
	for _, w := range ws {
		assert.Equal(t, 1, strings.Count(logs.String(), w.Problem), "%s\n%s", w, logs.String())
	}
}

// syncBuffer is a bytes.Buffer that goroutines may write at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRedisLibraryClosesItsStore requires the library's Taker on Redis
// to close the store its cell made, as runCell closes every Taker that is
// an io.Closer: the store's goroutines, which send its calls, outlived
// every cell of a run.
func TestRedisLibraryClosesItsStore(t *testing.T) {
	u, err := url.Parse(testserver.RedisURL(t))
	require.NoError(t, err)
	c := redis.NewClient(&redis.Options{Addr: u.Host})
	defer c.Close()
	e := &env{prefix: "rlcompare-test-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-", redis: c}
	defer func() {
		_, err := deleteKeys(context.Background(), c, e.prefix)
		assert.NoError(t, err)
	}()
	lib := redisContenders[0]
	require.Equal(t, Library, lib.Role)

	others := goroutines.Running(goroutines.CoalesceWorker)
	taker, err := lib.New(context.Background(), e, DefaultOptions().Limit)
	require.NoError(t, err)
	// A context that can end: the store sends its calls in the background.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for range 10 {
		_, err := taker.Take(ctx, e.prefix+"k")
		require.NoError(t, err)
	}
	var mine []string
	for _, g := range goroutines.Running(goroutines.CoalesceWorker) {
		if !slices.Contains(others, g) {
			mine = append(mine, g)
		}
	}
	require.NotEmpty(t, mine, "the store runs a worker")

	closer, ok := taker.(io.Closer)
	require.True(t, ok, "%T is no io.Closer: its cell leaves its store open", taker)
	require.NoError(t, closer.Close())
	require.Eventually(t, func() bool {
		now := goroutines.Running(goroutines.CoalesceWorker)
		return !slices.ContainsFunc(mine, func(g string) bool { return slices.Contains(now, g) })
	}, time.Minute, time.Millisecond, "the store's workers outlive the cell")
	runtime.KeepAlive(taker) // no collection ends the workers in its stead
}

func TestRunSkipsUnreachable(t *testing.T) {
	o := tiny()
	o.Media = []string{"redis", "pg"}
	o.RedisAddr = "127.0.0.1:1"
	o.PostgresURL = "postgres://postgres@127.0.0.1:1/test"
	rep, err := Run(context.Background(), o)
	require.NoError(t, err)
	require.Len(t, rep.Media, 2)
	assert.Contains(t, rep.Media[0].Skipped, "the Redis server at 127.0.0.1:1 cannot be reached")
	assert.Contains(t, rep.Media[1].Skipped, "the PostgreSQL server at 127.0.0.1:1 cannot be reached")
	assert.Empty(t, rep.Violations())
}

// TestRunRefusesRemoteServers requires a server that is not on this
// machine, or whose address cannot be parsed, to be an error of the
// options, as any other bad setting: it was a medium skipped, and a run of
// that medium alone exited 0.
func TestRunRefusesRemoteServers(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.Media, o.RedisAddr = []string{"redis"}, "192.0.2.1:6379" }, "compare: Redis server: 192.0.2.1:6379 is not a loopback address"},
		{func(o *Options) { o.Media, o.RedisAddr = []string{"redis"}, "127.0.0.1" }, `compare: Redis server: "127.0.0.1" is not host:port`},
		{func(o *Options) {
			o.Media, o.ClusterAddrs = []string{"cluster"}, []string{"127.0.0.1:7101", "192.0.2.1:7102"}
		}, "compare: Redis Cluster node: 192.0.2.1:7102 is not a loopback address"},
		{func(o *Options) { o.Media, o.PostgresURL = []string{"pg"}, "postgres://postgres@192.0.2.1:5432/test" }, "compare: PostgreSQL server: 192.0.2.1:5432 is not a loopback address"},
		{func(o *Options) { o.Media, o.PostgresURL = []string{"pg"}, "%%%" }, `compare: PostgreSQL URL "%%%": cannot parse`},
	} {
		o := tiny()
		tc.edit(&o)
		rep, err := Run(context.Background(), o)
		assert.ErrorContains(t, err, tc.want)
		assert.Nil(t, rep, tc.want)
	}
	// The servers of the media not run are not looked at.
	o := tiny()
	o.Media, o.RedisAddr, o.Goroutines, o.Keys = []string{"memory"}, "192.0.2.1:6379", []int{1}, []int{1}
	o.Match = regexp.MustCompile("^ratelimit")
	_, err := Run(context.Background(), o)
	assert.NoError(t, err)
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.Media = []string{"mongo"} }, `unknown medium "mongo"`},
		{func(o *Options) { o.Goroutines = []int{0} }, "0 goroutines"},
		{func(o *Options) { o.Keys = []int{0} }, "0 keys: choose 1 to 1000000"},
		// It said "choose at least 1".
		{func(o *Options) { o.Keys = []int{3_000_000_000} }, "3000000000 keys: choose 1 to 1000000"},
		// A table of 2^31-1 key names ended the process out of memory.
		{func(o *Options) { o.Keys = []int{1, math.MaxInt32} }, "2147483647 keys: choose 1 to 1000000"},
		// Each ran its medium or its cells twice over.
		{func(o *Options) { o.Media = []string{"memory", "memory"} }, `medium "memory" named twice: name each once`},
		{func(o *Options) { o.Goroutines = []int{1, 1} }, "goroutine count 1 named twice"},
		{func(o *Options) { o.Keys = []int{1, 10_000, 1} }, "key count 1 named twice"},
		{func(o *Options) { o.Rounds = 0 }, "0 rounds"},
		{func(o *Options) { o.Limit.Period = 1500 * time.Microsecond }, "whole milliseconds"},
		{func(o *Options) { o.Limit.Kind = 0 }, "limit kind"},
		// Limits the library refuses: the run opened its media and began
		// its report, and failed in the first cell.
		{func(o *Options) { o.Limit.Period = 2_000_000 * time.Hour }, "limit of 100 per 2000000h0m0s: ratelimit: invalid config: Period"},
		{func(o *Options) { o.Limit.Rate = math.MaxInt64 }, "ratelimit: invalid config: Rate"},
		// go-redis panics on a pool of -1 (makechan: size out of range).
		{func(o *Options) { o.Media, o.RedisAddr, o.RedisPool = []string{"redis"}, "127.0.0.1:1", -1 }, "-1 connections per Redis node"},
		// pgx would be given a pool of 20 without a word.
		{func(o *Options) {
			o.Media, o.PostgresURL, o.PGConns = []string{"pg"}, "postgres://postgres@127.0.0.1:1/test", -5
		}, "-5 PostgreSQL connections"},
	} {
		o := tiny()
		tc.edit(&o)
		rep, err := Run(context.Background(), o)
		assert.ErrorContains(t, err, tc.want)
		assert.Nil(t, rep, tc.want)
	}
}

// TestStreamsApart requires the goroutines of a slice to start their key
// streams far apart on the sequence that every stream walks, for the
// seeds that a run uses: two starts a few steps apart would make one
// goroutine call, a few calls later, the keys that another just called.
func TestStreamsApart(t *testing.T) {
	// inv is golden's inverse modulo 2⁶⁴ (Newton's iteration; golden is
	// odd), so that (a-b)·inv is how many steps apart two states are.
	inv := uint64(golden)
	for range 6 {
		inv *= 2 - golden*inv
	}
	require.Equal(t, uint64(1), inv*golden)
	const near = 1 << 24 // more steps than a goroutine takes in a slice
	starts := make([]uint64, 64)
	for index := range 30 {
		for round := range 21 {
			for n := range 10 {
				seed := uint64(index)<<40 ^ uint64(round)<<20 ^ uint64(n)
				for g := range starts {
					starts[g] = streamStart(seed, g)
				}
				for a := range starts {
					for b := a + 1; b < len(starts); b++ {
						if d := (starts[a] - starts[b]) * inv; d < near || -d < near {
							t.Fatalf("seed %#x: goroutines %d and %d start %d steps apart", seed, a, b, min(d, -d))
						}
					}
				}
			}
		}
	}
}

// TestFailedCallsAreNoDecisions requires a slice's decisions per second
// to count only the calls that were answered: a contender that fails its
// calls fast (a pool that is exhausted, a server that is gone) must not
// come out faster for it.
func TestFailedCallsAreNoDecisions(t *testing.T) {
	failing := TakeFunc(func(context.Context, string) (bool, error) { return false, errors.New("gone") })
	r := &contenderRun{taker: failing, keys: []string{"k"}, res: &Result{}}
	runSlice(context.Background(), r, 2, time.Millisecond, time.Now(), true, 1)
	require.Positive(t, r.res.Calls)
	assert.Equal(t, r.res.Calls, r.res.Errors)
	assert.Equal(t, []float64{0}, r.res.PerRound)
	assert.Zero(t, r.hist.n, "latencies of failed calls")
}

// TestRunEndsEarly requires a run that ends before a cell finishes (a
// contender that cannot be set up, an interrupt) to report the cells that
// finished and only those: the unfinished one has no statistics and no
// check, and the report printed it as a cell that decided and granted
// nothing, or, when the library was the one that could not be set up,
// panicked while writing it.
func TestRunEndsEarly(t *testing.T) {
	t.Run("setup", func(t *testing.T) {
		unready := Contender{
			Name: "unready library", Code: "unready", Role: Library, Bound: libraryBound,
			New: func(context.Context, *env, Limit) (Taker, error) { return nil, errors.New("no") },
		}
		o := tiny()
		o.Media = []string{"memory"}
		o.Match = regexp.MustCompile("^(unready|x/time)")
		o.extra = map[string][]Contender{"memory": {unready}}
		rep, err := Run(context.Background(), o)
		require.ErrorContains(t, err, "setting up unready library")
		require.Len(t, rep.Media, 1)
		assert.Empty(t, rep.Media[0].Cells)
		var out bytes.Buffer
		require.NotPanics(t, func() { require.NoError(t, rep.WriteMarkdown(&out)) })
	})
	t.Run("interrupt", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cells := 0
		interrupter := Contender{
			Name: "interrupter", Code: "int", Role: Peer, Bound: gcraBound,
			New: func(context.Context, *env, Limit) (Taker, error) {
				cells++
				return TakeFunc(func(context.Context, string) (bool, error) {
					if cells == 2 {
						cancel() // in the second cell
					}
					return false, nil
				}), nil
			},
		}
		o := tiny()
		o.Goroutines = []int{1}
		o.Media = []string{"memory"}
		o.Match = regexp.MustCompile("^(ratelimit|interrupter)")
		o.Slice = time.Millisecond
		o.extra = map[string][]Contender{"memory": {interrupter}}
		rep, err := Run(ctx, o)
		require.ErrorIs(t, err, context.Canceled)
		require.Len(t, rep.Media, 1)
		m := rep.Media[0]
		require.Len(t, m.Cells, 1, "the cell that finished")
		for _, res := range m.Cells[0].Results {
			assert.Positive(t, res.Calls, res.Contender.Name)
			assert.Len(t, res.PerRound, o.Rounds, res.Contender.Name)
		}
	})
}

// TestRunInterruptedWhileOpening requires a run whose context ends while
// a medium opens to end there, with the context's error: the medium and
// every one after it were reported as skipped, their servers as ones that
// could not be reached, and the run as one that went to its end.
func TestRunInterruptedWhileOpening(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o := tiny()
	o.Media = []string{"redis", "pg"}
	o.RedisAddr = "127.0.0.1:1"
	o.PostgresURL = "postgres://postgres@127.0.0.1:1/test"
	rep, err := Run(ctx, o)
	require.ErrorIs(t, err, context.Canceled)
	assert.EqualError(t, err, "redis: context canceled")
	assert.Empty(t, rep.Media, "media that never started")
}

// TestThrottledHoldsEveryKey requires throttled's memory store to hold
// every key of a cell: made to hold 65,536, it dropped the least recently
// used of a cell of more, and granted a key whose burst was spent a
// full burst again.
func TestThrottledHoldsEveryKey(t *testing.T) {
	i := slices.IndexFunc(memoryContenders, func(c Contender) bool { return c.Name == "throttled memstore" })
	require.GreaterOrEqual(t, i, 0)
	const keys = 70_000
	e := &env{keys: keys}
	taker, err := memoryContenders[i].New(context.Background(), e, Limit{Rate: 1, Period: time.Hour})
	require.NoError(t, err)
	ctx := context.Background()
	take := func(key string) bool {
		ok, err := taker.Take(ctx, key)
		require.NoError(t, err)
		return ok
	}
	require.True(t, take("k0"))
	require.False(t, take("k0"), "a burst of 1, spent")
	for k := 1; k < keys; k++ {
		take("k" + strconv.Itoa(k))
	}
	assert.False(t, take("k0"), "k0 granted again within the hour, after every other key of the cell")
}

// TestCleanupFailure requires a medium whose cleanup fails to be told in
// its report and by the Report's CleanupErr, named by its medium, for the
// command to exit on: the failure was a line of the Markdown alone.
func TestCleanupFailure(t *testing.T) {
	failing := media["memory"]
	failing.close = func(context.Context, *env) error { return errors.New("DROP SCHEMA: lock timeout") }
	o := tiny()
	o.Media = []string{"memory", "bolt"}
	o.Match = regexp.MustCompile("^ratelimit")
	o.Goroutines, o.Keys = []int{1}, []int{1}
	o.Slice = time.Millisecond
	o.media = map[string]medium{"memory": failing}
	rep, err := Run(context.Background(), o)
	require.NoError(t, err)
	require.Len(t, rep.Media, 2)
	assert.EqualError(t, rep.Media[0].Cleanup, "DROP SCHEMA: lock timeout")
	assert.NoError(t, rep.Media[1].Cleanup)
	assert.EqualError(t, rep.CleanupErr(), "memory: DROP SCHEMA: lock timeout")
	var out bytes.Buffer
	require.NoError(t, rep.WriteMarkdown(&out))
	assert.Contains(t, out.String(), "- cleaning up failed: DROP SCHEMA: lock timeout\n")

	// A run whose media cleaned up has none.
	o.media = nil
	rep, err = Run(context.Background(), o)
	require.NoError(t, err)
	assert.NoError(t, rep.CleanupErr())
}
