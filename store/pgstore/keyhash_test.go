package pgstore_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// With WithKeyHash, the clear key appears in no row of the table; without
// it, it does.
func TestKeyHashHidesKeys(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	limits := ratelimit.Limits{
		"tb":      {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Second},
		"sharded": {Kind: ratelimit.FixedWindow, Rate: 8, Period: time.Second, Shards: 4},
	}
	const key = "user-CLEARKEY-42"
	for _, hashed := range []bool{true, false} {
		table := uniqueTable(t, pool)
		store, err := pgstore.New(ctx, pool, pgstore.WithTable(table))
		require.NoError(t, err)
		var opts []ratelimit.Option
		if hashed {
			opts = append(opts, ratelimit.WithKeyHash([]byte("pgstore test secret, 32 bytes...")))
		}
		lim, err := ratelimit.New(store, limits, opts...)
		require.NoError(t, err)
		for _, name := range []string{"tb", "sharded"} {
			res, err := lim.Limit(ctx, name, key)
			require.NoError(t, err)
			require.True(t, res.OK)
		}
		rows, err := pool.Query(ctx, "SELECT key FROM "+pgx.Identifier{table}.Sanitize())
		require.NoError(t, err)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		require.NoError(t, err)
		require.NotEmpty(t, keys)
		clear := 0
		for _, k := range keys {
			if bytes.Contains(k, []byte("CLEARKEY")) {
				clear++
			}
		}
		if hashed {
			require.Zero(t, clear, "clear keys in %q", keys)
		} else {
			require.Equal(t, len(keys), clear, "the control: without hashing, every row holds the key")
		}
	}
}
