// Package storetest is the conformance suite of ratelimit.Store: every store
// of this project runs it, and so can a store written elsewhere, in a few
// lines:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) ratelimit.Store {
//			s, err := mystore.New(...) // a fresh, empty store; register cleanups with t.Cleanup
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
//
// The suite runs the project's golden vectors (computed by the reference
// implementation of the semantics) through the public API; compares the
// store step by step, to the last bit, with Model, which runs the pure
// transition ratelimit.Evaluate; checks exactness under 64 goroutines;
// checks that (name, key) pairs a naive encoding would confuse stay apart;
// and checks Reset, Value, expiry, sharding, the all-or-nothing Op, limits
// changed on a live Limiter, keyed hashing of keys and the errors of a
// batch that failed in part (which ops were left out). The contract it
// checks, and how to write a store, are in docs/stores.md.
package storetest

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// NewStore returns a fresh, empty store for one test. It may register
// cleanups with t.Cleanup.
type NewStore func(t *testing.T) ratelimit.Store

// Option adjusts the suite.
type Option func(*suite)

type suite struct {
	diffSeeds int
	diffSteps int
	spoil     func(t *testing.T, s ratelimit.Store, id driver.RecordID)
}

// DifferentialRuns sets how many random sequences (seeds) and steps per
// sequence the differential tests run. The defaults (40 × 150) take well
// under a second on an in-memory store; a store with a slow medium may
// lower them, never to zero.
func DifferentialRuns(seeds, steps int) Option {
	return func(s *suite) { s.diffSeeds, s.diffSteps = max(seeds, 1), max(steps, 1) }
}

// SpoilRecord gives the suite spoil, which writes in s, where the record
// id belongs, what no release writes (driver.CheckState refuses it), so
// that every op on it fails with driver.ErrBadRecord: the suite then
// checks the errors of a batch one of whose ops fails on its own
// (driver.OpError), also while its context ends. Without it, the suite
// does not check those.
func SpoilRecord(spoil func(t *testing.T, s ratelimit.Store, id driver.RecordID)) Option {
	return func(s *suite) { s.spoil = spoil }
}

// Run runs the whole suite against stores made by newStore.
func Run(t *testing.T, newStore NewStore, opts ...Option) {
	s := suite{diffSeeds: 40, diffSteps: 150}
	for _, o := range opts {
		o(&s)
	}
	t.Run("Vectors", func(t *testing.T) { TestVectors(t, newStore) })
	t.Run("ApplyDifferential", func(t *testing.T) { testApplyDifferential(t, newStore, s) })
	t.Run("LimiterDifferential", func(t *testing.T) { testLimiterDifferential(t, newStore, s) })
	t.Run("EdgeDifferential", func(t *testing.T) { testEdgeDifferential(t, newStore, s) })
	t.Run("TimeRange", func(t *testing.T) { testTimeRange(t, newStore) })
	t.Run("TimeSpans", func(t *testing.T) { testTimeSpans(t, newStore) })
	t.Run("PairWaitDifferential", func(t *testing.T) { testPairWaitDifferential(t, newStore, s) })
	t.Run("StoredUnderOtherParams", func(t *testing.T) { testStoredUnderOtherParams(t, newStore, s) })
	if _, ok := newStore(t).(driver.BatchApplier); ok {
		t.Run("BatchDifferential", func(t *testing.T) { testBatchDifferential(t, newStore, s) })
	}
	if _, ok := newStore(t).(driver.Binder); ok {
		t.Run("BindDifferential", func(t *testing.T) { testBindDifferential(t, newStore, s) })
		t.Run("BindHotKeys", func(t *testing.T) { testBindHotKeys(t, newStore, s) })
	}
	t.Run("Contention", func(t *testing.T) { testContention(t, newStore) })
	t.Run("ShardedContention", func(t *testing.T) { testShardedContention(t, newStore) })
	t.Run("ShardedReservations", func(t *testing.T) { testShardedReservations(t, newStore) })
	t.Run("Sharded", func(t *testing.T) { testSharded(t, newStore) })
	t.Run("ShardedReservationOfZero", func(t *testing.T) { testShardedReservationOfZero(t, newStore) })
	t.Run("Confusable", func(t *testing.T) { testConfusable(t, newStore) })
	t.Run("ResetValueExpiry", func(t *testing.T) { testResetValueExpiry(t, newStore) })
	t.Run("AllOrNothing", func(t *testing.T) { testAllOrNothing(t, newStore) })
	t.Run("Refund", func(t *testing.T) { testRefund(t, newStore) })
	t.Run("RefundBehind", func(t *testing.T) { testRefundBehind(t, newStore) })
	t.Run("Settle", func(t *testing.T) { testSettle(t, newStore, s) })
	t.Run("ClockBackwards", func(t *testing.T) { testClockBackwards(t, newStore) })
	t.Run("Rounding", func(t *testing.T) { testRounding(t, newStore, s) })
	t.Run("DebtOutlivesLimiter", func(t *testing.T) { testDebtOutlivesLimiter(t, newStore) })
	t.Run("ContextCanceled", func(t *testing.T) { testContextCanceled(t, newStore) })
	t.Run("Contract", func(t *testing.T) { testContract(t, newStore) })
	t.Run("Errors", func(t *testing.T) { testErrors(t, newStore) })
	if _, ok := newStore(t).(driver.BatchApplier); ok {
		t.Run("BatchErrors", func(t *testing.T) { testBatchErrors(t, newStore, s) })
	}
	if _, ok := newStore(t).(driver.Expirer); ok {
		t.Run("Expirer", func(t *testing.T) { testExpirer(t, newStore) })
		t.Run("SweepDifferential", func(t *testing.T) { testSweepDifferential(t, newStore, s) })
	}
	t.Run("ChangedLimits", func(t *testing.T) { testChangedLimits(t, newStore) })
	t.Run("KeyHash", func(t *testing.T) { testKeyHash(t, newStore) })
}

