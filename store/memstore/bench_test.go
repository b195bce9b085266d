package memstore_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
)

// BenchmarkMemoryPerKey measures the heap a memstore holds per idle key:
// one Limit on each of a million keys (a token bucket and a fixed window),
// then the same once every record has been full for ExpiryGrace and
// DeleteExpired has dropped them. The keys' own bytes are allocated before
// the first measure and not counted.
//
//	go test -run '^$' -bench MemoryPerKey -benchtime 1x ./store/memstore
func BenchmarkMemoryPerKey(b *testing.B) {
	const n = 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("user-", i)
	}
	for _, cfg := range []ratelimit.Config{
		{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
		{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute},
	} {
		b.Run(cfg.Kind.String(), func(b *testing.B) {
			for b.Loop() {
				mock := clock.NewMock()
				mock.Set(time.UnixMilli(1_700_000_000_000))
				store := must(memstore.New(memstore.WithClock(mock)))
				lim, err := ratelimit.New(store, ratelimit.Limits{"api": cfg}, ratelimit.WithClock(mock))
				if err != nil {
					b.Fatal(err)
				}
				base := heapInUse()
				ctx := context.Background()
				for _, k := range keys {
					if _, err := lim.Limit(ctx, "api", k); err != nil {
						b.Fatal(err)
					}
				}
				full := heapInUse()
				if store.Len() != n {
					b.Fatalf("%d records, want %d", store.Len(), n)
				}
				mock.Add(time.Minute + time.Duration(driver.ExpiryGrace)*time.Millisecond)
				dropped := must(store.DeleteExpired(context.Background(), mock.Now()))
				after := heapInUse()
				b.ReportMetric(float64(full-base)/n, "B/key")
				b.ReportMetric(float64(after-base)/n, "B/key-after-drop")
				b.ReportMetric(float64(dropped), "dropped")
				runtime.KeepAlive(lim)
			}
		})
	}
}

func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// BenchmarkDecide measures a bound limit's Decide alone (no Limiter, no
// clock): the store's part of a call, on one key and on 10,000.
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{1, 10_000} {
		b.Run(fmt.Sprint("keys=", n), func(b *testing.B) { benchDecide(b, n, []int64{0}, 0) })
	}
}

// benchDecide runs Decide on n keys, about a call a microsecond, the
// calls taking turns at the clocks offsets away from the store's time,
// after marks settlements whose marks outlive the run.
func benchDecide(b *testing.B, n int, offsets []int64, marks int) {
	s := must(memstore.New())
	settle(b, s, marks)
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1e9, Period: 1000, Capacity: 1e9}
	bl := s.Bind("api", p, func(string) int64 { return 0 })
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("user-", i)
	}
	ctx := context.Background()
	now := int64(1_700_000_000_000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%1024 == 0 {
			now++ // about a call a microsecond
		}
		v, err := bl.Decide(ctx, keys[i%n], driver.ModeLimit, now+offsets[i%len(offsets)], 1, false)
		if err != nil || !v.OK {
			b.Fatal("refused", err)
		}
		i += 7
	}
}

// go test -run '^$' -bench Settle ./store/memstore
func BenchmarkSettle(b *testing.B) {
	s, err := memstore.New()
	if err != nil {
		b.Fatal(err)
	}
	storetest.BenchmarkSettle(b, s)
}

// BenchmarkDecideClocksApart measures Decide on 10,000 keys when the calls
// come from clocks hours apart, interleaved (Limiters on one store, their
// clocks off), against one clock: each clock should step the sweeps on its
// own schedule, not at every call.
//
//	go test -run '^$' -bench DecideClocksApart ./store/memstore
func BenchmarkDecideClocksApart(b *testing.B) {
	offsets := []int64{0, -3_600_000, 3_600_000, 24 * 3_600_000, -24 * 3_600_000,
		2 * 3_600_000, -2 * 3_600_000, 3 * 3_600_000, -3 * 3_600_000, 4 * 3_600_000}
	for _, clocks := range []int{1, 2, 3, 4, 10} {
		for _, marks := range []int{0, 20_000} {
			b.Run(fmt.Sprint("clocks=", clocks, "/marks=", marks), func(b *testing.B) { benchDecide(b, 10_000, offsets[:clocks], marks) })
		}
	}
}

// settle applies n settlements of one key, whose marks expire a year
// after the benchmarks' time.
func settle(b *testing.B, s *memstore.Store, n int) {
	const t0 = int64(1_700_000_000_000)
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1e9, Period: 1000, Capacity: 1e9}
	for i := range n {
		cancelMark(b, s, p, i, t0, t0+365*24*3_600_000)
	}
}
