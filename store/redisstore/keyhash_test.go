package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
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
