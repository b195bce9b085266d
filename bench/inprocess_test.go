package bench_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/bench/compare"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	throttledmem "github.com/throttled/throttled/v2/store/memstore"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
)

// cd bench && go test -run '^$' -bench . -benchmem
//
// Each benchmark calls one in-process limiter, set up as the comparison
// command sets it up, from one goroutine (serial) or from GOMAXPROCS
// goroutines under b.RunParallel (parallel), on one hot key or on 10,000
// keys. The benchmarks of a run are the figures of issue 11's ratios.

// inProcess lists the in-process limiters: each returns a function that
// takes one token of a key.
var inProcess = []struct {
	name string
	new  func(b *testing.B, l compare.Limit) (func(ctx context.Context, key string) (bool, error), error)
}{
	{"ratelimit", func(b *testing.B, l compare.Limit) (func(context.Context, string) (bool, error), error) {
		lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
			"bench": {Kind: l.Kind, Rate: float64(l.Rate), Period: l.Period},
		})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, key string) (bool, error) {
			res, err := lim.Limit(ctx, "bench", key)
			return res.OK, err
		}, nil
	}},
	{"sethvargo", func(b *testing.B, l compare.Limit) (func(context.Context, string) (bool, error), error) {
		s, err := compare.NewSethvargo(l)
		if err != nil {
			return nil, err
		}
		b.Cleanup(func() { s.Close() }) // its sweeper
		return s.Take, nil
	}},
	{"xrate", func(b *testing.B, l compare.Limit) (func(context.Context, string) (bool, error), error) {
		x := compare.NewXRate(l)
		return x.Take, nil
	}},
	{"ulule", func(b *testing.B, l compare.Limit) (func(context.Context, string) (bool, error), error) {
		u := compare.NewUlule(ululemem.NewStore(), l)
		return u.Take, nil
	}},
	{"throttled", func(b *testing.B, l compare.Limit) (func(context.Context, string) (bool, error), error) {
		st, err := throttledmem.NewCtx(65536)
		if err != nil {
			return nil, err
		}
		t, err := compare.NewThrottled(st, l)
		if err != nil {
			return nil, err
		}
		return t.Take, nil
	}},
}

// BenchmarkGranted measures the path of a granted call: every call takes a
// token and writes its key's state. The limit, a billion per hour with as
// large a burst, is a bucket no benchmark can empty. (Not a billion per
// second: sethvargo/go-limiter refills Interval/Tokens tokens per elapsed
// interval rather than Tokens, so above √(Interval in ns) per interval,
// about 31,600 a second, it refills only part of its bucket.)
func BenchmarkGranted(b *testing.B) {
	l := compare.Limit{Rate: 1_000_000_000, Period: time.Hour, Kind: ratelimit.TokenBucket}
	for _, keys := range []int{1, 10_000} {
		benchmarkInProcess(b, l, keys, true, false)
	}
}

// BenchmarkGrantedScattered is BenchmarkGranted on 10,000 keys whose
// state was created in another order than the benchmark visits them in,
// as with real traffic. BenchmarkGranted visits its keys in turn, in the
// order of their first calls, so that a limiter that allocates an object
// per key on its first call (x/time/rate, go-limiter) finds each next key's
// object beside the last one's, where the processor has already fetched
// it; here, each key's first call comes in a random order, before the
// timer starts.
func BenchmarkGrantedScattered(b *testing.B) {
	l := compare.Limit{Rate: 1_000_000_000, Period: time.Hour, Kind: ratelimit.TokenBucket}
	benchmarkInProcess(b, l, 10_000, true, true)
}

// BenchmarkRefused measures the path of a refused call: one hot key under
// the comparison's limit (100 per second, a burst of 100), so that all but
// about 100 calls a second are refused.
func BenchmarkRefused(b *testing.B) {
	l := compare.Limit{Rate: 100, Period: time.Second, Kind: ratelimit.TokenBucket}
	benchmarkInProcess(b, l, 1, false, false)
}

// benchmarkInProcess runs every in-process limiter on keys keys, serial
// and parallel. It reports the share of calls granted and, when a limiter
// failed calls (throttled gives up after 10 compare-and-swaps of a hot
// key), the share that failed; with mustGrant, a refusal is a failure.
// With scatter, every key is taken once first, in a random order.
func benchmarkInProcess(b *testing.B, l compare.Limit, keys int, mustGrant, scatter bool) {
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprint("user-", i)
	}
	for _, mode := range []string{"serial", "parallel"} {
		for _, c := range inProcess {
			b.Run(fmt.Sprintf("keys=%d/%s/limiter=%s", keys, mode, c.name), func(b *testing.B) {
				take, err := c.new(b, l)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if scatter {
					for _, i := range rand.New(rand.NewPCG(1, 2)).Perm(keys) {
						if _, err := take(ctx, names[i]); err != nil {
							b.Fatal(err)
						}
					}
				}
				var granted, failed atomic.Int64
				// loop calls take until next says stop, from a random key on.
				loop := func(next func() bool) {
					var ok, bad int64
					for i := rand.IntN(keys); next(); {
						switch g, err := take(ctx, names[i]); {
						case err != nil:
							bad++
						case g:
							ok++
						case mustGrant:
							b.Errorf("%s refused a call of a limit it should grant", c.name)
							return
						}
						if i++; i == keys {
							i = 0
						}
					}
					granted.Add(ok)
					failed.Add(bad)
				}
				b.ReportAllocs()
				if mode == "serial" {
					loop(b.Loop)
				} else {
					b.ResetTimer() // b.Loop does it for the serial case
					b.RunParallel(func(pb *testing.PB) { loop(pb.Next) })
				}
				b.ReportMetric(float64(granted.Load())/float64(b.N), "granted/op")
				if n := failed.Load(); n > 0 {
					b.ReportMetric(float64(n)/float64(b.N), "errors/op")
				}
			})
		}
	}
}
