package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
)

// go test -run '^$' -bench . .

// BenchmarkTransition measures the pure transition on a found record, one
// call every 3 ms: granted (a limit that grants every call) and denied
// (100 per minute: after the first 150 calls, most are refused and told
// their wait), for a fixed window and a token bucket, through
// TransitionInto, which writes its Decision where the caller keeps it.
func BenchmarkTransition(b *testing.B) {
	for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
		for _, rate := range []float64{1e12, 100} {
			outcome := "granted"
			if rate == 100 {
				outcome = "denied"
			}
			p := driver.Params{Kind: kind, Rate: rate, Period: 60_000, Capacity: 1.5 * rate, Phase: 7}
			start := driver.State{Remaining: p.Capacity, TS: 1_700_000_000_007}
			b.Run(kind.String()+"/"+outcome, func(b *testing.B) {
				b.ReportAllocs()
				s, now := start, start.TS
				var d driver.Decision
				for b.Loop() {
					now += 3
					next := ratelimit.TransitionInto(&d, &p, s, true, now, 1, false)
					if d.OK {
						s = next
					}
				}
			})
		}
	}
}

// benchKeys returns n distinct keys.
func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("user-", i)
	}
	return keys
}

// benchCalls runs call on keys, walking them by a stride of 7: from one
// goroutine (a plain loop), or from GOMAXPROCS goroutines (b.RunParallel),
// each starting at a different key. Each key is called once first, untimed.
func benchCalls(b *testing.B, keys []string, parallel bool, call func(key string) error) {
	for _, k := range keys { // every key's record exists: the steady state
		if err := call(k); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	n := len(keys)
	if !parallel {
		i := 0
		for b.Loop() {
			if err := call(keys[i%n]); err != nil {
				b.Fatal(err)
			}
			i += 7
		}
		return
	}
	var start atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		i := int(start.Add(7919))
		for pb.Next() {
			if err := call(keys[i%n]); err != nil {
				b.Error(err)
				return
			}
			i += 7
		}
	})
}

// benchMatrix runs bench on one hot key and on 10,000 keys, from one
// goroutine and in parallel.
func benchMatrix(b *testing.B, bench func(b *testing.B, keys []string, parallel bool)) {
	for _, n := range []int{1, 10_000} {
		keys := benchKeys(n)
		for _, parallel := range []bool{false, true} {
			name := fmt.Sprintf("keys=%d/goroutines=1", n)
			if parallel {
				name = fmt.Sprintf("keys=%d/parallel", n)
			}
			b.Run(name, func(b *testing.B) { bench(b, keys, parallel) })
		}
	}
}

var errRefused = errors.New("refused")

// Limits that grant every call of the benchmarks: what is measured is the
// call, not refusals.
var benchLimits = ratelimit.Limits{
	"bucket": {Kind: ratelimit.TokenBucket, Rate: 1e9, Period: time.Second},
	"window": {Kind: ratelimit.FixedWindow, Rate: 1e12, Period: time.Hour},
}

func newBenchLimiter(b *testing.B) *ratelimit.Limiter {
	lim, err := ratelimit.New(must(memstore.New()), benchLimits)
	if err != nil {
		b.Fatal(err)
	}
	return lim
}

// BenchmarkMemstoreLimit measures Limiter.Limit on memstore, on a token
// bucket and on a fixed window (derived per-key phase).
func BenchmarkMemstoreLimit(b *testing.B) {
	for _, name := range []string{"bucket", "window"} {
		b.Run(name, func(b *testing.B) {
			benchMatrix(b, func(b *testing.B, keys []string, parallel bool) {
				lim := newBenchLimiter(b)
				ctx := context.Background()
				benchCalls(b, keys, parallel, func(key string) error {
					res, err := lim.Limit(ctx, name, key)
					if err == nil && !res.OK {
						err = errRefused // as a caller would: no copy of the Result kept
					}
					return err
				})
			})
		})
	}
}

