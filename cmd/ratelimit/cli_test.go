package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// execContext runs the command line with ctx and returns its exit code
// and output.
func execContext(ctx context.Context, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

var tokenBucket = []string{"--kind", "token bucket", "--rate", "10", "--period", "1m", "--capacity", "3"}

func TestErrorsSayRatelimitOnce(t *testing.T) {
	dir := t.TempDir()
	invalid := filepath.Join(dir, "invalid.yaml")
	require.NoError(t, os.WriteFile(invalid, []byte("x:\n  kind: fixed window\n  rate: 0\n  period: 1m\n"), 0o600))
	broken := filepath.Join(dir, "broken.yaml")
	require.NoError(t, os.WriteFile(broken, []byte("x: ["), 0o600))
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"simulate", "--kind", "fixed window", "--rate", "0", "--period", "1s", "--at", "0s=1"}, 2,
			"ratelimit: --rate is 0"},
		{[]string{"simulate", "--limits", invalid, "--name", "x", "--at", "0s=1"}, 1,
			"ratelimit: --limits " + invalid + `: limits file: line 1: limit "x": rate is 0`},
		{[]string{"simulate", "--limits", broken, "--name", "x", "--at", "0s=1"}, 1,
			"ratelimit: --limits " + broken + ": limits file: yaml: line 1"},
		{[]string{"simulate", "--kind", "sliding", "--rate", "1", "--period", "1s", "--at", "0s=1"}, 2,
			`ratelimit: unknown kind "sliding"`},
		{append([]string{"limit", "--store", "mem:", "--count", "-1"}, tokenBucket...), 2,
			`ratelimit: --count -1 is negative: a count is a number from 0 to 1000000000000000`},
		{[]string{"nope"}, 2, `ratelimit: unknown command "nope"`},
	} {
		code, _, errOut := exec(tc.args...)
		require.Equal(t, tc.code, code, "%q: %s", tc.args, errOut)
		require.True(t, strings.HasPrefix(errOut, tc.want), "%q: got %q, want it to start with %q", tc.args, errOut, tc.want)
		require.Equal(t, 1, strings.Count(errOut, "ratelimit:"), "%q: %s", tc.args, errOut)
	}

	// The sentinel at the end of a wrapped error loses its prefix too.
	err := fmt.Errorf("reading limits.yaml: %w", fmt.Errorf("ratelimit: limit %q: %w", "x", ratelimit.ErrInvalidConfig))
	require.Equal(t, `ratelimit: reading limits.yaml: limit "x": invalid config`, message(err))
	require.Equal(t, "ratelimit: store is closed", message(driver.ErrClosed))
}

func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken.json")
	require.NoError(t, os.WriteFile(broken, []byte(`{"x": `), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o700))
	for _, tc := range []struct {
		args []string
		code int
		want string // in standard error
	}{
		{[]string{"nope"}, 2, `unknown command "nope": run 'ratelimit --help' for the commands`},
		{[]string{"simulte"}, 2, `unknown command "simulte": did you mean "simulate"?`},
		{[]string{"--bogus"}, 2, "unknown flag: --bogus"},
		{[]string{"simulate", "--bogus"}, 2, "unknown flag: --bogus"},
		{[]string{"simulate", "--rate", "x"}, 2, `invalid argument "x" for "--rate" flag`},
		{[]string{"simulate", "extra"}, 2, `simulate takes no arguments, only flags: got ["extra"]`},
		{append([]string{"inspect", "--store", "mem:", "-o", "xml"}, tokenBucket...), 2, `invalid argument "xml" for "-o, --output" flag: write text or json`},
		{[]string{"schema", "--table", ""}, 2, "--table: pgstore: table name"},
		// The empty store all the same: reset said it reset a key there.
		{append([]string{"reset", "--store", "mem:limits.db"}, tokenBucket...), 2, `--store "mem:limits.db": mem: is an empty in-memory store, and names nothing after its colon: write mem: alone, or bolt://PATH for a file`},
		// A line break would end a comment of the SQL, and the rest of the line run.
		{[]string{"schema", "--table", "x\nSELECT 1/0;--"}, 2, `--table: pgstore: table name "x\nSELECT 1/0;--" holds U+000A, a control or other unprintable character`},
		{append([]string{"limit", "--store", "mem:", "--count", "4"}, tokenBucket...), 2, "--count 4 exceeds 3"},
		{append([]string{"bench", "--store", "mem:", "--count", "4", "--duration", "1h"}, tokenBucket...), 2, "--count 4 exceeds 3"},
		// simulate too: its count errors were failures (1).
		{append([]string{"simulate", "--every", "1s", "--for", "2s", "--count", "4"}, tokenBucket...), 2, "--count 4 exceeds 3"},
		{append([]string{"simulate", "--at", "0s=1,1s=4"}, tokenBucket...), 2, `--at "1s=4": count 4 exceeds 3`},
		{append([]string{"simulate", "--at", "0s=-1"}, tokenBucket...), 2, `--at "0s=-1": count -1 is negative: a count is a number from 0 to 1000000000000000`},
		{append([]string{"simulate", "--at", "0s=NaNr"}, tokenBucket...), 2, `--at "0s=NaNr": count NaN is not a number: a count is a number from 0 to 1000000000000000`},
		// The limits file is data, not the command line: a failure.
		{[]string{"simulate", "--limits", broken, "--name", "x", "--at", "0s=1"}, 1, "limits file"},
		{[]string{"simulate", "--limits", filepath.Join(dir, "missing.yaml"), "--name", "x", "--at", "0s=1"}, 1, "--limits " + filepath.Join(dir, "missing.yaml") + ": no such file"},
		{[]string{"simulate", "--limits", dir, "--name", "x", "--at", "0s=1"}, 2, "--limits " + dir + ": name it .json"},
		{[]string{"simulate", "--limits", filepath.Join(dir, "sub.yaml"), "--name", "x", "--at", "0s=1"}, 1, "--limits " + filepath.Join(dir, "sub.yaml") + ": is a directory"},
		{append([]string{"inspect", "--store", "redis://127.0.0.1:1/0"}, tokenBucket...), 1, "connection refused"},
	} {
		code, _, errOut := exec(tc.args...)
		require.Equal(t, tc.code, code, "%q: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%q", tc.args)
		if tc.code == 2 {
			require.Contains(t, errOut, "--help' for usage.", "%q", tc.args)
		} else {
			require.NotContains(t, errOut, "for usage", "%q", tc.args)
		}
	}

	// Without a command: the help, and success.
	code, out, errOut := exec()
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "Available Commands:")
}

// help with a command it does not know is a usage error, as the command
// itself would be: it printed the root's help, with status 0, for the
// root takes a word it does not know as an argument. Its hint names the
// --help of the command asked about: help token nope said to run
// 'ratelimit help --help'.
func TestHelpUnknownCommand(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		want, run string
	}{
		{[]string{"help", "simulte"}, `unknown command "simulte": did you mean "simulate"?`, "ratelimit"},
		{[]string{"help", "nope"}, `unknown command "nope": run 'ratelimit --help' for the commands`, "ratelimit"},
		{[]string{"help", "token", "refnd"}, `unknown command "refnd" for "ratelimit token": did you mean "refund"?`, "ratelimit token"},
		{[]string{"help", "token", "nope"}, `unknown command "nope" for "ratelimit token": run 'ratelimit token --help' for its commands`, "ratelimit token"},
		{[]string{"help", "simulate", "extra"}, `unknown command "extra" for "ratelimit simulate", which has none: run 'ratelimit simulate --help'`, "ratelimit simulate"},
		{[]string{""}, `unknown command "": run 'ratelimit --help' for the commands`, "ratelimit"},
	} {
		code, out, errOut := exec(tc.args...)
		require.Equal(t, 2, code, "%q: %s", tc.args, errOut)
		require.Empty(t, out, "%q", tc.args)
		require.Equal(t, "ratelimit: "+tc.want+"\nRun '"+tc.run+" --help' for usage.\n", errOut, "%q", tc.args)
	}
	for args, want := range map[string]string{"help": "Available Commands:", "help simulate": "ratelimit simulate [flags]",
		"help token inspect": "ratelimit token inspect TOKEN... | - [flags]", "help token": "ratelimit token [command]"} {
		code, out, errOut := exec(strings.Fields(args)...)
		require.Equal(t, 0, code, "%s: %s", args, errOut)
		require.Contains(t, out, want, args)
	}
}

