package boltstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	bolt "go.etcd.io/bbolt"
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

// A file opens once per process: a second Open of it is refused at once.
// Another part of the application shares the file through the first
// store's DB, in a bucket of its own.
func ExampleNew_sharedFile() {
	dir, err := os.MkdirTemp("", "ratelimit-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "limits.db")

	s, err := boltstore.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	_, err = boltstore.Open(path)
	fmt.Println("second Open:", errors.Is(err, boltstore.ErrAlreadyOpen))

	jobs, err := boltstore.New(s.DB(), boltstore.WithBucket("jobs"))
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(jobs, ratelimit.Limits{
		"export": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour},
	})
	if err != nil {
		log.Fatal(err)
	}
	res, err := lim.Limit(context.Background(), "export", "team-7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("export:", res.OK)
	// Output:
	// second Open: true
	// export: true
}

// A service bounds its start-up by a context: OpenContext stops waiting
// for a file that another opener holds (here bbolt itself, in this
// process, standing for another process) when the context ends.
func ExampleOpenContext() {
	dir, err := os.MkdirTemp("", "ratelimit-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "limits.db")
	other, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = boltstore.OpenContext(ctx, path)
	fmt.Println("start-up ended:", errors.Is(err, context.DeadlineExceeded))
	// Output:
	// start-up ended: true
}
