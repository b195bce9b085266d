package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
)

// A Limiter on Redis, shared by every process of a fleet. The same code
// works with a failover client or a Cluster client.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	store, err := redisstore.New(rdb, redisstore.WithPrefix("example:"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // before the client's Close, deferred above
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"sendMessage": {Kind: ratelimit.TokenBucket, Rate: 3, Period: time.Hour},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
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