func TestVersion(t *testing.T) {
	code, out, errOut := exec("--version")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "ratelimit "+version(debug.ReadBuildInfo())+"\n", out)
	require.Contains(t, out, runtime.Version())

	require.Equal(t, "v1.4.0 go1.26.8", version(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"}}, true))
	require.Equal(t, "(devel) go1.26.8", version(&debug.BuildInfo{GoVersion: "go1.26.8"}, true))
	require.Equal(t, "(devel) "+runtime.Version(), version(nil, false))
}

// keysOf returns the sorted keys of a JSON object.
func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// decode decodes a JSON report into a map and into v, refusing fields
// that v lacks.
func decode(t *testing.T, out string, v any) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &m), out)
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(v), out)
	return m
}

var limitFields = []string{"capacity", "kind", "max_reserved", "name", "name_base64", "period_ms", "rate", "shards", "start"}

func TestOutputJSON(t *testing.T) {
	store := "bolt://" + filepath.Join(t.TempDir(), "limits.db")
	limit := []string{"--store", store, "--kind", "fixed window", "--rate", "10", "--period", "1h", "--shards", "2",
		"--name", "signup", "--key", "k"}

	code, out, errOut := exec(append([]string{"limit", "--output", "json", "--count", "3"}, limit...)...)
	require.Equal(t, 0, code, errOut)
	var d decisionJSON
	m := decode(t, out, &d)
	require.Equal(t, []string{"check", "count", "key", "key_base64", "limit", "ok", "outcome", "remaining", "reserve", "reset_ms", "retry_after_ms"}, keysOf(m))
	require.Equal(t, limitFields, keysOf(m["limit"].(map[string]any)))
	require.Equal(t, limitJSON{Name: "signup", NameBase64: "c2lnbnVw", Kind: "fixed window", Rate: 10, PeriodMS: 3_600_000, Capacity: 10, Shards: 2}, d.Limit)
	require.Equal(t, "k", d.Key)
	require.Equal(t, 3.0, d.Count)
	require.Equal(t, "allowed", d.Outcome)
	require.True(t, d.OK)
	require.Zero(t, d.RetryAfterMS)

	code, out, errOut = exec(append([]string{"limit", "-o", "json", "--count", "8"}, limit...)...)
	require.Equal(t, 0, code, errOut)
	d = decisionJSON{}
	decode(t, out, &d)
	require.Equal(t, "denied", d.Outcome)
	require.False(t, d.OK)
	require.Positive(t, d.RetryAfterMS)

	code, out, errOut = exec(append([]string{"inspect", "-o", "json"}, limit...)...)
	require.Equal(t, 0, code, errOut)
	var s statusJSON
	m = decode(t, out, &s)
	require.Equal(t, []string{"at", "capacity", "debt", "key", "key_base64", "limit", "next_grant", "shards", "store_key", "tokens", "window_start"}, keysOf(m))
	require.Equal(t, []string{"debt", "index", "next_grant", "stored", "tokens", "window_start"},
		keysOf(m["shards"].([]any)[0].(map[string]any)))
	require.Equal(t, 7.0, s.Tokens)
	require.Equal(t, 10.0, s.Capacity)
	require.Zero(t, s.Debt)
	require.Len(t, s.Shards, 2)
	var stored int
	for i, sh := range s.Shards {
		require.Equal(t, i, sh.Index)
		if sh.Stored {
			stored++
			require.NotNil(t, sh.WindowStart)
			start, err := time.Parse(time.RFC3339Nano, *sh.WindowStart)
			require.NoError(t, err)
			require.Equal(t, time.UTC, start.Location())
		}
	}
	require.Positive(t, stored)
	require.NotNil(t, s.At)
	require.NotNil(t, s.NextGrant)

	// A token bucket has no windows: null.
	code, _, errOut = exec(append([]string{"limit", "-o", "json"}, append([]string{"--store", store, "--key", "tb"}, tokenBucket...)...)...)
	require.Equal(t, 0, code, errOut)
	code, out, errOut = exec(append([]string{"inspect", "-o", "json"}, append([]string{"--store", store, "--key", "tb"}, tokenBucket...)...)...)
	require.Equal(t, 0, code, errOut)
	m = decode(t, out, &statusJSON{})
	require.Contains(t, m, "window_start")
	require.Nil(t, m["window_start"])

	code, out, errOut = exec("bench", "--store", "mem:", "--kind", "fixed window", "--rate", "50", "--period", "100ms",
		"--keys", "3", "--goroutines", "4", "--duration", "100ms", "--quiet", "-o", "json")
	require.Equal(t, 0, code, errOut)
	var b benchJSON
	m = decode(t, out, &b)
	require.Equal(t, []string{"allowed", "allowed_per_second", "check", "count", "decisions", "decisions_per_second", "denied",
		"elapsed_ms", "goroutines", "interrupted", "keys", "latency_ms", "limit"}, keysOf(m))
	require.Equal(t, []string{"ok", "violation", "window_by_window"}, keysOf(m["check"].(map[string]any)))
	require.Equal(t, []string{"max", "p50", "p90", "p99"}, keysOf(m["latency_ms"].(map[string]any)))
	require.Positive(t, b.Decisions)
	require.Equal(t, b.Decisions, b.Allowed+b.Denied)
	require.Positive(t, b.DecisionsPerSecond)
	require.Equal(t, 3, b.Keys)
	require.Equal(t, 4, b.Goroutines)
	require.False(t, b.Interrupted)
	require.Equal(t, checkJSON{OK: true, WindowByWindow: true}, b.Check)
	require.LessOrEqual(t, b.LatencyMS.P50, b.LatencyMS.Max)
}

func TestConnectionHint(t *testing.T) {
	const hint = "(is the server up? check --store)"
	code, _, errOut := exec(append([]string{"inspect", "--store", "redis://127.0.0.1:1/0"}, tokenBucket...)...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "connection refused "+hint)
	code, _, errOut = exec(append([]string{"limit", "--store", "postgres://postgres@127.0.0.1:1/test"}, tokenBucket...)...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, hint)

	// A server that answers and refuses: no hint.
	pg, err := url.Parse(testserver.PostgresURL(t))
	require.NoError(t, err)
	pg.User = url.User(fmt.Sprintf("nobody_%d", time.Now().UnixNano()))
	code, _, errOut = exec(append([]string{"inspect", "--store", pg.String()}, tokenBucket...)...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "does not exist (SQLSTATE 28000)")
	require.NotContains(t, errOut, hint)

	pool, err := pgxpool.New(context.Background(), testserver.PostgresURL(t))
	require.NoError(t, err)
	defer pool.Close()
	_, sqlErr := pool.Exec(context.Background(), "SELECT * FROM ratelimit_cli_no_such_table")
	require.Error(t, sqlErr)
	require.False(t, isConnError(fmt.Errorf("postgres: %w", sqlErr)))
	require.False(t, isConnError(errors.New("dial tcp: nothing of the kind")))
	require.False(t, isConnError(redis.Nil))
}

