package ratelimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
)

// go test -bench . -run ^$ .

func BenchmarkTransition(b *testing.B) {
	for _, p := range []ratelimit.Params{
		{Kind: ratelimit.FixedWindow, Rate: 100, Period: 60_000, Capacity: 150, Phase: 7},
		{Kind: ratelimit.TokenBucket, Rate: 100, Period: 60_000, Capacity: 150},
	} {
		b.Run(p.Kind.String(), func(b *testing.B) {
			b.ReportAllocs()
			s := ratelimit.State{Value: 150, TS: 1_700_000_000_000}
			now := s.TS
			for b.Loop() {
				now += 3
				next, d := ratelimit.Transition(p, s, true, now, 1, false)
				if d.OK {
					s = next
				}
			}
		})
	}
}

func BenchmarkMemstoreLimit(b *testing.B) {
	for _, keys := range []int{1, 10_000} {
		for _, par := range []int{1, 64} {
			b.Run(fmt.Sprintf("keys=%d/goroutines=%d", keys, par), func(b *testing.B) {
				lim, err := ratelimit.New(memstore.New(), ratelimit.Limits{
					"api": {Kind: ratelimit.TokenBucket, Rate: 1e9, Period: time.Second},
				})
				if err != nil {
					b.Fatal(err)
				}
				names := make([]string, keys)
				for i := range names {
					names[i] = fmt.Sprint("user-", i)
				}
				ctx := context.Background()
				b.ReportAllocs()
				b.SetParallelism(par)
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					for pb.Next() {
						if _, err := lim.Limit(ctx, "api", names[i%keys]); err != nil {
							b.Error(err)
							return
						}
						i += 7
					}
				})
			})
		}
	}
}
