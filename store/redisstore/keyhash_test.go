package redisstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// With WithKeyHash, the clear key appears in no Redis key name (SCAN);
// without it, it does.
func TestKeyHashHidesKeys(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	limits := ratelimit.Limits{
		"tb":      {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Second},
		"sharded": {Kind: ratelimit.FixedWindow, Rate: 8, Period: time.Second, Shards: 4},
	}
	const key = "user-CLEARKEY-42"
	for _, hashed := range []bool{true, false} {
		prefix := uniquePrefix(t, c)
		var opts []ratelimit.Option
		if hashed {
			opts = append(opts, ratelimit.WithKeyHash([]byte("redisstore test secret, 32 bytes")))
		}
		lim, err := ratelimit.New(newStore(c, prefix), limits, opts...)
		require.NoError(t, err)
		for _, name := range []string{"tb", "sharded"} {
			res, err := lim.Limit(ctx, name, key)
			require.NoError(t, err)
			require.True(t, res.OK)
			require.Equal(t, key, res.Key)
		}
		var names []string
		iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			names = append(names, iter.Val())
		}
		require.NoError(t, iter.Err())
		require.NotEmpty(t, names)
		clear := 0
		for _, n := range names {
			if strings.Contains(n, "CLEARKEY") {
				clear++
			}
		}
		if hashed {
			require.Zero(t, clear, "clear keys in %q", names)
		} else {
			require.Equal(t, len(names), clear, "the control: without hashing, every name holds the key")
		}
	}
}

// Without WithKeyHash, a key longer than 256 bytes is known to Redis by
// its digest form ("sha256:" and its SHA-256 in unpadded base64url):
// every Redis key the calls of a key of 32 KiB make, charge and
// settle (SCAN) ends in it, and takes a few dozen bytes of the server's
// memory (MEMORY USAGE), not 32 KiB. A key of 256 bytes is kept as it
// is. Each Redis key held the whole key.
func TestLongKeyIsDigested(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	prefix := uniquePrefix(t, c)
	store := newStore(c, prefix)
	limits := ratelimit.Limits{
		"tb":      {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Second},
		"sharded": {Kind: ratelimit.FixedWindow, Rate: 8, Period: time.Second, Shards: 4},
	}
	lim, err := ratelimit.New(store, limits)
	require.NoError(t, err)
	long := strings.Repeat("L", 32<<10)
	sum := sha256.Sum256([]byte(long))
	digest := "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:])
	edge := strings.Repeat("E", 256)
	for _, key := range []string{long, edge} {
		for _, name := range []string{"tb", "sharded"} {
			res, err := lim.Limit(ctx, name, key, ratelimit.WithReceipt())
			require.NoError(t, err)
			require.True(t, res.OK)
			require.NoError(t, lim.Settle(ctx, res.Token, 0.5))
		}
	}
	records := []string{store.Key(driver.RecordID{Name: "tb", Key: digest})}
	for shard := range 4 {
		records = append(records, store.Key(driver.RecordID{Name: "sharded", Key: digest, Shard: shard}))
	}
	var names []string
	iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
	for iter.Next(ctx) {
		names = append(names, iter.Val())
	}
	require.NoError(t, iter.Err())
	digested, raw := 0, 0
	for _, n := range names {
		used, err := c.MemoryUsage(ctx, n).Result()
		require.NoError(t, err)
		require.Less(t, used, int64(1024), "a Redis key of %d bytes", len(n))
		switch {
		case strings.HasSuffix(n, ":"+digest):
			digested++
			require.Contains(t, records, n, "a record of the long key")
		case strings.HasSuffix(n, ":"+edge):
			raw++
		}
	}
	require.Positive(t, digested, "records under the digest form in %q", names)
	require.Positive(t, raw, "records under the key of 256 bytes")
}