// epoch is where the suite's mock clocks start (2023-11-14T22:13:20Z).
var epoch = time.UnixMilli(1_700_000_000_000)

func newMock(at time.Time) *clock.Mock {
	m := clock.NewMock()
	m.Set(at)
	return m
}

// TestVectors runs every golden scenario through the public API on fresh
// stores made by newStore.
func TestVectors(t *testing.T, newStore NewStore) {
	scenarios, err := Scenarios()
	require.NoError(t, err)
	require.NotEmpty(t, scenarios)
	ctx := context.Background()
	for _, sc := range scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			cfg, err := sc.Config.Config()
			require.NoError(t, err)
			mock := newMock(time.UnixMilli(sc.Steps[0].NowMS))
			lim, err := ratelimit.New(newStore(t), ratelimit.Limits{"vector": cfg}, ratelimit.WithClock(mock))
			require.NoError(t, err)
			for i, st := range sc.Steps {
				mock.Set(time.UnixMilli(st.NowMS))
				opts := []ratelimit.CallOption{ratelimit.Count(st.Count)}
				if st.Reserve {
					opts = append(opts, ratelimit.WithReserve())
				}
				var res ratelimit.Result
				switch st.Op {
				case "reset":
					require.NoError(t, lim.Reset(ctx, "vector", "key"), "step %d", i)
					continue
				case "check":
					res, err = lim.Check(ctx, "vector", "key", opts...)
				default:
					res, err = lim.Limit(ctx, "vector", "key", opts...)
				}
				if st.Expect.Error != nil {
					require.Error(t, err, "step %d: the reference rejects this call", i)
					require.ErrorIs(t, err, ratelimit.ErrInvalidCount, "step %d", i)
					continue
				}
				require.NoError(t, err, "step %d", i)
				require.NotNil(t, st.Expect.OK, "step %d", i)
				assert.Equal(t, *st.Expect.OK, res.OK, "step %d: ok", i)
				assert.Equal(t, wantRetry(st.Expect.RetryAfter), res.RetryAfter, "step %d: retry-after", i)
				if res.OK && st.Expect.Computed != nil {
					assert.InDelta(t, st.Expect.Computed.Value, res.Remaining, 1e-9, "step %d: remaining", i)
				}
			}
		})
	}
}

// wantRetry converts the reference's retry-after to this library's:
// rounded up to a whole millisecond. The reference divides where this
// library multiplies first, which leaves it float noise of about 1e-9 ms
// above a whole number (3600000.0000000005); that noise is not a wait.
func wantRetry(ref *float64) time.Duration {
	if ref == nil {
		return 0
	}
	return time.Duration(math.Ceil(*ref-1e-6)) * time.Millisecond
}

