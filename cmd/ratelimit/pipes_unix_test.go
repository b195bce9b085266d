//go:build unix

package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// simulate --svg writes the chart into a named pipe, as it would into
// /dev/stdout or a shell's >(gzip > chart.svgz): it truncated the file
// before writing, which a pipe refuses, and failed after printing the
// table with "truncate: invalid argument".
func TestSimulateSVGToPipe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "chart.fifo")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	read := make(chan string, 1)
	go func() {
		f, err := os.Open(path)
		if err != nil {
			read <- err.Error()
			return
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err != nil {
			read <- err.Error()
			return
		}
		read <- string(b)
	}()
	code, out, errOut := exec("simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--at", "0s=1", "--svg", path)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "chart: "+path)
	chart := <-read
	require.True(t, strings.HasPrefix(chart, "<svg xmlns"), chart)
	require.True(t, strings.HasSuffix(chart, "</svg>\n"), chart)
}

// A --store bolt:// path that is a named pipe, or a device, is refused as
// no bbolt file by every command: limit, bench and the others that may
// create the file took it for an empty file to write the store into, and
// bbolt read the pipe for ever, past --timeout.
func TestBoltFileNotRegular(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	for _, args := range [][]string{
		{"limit", "--key", "k"},
		{"inspect", "--key", "k"},
		{"reset", "--key", "k"},
		{"bench", "--duration", "10ms", "--quiet"},
	} {
		args = append(append(args, "--store", "bolt://"+path, "--timeout", "5s"), tokenBucket...)
		type result struct {
			code        int
			out, errOut string
		}
		done := make(chan result, 1)
		go func() {
			code, out, errOut := exec(args...)
			done <- result{code, out, errOut}
		}()
		select {
		case r := <-done:
			require.Equal(t, 1, r.code, "%q:\n%s%s", args, r.out, r.errOut)
			require.Equal(t, "ratelimit: bbolt file "+path+" is not a regular file (a named pipe, a device or a socket): "+
				"check the path in --store (the application's boltstore.Open path)\n", r.errOut, "%q", args)
		case <-time.After(20 * time.Second):
			t.Fatalf("%q: still running after 20s, with --timeout 5s", args)
		}
	}
}
