package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ratelimit-go/ratelimit/bench/compare"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runArgsEnv, when set, makes the test binary run the command with its
// space-separated arguments instead of the tests: TestTerminateCleansUp
// signals a run in a process of its own.
const runArgsEnv = "COMPARE_TEST_RUN_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(runArgsEnv); ok {
		os.Exit(run(strings.Fields(args), os.Stdout, os.Stderr, notify()))
	}
	os.Exit(m.Run())
}

// TestUsageErrors requires every bad command line to exit with status 2
// before anything runs, with one line that names what is wrong.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		// Parsing stops at "extra": the flags after it were dropped and
		// the run went ahead, and exited 0.
		{[]string{"-medium", "memory", "-match", "nothing", "extra", "-rounds", "0"},
			`compare: unexpected argument "extra": every setting is a flag (see -h)` + "\n"},
		// The package's errors name it; the command named it again, and
		// gave the time the run took though none ran.
		{[]string{"-rounds", "0"},
			"compare: 0 rounds of 200ms: choose at least one round of a positive slice\n"},
		{[]string{"-medium", "mongo"},
			`compare: unknown medium "mongo": choose among [memory bolt redis cluster pg]` + "\n"},
		{[]string{"-goroutines", "1,x"}, `compare: -goroutines: "x" is not a whole number` + "\n"},
		{[]string{"-fail", "some"}, `compare: -fail: "some": choose "any" or "library"` + "\n"},
		// A key table of 2^31-1 names, allocated before the first call.
		{[]string{"-medium", "memory", "-keys", "1,2147483647"}, "compare: 2147483647 keys: choose 1 to 1000000\n"},
		// Each ran twice over, and was reported twice.
		{[]string{"-medium", "redis,memory,redis"}, `compare: medium "redis" named twice: name each once` + "\n"},
		{[]string{"-medium", "memory", "-goroutines", "8,1,8"}, "compare: goroutine count 8 named twice: name each once\n"},
		{[]string{"-medium", "memory", "-keys", "10_000,10000"}, "compare: key count 10000 named twice: name each once\n"},
		// The library refuses it: the run began its report and failed in
		// its first cell, "(after 0s)".
		{[]string{"-medium", "memory", "-rate", "10000000000000000"},
			"compare: limit of 10000000000000000 per 1s: ratelimit: invalid config: Rate is 1e16: it must be a number of tokens from 1e-9 to 1000000000000000\n"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr, nil)
		assert.Equal(t, 2, code, "%q", tc.args)
		assert.Equal(t, tc.want, stderr.String(), "%q", tc.args)
		assert.Empty(t, stdout.String(), "%q", tc.args)
	}
}

// TestHelp requires -h to print the usage and exit 0, as a command of
// the flag package's ExitOnError does: it exited 2, as for a bad flag.
func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		var stdout, stderr bytes.Buffer
		code := run([]string{arg}, &stdout, &stderr, nil)
		assert.Equal(t, 0, code, arg)
		assert.True(t, strings.HasPrefix(stderr.String(), "usage: compare [flags]\n"), "%s: %s", arg, stderr.String())
		assert.Contains(t, stderr.String(), "-medium string", arg)
		assert.Empty(t, stdout.String(), arg)
	}
	// A bad flag still exits 2, after the usage.
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 2, run([]string{"-nosuch"}, &stdout, &stderr, nil))
	assert.Contains(t, stderr.String(), "flag provided but not defined: -nosuch")
}

// TestNothingRan requires a run in which every medium named was skipped
// to exit with status 2, having measured nothing: it exited 0.
func TestNothingRan(t *testing.T) {
	for _, args := range [][]string{
		{"-medium", "redis,pg", "-redis", "127.0.0.1:1", "-pg", "postgres://postgres@127.0.0.1:1/test"},
		{"-medium", "memory", "-match", "nothing"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append(args, "-quiet"), &stdout, &stderr, nil)
		assert.Equal(t, 2, code, "%q", args)
		assert.Equal(t, "compare: no medium ran: every one was skipped\n", stderr.String(), "%q", args)
		assert.Contains(t, stdout.String(), "Skipped: ", "%q", args)
	}
	// One medium that ran is a run.
	var stdout, stderr bytes.Buffer
	code := run([]string{"-medium", "redis,memory", "-redis", "127.0.0.1:1", "-match", "^ratelimit",
		"-goroutines", "1", "-keys", "1", "-rounds", "1", "-slice", "1ms", "-quiet"}, &stdout, &stderr, nil)
	assert.Equal(t, 0, code, stderr.String())
	assert.Empty(t, stderr.String())
}

