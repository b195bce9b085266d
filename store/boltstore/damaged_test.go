package boltstore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
	berrors "go.etcd.io/bbolt/errors"
)

// A file that is no bbolt database, or a damaged one, is refused by Open
// with ErrDamagedFile, and the process goes on. A file cut short (a copy
// that did not finish, a full disk) ended the process: bbolt maps the file
// and read a page past its end (a bus error, which no recover catches); so
// did a page that names one past the end of the mapping (a segmentation
// fault); a damaged page panicked out of Open.
func TestOpenRefusesDamagedFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	s := open(t, good)
	// Enough records for branch pages, in one transaction.
	ops, outs := make([]*driver.Op, 2000), make([][]driver.Decision, 2000)
	for i := range ops {
		ops[i], outs[i] = takeOp("l", fmt.Sprint("damaged-", i), 1, t0.UnixMilli()), make([]driver.Decision, 1)
	}
	require.NoError(t, s.ApplyBatch(context.Background(), ops, outs))
	require.NoError(t, s.Close())
	data, err := os.ReadFile(good)
	require.NoError(t, err)
	require.Greater(t, len(data), 3*os.Getpagesize())

	pageSize := os.Getpagesize()
	// A branch page (a page header's flags 0x01) whose first element
	// names a page far past the end of the file.
	farBranch := append([]byte(nil), data...)
	branches := 0
	for off := 0; off+32 <= len(farBranch); off += pageSize {
		if flags, count := binary.NativeEndian.Uint16(farBranch[off+8:]), binary.NativeEndian.Uint16(farBranch[off+10:]); flags == 0x01 && count > 1 {
			binary.NativeEndian.PutUint64(farBranch[off+16+8:], 1_000_000)
			branches++
		}
	}
	require.Positive(t, branches)
	cases := map[string][]byte{
		"text":              []byte("name,limit\napi,100\n"),
		"cut in page 0":     data[:100],
		"two pages":         data[:2*pageSize],
		"three pages":       data[:3*pageSize],
		"half":              data[:len(data)/2],
		"page past the end": farBranch,
		"damaged page": func() []byte {
			d := append([]byte(nil), data...)
			for i := 2 * pageSize; i < len(d); i++ {
				d[i] = 0xab
			}
			return d
		}(),
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "limits.db")
			require.NoError(t, os.WriteFile(path, content, 0o600))
			s, err := boltstore.Open(path, boltstore.WithTimeout(time.Second))
			require.ErrorIs(t, err, boltstore.ErrDamagedFile, "got %v", err)
			require.Nil(t, s)
			t.Log(err)
			if name == "text" {
				require.ErrorIs(t, err, berrors.ErrInvalid, "bbolt's own error is kept")
			}
			// Restored in place, the file opens: the refusal left no lock
			// and no entry in the process's registry behind.
			require.NoError(t, os.WriteFile(path, data, 0o600))
			s = open(t, path, boltstore.WithTimeout(time.Second))
			require.NoError(t, s.Close())
		})
	}
}