// Hammer makes calls calls of Limit(name, key) from each of goroutines
// goroutines at once, and returns how many were OK.
func Hammer(ctx context.Context, lim *ratelimit.Limiter, name, key string, goroutines, calls int, opts ...ratelimit.CallOption) (granted int, err error) {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	start := make(chan struct{})
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			n := 0
			for range calls {
				res, err := lim.Limit(ctx, name, key, opts...)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				if res.OK {
					n++
				}
			}
			mu.Lock()
			granted += n
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		return granted, errs[0]
	}
	return granted, nil
}

func testContention(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store := newStore(t)
	mock := newMock(epoch)
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"fw": {Kind: ratelimit.FixedWindow, Rate: 50, Period: time.Second, Capacity: 80, Start: time.UnixMilli(0)},
		"tb": {Kind: ratelimit.TokenBucket, Rate: 60, Period: time.Minute, Capacity: 30},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)

	// Fixed window: the first window grants the capacity, every later one
	// exactly the rate, since each window is drained.
	for w := range 4 {
		mock.Set(epoch.Add(time.Duration(w) * time.Second))
		granted, err := Hammer(ctx, lim, "fw", "hot", 64, 3)
		require.NoError(t, err)
		want := 50
		if w == 0 {
			want = 80
		}
		require.Equal(t, want, granted, "window %d", w)
	}
	// Token bucket, half-token counts: 30 tokens grant 60 calls, then 7s
	// refill 7 tokens, 14 calls.
	mock.Set(epoch)
	granted, err := Hammer(ctx, lim, "tb", "hot", 64, 2, ratelimit.Count(0.5))
	require.NoError(t, err)
	require.Equal(t, 60, granted)
	mock.Add(7 * time.Second)
	granted, err = Hammer(ctx, lim, "tb", "hot", 64, 2, ratelimit.Count(0.5))
	require.NoError(t, err)
	require.Equal(t, 14, granted)
}