func TestRedisPrefixIsNotAPattern(t *testing.T) {
	u := testserver.RedisURL(t)
	opt, err := redis.ParseURL(u)
	require.NoError(t, err)
	c := redis.NewClient(opt)
	base := fmt.Sprintf("ratelimit-cli-test-%d-", time.Now().UnixNano())
	cleanRedis(t, c, base)
	require.NoError(t, c.Set(context.Background(), base+"x:1", "1", time.Minute).Err())

	// "*" and "?" in a prefix are characters, not wildcards.
	for _, prefix := range []string{base + "*", base + "?:", base + "[x]:"} {
		code, _, errOut := exec(append([]string{"reset", "--store", u, "--prefix", prefix}, tokenBucket...)...)
		require.Equal(t, 1, code, prefix)
		require.Contains(t, errOut, fmt.Sprintf("no key starts with prefix %q", prefix))
	}
	code, out, errOut := exec(append([]string{"reset", "--store", u, "--prefix", base + "x:"}, tokenBucket...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "reset limit")
	require.Equal(t, `a\*b\?c\[d\]e\\f`, globEscape(`a*b?c[d]e\f`))
}

// --seed with a limit of one record, whose calls draw no shards, is
// refused: every seed printed the same table, silently.
func TestSimulateSeedUnsharded(t *testing.T) {
	for _, shards := range []string{"", "0", "1"} {
		args := []string{"simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--at", "0s=1", "--seed", "7"}
		if shards != "" {
			args = append(args, "--shards", shards)
		}
		code, out, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s%s", args, out, errOut)
		require.Equal(t, "ratelimit: --seed draws the shards each call of a sharded limit evaluates, and this limit has one record: leave --seed out\n"+
			"Run 'ratelimit simulate --help' for usage.\n", errOut, "%q", args)
	}
	code, _, errOut := exec("simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--at", "0s=1", "--seed", "7", "--shards", "2")
	require.Equal(t, 0, code, errOut)
}

func TestSimulateSeed(t *testing.T) {
	// A sharded limit near its end: which two shards a call evaluates
	// decides whether it passes.
	args := []string{"simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--capacity", "40", "--shards", "4",
		"--every", "1s", "--for", "40s", "--count", "2"}
	outputs := map[string]string{}
	for _, seed := range []string{"", "1", "7"} {
		a := args
		if seed != "" {
			a = append(slices.Clone(args), "--seed", seed)
		}
		code, first, errOut := exec(a...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, first, "denied")
		code, second, errOut := exec(a...)
		require.Equal(t, 0, code, errOut)
		require.Equal(t, first, second, "seed %q", seed)
		outputs[seed] = first
	}
	require.Equal(t, outputs["1"], outputs[""], "the default seed is 1")
	require.NotEqual(t, outputs["1"], outputs["7"])
}

// cancelling is a store that cancels a context at its nth Apply, as
// Ctrl-C would in the middle of a bench, and remembers the keys it saw.
type cancelling struct {
	*memstore.Store
	n      int64
	cancel context.CancelFunc
	calls  atomic.Int64
	mu     sync.Mutex
	keys   map[string]bool
}

func (c *cancelling) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if c.calls.Add(1) == c.n {
		c.cancel()
	}
	c.mu.Lock()
	for _, it := range op.Items {
		c.keys[it.Key] = true
	}
	c.mu.Unlock()
	return c.Store.Apply(ctx, op, out)
}

func TestBenchInterrupted(t *testing.T) {
	for _, cfg := range []ratelimit.Config{
		{Kind: ratelimit.FixedWindow, Rate: 20, Period: time.Second},
		{Kind: ratelimit.TokenBucket, Rate: 20, Period: time.Second, Shards: 2},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		store := &cancelling{Store: must(memstore.New()), n: 200, cancel: cancel, keys: map[string]bool{}}
		lim, err := ratelimit.New(store, ratelimit.Limits{"x": cfg})
		require.NoError(t, err)
		// An hour: only the cancel can end the run.
		rep, err := bench(ctx, lim, "x", cfg, 3, 4, time.Hour, 0, 1, true, false, io.Discard)
		require.NoError(t, err)
		require.True(t, rep.interrupted)
		require.GreaterOrEqual(t, rep.calls, 190, "the calls before the cancel, less those it caught in flight")
		require.Less(t, rep.elapsed, time.Hour)
		require.Empty(t, rep.violation)
		var out bytes.Buffer
		rep.print(&out)
		require.Contains(t, out.String(), "interrupted: the calls until then\ndecisions  ")
		require.Contains(t, out.String(), "check      ok")

		// The keys are gone, though the run's context had ended.
		require.Len(t, store.keys, 3)
		for key := range store.keys {
			st, err := lim.Value(context.Background(), "x", key)
			require.NoError(t, err)
			for _, sh := range st.Shards {
				require.False(t, sh.Stored, "key %q shard %d", key, sh.Index)
			}
		}
	}

	// Through the command: the report, then status 130.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	args := []string{"bench", "--store", "mem:", "--kind", "fixed window", "--rate", "5", "--period", "1s", "--duration", "1h", "--quiet"}
	code, out, errOut := execContext(ctx, args...)
	require.Equal(t, 130, code, errOut)
	require.True(t, strings.HasPrefix(out, "interrupted: the calls until then\ndecisions  "), out)
	require.Contains(t, out, "check      ok")
	require.Equal(t, "ratelimit: bench interrupted: the report covers the calls made until then; its keys are removed\n", errOut)
	code, out, errOut = execContext(ctx, append(args, "-o", "json")...)
	require.Equal(t, 130, code, errOut)
	var b benchJSON
	decode(t, out, &b)
	require.True(t, b.Interrupted)
	require.True(t, b.Check.OK)
}

func TestRateMeter(t *testing.T) {
	var m rateMeter
	t0 := time.Unix(1_000_000, 0)
	steps := []struct {
		at    time.Duration
		calls int64
		want  float64
	}{
		{0, 0, 0},
		{100 * time.Millisecond, 100, 1000},  // 100 calls in 0.1 s
		{500 * time.Millisecond, 300, 600},   // 300 in 0.5 s
		{time.Second, 1000, 1000},            // 1000 in 1 s
		{1500 * time.Millisecond, 1100, 800}, // since 0.5 s: 800 in 1 s
		{3 * time.Second, 1100, 0},           // idle since 1.5 s
	}
	for _, s := range steps {
		require.InDelta(t, s.want, m.rate(t0.Add(s.at), s.calls), 1e-9, "at %v", s.at)
	}
	require.LessOrEqual(t, len(m.samples), 3, "old samples are dropped")
}

// simulate refuses more than maxRequests requests with a usage error, before
// it makes any: --every 1ms --for 100y built some 3·10¹² of them in memory
// and never ended.
func TestSimulateTooManyRequests(t *testing.T) {
	fixed := []string{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--every", "1ms", "--for", "876000h"}, "--every 1ms --for 876000h0m0s: 3153600000001 requests"},
		{[]string{"--every", "1ms", "--for", "1000s"}, "--every 1ms --for 16m40s: 1000001 requests"},
		// --at's requests count too.
		{[]string{"--every", "1ms", "--for", "999999ms", "--at", "0s=1,1s=1"}, "--every 1ms --for 16m39.999s and --at: 1000002 requests"},
		{[]string{"--at", strings.Repeat("0s=1,", 1_000_000) + "0s=1"}, "--at: 1000001 requests"},
	} {
		args := append(slices.Clone(fixed), tc.args...)
		code, out, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s", args, errOut)
		require.Empty(t, out, "%q", args)
		require.Contains(t, errOut, tc.want, "%q", args)
		require.Contains(t, errOut, "at most 1000000", "%q", args)
		require.Contains(t, errOut, "--help' for usage.", "%q", args)
	}
}

