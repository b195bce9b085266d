package boltstore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

const commitFailEnv = "BOLTSTORE_TEST_COMMIT_FAIL"

// A commit that fails (a full disk, a write error) on a file damaged
// while open, in pages the commit does not touch, fails its calls with an
// error and leaves the process running: bbolt rolls such a commit back by
// rebuilding its list of free pages, which, when commits do not write
// that list, walked every page of the file and panicked on the damage on
// a goroutine of bbolt's own, where nothing can recover it, ending the
// process.
func TestFailedCommitOnDamagedFile(t *testing.T) {
	if path := os.Getenv(commitFailEnv); path != "" {
		commitFailChild(t, path)
		return
	}
	if testing.Short() {
		t.Skip("starts a child process")
	}
	path := filepath.Join(t.TempDir(), "commitfail.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestFailedCommitOnDamagedFile$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), commitFailEnv+"="+path)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child process failed:\n%s", out)
	require.Contains(t, string(out), "the failed commit returned")
}

// commitFailChild damages the file at path in a bucket the store does
// not use, makes the file's writes fail, and writes through the store.
func commitFailChild(t *testing.T, path string) {
	ctx := context.Background()
	s, err := boltstore.Open(path)
	require.NoError(t, err)
	defer s.Close()
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, takeOp("l", "before", 1, t0.UnixMilli()), out))

	// A bucket of its own, of a few leaf pages under a branch page.
	var root uint64
	require.NoError(t, s.DB().Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("other"))
		if err != nil {
			return err
		}
		for i := range 200 {
			if err := b.Put(fmt.Appendf(nil, "other-%03d", i), make([]byte, 100)); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, s.DB().View(func(tx *bolt.Tx) error {
		root = uint64(tx.Bucket([]byte("other")).Root())
		return nil
	}))
	require.NotZero(t, root)

	// Damage it: its branch page names its first child twice. (A branch
	// element is 16 bytes from 16: the key's position, the key's size,
	// the child's page.)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	page := make([]byte, s.DB().Info().PageSize)
	off := int64(root) * int64(len(page))
	_, err = f.ReadAt(page, off)
	require.NoError(t, err)
	require.Equal(t, uint16(0x01), binary.NativeEndian.Uint16(page[8:]), "a branch page")
	copy(page[16+16+8:16+16+16], page[16+8:16+16])
	_, err = f.WriteAt(page, off)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	// A write that does not reach the damage commits.
	require.NoError(t, s.Apply(ctx, takeOp("l", "damaged", 1, t0.UnixMilli()), out))

	// The file's writes fail from now on: its descriptor in bbolt reads
	// only.
	ro, err := os.Open(path)
	require.NoError(t, err)
	defer ro.Close()
	fd := -1
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || target != path || e.Name() == fmt.Sprint(ro.Fd()) {
			continue
		}
		_, err = fmt.Sscan(e.Name(), &fd)
		require.NoError(t, err)
	}
	require.NotEqual(t, -1, fd, "bbolt's descriptor of the file")
	require.NoError(t, syscall.Dup3(int(ro.Fd()), fd, syscall.O_CLOEXEC))

	err = s.Apply(ctx, takeOp("l", "failed", 1, t0.UnixMilli()), out)
	require.Error(t, err)
	require.False(t, strings.Contains(err.Error(), "panic"), "%v", err)
	fmt.Println("the failed commit returned:", err)
	// A goroutine of bbolt's that panics ends the process: give it time.
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, s.Close())
}