func testShardedContention(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	mock := newMock(epoch)
	lim, err := ratelimit.New(newStore(t), ratelimit.Limits{
		"fw": {Kind: ratelimit.FixedWindow, Rate: 40, Period: time.Second, Shards: 4, Start: time.UnixMilli(0)},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	total := 0
	for w := range 6 {
		mock.Set(epoch.Add(time.Duration(w) * time.Second))
		granted, err := Hammer(ctx, lim, "fw", "hot", 32, 4, ratelimit.Count(1))
		require.NoError(t, err)
		require.LessOrEqual(t, granted, 40, "window %d: a sharded limit granted more than the unsharded one", w)
		total += granted
	}
	// Power of two choices leaves little stranded: most of the 240 tokens
	// of six windows are granted.
	require.GreaterOrEqual(t, total, 200)
}

// testShardedReservations makes sharded reservations from 32 goroutines,
// each a client with a clock of its own, 160 a second (the limit grants
// 100) for 12 s, and requires no window to have more jobs scheduled into
// it than the limit grants.
func testShardedReservations(t *testing.T, newStore NewStore) {
	jobs, err := reserveRun(context.Background(), newStore(t), "hot", epoch, 32, 60, 6250*time.Microsecond)
	require.NoError(t, err)
	checkJobs(t, jobs, "32 goroutines")
}

func testSharded(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	mock := newMock(epoch)
	lim, err := ratelimit.New(newStore(t), ratelimit.Limits{
		"s": {Kind: ratelimit.FixedWindow, Rate: 40, Period: time.Minute, Shards: 4, Start: time.UnixMilli(0)},
		"t": {Kind: ratelimit.TokenBucket, Rate: 20, Period: time.Minute, Shards: 2},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)

	// One shard holds 10; a fresh sharded limit grants 15 from two shards.
	res, err := lim.Limit(ctx, "s", "k", ratelimit.Count(15))
	require.NoError(t, err)
	require.True(t, res.OK, "a fresh sharded limit must grant a count above one shard's share")
	st, err := lim.Value(ctx, "s", "k")
	require.NoError(t, err)
	require.InDelta(t, 25, st.Remaining, 1e-9)
	require.Len(t, st.Shards, 4)
	// Two shards of a 2-shard token bucket hold the whole capacity.
	res, err = lim.Limit(ctx, "t", "k", ratelimit.Count(20))
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = lim.Limit(ctx, "t", "k", ratelimit.Count(1))
	require.NoError(t, err)
	require.False(t, res.OK)
	_, err = lim.Limit(ctx, "s", "k", ratelimit.Count(21))
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
	require.NoError(t, lim.Reset(ctx, "s", "k"))
	st, err = lim.Value(ctx, "s", "k")
	require.NoError(t, err)
	require.InDelta(t, 40, st.Remaining, 1e-9)
}

// Confusable returns (name, key) pairs that a store joining name and key
// naively would map to the same record.
func Confusable() [][2]string {
	big := string(make([]byte, 1<<20))
	bigX := big[:len(big)-1] + "x"
	return [][2]string{
		{"a:b", "c"}, {"a", "b:c"}, {"a", "b\x00c"}, {"a\x00b", "c"},
		{"a", "{b}"}, {"{a}", "b"}, {"a", "b}"}, {"a", "{b"},
		{"a", ""}, {"a", "\x00"}, {"a", "\xff\xfe"},
		{"a", `b"c`}, {"a", "b'c"}, {"a'", "bc"},
		{"a", big}, {"a", bigX},
	}
}

func testConfusable(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	mock := newMock(epoch)
	lim, err := ratelimit.New(newStore(t), nil, ratelimit.WithClock(mock))
	require.NoError(t, err)
	cfg := ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Hour, Start: time.UnixMilli(0)})
	pairs := Confusable()
	for i, p := range pairs {
		res, err := lim.Limit(ctx, p[0], p[1], cfg, ratelimit.Count(3))
		require.NoError(t, err)
		require.True(t, res.OK, "pair %d (%.20q, %.20q) was charged by another pair", i, p[0], p[1])
		for j, q := range pairs[i+1:] {
			st, err := lim.Value(ctx, q[0], q[1], cfg)
			require.NoError(t, err)
			require.Equal(t, 3.0, st.Remaining, "charging pair %d (%.20q, %.20q) changed pair %d (%.20q, %.20q)",
				i, p[0], p[1], i+1+j, q[0], q[1])
		}
	}
}

func testResetValueExpiry(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	mock := newMock(epoch)
	start := epoch.Add(-15 * time.Second)
	lim, err := ratelimit.New(newStore(t), ratelimit.Limits{
		"fw": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Capacity: 25, Start: start},
		"tb": {Kind: ratelimit.TokenBucket, Rate: 6, Period: time.Minute, MaxReserved: 12},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)

	st, err := lim.Value(ctx, "fw", "k")
	require.NoError(t, err)
	require.Equal(t, 25.0, st.Remaining, "a missing record is a full bucket")
	require.Equal(t, start.UnixMilli(), st.WindowStart.UnixMilli())
	require.Equal(t, start.Add(time.Minute).UnixMilli(), st.NextGrant.UnixMilli())

	res, err := lim.Limit(ctx, "fw", "k", ratelimit.Count(25))
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = lim.Check(ctx, "fw", "k")
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Equal(t, 45*time.Second, res.RetryAfter)
	st, err = lim.Value(ctx, "fw", "k")
	require.NoError(t, err)
	require.Equal(t, 0.0, st.Remaining, "Check must not spend")

	// Two windows later 20 tokens have been granted; three later, the cap.
	mock.Add(2 * time.Minute)
	st, err = lim.Value(ctx, "fw", "k")
	require.NoError(t, err)
	require.Equal(t, 20.0, st.Remaining)
	mock.Add(time.Minute)
	st, err = lim.Value(ctx, "fw", "k")
	require.NoError(t, err)
	require.Equal(t, 25.0, st.Remaining)
	res, err = lim.Limit(ctx, "fw", "k", ratelimit.Count(25))
	require.NoError(t, err)
	require.True(t, res.OK, "a bucket full again (record expired or not) grants the capacity")

	require.NoError(t, lim.Reset(ctx, "fw", "k"))
	st, err = lim.Value(ctx, "fw", "k")
	require.NoError(t, err)
	require.Equal(t, 25.0, st.Remaining, "reset gives a full bucket")
	require.Equal(t, start.Add(3*time.Minute).UnixMilli(), st.WindowStart.UnixMilli(), "reset keeps the phase")
	require.NoError(t, lim.Reset(ctx, "fw", "never-used"), "resetting a missing record is no error")

	// A token bucket in debt: Value is negative, and it recovers with time.
	res, err = lim.Limit(ctx, "tb", "k", ratelimit.Count(12), ratelimit.WithReserve())
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Equal(t, time.Minute, res.RetryAfter)
	st, err = lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.Equal(t, -6.0, st.Remaining)
	require.True(t, st.WindowStart.IsZero())
	mock.Add(30 * time.Second)
	st, err = lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.Equal(t, -3.0, st.Remaining)
	mock.Add(time.Hour)
	st, err = lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.Equal(t, 6.0, st.Remaining)
}

// opOf builds a one-record ModeLimit op.
func itemOf(name, key string, count float64, p driver.Params) driver.Item {
	return driver.Item{Name: name, Key: key, Count: count, Shards: []driver.Shard{{Index: 0, Params: p}}}
}

func loadOne(t *testing.T, s ratelimit.Store, p driver.Params, id driver.RecordID, now int64) float64 {
	t.Helper()
	out := make([]driver.Record, 1)
	require.NoError(t, s.Load(context.Background(), []driver.RecordID{id}, out))
	return ratelimit.StateAt(p, out[0], now).Remaining
}

func testAllOrNothing(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	s := newStore(t)
	now := epoch.UnixMilli()
	hour := driver.Params{Kind: ratelimit.FixedWindow, Rate: 2000, Period: 3_600_000, Capacity: 2000}
	minute := driver.Params{Kind: ratelimit.FixedWindow, Rate: 33, Period: 60_000, Capacity: 33}
	op := &driver.Op{Mode: driver.ModeLimit, Now: now, Items: []driver.Item{
		itemOf("hour", "k", 30, hour), itemOf("minute", "k", 30, minute)}}
	out := make([]driver.Decision, 2)
	require.NoError(t, s.Apply(ctx, op, out))
	require.True(t, out[0].OK && out[1].OK)
	// 30 more: the hour grants, the minute refuses, so neither is charged.
	op.Now += 1000
	require.NoError(t, s.Apply(ctx, op, out))
	require.True(t, out[0].OK)
	require.False(t, out[1].OK)
	require.Equal(t, 1970.0, loadOne(t, s, hour, driver.RecordID{Name: "hour", Key: "k"}, op.Now),
		"an item granted in a refused op must not be charged")
	require.Equal(t, 3.0, loadOne(t, s, minute, driver.RecordID{Name: "minute", Key: "k"}, op.Now))
}

func testRefund(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	s := newStore(t)
	now := epoch.UnixMilli()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	id := driver.RecordID{Name: "r", Key: "k"}
	out := make([]driver.Decision, 1)
	op := &driver.Op{Mode: driver.ModeLimit, Now: now, Reserve: true, Items: []driver.Item{itemOf("r", "k", 14, p)}}
	require.NoError(t, s.Apply(ctx, op, out))
	require.True(t, out[0].OK)
	require.Equal(t, int64(24_000), out[0].RetryAfter)
	require.Equal(t, now, out[0].Now)
	require.Equal(t, -4.0, loadOne(t, s, p, id, now))
	refund := itemOf("r", "k", 14, p)
	refund.At, refund.Run = out[0].Now, out[0].Now+out[0].RetryAfter
	op = &driver.Op{Mode: driver.ModeRefund, Now: now, Items: []driver.Item{refund}}
	require.NoError(t, s.Apply(ctx, op, out))
	require.Equal(t, 10.0, out[0].Remaining)
	require.Equal(t, -14.0, out[0].Charged[0], "handed back: -4 to 10")
	require.Equal(t, 10.0, loadOne(t, s, p, id, now))
	// A refund never lifts a bucket above its capacity.
	require.NoError(t, s.Apply(ctx, op, out))
	require.Equal(t, 10.0, loadOne(t, s, p, id, now))

	// A refund gives back the count less what the limit granted since the
	// charge: 10 taken, 5 reserved, 18 s later (3 granted) only 2 come back.
	op = &driver.Op{Now: now, Reserve: true, Items: []driver.Item{itemOf("r", "k", 10, p)}}
	require.NoError(t, s.Apply(ctx, op, out))
	op.Items[0].Count = 5
	require.NoError(t, s.Apply(ctx, op, out))
	require.Equal(t, -5.0, loadOne(t, s, p, id, now))
	run := now + out[0].RetryAfter
	refund = itemOf("r", "k", 5, p)
	refund.At, refund.Run = now, run
	later := now + 18_000
	op = &driver.Op{Mode: driver.ModeRefund, Now: later, Items: []driver.Item{refund}}
	require.NoError(t, s.Apply(ctx, op, out))
	require.Equal(t, 0.0, loadOne(t, s, p, id, later))

	// A fixed window: a reservation's tokens granted at the next window,
	// canceled late, give nothing back: that window's grant went to it.
	fw := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: 60_000, Capacity: 10}
	fid := driver.RecordID{Name: "f", Key: "k"}
	start := (epoch.UnixMilli()/60_000 + 1) * 60_000 // a window start
	op = &driver.Op{Now: start, Reserve: true, Items: []driver.Item{itemOf("f", "k", 10, fw)}}
	require.NoError(t, s.Apply(ctx, op, out))
	require.NoError(t, s.Apply(ctx, op, out))
	require.Equal(t, int64(60_000), out[0].RetryAfter)
	refund = itemOf("f", "k", 10, fw)
	refund.At, refund.Run = start, start+out[0].RetryAfter
	late := start + 61_000
	op = &driver.Op{Mode: driver.ModeRefund, Now: late, Items: []driver.Item{refund}}
	require.NoError(t, s.Apply(ctx, op, out))
	require.Equal(t, 0.0, loadOne(t, s, fw, fid, late), "a late refund would let the window serve its grant twice")
	// Within the window of the charge the whole count comes back.
	op = &driver.Op{Now: late, Reserve: true, Items: []driver.Item{itemOf("f", "k", 4, fw)}}
	require.NoError(t, s.Apply(ctx, op, out))
	refund.Count, refund.At, refund.Run = 4, out[0].Now, out[0].Now+out[0].RetryAfter
	op = &driver.Op{Mode: driver.ModeRefund, Now: late + 1_000, Items: []driver.Item{refund}}
	require.NoError(t, s.Apply(ctx, op, out))
	require.Equal(t, 0.0, loadOne(t, s, fw, fid, late+1_000))
}

