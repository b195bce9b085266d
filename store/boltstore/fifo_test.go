//go:build linux

package boltstore_test

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
)

// Open of a path that is a named pipe fails at once, with ErrDamagedFile:
// the checks of the file, and the wait for another opener's lock, opened
// the pipe to read it, which blocks until a writer comes, for ever and
// past every timeout and context.
func TestOpenNamedPipe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	done := make(chan error, 1)
	go func() {
		s, err := boltstore.Open(path, boltstore.WithTimeout(time.Second))
		if err == nil {
			s.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err, "a named pipe is no bbolt file")
	case <-time.After(time.Minute): // a hang, not a slow machine
		t.Fatal("Open of a named pipe still waits after a minute")
	}
}
