package boltstore_test

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	bolt "go.etcd.io/bbolt"
)

// go test -run '^$' -bench . ./store/boltstore

func BenchmarkLimit(b *testing.B) {
	s, err := boltstore.Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchmarkLimit(b, s)
}

var versusRounds = flag.Int("versus.rounds", 1, "rounds of BenchmarkVersus")

// BenchmarkVersus runs the store beside two bare baselines on the same
// medium, interleaved: for each of one hot key and 10,000 keys, from 1 and
// from 64 goroutines, the store's Limit, a bare bbolt Update that
// increments a counter key, and the same in bbolt's Batch (bbolt's
// defaults: 10 ms delay, 1,000 calls a batch), in an order that turns
// from cell to cell. Each runs on a fresh file of its own, and reports
// its calls per commit. With -versus.rounds n the whole matrix runs n
// times (a multiple of 3 gives each implementation each place in the
// order equally), and the benchmark prints, per cell, the median ns/op of
// the rounds with the spread (± half the range), and the median over the
// rounds of the store's speed over each baseline in that round:
//
//	go test -run '^$' -bench Versus -benchtime 1s ./store/boltstore -args -versus.rounds 6
func BenchmarkVersus(b *testing.B) {
	type cell struct{ keys, goroutines int }
	cells := []cell{{1, 1}, {1, 64}, {10_000, 1}, {10_000, 64}}
	impls := []string{"boltstore", "update", "batch"}
	ns := map[string][]float64{} // "keys/goroutines/impl" -> ns/op of each round
	for round := 1; round <= *versusRounds; round++ {
		for ci, c := range cells {
			// The order of the three turns from cell to cell and round to
			// round: the first of a cell follows the removal of the last
			// cell's files, which the file system may still be paying for.
			for j := range impls {
				impl := impls[(j+ci+round)%len(impls)]
				id := fmt.Sprintf("keys=%d/goroutines=%d/%s", c.keys, c.goroutines, impl)
				var last float64
				b.Run(fmt.Sprintf("round=%d/%s", round, id), func(b *testing.B) {
					call, db := versusCall(b, impl, c.keys)
					before := lastCommit(b, db)
					storetest.BenchmarkParallel(b, c.goroutines, call)
					last = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
					b.ReportMetric(float64(b.N)/float64(lastCommit(b, db)-before), "calls/commit")
				})
				ns[id] = append(ns[id], last)
			}
		}
	}
	if *versusRounds < 2 {
		return
	}
	// Printed, not logged: a benchmark with sub-benchmarks shows its log
	// only with -v.
	fmt.Printf("BenchmarkVersus, %d rounds: median ns/op (± half the range); boltstore's speed over each baseline, the median of the rounds' [their range]\n", *versusRounds)
	for _, c := range cells {
		pre := fmt.Sprintf("keys=%d/goroutines=%d", c.keys, c.goroutines)
		round := func(impl string) []float64 {
			xs := ns[pre+"/"+impl]
			if len(xs) < *versusRounds || slices.Contains(xs, 0) {
				return nil // filtered out by -bench
			}
			return xs
		}
		for _, impl := range impls {
			if xs := round(impl); xs != nil {
				m, half := medianSpread(xs)
				fmt.Printf("  %-26s %-9s %10.0f ± %.0f\n", pre, impl, m, half)
			}
		}
		store := round("boltstore")
		for _, base := range impls[1:] {
			xs := round(base)
			if store == nil || xs == nil {
				continue
			}
			speed := make([]float64, len(xs))
			for i := range xs {
				speed[i] = xs[i] / store[i]
			}
			m, _ := medianSpread(speed)
			fmt.Printf("  %-26s ×%-8s %10.2f [%.2f–%.2f]\n", pre, base, m, slices.Min(speed), slices.Max(speed))
		}
	}
}

// lastCommit returns the id of db's last write transaction.
func lastCommit(b *testing.B, db *bolt.DB) int {
	var id int
	if err := db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		b.Fatal(err)
	}
	return id
}

// versusCall returns the call one implementation makes, on a fresh file,
// and the file's database.
func versusCall(b *testing.B, impl string, keys int) (func(context.Context, int) error, *bolt.DB) {
	path := filepath.Join(b.TempDir(), impl+".db")
	if impl == "boltstore" {
		s, err := boltstore.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		lim, err := ratelimit.New(s, ratelimit.Limits{"bench": {Kind: ratelimit.TokenBucket, Rate: 1e12, Period: time.Second}})
		if err != nil {
			b.Fatal(err)
		}
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprint("bench-", i)
		}
		return func(ctx context.Context, i int) error {
			res, err := lim.Limit(ctx, "bench", names[i%keys])
			if err == nil && !res.OK {
				err = fmt.Errorf("refused: %+v", res)
			}
			return err
		}, s.DB()
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	bucket := []byte("bench")
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(bucket); return err }); err != nil {
		b.Fatal(err)
	}
	names := make([][]byte, keys)
	for i := range names {
		names[i] = fmt.Append(nil, "bench-", i)
	}
	write := db.Update
	if impl == "batch" {
		write = db.Batch
	}
	return func(_ context.Context, i int) error {
		k := names[i%keys]
		return write(func(tx *bolt.Tx) error {
			bk := tx.Bucket(bucket)
			var n uint64
			if v := bk.Get(k); len(v) == 8 {
				n = binary.BigEndian.Uint64(v)
			}
			return bk.Put(k, binary.BigEndian.AppendUint64(nil, n+1))
		})
	}, db
}

