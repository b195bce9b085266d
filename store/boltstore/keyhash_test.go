package boltstore_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// With WithKeyHash, the clear key appears in no bbolt key; without it, it
// does.
func TestKeyHashHidesKeys(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{
		"tb":      {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Second},
		"sharded": {Kind: ratelimit.FixedWindow, Rate: 8, Period: time.Second, Shards: 4},
	}
	const key = "user-CLEARKEY-42"
	for _, hashed := range []bool{true, false} {
		db, err := bolt.Open(filepath.Join(t.TempDir(), "limits.db"), 0o600, nil)
		require.NoError(t, err)
		defer db.Close()
		store, err := boltstore.New(db)
		require.NoError(t, err)
		var opts []ratelimit.Option
		if hashed {
			opts = append(opts, ratelimit.WithKeyHash([]byte("boltstore test secret, 32 bytes.")))
		}
		lim, err := ratelimit.New(store, limits, opts...)
		require.NoError(t, err)
		for _, name := range []string{"tb", "sharded"} {
			res, err := lim.Limit(ctx, name, key)
			require.NoError(t, err)
			require.True(t, res.OK)
		}
		var keys, clear int
		require.NoError(t, db.View(func(tx *bolt.Tx) error {
			return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
				return b.ForEach(func(k, _ []byte) error {
					keys++
					if bytes.Contains(k, []byte("CLEARKEY")) {
						clear++
					}
					return nil
				})
			})
		}))
		require.NotZero(t, keys)
		if hashed {
			require.Zero(t, clear)
		} else {
			require.NotZero(t, clear, "the control: without hashing, the records' keys hold the key")
		}
	}
}