// testRefundBehind checks that a refund never shortens a debt that later
// reservations were given their times on: at 1 a second, capacity 1,
// reservations A, B and C run at 0 s, 1 s and 2 s; a refund of B (whose
// job time, Item.Run, is before the debt's tail) gives back nothing, and
// one of the tail, C, all of it, also a while later (the tail timed from
// the record as stored: float noise cannot put it a millisecond past
// C's time), or of a run before At, which reads as At.
func testRefundBehind(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	s := newStore(t)
	start := (epoch.UnixMilli()/1000 + 1) * 1000 // a window start
	for _, p := range []driver.Params{
		{Kind: ratelimit.FixedWindow, Rate: 1, Period: 1000, Capacity: 1, MaxReserved: 10},
		{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 1, MaxReserved: 10},
		{Kind: ratelimit.TokenBucket, Rate: 3, Period: 1000, Capacity: 1, MaxReserved: 10},
	} {
		name := fmt.Sprintf("behind-%v-%v", p.Kind, p.Rate)
		id := driver.RecordID{Name: name, Key: "k"}
		out := make([]driver.Decision, 1)
		var runs [3]int64
		for i := range runs {
			op := &driver.Op{Now: start, Reserve: true, Items: []driver.Item{itemOf(name, "k", 1, p)}}
			require.NoError(t, s.Apply(ctx, op, out))
			require.True(t, out[0].OK)
			runs[i] = out[0].Now + out[0].RetryAfter
		}
		before := loadOne(t, s, p, id, start)
		refund := func(now, run int64) driver.Decision {
			t.Helper()
			it := itemOf(name, "k", 1, p)
			it.At, it.Run = start, run
			require.NoError(t, s.Apply(ctx, &driver.Op{Mode: driver.ModeRefund, Now: now, Items: []driver.Item{it}}, out))
			require.True(t, out[0].OK)
			return out[0]
		}
		d := refund(start, runs[1])
		require.Equal(t, 0.0, d.Charged[0], "%v: B stands before C: nothing comes back", p)
		require.Equal(t, before, loadOne(t, s, p, id, start), "%v: B", p)
		d = refund(start, start-5)
		require.Equal(t, 0.0, d.Charged[0], "%v: a run before the charge reads as the charge", p)
		d = refund(start, runs[2])
		require.Equal(t, -1.0, d.Charged[0], "%v: C is the tail: all of it comes back", p)
		require.Equal(t, before+1, loadOne(t, s, p, id, start), "%v: C", p)
		// E takes C's place; refunded a millisecond later, it is still the
		// tail, and gets back what the limit did not grant since.
		op := &driver.Op{Now: start, Reserve: true, Items: []driver.Item{itemOf(name, "k", 1, p)}}
		require.NoError(t, s.Apply(ctx, op, out))
		require.Equal(t, runs[2], out[0].Now+out[0].RetryAfter, "%v: E takes C's time", p)
		d = refund(start+1, runs[2])
		require.Less(t, d.Charged[0], 0.0, "%v: E is the tail", p)
	}
}

