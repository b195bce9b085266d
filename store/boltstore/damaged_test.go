package boltstore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
	berrors "go.etcd.io/bbolt/errors"
)

// A file that is no bbolt database, or a damaged one, is refused by Open
// with ErrDamagedFile, and the process goes on. A file cut short (a copy
// that did not finish, a full disk) ended the process: bbolt maps the file
// and read a page past its end (a bus error, which no recover catches); a
// damaged page panicked out of Open.
func TestOpenRefusesDamagedFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	s := open(t, good)
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Minute}},
		ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	for i := range 50 {
		_, err := lim.Limit(context.Background(), "l", "damaged-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())
	data, err := os.ReadFile(good)
	require.NoError(t, err)
	require.Greater(t, len(data), 3*4096)

	pageSize := 4096
	cases := map[string][]byte{
		"text":          []byte("name,limit\napi,100\n"),
		"cut in page 0": data[:100],
		"two pages":     data[:2*pageSize],
		"three pages":   data[:3*pageSize],
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
