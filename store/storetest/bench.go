package storetest

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// BenchmarkLimit measures Limiter.Limit over store: on one hot key and
// on 10,000 keys, from 1 and from 64 goroutines. The limit grants every
// call, so that what is measured is the store's round trip, not refusals.
func BenchmarkLimit(b *testing.B, store ratelimit.Store) {
	BenchmarkLimitConfig(b, store, ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1e12, Period: time.Second})
}

// BenchmarkLimitConfig is BenchmarkLimit with the limit's config given,
// e.g. a sharded one.
func BenchmarkLimitConfig(b *testing.B, store ratelimit.Store, cfg ratelimit.Config) {
	lim, err := ratelimit.New(store, ratelimit.Limits{"bench": cfg})
	if err != nil {
		b.Fatal(err)
	}
	run := fmt.Sprint(time.Now().UnixNano()) // fresh keys on a shared server
	for _, keys := range []int{1, 10_000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprint("bench-", run, "-", i)
		}
		for _, par := range []int{1, 64} {
			b.Run(fmt.Sprintf("keys=%d/goroutines=%d", keys, par), func(b *testing.B) {
				BenchmarkParallel(b, par, func(ctx context.Context, i int) error {
					res, err := lim.Limit(ctx, "bench", names[i%keys])
					if err == nil && !res.OK {
						err = fmt.Errorf("refused: %+v", res)
					}
					return err
				})
			})
		}
	}
}

// BenchmarkParallel makes b.N calls of call from goroutines goroutines
// (one: a plain loop; more: rounded up to a multiple of GOMAXPROCS, as
// b.SetParallelism does). i counts a goroutine's calls, from a varied
// start and by a stride, so that goroutines walk different keys.
func BenchmarkParallel(b *testing.B, goroutines int, call func(ctx context.Context, i int) error) {
	ctx := context.Background()
	b.ReportAllocs()
	if goroutines <= 1 {
		i := 0
		for b.Loop() {
			if err := call(ctx, i); err != nil {
				b.Fatal(err)
			}
			i += 7
		}
		return
	}
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((goroutines + procs - 1) / procs)
	var start atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		i := int(start.Add(7919))
		for pb.Next() {
			if err := call(ctx, i); err != nil {
				b.Error(err)
				return
			}
			i += 7
		}
	})
}

// BenchmarkSettle measures a settlement over store, each of its iterations
// two calls: a Reserve and the Reservation's Cancel (the owner's
// settlement), or a Limit with a receipt and Limiter.Refund of it (a
// holder's), from 1 and from 64 goroutines, on 10,000 keys.
func BenchmarkSettle(b *testing.B, store ratelimit.Store) {
	lim, err := ratelimit.New(store, ratelimit.Limits{"bench": {Kind: ratelimit.TokenBucket, Rate: 1e12, Period: time.Second, MaxReserved: 1e12}})
	if err != nil {
		b.Fatal(err)
	}
	run := fmt.Sprint(time.Now().UnixNano()) // fresh keys on a shared server
	names := make([]string, 10_000)
	for i := range names {
		names[i] = fmt.Sprint("bench-settle-", run, "-", i)
	}
	ways := []struct {
		name   string
		settle func(ctx context.Context, key string) error
	}{
		{"cancel", func(ctx context.Context, key string) error {
			r, err := lim.Reserve(ctx, "bench", key)
			if err != nil {
				return err
			}
			return r.Cancel(ctx)
		}},
		{"refund", func(ctx context.Context, key string) error {
			res, err := lim.Limit(ctx, "bench", key, ratelimit.WithReceipt())
			if err != nil {
				return err
			}
			return lim.Refund(ctx, res.Token)
		}},
	}
	for _, w := range ways {
		for _, par := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", w.name, par), func(b *testing.B) {
				BenchmarkParallel(b, par, func(ctx context.Context, i int) error {
					return w.settle(ctx, names[i%len(names)])
				})
			})
		}
	}
}