// simulate --svg draws at most maxChartRequests requests, and refuses
// more with a usage error naming the flags, before it runs or makes the
// file: a million made a chart of some 150 MB. The table alone still
// takes up to maxRequests. (TestSimulateManyRequestsIsQuick draws the
// most.)
func TestSimulateChartTooManyRequests(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "big.svg")
	fixed := []string{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--svg", svg}
	code, out, errOut := exec(append(slices.Clone(fixed), "--every", "1ms", "--for", "20s")...)
	require.Equal(t, 2, code, errOut)
	require.Empty(t, out)
	require.Equal(t, "ratelimit: --svg: 20001 requests, and a chart draws at most 20000, a marker each: give fewer (a longer --every, a shorter --for, or fewer --at), "+
		"or leave out --svg for the table alone\nRun 'ratelimit simulate --help' for usage.\n", errOut)
	require.NoFileExists(t, svg)
}

// silentServer returns the address of a server that accepts connections
// and never answers, as a host whose port another program holds can.
func silentServer(t *testing.T) string { return stallingServer(t, "") }

// A server that accepts and never answers is given up on in a bounded
// time, with the hint to check the server: PostgreSQL without
// connect_timeout waited for ever, and Redis's read timeout lacked the
// hint.
func TestSilentServer(t *testing.T) {
	defer func(d time.Duration) { connectTimeout = d }(connectTimeout)
	connectTimeout = 200 * time.Millisecond
	addr := silentServer(t)
	for _, store := range []string{"postgres://postgres@" + addr + "/test", "redis://" + addr + "/0"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		code, out, errOut := execContext(ctx, append([]string{"inspect", "--store", store}, tokenBucket...)...)
		cancel()
		require.Equal(t, 1, code, "%s after %v:\n%s%s", store, time.Since(start), out, errOut)
		require.Less(t, time.Since(start), 10*time.Second, store)
		require.Contains(t, errOut, "(is the server up? check --store)", store)
	}
	// connect_timeout in the connection string is kept.
	start := time.Now()
	code, _, errOut := exec(append([]string{"inspect", "--store", "postgres://postgres@" + addr + "/test?connect_timeout=1"}, tokenBucket...)...)
	require.Equal(t, 1, code, errOut)
	require.GreaterOrEqual(t, time.Since(start), time.Second)
}

// Ctrl-C while bench opens the store (a server that does not answer)
// ends it as one during the run does: status 130, saying that it was
// interrupted, not status 1 with the client's "context canceled".
func TestBenchInterruptedOpening(t *testing.T) {
	addr := silentServer(t)
	for _, store := range []string{"postgres://postgres@" + addr + "/test", "redis://" + addr + "/0"} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		code, out, errOut := execContext(ctx, append([]string{"bench", "--store", store, "--quiet"}, tokenBucket...)...)
		cancel()
		require.Equal(t, 130, code, "%s:\n%s%s", store, out, errOut)
		require.Empty(t, out)
		require.Equal(t, "ratelimit: bench interrupted while it opened the store: no call was made\n", errOut, store)
	}
}

// stallingServer returns the address of a server that answers the
// handshake of a connection as proto ("postgres" or "redis") does, then
// never answers a query: a server stalled, or one whose disk hangs. With
// proto "" it answers nothing at all.
func stallingServer(t *testing.T, proto string) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	none := func(net.Conn) error { return nil }
	handshake := map[string]func(net.Conn) error{"": none, "postgres": pgHandshake, "redis": redisHandshake}[proto]
	require.NotNil(t, handshake, proto)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				if handshake(c) == nil {
					_, _ = io.Copy(io.Discard, c) // the queries, unanswered
				}
				c.Close()
			}()
		}
	}()
	return l.Addr().String()
}

// pgHandshake answers a PostgreSQL client's startup, refusing TLS and
// asking for no password, up to ReadyForQuery.
func pgHandshake(c net.Conn) error {
	be := pgproto3.NewBackend(c, c)
	for {
		msg, err := be.ReceiveStartupMessage()
		if err != nil {
			return err
		}
		switch msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := c.Write([]byte("N")); err != nil {
				return err
			}
			continue
		case *pgproto3.StartupMessage:
		default: // a CancelRequest: nothing to cancel
			return io.EOF
		}
		be.Send(&pgproto3.AuthenticationOk{})
		be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "16.0"})
		be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: 1})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		return be.Flush()
	}
}

// redisHandshake answers what a Redis client sends as it connects (HELLO,
// as a server of RESP2 only, CLIENT, SELECT) and PING, until the first
// other command, which it leaves unanswered.
func redisHandshake(c net.Conn) error {
	r := bufio.NewReader(c)
	for {
		var args []string
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
		for range n {
			if line, err = r.ReadString('\n'); err != nil {
				return err
			}
			size, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
			arg := make([]byte, size+2)
			if _, err := io.ReadFull(r, arg); err != nil {
				return err
			}
			args = append(args, string(arg[:size]))
		}
		if len(args) == 0 {
			return io.EOF
		}
		var reply string
		switch strings.ToUpper(args[0]) {
		case "HELLO":
			reply = "-ERR unknown command 'HELLO'\r\n"
		case "PING":
			reply = "+PONG\r\n"
		case "CLIENT", "SELECT":
			reply = "+OK\r\n"
		default:
			return nil // stalled from now on
		}
		if _, err := c.Write([]byte(reply)); err != nil {
			return err
		}
	}
}

// A server that answers the handshake and then never a query is given
// up on at --timeout, by every command that uses a store, with what
// happened: PostgreSQL waited for ever on its first query, and Redis for
// its client's retries of 3 s reads.
func TestStalledServer(t *testing.T) {
	defer func(d time.Duration) { defaultTimeout = d }(defaultTimeout)
	defaultTimeout = 300 * time.Millisecond
	stores := []string{"postgres://postgres@" + stallingServer(t, "postgres") + "/test?sslmode=disable",
		"postgres://postgres@" + stallingServer(t, "postgres") + "/test",
		"redis://" + stallingServer(t, "redis") + "/0"}
	for _, store := range stores {
		for _, cmd := range [][]string{{"inspect"}, {"limit"}, {"reset"}, {"bench", "--duration", "100ms", "--quiet"}} {
			// Were the command not bounded, it would end here, with another
			// error.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			args := append(append(cmd, "--store", store), tokenBucket...)
			code, out, errOut := execContext(ctx, args...)
			cancel()
			require.Equal(t, 1, code, "%q:\n%s%s", args, out, errOut)
			require.Contains(t, errOut, "ratelimit: no answer from the store within --timeout 300ms", "%q", args)
			require.Contains(t, errOut, "(is the server up? check --store)", "%q", args)
		}
	}
	code, _, errOut := exec(append([]string{"inspect", "--store", stores[0], "--timeout", "200ms"}, tokenBucket...)...)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "no answer from the store within --timeout 200ms")
	for _, cmd := range []string{"inspect", "limit", "reset", "bench"} {
		code, _, errOut := exec(append([]string{cmd, "--store", "mem:", "--timeout", "0s"}, tokenBucket...)...)
		require.Equal(t, 2, code, errOut)
		require.Contains(t, errOut, "--timeout 0s: give a time above 0", cmd)
	}
}

