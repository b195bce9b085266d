//go:build unix

package testserver

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// LockServer holds, until the test ends, the lock of the server named
// name among the processes of this machine: a test that stops and starts
// a server (a failover test) takes it first, so that two test runs at
// once (a CI run beside a developer's) do not stop the server under each
// other's feet, nor one's stop race the other's start.
func LockServer(t testing.TB, name string) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "ratelimit-test-"+name+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("testserver: lock of server %s: %v", name, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		t.Fatalf("testserver: lock of server %s: %v", name, err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
}
