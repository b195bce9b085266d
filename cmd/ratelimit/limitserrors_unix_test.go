//go:build unix

package main

import (
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every error about the --limits file reads one way: "--limits FILE: ",
// the flag and the file once, then what was wrong and what to do, with
// the library's own message (ParseLimits's "limits file: ...") kept
// whole inside. They came in three shapes: "limits file FILE: larger
// than ...", "FILE: limits file: ..." and "--limits: open FILE: ...". An
// empty file, or nothing piped in, said to write a mapping of limit names
// to their fields, as if the file held something else.
func TestLimitsFileErrorShape(t *testing.T) {
	dir := t.TempDir()
	const limit = "  kind: token bucket\n  rate: 10\n  period: 1m\n"
	big := filepath.Join(dir, "big.yaml")
	f, err := os.Create(big)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(maxLimitsFile+1)) // sparse
	require.NoError(t, f.Close())
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o700))

	// emptyPipe is bash's <(...) of a command that wrote nothing.
	emptyPipe := func(t *testing.T) string {
		r, w, err := os.Pipe()
		require.NoError(t, err)
		require.NoError(t, w.Close())
		t.Cleanup(func() { _ = r.Close() })
		return fmt.Sprintf("/dev/fd/%d", r.Fd())
	}

	tests := []struct {
		name string
		path func(t *testing.T) string
		code int
		want string // after "ratelimit: --limits PATH: "
	}{
		{"missing file", func(*testing.T) string { return filepath.Join(dir, "missing.yaml") }, 1,
			"no such file or directory: check the path of the limits file"},
		{"directory", func(*testing.T) string { return filepath.Join(dir, "sub.yaml") }, 1,
			"is a directory: give the limits file, not its directory"},
		{"too large", func(*testing.T) string { return big }, 1,
			"larger than 4 MiB, the most a limits file may be: is it the limits file? a limits file declares limits, a few lines each"},
		{"wrong extension", func(t *testing.T) string { return writeFile(t, dir, "limits.txt", "api:\n"+limit) }, 2,
			"name it .json, .yaml or .yml, or pipe it in (--limits /dev/stdin), which is read as YAML"},
		{"empty yaml", func(t *testing.T) string { return writeFile(t, dir, "empty.yaml", "") }, 1,
			"the file is empty: write the limits in it, a mapping of limit names to their fields"},
		{"white space json", func(t *testing.T) string { return writeFile(t, dir, "empty.json", " \n\t\n") }, 1,
			"the file is empty: write the limits in it, a JSON object of limit names to their fields"},
		{"empty pipe", emptyPipe, 1,
			"nothing was read from it: pipe the limits file in, such as --limits /dev/stdin < limits.yaml"},
		{"bad yaml", func(t *testing.T) string { return writeFile(t, dir, "bad.yaml", "api: [\n") }, 1,
			"limits file: yaml: line 1: did not find expected node content"},
		{"bad json", func(t *testing.T) string { return writeFile(t, dir, "bad.json", `{"api": {"rate": 10,}}`) }, 1,
			"limits file: line 1, column 21: not JSON: a comma before }: JSON allows none after the last member of an object or an array; remove it"},
		{"unknown field", func(t *testing.T) string { return writeFile(t, dir, "field.yaml", "api:\n"+limit+"  capcity: 3\n") }, 1,
			`limits file: limit "api": line 5: unknown field "capcity" (did you mean "capacity"?)`},
		{"invalid value", func(t *testing.T) string {
			return writeFile(t, dir, "value.yaml", "api:\n  kind: token bucket\n  rate: 0\n  period: 1m\n")
		}, 1, `limits file: line 1: limit "api": rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.path(t)
			code, out, errOut := exec("simulate", "--limits", path, "--name", "api", "--at", "0s=1")
			require.Equal(t, tt.code, code, "%s%s", out, errOut)
			line, _, _ := strings.Cut(errOut, "\n")
			assert.True(t, strings.HasPrefix(line, "ratelimit: --limits "+path+": "+tt.want), "got %q, want it to start with %q", line, "ratelimit: --limits "+path+": "+tt.want)
			assert.Equal(t, 1, strings.Count(line, path), "the flag and the file are named once: %q", line)
		})
	}
}

// --limits /dev/stdin with nothing on standard input (< /dev/null, or a
// pipe left out of the command line) says so, and to pipe the limits
// file in: it said to write a mapping of limit names to their fields. The
// command runs in a process of its own, whose standard input is
// /dev/null.
func TestLimitsFileStdinEmpty(t *testing.T) {
	if os.Getenv("RATELIMIT_TEST_STDIN_EMPTY") == "1" {
		os.Exit(run(context.Background(), []string{"simulate", "--limits", "/dev/stdin", "--name", "api", "--at", "0s=1"}, os.Stdout, os.Stderr))
	}
	cmd := osexec.Command(os.Args[0], "-test.run=^TestLimitsFileStdinEmpty$")
	cmd.Env = append(os.Environ(), "RATELIMIT_TEST_STDIN_EMPTY=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr // Stdin nil: /dev/null
	err := cmd.Run()
	var exit *osexec.ExitError
	require.ErrorAs(t, err, &exit, stderr.String())
	assert.Equal(t, 1, exit.ExitCode())
	assert.Equal(t, "ratelimit: --limits /dev/stdin: standard input is empty: pipe the limits file in, such as --limits /dev/stdin < limits.yaml\n", stderr.String())
}