// TestQuietRedisWarning requires -quiet to keep the warning about a Redis
// server that keeps nothing on disk off standard error, as it keeps the
// progress, and the warning to be said with the progress otherwise: it
// was logged to the process's standard error whatever -quiet said.
func TestQuietRedisWarning(t *testing.T) {
	var logs bytes.Buffer
	def := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	defer slog.SetDefault(def)
	args := []string{"-medium", "redis", "-match", "^ratelimit", "-goroutines", "1", "-keys", "1", "-rounds", "1", "-slice", "1ms"}
	var stdout, stderr bytes.Buffer
	code := run(append(args, "-quiet"), &stdout, &stderr, nil)
	if strings.Contains(stdout.String(), "Skipped: ") {
		t.Skipf("no Redis server at the default address: %s", stdout.String())
	}
	require.Equal(t, 0, code, stderr.String())
	assert.Empty(t, stderr.String())
	assert.Empty(t, logs.String())

	stdout.Reset()
	code = run(args, &stdout, &stderr, nil)
	require.Equal(t, 0, code, stderr.String())
	assert.Empty(t, logs.String())
	if !strings.Contains(stderr.String(), "warning: redis ") {
		t.Skipf("the Redis server keeps its records: nothing to warn of\n%s", stderr.String())
	}
	assert.Equal(t, 1, strings.Count(stderr.String(), "warning: redis "), stderr.String())
}

// TestTerminateCleansUp requires a run told to terminate (SIGTERM, as
// kill and timeout send) to remove what it made, as an interrupted one
// does: here the bbolt files of its temporary directory.
func TestTerminateCleansUp(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no SIGTERM")
	}
	tmp := t.TempDir()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp,
		runArgsEnv+"=-medium bolt -goroutines 1 -keys 1 -rounds 1000 -slice 10ms -quiet")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	// Wait for the run to make its directory.
	var made []string
	for deadline := time.Now().Add(time.Minute); len(made) == 0; {
		var err error
		made, err = filepath.Glob(filepath.Join(tmp, "rlcompare-*"))
		require.NoError(t, err)
		select {
		case err := <-done:
			t.Fatalf("the run ended before it made its directory: %v\n%s", err, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "no directory after a minute")
	}

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-done:
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit)
		assert.Equal(t, 143, exit.ExitCode(), "128 + SIGTERM\n%v\n%s", err, stderr.String())
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("the run did not end within a minute of SIGTERM")
	}
	left, err := filepath.Glob(filepath.Join(tmp, "rlcompare-*"))
	require.NoError(t, err)
	assert.Empty(t, left, "left behind")
	assert.Contains(t, stderr.String(), "compare: terminated: bolt, 1 goroutine, 1 key: context canceled")
}

// signalOnLine is a standard error that sends a signal once a line
// containing line has been written to it.
type signalOnLine struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	line string
	sigs chan<- os.Signal
	sig  os.Signal
}

func (w *signalOnLine) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if w.sigs != nil && strings.Contains(w.buf.String(), w.line) {
		w.sigs <- w.sig
		w.sigs = nil
	}
	return n, err
}

func (w *signalOnLine) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestInterruptExitStatus requires a run ended by its first signal to exit
// as shells report a command the signal ended, 128 + its number (130 for
// Ctrl-C), having written the report of the cells that finished: it exited
// 2, the status of a usage error.
func TestInterruptExitStatus(t *testing.T) {
	for _, tc := range []struct {
		sig  os.Signal
		want int
		name string
	}{
		{os.Interrupt, 130, "interrupt"},
		{syscall.SIGTERM, 143, "terminated"},
	} {
		sigs := make(chan os.Signal, 2)
		// The first cell's progress line: the signal comes while the
		// second runs.
		stderr := &signalOnLine{line: "memory, 1 goroutine, 1 key: ", sigs: sigs, sig: tc.sig}
		var stdout bytes.Buffer
		code := run([]string{"-medium", "memory", "-match", "^ratelimit", "-goroutines", "1", "-keys", "1,2,3,4,5,6,7,8",
			"-rounds", "1", "-slice", "10ms"}, &stdout, stderr, sigs)
		assert.Equal(t, tc.want, code, "%v\n%s", tc.sig, stderr)
		assert.Contains(t, stdout.String(), "| 1 | 1 | **ratelimit memstore** |", "%v: the cell that finished", tc.sig)
		assert.Contains(t, stdout.String(), "### Bounds checked", "%v: the whole report", tc.sig)
		assert.Regexp(t, `(?m)^compare: `+tc.name+`: memory, 1 goroutine, \d keys: context canceled \(after .*\); the report holds the cells that finished$`,
			stderr.String(), tc.sig)
	}
}

