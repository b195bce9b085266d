//go:build unix

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A limits file whose size is not known ahead, a named pipe, is read up
// to maxLimitsFile bytes and a byte more, and refused then, however much
// more it would give.
func TestLimitsFileTooLargePipe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pipe.yaml")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	wrote := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			wrote <- err
			return
		}
		defer f.Close()
		// Twice the bound: the command stops reading, and the write ends
		// when it closes the pipe (EPIPE).
		_, err = f.Write(bytes.Repeat([]byte("#"), 2*maxLimitsFile))
		wrote <- err
	}()
	code, out, errOut := exec("simulate", "--limits", path, "--name", "api", "--at", "0s=1")
	require.Equal(t, 1, code, "%s%s", out, errOut)
	assert.Equal(t, "ratelimit: limits file "+path+": larger than 4 MiB, the most a limits file may be: is it the limits file? a limits file declares limits, a few lines each\n", errOut)
	require.ErrorIs(t, <-wrote, syscall.EPIPE, "the command read no more than it needed")
}
