package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// simulate --svg /dev/stdout, with standard output redirected to a file
// (> report.txt), opens that file anew, at its start: the chart was cut
// into it there, over the table, which was lost, and the "chart:" line
// written where the table had ended. The chart goes after the table, as it
// does into a pipe. Standard output here is the file, and --svg names it,
// as /dev/stdout would.
func TestSimulateSVGToRedirectedStdout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.txt")
	stdout, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	require.NoError(t, err)
	defer stdout.Close()
	var errOut bytes.Buffer
	code := run(context.Background(), []string{"simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--at", "0s=1,1s=1", "--svg", path}, stdout, &errOut)
	require.Equal(t, 0, code, errOut.String())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	report := string(data)
	assert.NotContains(t, report, "\x00")
	table, chart, ok := strings.Cut(report, "<svg xmlns")
	require.True(t, ok, report)
	assert.True(t, strings.HasPrefix(table, "limit: token bucket"), "the table first: %q", table)
	assert.Len(t, rows(table), 2, "%q", table)
	assert.True(t, strings.HasSuffix(chart, "</svg>\n\nchart: "+path+"\n"), "%q", chart[max(0, len(chart)-200):])
}