// TestSecondInterruptExits requires a second Ctrl-C, while the run cleans
// up, to end the process at once with status 130: the run swallowed it
// and went on waiting, here for a lock that holds up its DROP SCHEMA, as
// long as its cleanup's timeout (a minute).
func TestSecondInterruptExits(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no SIGINT to a child")
	}
	ctx := context.Background()
	pgURL := os.Getenv("DATABASE_URL") // as the store tests take it
	if pgURL == "" {
		pgURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	connect := func() *pgx.Conn {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		conn, err := pgx.Connect(cctx, pgURL)
		if err != nil {
			t.Skipf("PostgreSQL at %s: %v", pgURL, err)
		}
		t.Cleanup(func() { conn.Close(ctx) })
		return conn
	}
	// One session watches the run's, outside a transaction: within one,
	// pg_stat_activity reads the same as at its first read. The other
	// holds the lock.
	conn, locker := connect(), connect()
	// The run's sessions are known by their application_name.
	app := fmt.Sprintf("rlcompare-test-%d", time.Now().UnixNano())
	u, err := url.Parse(pgURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()

	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), runArgsEnv+"=-medium pg -match ^bare -goroutines 1 -keys 1 -rounds 1000 -slice 10ms -quiet -pg "+u.String())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		cmd.Process.Kill() // if the test failed first
		<-exited
	}()

	// waitFor polls the child's sessions until one's statement matches
	// re, and returns the match's first group.
	waitFor := func(re *regexp.Regexp, lockWait bool) string {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; {
			rows, err := conn.Query(ctx, "SELECT query FROM pg_stat_activity WHERE application_name = $1 AND ($2 = false OR wait_event_type = 'Lock')", app, lockWait)
			require.NoError(t, err)
			queries, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			for _, q := range queries {
				if m := re.FindStringSubmatch(q); m != nil {
					return m[1]
				}
			}
			select {
			case <-exited:
				t.Fatalf("the run ended: %v\n%s", waitErr, stderr.String())
			case <-time.After(10 * time.Millisecond):
			}
			require.True(t, time.Now().Before(deadline), "no statement matching %v after a minute", re)
		}
	}
	// The run's schema, from its upserts; a lock on its table holds up the
	// run's DROP SCHEMA, not its upserts.
	schema := waitFor(regexp.MustCompile(`^INSERT INTO "(rlcompare_[a-z0-9_]+)"\."bare"`), false)
	defer func() {
		_, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		assert.NoError(t, err)
	}()
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) // before the schema is dropped
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, "bare"}.Sanitize()+" IN ACCESS SHARE MODE")
	require.NoError(t, err)

	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	waitFor(regexp.MustCompile(`^(DROP SCHEMA)`), true) // cleaning up, held up
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	select {
	case <-exited:
		var exit *exec.ExitError
		require.ErrorAs(t, waitErr, &exit)
		assert.Equal(t, 130, exit.ExitCode(), "%v\n%s", waitErr, stderr.String())
	case <-time.After(2 * time.Minute):
		t.Fatal("the run did not end within two minutes of the second interrupt")
	}
	assert.Contains(t, stderr.String(), "compare: interrupt again while cleaning up: exiting at once")
}

// TestCleanupFailureExitStatus requires a run that could not remove what
// it made to say so on stderr and exit 3, its report written: it exited
// 0, the failure a line of the Markdown alone. A signal's status still
// comes first.
func TestCleanupFailureExitStatus(t *testing.T) {
	defer func(f func(context.Context, compare.Options) (*compare.Report, error)) { runCompare = f }(runCompare)
	runCompare = func(ctx context.Context, o compare.Options) (*compare.Report, error) {
		rep, err := compare.Run(ctx, o)
		if rep != nil && len(rep.Media) > 0 {
			// As a medium whose DROP SCHEMA timed out.
			rep.Media[0].Cleanup = errors.New("DROP SCHEMA: lock timeout")
		}
		return rep, err
	}
	args := []string{"-medium", "memory", "-match", "^ratelimit", "-goroutines", "1", "-keys", "1", "-rounds", "1", "-slice", "1ms", "-quiet"}
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr, nil)
	assert.Equal(t, 3, code, stderr.String())
	assert.Equal(t, "compare: cleaning up failed: memory: DROP SCHEMA: lock timeout; the run's Redis keys (rlcompare-*), "+
		"PostgreSQL schema (rlcompare_*) or bbolt directory (rlcompare-* in "+os.TempDir()+") may be left\n", stderr.String())
	assert.Contains(t, stdout.String(), "- cleaning up failed: DROP SCHEMA: lock timeout\n")
	assert.Contains(t, stdout.String(), "### Bounds checked")

	// Interrupted, it exits as the signal says.
	sigs := make(chan os.Signal, 1)
	sigs <- os.Interrupt
	run1 := runCompare
	runCompare = func(ctx context.Context, o compare.Options) (*compare.Report, error) {
		<-ctx.Done() // the signal came before the run ended
		return run1(ctx, o)
	}
	stdout.Reset()
	stderr.Reset()
	code = run(args, &stdout, &stderr, sigs)
	assert.Equal(t, 130, code, stderr.String())
	assert.Contains(t, stderr.String(), "compare: cleaning up failed: memory: DROP SCHEMA: lock timeout;")
}
