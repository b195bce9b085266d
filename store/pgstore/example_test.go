package pgstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
)

// A Limiter on PostgreSQL, shared by every process of a fleet. New creates
// the table and its functions unless given WithoutDDL (then apply
// pgstore.Schema with your migration tool).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(ctx, pool, pgstore.WithTable("ratelimit_example"))
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"sendMessage": {Kind: ratelimit.TokenBucket, Rate: 3, Period: time.Hour},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := lim.Reset(ctx, "sendMessage", "user-42"); err != nil { // a clean start for the example
		log.Fatal(err)
	}
	for range 4 {
		res, err := lim.Limit(ctx, "sendMessage", "user-42")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("ok=%v remaining=%.0f\n", res.OK, res.Remaining)
	}
	// Output:
	// ok=true remaining=2
	// ok=true remaining=1
	// ok=true remaining=0
	// ok=false remaining=0
}