// redis+cluster:// reads credentials and the database 0 as a redis:// URL
// does, and refuses what is not a list of nodes as a usage error: without
// a node go-redis dialed localhost:6379, and a path or credentials were
// taken for a node's address ("unknown port", "too many colons").
func TestRedisClusterURL(t *testing.T) {
	for rest, want := range map[string]redis.ClusterOptions{
		"//127.0.0.1:7000":                  {Addrs: []string{"127.0.0.1:7000"}},
		"//127.0.0.1:7000,127.0.0.2:7000/0": {Addrs: []string{"127.0.0.1:7000", "127.0.0.2:7000"}},
		"//app:s%40cret@127.0.0.1:7000":     {Addrs: []string{"127.0.0.1:7000"}, Username: "app", Password: "s@cret"},
		"//:pw@[::1]:7000,cache.local:700":  {Addrs: []string{"[::1]:7000", "cache.local:700"}, Password: "pw"},
	} {
		opt, err := parseClusterURL(rest)
		require.NoError(t, err, rest)
		require.Equal(t, want, *opt, rest)
	}
	for _, bad := range []string{"", "//", "//127.0.0.1:7000,", "//127.0.0.1", "//127.0.0.1:7000/1", "//127.0.0.1:7000?x=1", "127.0.0.1:7000"} {
		_, err := parseClusterURL(bad)
		require.Error(t, err, bad)
		code, _, errOut := exec(append([]string{"inspect", "--store", "redis+cluster:" + bad}, tokenBucket...)...)
		require.Equal(t, 2, code, "%q: %s", bad, errOut)
		require.Contains(t, errOut, "write redis+cluster://HOST:PORT,HOST:PORT", bad)
	}
}

// A redis:// URL without its slashes (redis:10.0.0.5:6379) is refused:
// go-redis reads the address from what follows them, and finding none,
// dialed localhost:6379, another server than the one written.
func TestRedisURLWithoutSlashes(t *testing.T) {
	for _, store := range []string{"redis:127.0.0.1:1", "rediss:127.0.0.1:1/0", "redis:/127.0.0.1:1/0", "redis:"} {
		code, _, errOut := exec(append([]string{"inspect", "--store", store}, tokenBucket...)...)
		require.Equal(t, 2, code, "%s: %s", store, errOut)
		require.Contains(t, errOut, "://HOST:PORT/DB", store)
		require.NotContains(t, errOut, "localhost", store)
	}
}

// An error about --store hides its password, in the command's words and
// in the client's: they quoted the URL whole.
func TestStorePasswordHidden(t *testing.T) {
	for _, store := range []string{"reddis://app:hunter22@127.0.0.1:1/0", "redis://app:hunter22@127.0.0.1:1/x",
		"rediss://app:hunter22@127.0.0.1:1/0?bogus=1", "redis+cluster://app:hunter22@127.0.0.1:1/5",
		"postgres://app:hunter22@127.0.0.1:x/db", "redis://app:hun%2Fter22@127.0.0.1:1/x"} {
		code, _, errOut := exec(append([]string{"inspect", "--store", store}, tokenBucket...)...)
		require.Equal(t, 2, code, "%s: %s", store, errOut)
		require.NotContains(t, errOut, "hunter22", store)
		require.NotContains(t, errOut, "hun%2Fter22", store)
		require.NotContains(t, errOut, "hun/ter22", store)
		require.Contains(t, errOut, "app:xxxxx", store)
	}
	// A password given as a parameter, of a URL (which pgx reads) or of a
	// connection string of keywords, is hidden too: a URL that did not
	// parse was quoted whole.
	for _, store := range []string{"postgres://app@127.0.0.1:x/db?password=hunter22", "postgresql://app@127.0.0.1:x/db?sslmode=disable&password=hunter22&x=1",
		"postgres://app@127.0.0.1:x/db?password=hun%2Fter22", "postgres://app@127.0.0.1:x/db?sslpassword=hunter22",
		"host=127.0.0.1 port=x password=hunter22 user=app", "host=127.0.0.1 port=x password='hunter22'",
		"redis://127.0.0.1:1/x?password=hunter22"} {
		code, _, errOut := exec(append([]string{"inspect", "--store", store}, tokenBucket...)...)
		require.Equal(t, 2, code, "%s: %s", store, errOut)
		require.NotContains(t, errOut, "hunter22", store)
		require.NotContains(t, errOut, "hun%2Fter22", store)
		require.NotContains(t, errOut, "hun/ter22", store)
		require.Contains(t, errOut, "password=xxxxx", store)
	}
	// A connection string of keywords, read as pgx reads it: spaces
	// around the =, quotes, backslashes, the key's sslpassword. pgx's own
	// error showed the password of "password = x", and the command's
	// hiding stopped a password at a & or # and missed the others.
	for store, secrets := range map[string][]string{
		"host=127.0.0.1 port=x user=app password=hunter22":                        {"hunter22"},
		"host=127.0.0.1 port=x password = Zq9 user=app":                           {"Zq9"},
		"host=127.0.0.1 port=x password = 'hunter 22' user=app":                   {"hunter 22", "hunter"},
		`host=127.0.0.1 port=x password='hun\'ter 22'`:                            {"hun\\'ter 22", "hun'ter 22", "ter 22"},
		"password=hun&ter#22 host=127.0.0.1 port=x":                               {"hun&ter#22", "ter#22", "22 host"},
		`port=x password=hun\ ter22`:                                              {"hun\\ ter22", "ter22"},
		"host=127.0.0.1 port=x sslpassword=hunter22 password=Zq9 sslmode=require": {"hunter22", "Zq9"},
		"host=127.0.0.1 port=x password='hunter22 dbname=test":                    {"hunter22"},
	} {
		code, out, errOut := exec(append([]string{"inspect", "--store", store}, tokenBucket...)...)
		require.Equal(t, 2, code, "%s: %s%s", store, out, errOut)
		for _, secret := range secrets {
			require.NotContains(t, errOut, secret, store)
		}
		require.Regexp(t, `password *= *xxxxx`, errOut, store)
	}
	// As the store, refused or not reached.
	for store, code := range map[string]int{
		"host=127.0.0.1 port=1 user=app password=hunter22 dbname=test":       1,
		"host=127.0.0.1 port=1 user=app password = 'hunter 22' dbname=test":  1,
		"host=127.0.0.1 port=1 user=app password = Zq9 dbname=test":          1,
		"host=127.0.0.1 port=1 password=hunter22 pool_max_conns=x":           2,
		"host=127.0.0.1 port=1 password=Zq9 connect_timeout=x":               2,
		"host=127.0.0.1 port=1 password=hunter22 statement_cache_capacity=x": 2,
	} {
		got, out, errOut := exec(append([]string{"inspect", "--store", store}, tokenBucket...)...)
		require.Equal(t, code, got, "%s: %s%s", store, out, errOut)
		require.NotContains(t, errOut, "hunter", store)
		require.NotContains(t, errOut, "Zq9", store)
	}
	for in, want := range map[string]string{
		"host=h password=hunter22":          "host=h password=xxxxx",
		" host = h  password = 'a b'  x=1 ": " host = h  password = xxxxx  x=1 ",
		`password='a\'b c' sslpassword=x`:   "password=xxxxx sslpassword=xxxxx",
		"host=h password=":                  "host=h password=xxxxx",
		"dbname=test host=::1":              "dbname=test host=::1",
	} {
		shown, _ := hidePassword(in)
		require.Equal(t, want, shown, in)
	}
	shown, hide := hidePassword("redis://:pw@127.0.0.1:6379/0")
	require.Equal(t, "redis://:xxxxx@127.0.0.1:6379/0", shown)
	require.Equal(t, "127.0.0.1:6379 pw", hide("127.0.0.1:6379 pw"), "a short password is left in the client's text")
	for _, u := range []string{"bolt://a@b:c/d.db", "bolt://u:secretive@x.db", "bolt:///var/lib/x@y.db", "redis://127.0.0.1:6379/0", "mem:", "redis://app@h:1/0"} {
		shown, _ := hidePassword(u)
		require.Equal(t, u, shown)
	}
}

