package memstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
)

// A Limiter on a store in this process's memory: for a single server, a
// CLI or tests.
func Example() {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"sendMessage": {Kind: ratelimit.TokenBucket, Rate: 3, Period: time.Hour},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
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
