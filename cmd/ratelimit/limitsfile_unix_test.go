//go:build unix

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A limits file whose size is not known ahead, a named pipe, is read up
// to maxLimitsFile bytes and a byte more, and refused then, however much
// more it would give.
func TestLimitsFileTooLargePipe(t *testing.T) {
	// Twice the bound: the command stops reading, and the write ends when
	// it closes the pipe (EPIPE).
	path := filepath.Join(t.TempDir(), "pipe.yaml")
	wrote := writeFIFO(t, path, bytes.Repeat([]byte("#"), 2*maxLimitsFile))
	code, out, errOut := exec("simulate", "--limits", path, "--name", "api", "--at", "0s=1")
	require.Equal(t, 1, code, "%s%s", out, errOut)
	assert.Equal(t, "ratelimit: --limits "+path+": larger than 4 MiB, the most a limits file may be: is it the limits file? a limits file declares limits, a few lines each\n", errOut)
	require.ErrorIs(t, <-wrote, syscall.EPIPE, "the command read no more than it needed")
}

// A limits file piped in is read, as YAML (which reads JSON too), whatever
// its name: a named pipe without .yaml, bash's <(...) (/dev/fd/N) and
// /dev/stdin were refused for their names ("name it .json, .yaml or
// .yml"), which a pipe's name does not say. A regular file or a directory
// of another name is still refused, saying how to pipe one in.
func TestLimitsFilePiped(t *testing.T) {
	const limits = "api:\n  kind: token bucket\n  rate: 10\n  period: 1m\n"
	const want = "api: token bucket, rate 10 per 1m0s\n"
	dir := t.TempDir()
	fifo := filepath.Join(dir, "limits")
	wrote := writeFIFO(t, fifo, []byte(limits))
	code, out, errOut := exec("simulate", "--limits", fifo, "--name", "api", "--at", "0s=1")
	require.Equal(t, 0, code, errOut)
	assert.True(t, strings.HasPrefix(out, want), out)
	require.NoError(t, <-wrote)

	// As bash's <(...) passes it: /dev/fd/N of a pipe, here of JSON.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	go func() {
		_, _ = w.WriteString(`{"api": {"kind": "token bucket", "rate": 10, "period": "1m"}}`)
		_ = w.Close()
	}()
	code, out, errOut = exec("simulate", "--limits", fmt.Sprintf("/dev/fd/%d", r.Fd()), "--name", "api", "--at", "0s=1")
	require.Equal(t, 0, code, errOut)
	assert.True(t, strings.HasPrefix(out, want), out)

	for _, path := range []string{filepath.Join(dir, "limits.txt"), filepath.Join(dir, "limits.d")} {
		if strings.HasSuffix(path, ".txt") {
			require.NoError(t, os.WriteFile(path, []byte(limits), 0o600))
		} else {
			require.NoError(t, os.Mkdir(path, 0o700))
		}
		code, _, errOut = exec("simulate", "--limits", path, "--name", "api", "--at", "0s=1")
		assert.Equal(t, 2, code)
		assert.Equal(t, "ratelimit: --limits "+path+": name it .json, .yaml or .yml, or pipe it in (--limits /dev/stdin), which is read as YAML\n"+
			"Run 'ratelimit simulate --help' for usage.\n", errOut)
	}

	// Standard input cannot give both the limits file and the tokens.
	code, _, errOut = execIn("AQ\n", "token", "refund", "--store", "redis://127.0.0.1:1", "--limits", "/dev/stdin", "-")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "ratelimit: --limits /dev/stdin with -: both read standard input: give the limits file by its name, or the tokens as arguments\n")
}

// A named pipe named .json is held to JSON's rules, as a .json file is:
// the name says what it gives, where /dev/stdin's and /dev/fd/N's say
// nothing and are read as YAML.
func TestLimitsFilePipedJSONByName(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "limits.json")
	wrote := writeFIFO(t, fifo, []byte(`{"api": {"kind": "token bucket", "rate": 10, "period": "1m"},}`))
	code, _, errOut := exec("simulate", "--limits", fifo, "--name", "api", "--at", "0s=1")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "ratelimit: --limits "+fifo+": limits file: line 1, column 62: not JSON: a comma before }")
	require.NoError(t, <-wrote)
}

// writeFIFO makes a named pipe at path and writes data into it once a
// reader opens it; the channel gets the error of the write and the close.
func writeFIFO(t *testing.T, path string, data []byte) <-chan error {
	t.Helper()
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	wrote := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			wrote <- err
			return
		}
		_, err = f.Write(data)
		wrote <- errors.Join(err, f.Close())
	}()
	return wrote
}
