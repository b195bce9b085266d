//go:build unix

package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

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
