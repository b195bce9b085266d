package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
)

// unreachableStore stands for a Redis or PostgreSQL that cannot be
// reached: every call fails, and counts how often it was asked.
type unreachableStore struct{ asked int }

func (s *unreachableStore) fail() error {
	s.asked++
	return errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
}

func (s *unreachableStore) Apply(context.Context, *driver.Op, []driver.Decision) error {
	return s.fail()
}

func (s *unreachableStore) Load(context.Context, []driver.RecordID, []driver.Record) error {
	return s.fail()
}

func (s *unreachableStore) Delete(context.Context, []driver.RecordID) error { return s.fail() }

// What a call gets when the store is down. Each limit's failure policy
// decides: FailOpen allows the call, the default (fail closed) refuses
// it. Either way the Result is Degraded and the error matches
// ErrStoreUnavailable, so a caller may act on the policy's answer (res.OK)
// or treat any error as a failure. After DefaultBreakerFailures failures
// in a row the breaker opens: calls are decided by their policy without
// asking the store, and a refusal says to retry when the cool-down ends.
func ExampleConfig_failOpen() {
	ctx := context.Background()
	store := &unreachableStore{}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"search": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
		"signup": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour}, // fails closed
	}, ratelimit.WithClock(clock.NewMock()))
	if err != nil {
		panic(err)
	}
	for i := range 4 {
		for _, name := range []string{"search", "signup"} {
			res, err := lim.Limit(ctx, name, "user-42")
			if err != nil && !errors.Is(err, ratelimit.ErrStoreUnavailable) {
				panic(err) // bad input, or the caller's context is done
			}
			fmt.Printf("%d %s: ok=%v degraded=%v unavailable=%v retryAfter=%v\n",
				i+1, name, res.OK, res.Degraded, errors.Is(err, ratelimit.ErrStoreUnavailable), res.RetryAfter)
		}
	}
	fmt.Println("the store was asked", store.asked, "times")
	// Output:
	// 1 search: ok=true degraded=true unavailable=true retryAfter=0s
	// 1 signup: ok=false degraded=true unavailable=true retryAfter=2s
	// 2 search: ok=true degraded=true unavailable=true retryAfter=0s
	// 2 signup: ok=false degraded=true unavailable=true retryAfter=2s
	// 3 search: ok=true degraded=true unavailable=true retryAfter=0s
	// 3 signup: ok=false degraded=true unavailable=true retryAfter=2s
	// 4 search: ok=true degraded=true unavailable=true retryAfter=0s
	// 4 signup: ok=false degraded=true unavailable=true retryAfter=2s
	// the store was asked 5 times
}
