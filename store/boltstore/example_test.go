package boltstore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
)

// A Limiter on an embedded bbolt file: state that survives a restart,
// without a server. One process opens the file at a time.
func Example() {
	dir, err := os.MkdirTemp("", "ratelimit-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := boltstore.Open(filepath.Join(dir, "limits.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
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
