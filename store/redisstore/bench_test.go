package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/redis/go-redis/v9"
)

// go test -run '^$' -bench . ./store/redisstore

func BenchmarkLimit(b *testing.B) {
	c := client(b)
	storetest.BenchmarkLimit(b, redisstore.New(c, redisstore.WithPrefix(uniquePrefix(b, c))))
}

// bareCounter is the least a fixed-window limiter on Redis can do: one
// script that counts a window's calls and sets the window's expiry.
var bareCounter = redis.NewScript(`
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n`)

// BenchmarkBareCounter is the baseline of BenchmarkLimit: the same matrix
// of keys and goroutines, one script call per decision.
func BenchmarkBareCounter(b *testing.B) {
	c := client(b)
	prefix := uniquePrefix(b, c)
	for _, keys := range []int{1, 10_000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprint(prefix, "bare-", i)
		}
		for _, par := range []int{1, 64} {
			b.Run(fmt.Sprintf("keys=%d/goroutines=%d", keys, par), func(b *testing.B) {
				storetest.BenchmarkParallel(b, par, func(ctx context.Context, i int) error {
					return bareCounter.Run(ctx, c, []string{names[i%keys]}, time.Minute.Milliseconds()).Err()
				})
			})
		}
	}
}