// testContextCanceled checks that every method given a context canceled
// before the call returns its error, and has no effect.
func testContextCanceled(t *testing.T, newStore NewStore) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	now := epoch.UnixMilli()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	id := driver.RecordID{Name: "c", Key: "k"}
	op := func() *driver.Op { return &driver.Op{Now: now, Items: []driver.Item{itemOf("c", "k", 1, p)}} }
	stored := func(t *testing.T, s ratelimit.Store) bool {
		t.Helper()
		out := make([]driver.Record, 1)
		require.NoError(t, s.Load(context.Background(), []driver.RecordID{id}, out))
		return out[0].Found
	}

	t.Run("Apply", func(t *testing.T) {
		s := newStore(t)
		require.ErrorIs(t, s.Apply(ctx, op(), make([]driver.Decision, 1)), context.Canceled)
		require.Equal(t, 10.0, loadOne(t, s, p, id, now), "a canceled Apply must not have written")
	})
	t.Run("ApplyCheck", func(t *testing.T) {
		s := newStore(t)
		check := op()
		check.Mode = driver.ModeCheck
		require.ErrorIs(t, s.Apply(ctx, check, make([]driver.Decision, 1)), context.Canceled)
	})
	t.Run("Load", func(t *testing.T) {
		s := newStore(t)
		require.ErrorIs(t, s.Load(ctx, []driver.RecordID{id}, make([]driver.Record, 1)), context.Canceled)
	})
	t.Run("Delete", func(t *testing.T) {
		s := newStore(t)
		charge(t, s, now, "c", p)
		require.ErrorIs(t, s.Delete(ctx, []driver.RecordID{id}), context.Canceled)
		require.True(t, stored(t, s), "a canceled Delete must not have deleted")
	})
	if _, ok := newStore(t).(driver.BatchApplier); ok {
		t.Run("ApplyBatch", func(t *testing.T) {
			s := newStore(t)
			err := s.(driver.BatchApplier).ApplyBatch(ctx, []*driver.Op{op()}, [][]driver.Decision{make([]driver.Decision, 1)})
			require.ErrorIs(t, err, context.Canceled)
			require.False(t, stored(t, s), "a canceled ApplyBatch must not have written")
		})
	}
	if _, ok := newStore(t).(driver.Expirer); ok {
		t.Run("DeleteExpired", func(t *testing.T) {
			s := newStore(t)
			charge(t, s, now, "c", p)
			later := time.UnixMilli(now).Add(time.Hour)
			n, err := s.(driver.Expirer).DeleteExpired(ctx, later)
			require.ErrorIs(t, err, context.Canceled)
			require.Zero(t, n)
			n, err = s.(driver.Expirer).DeleteExpired(context.Background(), later)
			require.NoError(t, err)
			require.Equal(t, 1, n, "a canceled DeleteExpired must not have dropped the record")
		})
	}
	if _, ok := newStore(t).(driver.TimeSource); ok {
		t.Run("Now", func(t *testing.T) {
			ts := newStore(t).(driver.TimeSource)
			if _, err := ts.Now(context.Background()); err != nil {
				t.Skipf("the store has no time to give: %v", err)
			}
			_, err := ts.Now(ctx)
			require.ErrorIs(t, err, context.Canceled)
		})
	}
	if _, ok := newStore(t).(driver.RecordClock); ok {
		t.Run("RecordNow", func(t *testing.T) {
			rc := newStore(t).(driver.RecordClock)
			if _, err := rc.RecordNow(context.Background(), id); err != nil {
				t.Skipf("the store has no time to give: %v", err)
			}
			_, err := rc.RecordNow(ctx, id)
			require.ErrorIs(t, err, context.Canceled)
		})
	}
	if _, ok := newStore(t).(driver.Binder); ok {
		t.Run("Decide", func(t *testing.T) {
			s := newStore(t)
			bl := s.(driver.Binder).Bind("c", p, func(string) int64 { return 0 })
			_, err := bl.Decide(ctx, "k", driver.ModeLimit, now, 1, false)
			require.ErrorIs(t, err, context.Canceled)
			require.False(t, stored(t, s), "a canceled Decide must not have written")
		})
	}
}