// A URL that reads both ways, USER:DIGITS?KEY=VALUE@HOST, is read as the
// clients read it, a port and a query holding the @ (docs/cli.md); when
// the client refuses that query, the error shows neither the text that may
// be a password written without its ? escaped nor the client's words about
// it ("unexpected option: hunter"), and says how to write either reading.
// One the client takes is read so, and shown as it is.
func TestStoreQueryOrPassword(t *testing.T) {
	for store, shown := range map[string]string{
		"redis://app:1234?hunter=22@127.0.0.1:1/0":         "redis://app:xxxxx@127.0.0.1:1/0",
		"redis://app:1234?db=hunter22@127.0.0.1:1":         "redis://app:xxxxx@127.0.0.1:1",
		"postgres://app:1234?sslmode=hunter@127.0.0.1:1/x": "postgres://app:xxxxx@127.0.0.1:1/x",
	} {
		code, out, errOut := exec(append([]string{"inspect", "--store", store}, tokenBucket...)...)
		require.Equal(t, 2, code, "%s: %s%s", store, out, errOut)
		require.NotContains(t, errOut, "hunter", store)
		require.Equal(t, "ratelimit: --store \""+shown+"\": the text from the user's colon to the @ (xxxxx here) reads as a port and a query (?...) holding the @, "+
			"and the client refused that query: if it is a password, write its ? or # escaped (%3F, %23); if the @ is in a query's value, write it escaped (%40)\n"+
			"Run 'ratelimit inspect --help' for usage.\n", errOut, store)
	}
	// Taken by the client: a port and a query, dialled (a closed port).
	code, _, errOut := exec(append([]string{"inspect", "--store", "redis://127.0.0.1:1?client_name=a@b"}, tokenBucket...)...)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "redis at 127.0.0.1:1: ")
}

// A password that a URL does not hold as written is hidden too: one with
// a /, ? or # not escaped, which ends a URL's host, so that the clients
// read its start as a port and quoted it (invalid port ":hunter"), and
// the command quoted the URL whole; and one of a URL without its scheme
// or its slashes. A URL whose password holds such a character is refused
// before any client reads it.
func TestStorePasswordHiddenMalformed(t *testing.T) {
	for store, escape := range map[string]bool{
		"redis://app:hunter/22@127.0.0.1:1/0":        true,
		"rediss://app:hunter?22@127.0.0.1:1/0":       true,
		"redis://app:hunter#22@127.0.0.1:1/0":        true,
		"postgres://app:hunter/22@127.0.0.1:1/db":    true,
		"postgresql://app:hunter#22@127.0.0.1:1/db":  true,
		"redis+cluster://app:hunter/22@127.0.0.1":    false,
		"redis:/app:hunter22@127.0.0.1:1/0":          false,
		"redis:app:hunter22@127.0.0.1:1/0":           false,
		"redis+cluster:app:hunter22@127.0.0.1:1":     false,
		"app:hunter22@127.0.0.1:1":                   false,
		"reddis://app:hunter/22@127.0.0.1:1/0":       false,
		"postgres:app:hunter22@127.0.0.1:1/db":       false,
		"postgres://app:hunter/22@127.0.0.1:1/db?x=": true,
		"redis://app:1234/hunter@127.0.0.1:1/0":      true,
		// After digits, a ? or # and no key=value before the @: a
		// password, not a port and a query, which go-redis quoted
		// (unexpected option: hunter@...).
		"redis://127.0.0.1:1?hunter@127.0.0.1:1/0":       true,
		"rediss://127.0.0.1:1#hunter@127.0.0.1:1/0":      true,
		"postgres://127.0.0.1:1?hunter@127.0.0.1:1/db":   true,
		"postgresql://127.0.0.1:1/db?hunter@127.0.0.1:1": true,
	} {
		code, _, errOut := exec(append([]string{"inspect", "--store", store}, tokenBucket...)...)
		require.Equal(t, 2, code, "%s: %s", store, errOut)
		require.NotContains(t, errOut, "hunter", store)
		require.Regexp(t, `(app|127\.0\.0\.1):xxxxx@`, errOut, store)
		if escape {
			require.Contains(t, errOut, "write it escaped", store)
		} else {
			require.NotContains(t, errOut, "write it escaped", store)
		}
	}
	// What is not a password is shown as it is: a port, and an @ in a
	// path or in a query's value.
	for _, u := range []string{"redis://127.0.0.1:6379/0?x=a@b", "postgres://db:5432/app?user=admin@srv", "redis://[::1]:6379/0#a@b",
		"postgres://db/app?application_name=a@b", "redis://app@127.0.0.1:6379/0", "postgres://db:5432?user=admin@srv",
		"redis://h:6379?x=1&client_name=a@b"} {
		shown, _ := hidePassword(u)
		require.Equal(t, u, shown)
	}
}

// A password that is no valid URL text is hidden in the error that says
// so: url.Parse quotes the escape it cannot read (invalid URL escape
// "%Zq"), and a password too short to hide all over a text was quoted
// with the URL whole.
func TestStorePasswordHiddenEscape(t *testing.T) {
	for _, store := range []string{"redis://app:hu%Zqter22@127.0.0.1:1/0", "rediss://app:%Zq@127.0.0.1:1/0",
		"postgres://app:hu%Zqter22@127.0.0.1:1/db", "postgresql://app:%Zq@127.0.0.1:1/db",
		"postgres://app@127.0.0.1:1/db?password=%Zq", "redis+cluster://app:%Zq@127.0.0.1:1",
		"redis://app:a%Z@127.0.0.1:1/0", "postgres://app:Zq%@127.0.0.1:1/db"} {
		code, out, errOut := exec(append([]string{"inspect", "--store", store}, tokenBucket...)...)
		require.NotZero(t, code, "%s: %s%s", store, out, errOut)
		require.NotContains(t, errOut, "Zq", store)
		require.NotContains(t, errOut, "%Z", store)
	}
}

// A password under 4 characters is hidden where a client's text quotes
// it as the URL's, in --store whole or in its user and password, though
// not all over the text, where it would hide a port or an address.
func TestStoreShortPasswordHidden(t *testing.T) {
	shown, hide := hidePassword("redis://app:Zq9@127.0.0.1:1/0")
	require.Equal(t, "redis://app:xxxxx@127.0.0.1:1/0", shown)
	for in, want := range map[string]string{
		`parse "redis://app:Zq9@127.0.0.1:1/0": bad`: `parse "redis://app:xxxxx@127.0.0.1:1/0": bad`,
		"dial app:Zq9@127.0.0.1:1":                   "dial app:xxxxx@127.0.0.1:1",
		"port Zq9":                                   "port Zq9",
	} {
		require.Equal(t, want, hide(in), in)
	}
	// As url.Parse reports a host it cannot read, with the URL whole.
	for _, store := range []string{"redis://app:Zq9@[::1/0", "rediss://app:Zq9@127.0.0.1:1/0?bogus=1", "postgres://app:Zq9@[::1/db"} {
		code, out, errOut := exec(append([]string{"inspect", "--store", store}, tokenBucket...)...)
		require.Equal(t, 2, code, "%s: %s%s", store, out, errOut)
		require.NotContains(t, errOut, "Zq9", store)
	}
}

