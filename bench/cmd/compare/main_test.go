package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runArgsEnv, when set, makes the test binary run the command with its
// space-separated arguments instead of the tests: TestTerminateCleansUp
// signals a run in a process of its own.
const runArgsEnv = "COMPARE_TEST_RUN_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(runArgsEnv); ok {
		os.Exit(run(strings.Fields(args), os.Stdout, os.Stderr))
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
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		assert.Equal(t, 2, code, "%q", tc.args)
		assert.Equal(t, tc.want, stderr.String(), "%q", tc.args)
		assert.Empty(t, stdout.String(), "%q", tc.args)
	}
}

// TestNothingRan requires a run in which every medium named was skipped
// to exit with status 2, having measured nothing: it exited 0.
func TestNothingRan(t *testing.T) {
	for _, args := range [][]string{
		{"-medium", "redis,pg", "-redis", "127.0.0.1:1", "-pg", "postgres://postgres@127.0.0.1:1/test"},
		{"-medium", "memory", "-match", "nothing"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append(args, "-quiet"), &stdout, &stderr)
		assert.Equal(t, 2, code, "%q", args)
		assert.Equal(t, "compare: no medium ran: every one was skipped\n", stderr.String(), "%q", args)
		assert.Contains(t, stdout.String(), "Skipped: ", "%q", args)
	}
	// One medium that ran is a run.
	var stdout, stderr bytes.Buffer
	code := run([]string{"-medium", "redis,memory", "-redis", "127.0.0.1:1", "-match", "^ratelimit",
		"-goroutines", "1", "-keys", "1", "-rounds", "1", "-slice", "1ms", "-quiet"}, &stdout, &stderr)
	assert.Equal(t, 0, code, stderr.String())
	assert.Empty(t, stderr.String())
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
		assert.Equal(t, 2, exit.ExitCode(), "%v\n%s", err, stderr.String())
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("the run did not end within a minute of SIGTERM")
	}
	left, err := filepath.Glob(filepath.Join(tmp, "rlcompare-*"))
	require.NoError(t, err)
	assert.Empty(t, left, "left behind")
	assert.Contains(t, stderr.String(), "context canceled")
}