// BenchmarkMemstoreCheck measures Limiter.Check on memstore.
func BenchmarkMemstoreCheck(b *testing.B) {
	benchMatrix(b, func(b *testing.B, keys []string, parallel bool) {
		lim := newBenchLimiter(b)
		ctx := context.Background()
		for _, k := range keys {
			if _, err := lim.Limit(ctx, "bucket", k); err != nil { // records exist
				b.Fatal(err)
			}
		}
		benchCalls(b, keys, parallel, func(key string) error {
			_, err := lim.Check(ctx, "bucket", key)
			return err
		})
	})
}

// BenchmarkMemstoreReserve measures a plain Limiter.Reserve on memstore
// (granted at once; the Reservation itself is the one allocation).
func BenchmarkMemstoreReserve(b *testing.B) {
	benchMatrix(b, func(b *testing.B, keys []string, parallel bool) {
		lim := newBenchLimiter(b)
		ctx := context.Background()
		benchCalls(b, keys, parallel, func(key string) error {
			r, err := lim.Reserve(ctx, "bucket", key)
			if err == nil && !r.OK() {
				err = fmt.Errorf("refused: %+v", r.Result())
			}
			return err
		})
	})
}

// nopStore binds limits to a BoundLimit that decides nothing: every call
// is granted at once, so that what is measured is the Limiter's own part.
type nopStore struct{ *memstore.Store }

func (s *nopStore) Bind(string, driver.Params, func(string) int64) driver.BoundLimit {
	return nopBound{s}
}

type nopBound struct{ s *nopStore }

func (b nopBound) Decide(_ context.Context, _ string, _ driver.Mode, now int64, _ float64, _ bool) (driver.Verdict, error) {
	return driver.Verdict{OK: true, Remaining: 5, TS: now}, nil
}

func (b nopBound) Store() ratelimit.Store { return b.s }

// fixedClock reads always the same time, without a system call.
type fixedClock struct{ *clock.Mock }

func (fixedClock) Now() time.Time { return time.UnixMilli(1_700_000_000_000) }

// BenchmarkLimiterAlone measures Limit on one key through a store that
// decides nothing, with the real clock and with a clock that costs
// nothing: the Limiter's own part of a call, and the clock's.
func BenchmarkLimiterAlone(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []ratelimit.Option
	}{
		{"clock=real", nil},
		{"clock=fixed", []ratelimit.Option{ratelimit.WithClock(fixedClock{clock.NewMock()})}},
	} {
		b.Run(c.name, func(b *testing.B) {
			lim, err := ratelimit.New(&nopStore{must(memstore.New())}, benchLimits, c.opts...)
			if err != nil {
				b.Fatal(err)
			}
			benchCalls(b, benchKeys(1), false, func(key string) error {
				res, err := lim.Limit(context.Background(), "bucket", key)
				if err == nil && !res.OK {
					err = errRefused
				}
				return err
			})
		})
	}
}

// BenchmarkKeyHash measures Limit on memstore with keyed hashing of keys
// (WithKeyHash) and without: the cost of the HMAC per call.
func BenchmarkKeyHash(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []ratelimit.Option
	}{
		{"hash=off", nil},
		{"hash=on", []ratelimit.Option{ratelimit.WithKeyHash([]byte("0123456789abcdef0123456789abcdef"))}},
	} {
		b.Run(c.name, func(b *testing.B) {
			benchMatrix(b, func(b *testing.B, keys []string, parallel bool) {
				lim, err := ratelimit.New(must(memstore.New()), benchLimits, c.opts...)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				benchCalls(b, keys, parallel, func(key string) error {
					res, err := lim.Limit(ctx, "bucket", key)
					if err == nil && !res.OK {
						err = errRefused
					}
					return err
				})
			})
		})
	}
}

// BenchmarkTokenOfUsedReservation measures a reservation granted at once,
// let run (Wait) and then asked for its token, signed with a token key:
// the token carries the use, and is signed once, with it.
func BenchmarkTokenOfUsedReservation(b *testing.B) {
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 1e12, Period: time.Millisecond},
	}, ratelimit.WithTokenKey([]byte("benchmark token key, 32 bytes...")))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		r, err := lim.Reserve(ctx, "jobs", "k")
		if err != nil || !r.OK() {
			b.Fatalf("refused: %v %+v", err, r.Result())
		}
		if err := r.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		if r.Token() == nil {
			b.Fatal("no token")
		}
	}
}