// --store takes a PostgreSQL connection string of keywords, as pgx does
// (host=... port=... dbname=...), not only a URL: it was an unknown kind
// of store.
func TestPostgresKeywordString(t *testing.T) {
	clk := clock.NewMock() // the time of every call and command: the answers stay put however long the test takes
	clk.Set(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	ctx := context.Background()
	u, err := url.Parse(testserver.PostgresURL(t))
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(u.Host)
	require.NoError(t, err)
	var password string
	if p, ok := u.User.Password(); ok {
		password = " password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(p) + "'"
	}
	store := fmt.Sprintf("host=%s port = %s  user=%s dbname=%s sslmode=disable%s", host, port, u.User.Username(), strings.TrimPrefix(u.Path, "/"), password)
	table := fmt.Sprintf("ratelimit_cli_kw_%d", time.Now().UnixNano())
	pool, err := pgxpool.New(ctx, testserver.PostgresURL(t))
	require.NoError(t, err)
	t.Cleanup(func() {
		defer pool.Close()
		dropTable(t, pool, table)
	})
	args := func(cmd string) []string {
		return []string{cmd, "--store", store, "--table", table, "--key", "k", "--kind", "fixed window", "--rate", "3", "--period", "1h"}
	}
	code, _, errOut := execAt(clk, args("inspect")...)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "does not exist in this database", "inspect creates nothing")
	code, out, errOut := execAt(clk, append(args("limit"), "--count", "2")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "allowed 2 of limit")
	code, out, errOut = execAt(clk, args("inspect")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 1 of capacity 3")
	code, out, errOut = execAt(clk, args("reset")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "reset limit")

	// The server's refusal, and a closed port, as for a URL.
	code, _, errOut = execAt(clk, append([]string{"inspect", "--store", fmt.Sprintf("host=%s port=%s user=nobody_%d dbname=test", host, port, time.Now().UnixNano())}, tokenBucket...)...)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "(SQLSTATE 28000)")
	code, _, errOut = execAt(clk, append([]string{"inspect", "--store", "host=127.0.0.1 port=1 dbname=test"}, tokenBucket...)...)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "(is the server up? check --store)")
	// One that does not parse is a usage error that says what is wrong.
	code, _, errOut = execAt(clk, append([]string{"inspect", "--store", "host=127.0.0.1 port=x"}, tokenBucket...)...)
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, `ratelimit: --store "host=127.0.0.1 port=x": invalid port`)
}

// A node of a Redis Cluster given as redis:// is refused with what to
// write: the commands read only its part of the keys and failed on the
// others with "MOVED 1373 127.0.0.1:7101".
func TestRedisClusterNodeAsServer(t *testing.T) {
	addrs := testserver.ClusterAddrs(t)
	node, _, _ := strings.Cut(addrs, ",")
	for _, cmd := range []string{"inspect", "limit", "reset", "bench"} {
		code, out, errOut := exec(append([]string{cmd, "--store", "redis://" + node + "/0"}, tokenBucket...)...)
		require.Equal(t, 2, code, "%s:\n%s%s", cmd, out, errOut)
		require.Contains(t, errOut, fmt.Sprintf("redis at %s is a node of a Redis Cluster, which holds some of the keys: write --store redis+cluster://%s (any of its nodes)", node, node), cmd)
	}
}

// A time RFC 3339 cannot write, before year 0 or after 9999, is written
// with ISO 8601's expanded year, a sign and six digits, as JavaScript's
// Date writes it, in the JSON reports and in the text alike. Go's Format
// wrote "73326-09-11T20:14:45.248Z", which no reader of RFC 3339 takes
// (Go's own time.Time refuses it) and which sorts as text before 2024.
// Such a time comes from a record of a far future, which the stores
// keep: a call's time may be up to driver.MaxTime from 1970.
func TestTimesBeyondRFC3339(t *testing.T) {
	for ms, want := range map[int64]string{
		0:                 "1970-01-01T00:00:00.000Z",
		-62167219200000:   "0000-01-01T00:00:00.000Z",
		-62167219200001:   "-000001-12-31T23:59:59.999Z",
		253402300799999:   "9999-12-31T23:59:59.999Z",
		253402300800000:   "+010000-01-01T00:00:00.000Z",
		1 << 51:           "+073326-09-11T20:14:45.248Z",
		-(1 << 52):        "-140744-08-10T07:30:29.504Z",
		math.MaxInt64 / 8: "+36536598-01-28T21:54:06.975Z",
	} {
		got := timeText(time.UnixMilli(ms))
		require.Equal(t, want, got, "%d ms", ms)
		if y := time.UnixMilli(ms).UTC().Year(); y >= 0 && y <= 9999 {
			_, err := time.Parse(time.RFC3339, got)
			require.NoError(t, err, got)
		}
	}
	require.Nil(t, timeJSON(time.Time{}))
	require.Equal(t, "-", stamp(time.Time{}))

	// A record of the year 73326, through inspect.
	path := filepath.Join(t.TempDir(), "limits.db")
	args := []string{"--store", "bolt://" + path, "--kind", "fixed window", "--rate", "10", "--period", "1h", "--key", "k"}
	code, _, errOut := exec(append([]string{"limit"}, args...)...)
	require.Equal(t, 0, code, errOut)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("ratelimit"))
		return b.ForEach(func(k, _ []byte) error {
			v := binary.BigEndian.AppendUint64(nil, math.Float64bits(5))
			v = binary.BigEndian.AppendUint64(v, 1<<51)
			v = binary.BigEndian.AppendUint64(v, math.MaxInt64)
			return b.Put(k, v)
		})
	}))
	require.NoError(t, db.Close())
	code, out, errOut := exec(append([]string{"inspect", "-o", "json"}, args...)...)
	require.Equal(t, 0, code, errOut)
	var s statusJSON
	decode(t, out, &s)
	require.Equal(t, "+073326-09-11T20:14:45.248Z", *s.WindowStart)
	require.Equal(t, "+073326-09-11T21:14:45.248Z", *s.NextGrant)
	require.Equal(t, "+073326-09-11T20:14:45.248Z", *s.Shards[0].WindowStart)
	code, out, errOut = exec(append([]string{"inspect"}, args...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "+073326-09-11T20:14:45.248Z  +073326-09-11T21:14:45.248Z")
}

// A limit's name is any bytes, as a key is, and JSON text is UTF-8: a
// name that is not valid UTF-8 came out as U+FFFD, "\xff" and "\xfe"
// alike. name_base64 (and a token item's limit_base64) gives its bytes
// exactly, as key_base64 gives a key's.
func TestNameNotUTF8JSON(t *testing.T) {
	unsetenv(t, tokenKeyEnv)
	names := map[string]string{"\xff": "/w==", "\xfe": "/g==", "\ufffd": "77+9", "signup": "c2lnbnVw"}
	for name, b64 := range names {
		code, out, errOut := exec("limit", "--store", "mem:", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--name", name, "--key", "k", "-o", "json")
		require.Equal(t, 0, code, errOut)
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &m))
		limit := m["limit"].(map[string]any)
		require.Equal(t, b64, limit["name_base64"], "%q", name)
		require.Equal(t, strings.ToValidUTF8(name, "\ufffd"), limit["name"], "%q", name)

		lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{name: {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}}))
		tok := receipt(t, lim, name, "k", 1)
		code, out, errOut = exec("token", "inspect", "-o", "json", tok)
		require.Equal(t, 0, code, errOut)
		require.NoError(t, json.Unmarshal([]byte(out), &m))
		item := m["items"].([]any)[0].(map[string]any)
		require.Equal(t, b64, item["limit_base64"], "%q", name)
		require.Equal(t, []string{"amount", "limit", "limit_base64", "shard"}, keysOf(item))
	}
}

// earlyDeadline is a context whose deadline a store's own timer saw pass a
// moment before the context's timer ended it: Deadline says it is past
// while Done is not closed yet.
type earlyDeadline struct{ context.Context }