// testClockBackwards checks that a clock stepping back neither mints nor
// removes tokens: the state is judged at its own latest time.
func testClockBackwards(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	mock := newMock(epoch)
	lim, err := ratelimit.New(newStore(t), ratelimit.Limits{
		"fw": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: time.UnixMilli(0)},
		"tb": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	for _, name := range []string{"fw", "tb"} {
		res, err := lim.Limit(ctx, name, "k", ratelimit.Count(10))
		require.NoError(t, err)
		require.True(t, res.OK)
		mock.Add(2 * time.Minute)
		res, err = lim.Limit(ctx, name, "k", ratelimit.Count(4))
		require.NoError(t, err)
		require.True(t, res.OK, name)
		require.Equal(t, 6.0, res.Remaining, name)
		mock.Add(-90 * time.Second) // back, into an earlier window
		st, err := lim.Value(ctx, name, "k")
		require.NoError(t, err)
		require.Equal(t, 6.0, st.Remaining, "%s: a step back must not remove tokens", name)
		res, err = lim.Limit(ctx, name, "k", ratelimit.Count(6))
		require.NoError(t, err)
		require.True(t, res.OK, name)
		res, err = lim.Limit(ctx, name, "k", ratelimit.Count(1))
		require.NoError(t, err)
		require.False(t, res.OK, "%s: a step back must not mint tokens", name)
		require.Greater(t, res.RetryAfter, time.Duration(0), name)
		mock.Add(90 * time.Second)
	}
}

// testDebtOutlivesLimiter checks that a reservation's debt lives in the
// record: a new Limiter on the same store (a restarted process) sees it.
func testDebtOutlivesLimiter(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store := newStore(t)
	mock := newMock(epoch)
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, MaxReserved: 50}}
	before, err := ratelimit.New(store, limits, ratelimit.WithClock(mock))
	require.NoError(t, err)
	r, err := before.Reserve(ctx, "jobs", "batch", ratelimit.Count(40))
	require.NoError(t, err)
	require.True(t, r.OK())
	require.Equal(t, 3*time.Minute, r.Delay())

	after, err := ratelimit.New(store, limits, ratelimit.WithClock(mock))
	require.NoError(t, err)
	st, err := after.Value(ctx, "jobs", "batch")
	require.NoError(t, err)
	require.Equal(t, -30.0, st.Remaining)
	res, err := after.Limit(ctx, "jobs", "batch")
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Equal(t, 186*time.Second, res.RetryAfter, "a new call queues behind the reserved debt")
}

// clampTime returns t held to ±driver.MaxTime, where the times of a
// valid op lie: a refund's At, the time of a charge that a call judged
// within those bounds made, and a settlement's Until, which the Limiter
// holds to them (beyond, the op is invalid: driver.CheckOp).
func clampTime(t int64) int64 {
	return min(max(t, -driver.MaxTime), driver.MaxTime)
}
