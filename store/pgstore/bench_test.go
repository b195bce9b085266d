package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/storetest"
)

// go test -run '^$' -bench . ./store/pgstore

func BenchmarkLimit(b *testing.B) {
	pool := newPool(b, testserver.PostgresURL(b), nil)
	storetest.BenchmarkLimit(b, newStore(b, pool))
}

// BenchmarkBareUpsert is the baseline of BenchmarkLimit: the least a
// counter on Postgres can do, one upsert statement per decision, with the
// same matrix of keys and goroutines.
func BenchmarkBareUpsert(b *testing.B) {
	ctx := context.Background()
	pool := newPool(b, testserver.PostgresURL(b), nil)
	table := pgx.Identifier{uniqueTable(b, pool)}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (key text PRIMARY KEY, n bigint NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	upsert := "INSERT INTO " + table + " AS t (key, n) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = t.n + 1 RETURNING n"
	for _, keys := range []int{1, 10_000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprint("bare-", i)
		}
		for _, par := range []int{1, 64} {
			b.Run(fmt.Sprintf("keys=%d/goroutines=%d", keys, par), func(b *testing.B) {
				storetest.BenchmarkParallel(b, par, func(ctx context.Context, i int) error {
					var n int64
					return pool.QueryRow(ctx, upsert, names[i%keys]).Scan(&n)
				})
			})
		}
	}
}

// BenchmarkShardedHotKey shows what sharding buys on Postgres: one hot key
// called by 64 goroutines, its record split in 1, 8 and 32 shards.
func BenchmarkShardedHotKey(b *testing.B) {
	pool := newPool(b, testserver.PostgresURL(b), nil)
	store := newStore(b, pool)
	for _, shards := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"hot": {Kind: ratelimit.TokenBucket, Rate: 1e12, Period: time.Second, Shards: shards},
			})
			if err != nil {
				b.Fatal(err)
			}
			key := fmt.Sprint("hot-", shards, "-", time.Now().UnixNano())
			storetest.BenchmarkParallel(b, 64, func(ctx context.Context, _ int) error {
				res, err := lim.Limit(ctx, "hot", key)
				if err == nil && !res.OK {
					err = fmt.Errorf("refused: %+v", res)
				}
				return err
			})
		})
	}
}

// BenchmarkSettle is storetest.BenchmarkSettle: a reservation canceled, a
// receipt refunded.
func BenchmarkSettle(b *testing.B) {
	pool := newPool(b, testserver.PostgresURL(b), nil)
	storetest.BenchmarkSettle(b, newStore(b, pool))
}