// medianSpread returns the median of xs and half their range.
func medianSpread(xs []float64) (median, half float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	median = s[n/2]
	if n%2 == 0 {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return median, (s[n-1] - s[0]) / 2
}

// BenchmarkSweepUnderLoad fills a file with 600,000 records that may all
// be removed, then runs DeleteExpired over them while one goroutine calls
// Limit, one call after another, each with a 50 ms deadline. It reports
// the sweep's time, how many calls ran during it, the slowest call and
// how many missed their deadline; then the same calls for as long again
// without a sweep, as the disk's own share (the -alone metrics):
//
//	go test -run '^$' -bench SweepUnderLoad -benchtime 1x ./store/boltstore
func BenchmarkSweepUnderLoad(b *testing.B) {
	const records = 600_000
	ctx := context.Background()
	s, err := boltstore.Open(filepath.Join(b.TempDir(), "sweep.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	lim, err := ratelimit.New(s, ratelimit.Limits{"new": {Kind: ratelimit.TokenBucket, Rate: 1e12, Period: time.Second}})
	if err != nil {
		b.Fatal(err)
	}
	type stats struct {
		calls, missed int
		slowest       time.Duration
	}
	// calls calls Limit until done is closed.
	calls := func(done <-chan struct{}) stats {
		var st stats
		for {
			select {
			case <-done:
				return st
			default:
			}
			dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			start := time.Now()
			_, err := lim.Limit(dctx, "new", "k")
			took := time.Since(start)
			cancel()
			st.calls++
			st.slowest = max(st.slowest, took)
			if err != nil || took > 50*time.Millisecond {
				st.missed++
			}
		}
	}
	now := time.Now()
	for b.Loop() {
		b.StopTimer()
		fillExpired(b, s, records, now.Add(-time.Hour))
		b.StartTimer()

		done := make(chan struct{})
		got := make(chan stats)
		go func() { got <- calls(done) }()
		start := time.Now()
		n, err := s.DeleteExpired(ctx, now)
		sweep := time.Since(start)
		close(done)
		st := <-got
		if err != nil || n != records {
			b.Fatalf("DeleteExpired: %d, %v", n, err)
		}

		b.StopTimer()
		stop := make(chan struct{})
		time.AfterFunc(sweep, func() { close(stop) })
		alone := calls(stop)
		b.StartTimer()

		b.ReportMetric(float64(sweep.Milliseconds()), "sweep-ms")
		b.ReportMetric(float64(st.calls), "calls")
		b.ReportMetric(float64(st.slowest.Microseconds())/1000, "slowest-call-ms")
		b.ReportMetric(float64(st.missed), "missed-deadlines")
		b.ReportMetric(float64(alone.calls), "calls-alone")
		b.ReportMetric(float64(alone.slowest.Microseconds())/1000, "slowest-call-alone-ms")
		b.ReportMetric(float64(alone.missed), "missed-deadlines-alone")
	}
}

// fillExpired writes n records whose buckets were full again at
// fullAt, in the layout of docs/stores/bolt.md.
func fillExpired(b *testing.B, s *boltstore.Store, n int, fullAt time.Time) {
	const perTx = 50_000
	for done := 0; done < n; done += perTx {
		err := s.DB().Update(func(tx *bolt.Tx) error {
			bk := tx.Bucket([]byte(boltstore.DefaultBucket))
			for i := done; i < min(n, done+perTx); i++ {
				k := driver.RecordID{Name: "old", Key: fmt.Sprint("user-", i)}.AppendKey([]byte{0})
				v := binary.BigEndian.AppendUint64(nil, math.Float64bits(1))
				v = binary.BigEndian.AppendUint64(v, uint64(fullAt.UnixMilli()-1000))
				v = binary.BigEndian.AppendUint64(v, uint64(fullAt.UnixMilli()))
				if err := bk.Put(k, v); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoneWrite measures a lone caller's writes (Limit, Delete) with
// a context that cannot end and with one that can, which the store hands
// to another goroutine so that its caller may leave on time.
func BenchmarkLoneWrite(b *testing.B) {
	for _, withCancel := range []bool{false, true} {
		name := "ctx=background"
		if withCancel {
			name = "ctx=cancelable"
		}
		ctxOf := func() (context.Context, context.CancelFunc) {
			if withCancel {
				return context.WithCancel(context.Background())
			}
			return context.Background(), func() {}
		}
		b.Run("Limit/"+name, func(b *testing.B) {
			s, err := boltstore.Open(filepath.Join(b.TempDir(), "bench.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			lim, err := ratelimit.New(s, ratelimit.Limits{"bench": {Kind: ratelimit.TokenBucket, Rate: 1e12, Period: time.Second}})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := ctxOf()
			defer cancel()
			b.ReportAllocs()
			for b.Loop() {
				if res, err := lim.Limit(ctx, "bench", "k"); err != nil || !res.OK {
					b.Fatal(res, err)
				}
			}
		})
		b.Run("Delete/"+name, func(b *testing.B) {
			s, err := boltstore.Open(filepath.Join(b.TempDir(), "bench.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := ctxOf()
			defer cancel()
			ids := []driver.RecordID{{Name: "bench", Key: "k"}}
			take := takeOp("bench", "k", 1, t0.UnixMilli())
			out := make([]driver.Decision, 1)
			b.ReportAllocs()
			for b.Loop() {
				// A record to delete: a Delete that finds none commits nothing.
				b.StopTimer()
				if err := s.Apply(context.Background(), take, out); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := s.Delete(ctx, ids); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSettle is storetest.BenchmarkSettle: a reservation canceled, a
// receipt refunded.
func BenchmarkSettle(b *testing.B) {
	s, err := boltstore.Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchmarkSettle(b, s)
}