func (earlyDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A store's deadline error that comes a moment before --timeout's timer
// has ended the command's context is still told as the store's silence:
// under load, bench on a stalled Redis said "context deadline exceeded"
// alone, the store's batch having given up by its own timer first.
func TestCauseAfterAStoresOwnTimer(t *testing.T) {
	ctx, cancel := context.WithTimeoutCause(context.Background(), 30*time.Millisecond, errTimeout)
	defer cancel()
	err := fmt.Errorf("redisstore: apply: %w", context.DeadlineExceeded)
	require.ErrorIs(t, causeAfter(earlyDeadline{ctx}, err), errTimeout)
	f := storeFlags{timeout: 30 * time.Millisecond}
	require.ErrorContains(t, f.timedOut(earlyDeadline{ctx}, err), "no answer from the store within --timeout 30ms")

	// Another error, or a deadline not passed, does not wait.
	other, cancel2 := context.WithTimeoutCause(context.Background(), time.Hour, errTimeout)
	defer cancel2()
	require.NoError(t, causeAfter(other, err))
	require.NoError(t, causeAfter(earlyDeadline{other}, errors.New("connection refused")))
}

// A flag of one kind of store given with another is refused: --prefix
// names a Redis store's keys, --table a PostgreSQL store's table and
// --bucket a bbolt file's bucket, and each was ignored by the others, so
// that inspect --store postgres://... --prefix app: showed the records of
// the default table as those the flag named.
func TestStoreFlagsOfAnotherStore(t *testing.T) {
	bolt := "bolt://" + filepath.Join(t.TempDir(), "limits.db")
	for _, tc := range []struct{ store, flag string }{
		{"mem:", "--prefix"}, {"mem:", "--table"}, {"mem:", "--bucket"},
		{bolt, "--prefix"}, {bolt, "--table"},
		{"redis://127.0.0.1:1/0", "--table"}, {"redis://127.0.0.1:1/0", "--bucket"},
		{"redis+cluster://127.0.0.1:1", "--bucket"},
		{"postgres://app:hunter22@127.0.0.1:1/db", "--prefix"}, {"host=127.0.0.1 port=1", "--bucket"},
	} {
		for _, cmd := range []string{"inspect", "limit", "reset", "bench", "token refund"} {
			args := append(strings.Fields(cmd), "--store", tc.store, tc.flag, "x")
			if cmd == "token refund" {
				args = append(args, "--kind", "token bucket", "--rate", "1", "--period", "1s", "AQ")
			} else {
				args = append(args, tokenBucket...)
			}
			code, _, errOut := exec(args...)
			require.Equal(t, 2, code, "%q: %s", args, errOut)
			require.Contains(t, errOut, tc.flag+" is of ", "%q", args)
			require.NotContains(t, errOut, "hunter22", "%q", args)
		}
	}
	// The store's own flag, and the defaults, are taken.
	code, _, errOut := exec(append([]string{"limit", "--store", bolt, "--bucket", "mine"}, tokenBucket...)...)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = exec(append([]string{"inspect", "--store", bolt, "--bucket", "mine"}, tokenBucket...)...)
	require.Equal(t, 0, code, errOut)
}

// A --table that is no valid name is a usage error for every command,
// told before connecting: limit and bench, which may create the table,
// reported it as a failure (status 1), once connected, and not at all
// when the server could not be reached.
func TestTableNameUsage(t *testing.T) {
	for _, cmd := range []string{"inspect", "limit", "reset", "bench", "token refund"} {
		for _, table := range []string{"", strings.Repeat("a", 70), `"a`} {
			args := append(strings.Fields(cmd), "--store", "postgres://app@127.0.0.1:1/db", "--table", table, "--kind", "token bucket", "--rate", "1", "--period", "1s")
			if cmd == "token refund" {
				args = append(args, "AQ")
			}
			code, _, errOut := exec(args...)
			require.Equal(t, 2, code, "%q: %s", args, errOut)
			require.Contains(t, errOut, "ratelimit: --table: pgstore: table name", "%q", args)
			require.NotContains(t, errOut, "connect", "%q", args)
		}
	}
}

// --bucket "" is a usage error, as boltstore refuses an empty bucket name:
// it was a failure (status 1), and inspect reported the file missing.
func TestEmptyBucketUsage(t *testing.T) {
	store := "bolt://" + filepath.Join(t.TempDir(), "limits.db")
	for _, cmd := range []string{"inspect", "limit", "reset", "bench"} {
		args := append([]string{cmd, "--store", store, "--bucket", ""}, tokenBucket...)
		code, _, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, `--bucket "": give the bucket's name`, "%q", args)
	}
}

// A --count the limit can never grant is a usage error before the store
// is opened: behind a store that could not be reached, it was told as
// that failure (status 1), and limit and bench made a bbolt file first.
func TestCountRefusedFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	for _, store := range []string{"redis://127.0.0.1:1/0", "bolt://" + path} {
		for _, args := range [][]string{
			{"limit", "--count", "4"},
			{"limit", "--count", "4", "--check"},
			{"limit", "--count", "-1", "--reserve"},
			{"bench", "--count", "4", "--duration", "1h"},
		} {
			args = append(append(args, "--store", store), tokenBucket...)
			code, _, errOut := exec(args...)
			require.Equal(t, 2, code, "%q: %s", args, errOut)
			require.Contains(t, errOut, "--count", "%q", args)
			require.NotContains(t, errOut, "connection refused", "%q", args)
		}
	}
	require.NoFileExists(t, path)
	// A count the limit grants by reserving is no usage error.
	code, out, errOut := exec(append([]string{"limit", "--count", "4", "--reserve", "--store", "bolt://" + path, "--max-reserved", "5"}, tokenBucket...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "reserved 4")
}

// --svg "" is refused: an empty path drew no chart, and the run printed
// its table as if none had been asked for.
func TestSimulateSVGEmpty(t *testing.T) {
	code, out, errOut := exec("simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--at", "0s=1", "--svg", "")
	require.Equal(t, 2, code, out)
	require.Empty(t, out)
	require.Equal(t, "ratelimit: --svg \"\": give the chart's file, such as --svg chart.svg, or leave --svg out for the table alone\n"+
		"Run 'ratelimit simulate --help' for usage.\n", errOut)
}

// bench's check line counts its keys in words: "(1 key)", not "(1 keys)".
func TestBenchCheckKeys(t *testing.T) {
	for keys, want := range map[string]string{"1": "(1 key)", "2": "(2 keys)"} {
		code, out, errOut := exec("bench", "--store", "mem:", "--kind", "token bucket", "--rate", "10", "--period", "1h", "--keys", keys,
			"--goroutines", "1", "--duration", "10ms", "--quiet")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "check      ok: no key was granted more than the limit allows "+want+"\n")
	}
}

// fullWriter is standard output on a full disk: every write fails.
type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// A command whose output could not be written fails (1), and says so: the
// text reports did not look at their writes' errors, so that ratelimit
// schema > migration.sql on a full disk exited 0, leaving the migration
// an empty or cut file.
func TestOutputWriteFails(t *testing.T) {
	for _, args := range [][]string{
		{"schema"},
		append([]string{"simulate", "--at", "0s=1"}, tokenBucket...),
		append([]string{"inspect", "--store", "mem:"}, tokenBucket...),
		append([]string{"inspect", "--store", "mem:", "-o", "json"}, tokenBucket...),
		append([]string{"limit", "--store", "mem:"}, tokenBucket...),
		append([]string{"bench", "--store", "mem:", "--duration", "10ms", "--goroutines", "1"}, tokenBucket...),
		{"token", "inspect", "-o", "json", "AQ"},
	} {
		var errOut bytes.Buffer
		code := run(context.Background(), args, fullWriter{}, &errOut)
		require.Equal(t, 1, code, "%q: %s", args, errOut.String())
		require.Contains(t, errOut.String(), "ratelimit: writing the output: no space left on device\n", "%q", args)
	}
	// The help said it twice, first without "ratelimit: ".
	for _, args := range [][]string{{"--help"}, {"help", "schema"}, {"schema", "--help"}, {"token"}, {"--version"}} {
		var errOut bytes.Buffer
		code := run(context.Background(), args, fullWriter{}, &errOut)
		require.Equal(t, 1, code, "%q: %s", args, errOut.String())
		require.Equal(t, "ratelimit: writing the output: no space left on device\n", errOut.String(), "%q", args)
	}
}
