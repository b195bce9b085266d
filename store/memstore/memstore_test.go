package memstore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) ratelimit.Store { return must(memstore.New()) })
}

func TestModelConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) ratelimit.Store { return storetest.NewModel() })
}

// A call judged at a now read a moment before a record's FullAt may reach
// the store after a later call has swept expired records: it must still
// see the record, not a full bucket.
func TestLateCallAfterDeletion(t *testing.T) {
	ctx := context.Background()
	s := must(memstore.New())
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: 1000, Capacity: 10}
	item := driver.Item{Name: "l", Key: "k", Count: 10, Shards: []driver.Shard{{Params: p}}}
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, &driver.Op{Now: 5_500, Items: []driver.Item{item}}, out))
	require.True(t, out[0].OK) // drained; full again at 6_000
	must(s.DeleteExpired(ctx, time.UnixMilli(6_000)))
	late := &driver.Op{Now: 5_999, Items: []driver.Item{item}}
	require.NoError(t, s.Apply(ctx, late, out))
	require.False(t, out[0].OK, "a call judged in the drained window found a full bucket")
	// Once the grace has passed, the record goes.
	must(s.DeleteExpired(ctx, time.UnixMilli(6_000+driver.ExpiryGrace)))
	require.Zero(t, s.Len())
}

// A calls' clock that steps forward, then back, must not mint tokens:
// sweeps made by other keys at the forward time used to drop a drained
// record, and after the clock came back the key was full again (10
// grants where none were due; the other stores granted none).
func TestClockStepForwardAndBackMintsNothing(t *testing.T) {
	ctx := context.Background()
	mock := clock.NewMock()
	start := time.UnixMilli(1_700_000_040_000)
	mock.Set(start)
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"l": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: time.UnixMilli(0)},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "l", "drained", ratelimit.Count(10))
	require.NoError(t, err)
	require.True(t, res.OK)

	mock.Set(start.Add(3 * time.Hour))
	for i := range 5000 {
		_, err := lim.Limit(ctx, "l", fmt.Sprint("other-", i))
		require.NoError(t, err)
	}
	mock.Set(start.Add(time.Second))
	require.Zero(t, grants(t, lim, "drained", 10), "the window was drained before the clock jumped")
}

// The same when the clock was already ahead at the store's first call,
// and came back before it went ahead again: the sweeps measured the
// calls' time from that first call, so the second jump dropped the
// drained record as the first could not, and the key was full again once
// the clock came back (10 grants where none were due).
func TestClockAheadAtTheFirstCallMintsNothing(t *testing.T) {
	ctx := context.Background()
	mock := clock.NewMock()
	start := time.UnixMilli(1_700_000_040_000)
	mock.Set(start.Add(3 * time.Hour))
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"l": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: time.UnixMilli(0)},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "l", "first")
	require.NoError(t, err)

	// The clock comes back: the key is drained, and the calls of a
	// second go on.
	mock.Set(start)
	res, err := lim.Limit(ctx, "l", "drained", ratelimit.Count(10))
	require.NoError(t, err)
	require.True(t, res.OK)
	for i := range 100 {
		mock.Set(start.Add(time.Duration(i) * 10 * time.Millisecond))
		_, err := lim.Limit(ctx, "l", fmt.Sprint("early-", i))
		require.NoError(t, err)
	}

	mock.Set(start.Add(3 * time.Hour))
	for i := range 5000 {
		_, err := lim.Limit(ctx, "l", fmt.Sprint("other-", i))
		require.NoError(t, err)
	}
	mock.Set(start.Add(2 * time.Second))
	require.Zero(t, grants(t, lim, "drained", 10), "the window was drained before the clock jumped")
}

// grants calls lim's limit "l" n times on key, and returns how many it
// granted.
func grants(t *testing.T, lim *ratelimit.Limiter, key string, n int) int {
	t.Helper()
	granted := 0
	for range n {
		res, err := lim.Limit(context.Background(), "l", key)
		require.NoError(t, err)
		if res.OK {
			granted++
		}
	}
	return granted
}

// stepClock is a store clock moved by hand, without the pause that
// clock.Mock takes on every move.
type stepClock struct {
	*clock.Mock
	ms atomic.Int64
}

func (c *stepClock) Now() time.Time                  { return time.UnixMilli(c.ms.Load()) }
func (c *stepClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func newStepClock(ms int64) *stepClock {
	c := &stepClock{Mock: clock.NewMock()}
	c.ms.Store(ms)
	return c
}

// drain takes the one token of a 1-per-second bucket of key at now: the
// record is full again a second later, and may be dropped a grace later.
func drain(t *testing.T, s *memstore.Store, key string, now int64) {
	t.Helper()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}
	op := &driver.Op{Now: now, Items: []driver.Item{{Name: "l", Key: key, Count: 1, Shards: []driver.Shard{{Params: p}}}}}
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(context.Background(), op, out))
	require.True(t, out[0].OK)
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// Once most records are dropped, the store gives their memory back: its
// tables shrink (a Go map never does; the store used to keep 577 MB of
// 662 MB after DeleteExpired dropped 5M records).
func TestHeapShrinksAfterDroppingMostRecords(t *testing.T) {
	const n = 200_000
	const t0 = int64(1_700_000_000_000)
	s := must(memstore.New(memstore.WithClock(newStepClock(t0))))
	base := heapAlloc()
	for i := range n {
		drain(t, s, "key-"+strconv.Itoa(i), t0)
	}
	full := heapAlloc()
	require.Equal(t, n, s.Len())
	// Every hundredth key is active again; the others have been full for
	// longer than the grace.
	later := t0 + 1000 + driver.ExpiryGrace
	for i := 0; i < n; i += 100 {
		drain(t, s, "key-"+strconv.Itoa(i), later)
	}
	require.Equal(t, n-n/100, must(s.DeleteExpired(context.Background(), time.UnixMilli(later))))
	require.Equal(t, n/100, s.Len())
	after := heapAlloc()
	grown, kept := int64(full)-int64(base), int64(after)-int64(base)
	t.Logf("heap: %d B before, %d B with %d records (%.0f B each), %d B with %d", base, full, n, float64(grown)/n, after, s.Len())
	require.Less(t, kept, grown/10, "the store kept %d of the %d bytes its records took, after dropping 99%% of them", kept, grown)
}

// Once most settlements' marks are dropped, the store gives their memory
// back too: 200,000 marks of which 99% were dropped kept all of the
// 15 MB they took, in a Go map, which never shrinks.
func TestHeapShrinksAfterDroppingMostMarks(t *testing.T) {
	ctx := context.Background()
	const n = 200_000
	const t0 = int64(1_700_000_000_000)
	s := must(memstore.New(memstore.WithClock(newStepClock(t0))))
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1e9, Period: 1000, Capacity: 1e9}
	settle := func(i int, until int64) driver.Decision {
		t.Helper()
		return cancelMark(t, s, p, i, t0, until)
	}
	// Every hundredth mark is kept for an hour, the others for a second.
	until := func(i int) int64 {
		if i%100 == 0 {
			return t0 + 3_600_000
		}
		return t0 + 1000
	}
	base := heapAlloc()
	for i := range n {
		settle(i, until(i))
	}
	full := heapAlloc()
	dropped := must(s.DeleteExpired(ctx, time.UnixMilli(t0+1000+driver.ExpiryGrace)))
	require.GreaterOrEqual(t, dropped, n-n/100, "the marks past their grace")
	after := heapAlloc()
	grown, kept := int64(full)-int64(base), int64(after)-int64(base)
	t.Logf("heap: %d B before, %d B with %d marks, %d B with %d", base, full, n, after, n/100)
	require.Less(t, kept, grown/10, "the store kept %d of the %d bytes its marks took, after dropping 99%% of them", kept, grown)
	for i := 0; i < n; i += 100 {
		require.Equal(t, driver.SettleCancel, settle(i, until(i)).Settled, "a mark kept is kept")
	}
	runtime.KeepAlive(s)
}

// A stream of one-off keys keeps the store's size near the records that
// may not be dropped yet (a minute's worth of keys, plus a few seconds of
// the ones waiting for their turn to be examined), without DeleteExpired.
func TestStreamOfKeysStaysBounded(t *testing.T) {
	const t0 = int64(1_700_000_000_000)
	c := newStepClock(t0)
	s := must(memstore.New(memstore.WithClock(c)))
	n := 150_000 // one key a millisecond: 150 s
	most := 0
	for i := range n {
		now := t0 + int64(i)
		c.ms.Store(now)
		drain(t, s, "once-"+strconv.Itoa(i), now)
		most = max(most, s.Len())
	}
	live := int(1000 + driver.ExpiryGrace) // keys not yet droppable at any time
	t.Logf("%d keys, at most %d records held; %d may not be dropped", n, most, live)
	require.Less(t, most, live+live/2)
}

// Records of keys gone idle are dropped while calls go on without new
// keys: writes to the keys still active sweep every stripe in turn, not
// only their own. After a burst of one-off keys, a single key written
// every 100 ms for hours left 98% of the burst's records held for good:
// only inserts swept the other stripes.
func TestIdleRecordsGoWhileOtherKeysAreWritten(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	c := newStepClock(t0)
	s := must(memstore.New(memstore.WithClock(c)))
	const n = 20_000
	for i := range n {
		drain(t, s, "once-"+strconv.Itoa(i), t0)
	}
	// The burst is droppable from a second and a grace on. Then one key is
	// written every 100 ms, through Apply and through a bound limit, for
	// two minutes more.
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 1000, Capacity: 10}
	b := s.Bind("bound", p, func(string) int64 { return 0 })
	op := &driver.Op{Items: []driver.Item{{Name: "l", Key: "steady", Count: 1, Shards: []driver.Shard{{Params: p}}}}}
	out := make([]driver.Decision, 1)
	for now := t0 + 1000; now < t0+1000+driver.ExpiryGrace+2*60_000; now += 100 {
		c.ms.Store(now)
		op.Now = now
		require.NoError(t, s.Apply(ctx, op, out))
		require.True(t, out[0].OK)
		v, err := b.Decide(ctx, "steady", driver.ModeLimit, now, 1, false)
		require.NoError(t, err)
		require.True(t, v.OK)
	}
	require.LessOrEqual(t, s.Len(), 2, "records of idle keys held, of %d", n)
}

// The tables hold their records under growth, sweeps, backward-shift
// deletes and shrinking: thousands of keys and two limits, calls at times
// that leave many records droppable, deletes, compared with Model decision
// by decision and record by record.
func TestManyKeysDifferential(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	c := newStepClock(t0)
	s, model := must(memstore.New(memstore.WithClock(c))), storetest.NewModel()
	rng := rand.New(rand.NewPCG(16, 11))
	params := map[string]driver.Params{
		"tb": {Kind: ratelimit.TokenBucket, Rate: 3, Period: 1000, Capacity: 5, MaxReserved: 5},
		"fw": {Kind: ratelimit.FixedWindow, Rate: 2, Period: 700, Capacity: 3, Phase: 123},
	}
	names := []string{"tb", "fw"}
	keys := make([]string, 3000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	now := t0
	steps := 60_000
	if testing.Short() {
		steps = 10_000
	}
	for step := range steps {
		if step%5000 == 0 {
			compareAll(t, ctx, s, model, params, keys, now, fmt.Sprint("step ", step))
			t.Logf("step %d: %d records held", step, s.Len())
		}
		switch rng.IntN(8000) {
		case 0: // a long pause: most records become droppable
			now += 2*driver.ExpiryGrace + rng.Int64N(10_000)
		default:
			now += rng.Int64N(3)
		}
		c.ms.Store(now)
		name := names[rng.IntN(2)]
		key := keys[min(rng.IntN(len(keys)), rng.IntN(len(keys)))] // some keys hotter
		id := driver.RecordID{Name: name, Key: key}
		if rng.IntN(50) == 0 {
			require.NoError(t, s.Delete(ctx, []driver.RecordID{id}))
			require.NoError(t, model.Delete(ctx, []driver.RecordID{id}))
			continue
		}
		op := &driver.Op{Now: now, Reserve: rng.IntN(4) == 0,
			Items: []driver.Item{{Name: name, Key: key, Count: float64(rng.IntN(4)), Shards: []driver.Shard{{Params: params[name]}}}}}
		if rng.IntN(5) == 0 {
			op.Mode = driver.ModeCheck
		}
		got, want := make([]driver.Decision, 1), make([]driver.Decision, 1)
		require.NoError(t, model.Apply(ctx, op, want))
		require.NoError(t, s.Apply(ctx, op, got))
		require.Equal(t, want, got, "step %d: %+v", step, op.Items[0])
	}
	compareAll(t, ctx, s, model, params, keys, now, "end")
}

// compareAll requires every record of keys to read the same, refreshed to
// now, from s and from model.
func compareAll(t *testing.T, ctx context.Context, s *memstore.Store, model *storetest.Model, params map[string]driver.Params, keys []string, now int64, where string) {
	t.Helper()
	ids := make([]driver.RecordID, 0, len(params)*len(keys))
	for _, k := range keys {
		for n := range params {
			ids = append(ids, driver.RecordID{Name: n, Key: k})
		}
	}
	g, w := make([]driver.Record, len(ids)), make([]driver.Record, len(ids))
	require.NoError(t, s.Load(ctx, ids, g))
	require.NoError(t, model.Load(ctx, ids, w))
	for i, id := range ids {
		p := params[id.Name]
		require.Equal(t, refresh(p, w[i], now), refresh(p, g[i], now), "%s: record %+v", where, id)
	}
}

func refresh(p driver.Params, r driver.Record, now int64) driver.State {
	return ratelimit.StateAt(p, r, now)
}

// A write through a bound limit leaves its record's expiry to the sweeps:
// resolved, it is ratelimit.FullAt of the record by the bound params.
func TestBoundExpiry(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 7))
	ctx := context.Background()
	s := must(memstore.New())
	for i := range 200_000 {
		p := driver.Params{
			Kind:   []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket}[rng.IntN(2)],
			Rate:   []float64{1, 3, 0.1, 1.0 / 3, 7.5, 1e9, 1e-9, 1e15}[rng.IntN(8)],
			Period: []int64{1, 7, 1000, 60_000, 86_400_000, ratelimit.MaxPeriod.Milliseconds()}[rng.IntN(6)],
		}
		p.Capacity = min(p.Rate*[]float64{1, 1.5, 3, 0.25}[rng.IntN(4)], ratelimit.MaxTokens)
		if p.Rate >= 1 && rng.IntN(2) == 0 {
			p.Capacity = math.Round(p.Capacity)
		}
		key := fmt.Sprint("k", i)
		b := s.Bind(fmt.Sprint("l", i%50), p, func(string) int64 { return 0 })
		now := int64(1_700_000_000_000) + rng.Int64N(1<<30)
		count := rng.Float64() * p.Capacity
		if rng.IntN(3) == 0 {
			count = math.Floor(count)
		}
		if count < ratelimit.MinCount { // 0 or a count no call asks
			count = 0
		}
		count = min(count, ratelimit.MaxTokens)
		v, err := b.Decide(ctx, key, driver.ModeLimit, now, count, rng.IntN(2) == 0)
		require.NoError(t, err)
		if !v.OK || count == 0 {
			continue
		}
		var rec [1]driver.Record
		require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: fmt.Sprint("l", i%50), Key: key}}, rec[:]))
		require.True(t, rec[0].Found)
		exp := memstore.ExpiryOf(s, fmt.Sprint("l", i%50), key)
		require.Equal(t, ratelimit.FullAt(p, rec[0].State), exp, "params %+v state %+v", p, rec[0].State)
		if exp != driver.Never {
			require.Equal(t, p.Capacity, ratelimit.StateAt(p, rec[0], exp).Remaining)
		}
	}
}

// Calls that find their records without the stripe's mutex stay exact
// while records are added, moved by deletes' shifts, and tables grow and
// shrink around them: 8 goroutines drain 300 keys of 40 tokens each
// through a bound limit and through Apply, while others add and drop
// thousands of records in the same stripes; every key grants exactly 40.
func TestExactWhileRecordsMove(t *testing.T) {
	ctx := context.Background()
	const (
		keys  = 300
		quota = 40
		t0    = int64(1_700_000_000_000) // all calls in one window
	)
	s := must(memstore.New())
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: quota, Period: 3_600_000, Capacity: quota}
	b := s.Bind("main", p, func(string) int64 { return 0 })
	var granted [keys]atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]driver.Decision, 1)
			for round := range 3 * quota {
				for k := range keys {
					key := fmt.Sprint("main-", (k+g*37)%keys)
					var ok bool
					if (round+k+g)%4 == 0 {
						op := &driver.Op{Now: t0, Items: []driver.Item{{Name: "main", Key: key, Count: 1, Shards: []driver.Shard{{Params: p}}}}}
						require.NoError(t, s.Apply(ctx, op, out))
						ok = out[0].OK
					} else {
						v, err := b.Decide(ctx, key, driver.ModeLimit, t0, 1, false)
						require.NoError(t, err)
						ok = v.OK
					}
					if ok {
						granted[(k+g*37)%keys].Add(1)
					}
				}
			}
		}()
	}
	churn := func(g int) {
		tb := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}
		out := make([]driver.Decision, 1)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Records long full by t0: DeleteExpired(t0) drops them.
			op := &driver.Op{Now: t0 - 3_600_000, Items: []driver.Item{{Name: "churn", Key: fmt.Sprint("churn-", g, "-", i%2000), Count: 1, Shards: []driver.Shard{{Params: tb}}}}}
			require.NoError(t, s.Apply(ctx, op, out))
			if i%200 == 199 {
				must(s.DeleteExpired(ctx, time.UnixMilli(t0)))
			}
		}
	}
	var cw sync.WaitGroup
	for g := range 2 {
		cw.Add(1)
		go func() { defer cw.Done(); churn(g) }()
	}
	wg.Wait()
	close(stop)
	cw.Wait()
	for k := range keys {
		require.Equal(t, int64(quota), granted[k].Load(), "key %d", k)
	}
}

// The refusal a record remembers answers only a call at the same elapsed
// time since the record's: one 2^48 ms before or after (within
// ±driver.MaxTime), whose elapsed time has the same low 16 bits, gets the
// transition's answer, as through Apply, not the remembered one.
func TestRecalledRefusalNeedsTheSameElapsedTime(t *testing.T) {
	ctx := context.Background()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	const t0 = int64(1_700_000_000_000)
	bound := must(memstore.New()).Bind("l", p, func(string) int64 { return 0 })
	ref := must(memstore.New())
	apply := func(now int64, count float64) driver.Decision {
		out := make([]driver.Decision, 1)
		op := &driver.Op{Now: now, Items: []driver.Item{{Name: "l", Key: "k", Count: count, Shards: []driver.Shard{{Params: p}}}}}
		require.NoError(t, ref.Apply(ctx, op, out))
		return out[0]
	}
	steps := []struct {
		now   int64
		count float64
	}{
		{t0, 10},            // drains the bucket
		{t0 + 1, 1},         // refused, and remembered: elapsed 1
		{t0 + 1, 1},         // the same refusal, remembered
		{t0 + 1 - 1<<48, 1}, // elapsed 1 - 2^48
		{t0 + 1 + 1<<48, 1}, // elapsed 1 + 2^48
	}
	for i, st := range steps {
		require.LessOrEqual(t, max(st.now, -st.now), driver.MaxTime)
		v, err := bound.Decide(ctx, "k", driver.ModeLimit, st.now, st.count, false)
		require.NoError(t, err)
		require.Equal(t, apply(st.now, st.count), v.Decision(st.now, st.count), "step %d", i)
	}
}

// An out shorter than the op's items is refused with an error, before
// the decision would panic holding the records' locks: the key's later
// calls, bound or not, are decided as ever.
func TestApplyRefusesAShortOut(t *testing.T) {
	ctx := context.Background()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	const t0 = int64(1_700_000_000_000)
	s := must(memstore.New())
	op := func(count float64, names ...string) *driver.Op { // of the key "k"
		op := &driver.Op{Now: t0}
		for _, n := range names {
			op.Items = append(op.Items, driver.Item{Name: n, Key: "k", Count: count, Shards: []driver.Shard{{Params: p}}})
		}
		return op
	}
	out := make([]driver.Decision, 2)
	require.NoError(t, s.Apply(ctx, op(1, "a", "b"), out)) // both records exist
	for _, short := range [][]driver.Decision{nil, out[:1]} {
		err := s.Apply(ctx, op(1, "a", "b"), short)
		require.ErrorContains(t, err, "an op of 2 items and an out of")
	}
	settle := op(1, "a", "b")
	settle.Mode, settle.Settle = driver.ModeRefund, &driver.Settlement{ID: [16]byte{1}, Kind: driver.SettleCancel, Until: t0 + 60_000}
	require.Error(t, s.Apply(ctx, settle, out[:1]))

	requireFreeAndCharged(t, s.Bind("b", p, func(string) int64 { return 0 }), "k", t0, 8, "op")
	require.NoError(t, s.Apply(ctx, op(1, "a", "b"), out))
	require.Equal(t, 8.0, out[0].Remaining)
}

// Decide refuses, as Apply does (driver.CheckOp), a count or a time that
// no valid op carries, before it reads or writes the record. Before, a
// count above 0 and below ratelimit.MinCount was granted on an empty
// bucket again and again (a decision forgives a shortfall below Noise),
// and a time beyond ±MaxTime was decided.
func TestDecideBounds(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	s := must(memstore.New())
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}
	b := s.Bind("bounds", p, func(string) int64 { return 0 })
	v, err := b.Decide(ctx, "k", driver.ModeLimit, t0, 1, false)
	require.NoError(t, err)
	require.True(t, v.OK)
	for _, c := range []struct {
		now   int64
		count float64
	}{
		{t0, ratelimit.MinCount / 100},
		{t0, ratelimit.MaxTokens * 2},
		{t0, -1},
		{t0, math.NaN()},
		{t0, math.Inf(1)},
		{driver.MaxTime + 1, 1},
		{-driver.MaxTime - 1, 1},
	} {
		for _, mode := range []driver.Mode{driver.ModeLimit, driver.ModeCheck} {
			v, err := b.Decide(ctx, "k", mode, c.now, c.count, false)
			require.ErrorIs(t, err, driver.ErrInvalidOp, "mode %d, now %d, count %v: granted %v", mode, c.now, c.count, v.OK)
		}
	}
	// The bounds themselves and 0 are decided.
	for _, count := range []float64{0, ratelimit.MinCount, ratelimit.MaxTokens} {
		_, err := b.Decide(ctx, "k", driver.ModeCheck, t0, count, false)
		require.NoError(t, err, "count %v", count)
	}
	_, err = b.Decide(ctx, "k", driver.ModeCheck, driver.MaxTime, 1, false)
	require.NoError(t, err)
}

// A limit bound with params that no valid op carries (driver.CheckOp), or
// whose phase function gives a phase outside [0, Period), is refused by
// every Decide with an error matching driver.ErrInvalidOp, as Apply
// refuses such an op (the phase only where it is used: for a missing
// record), and the key's record stays usable. Before, a fixed
// window of period 0 panicked with an integer division by zero while it
// held the record's lock, so that every later call on the key waited for
// ever, and a phase outside the period was decided.
func TestBindRefusesBadParams(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	good := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: 1000, Capacity: 10}
	noPhase := func(string) int64 { return 0 }
	for _, c := range []struct {
		name  string
		p     driver.Params
		phase func(string) int64
	}{
		{"period 0", driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: 0, Capacity: 10}, noPhase},
		{"negative period", driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: -5, Capacity: 10}, noPhase},
		{"rate 0", driver.Params{Kind: ratelimit.TokenBucket, Rate: 0, Period: 1000, Capacity: 10}, noPhase},
		{"NaN rate", driver.Params{Kind: ratelimit.TokenBucket, Rate: math.NaN(), Period: 1000, Capacity: 10}, noPhase},
		{"infinite capacity", driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: 1000, Capacity: math.Inf(1)}, noPhase},
		{"no kind", driver.Params{Kind: 7, Rate: 10, Period: 1000, Capacity: 10}, noPhase},
		{"negative phase", good, func(string) int64 { return -3 }},
		{"phase of a period", good, func(string) int64 { return 1000 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := must(memstore.New())
			// The key's record exists: the call on it finds it without
			// the stripe's mutex.
			v, err := s.Bind("l", good, noPhase).Decide(ctx, "old", driver.ModeLimit, t0, 1, false)
			require.NoError(t, err)
			require.True(t, v.OK)
			bad := s.Bind("l", c.p, c.phase)
			keys := []string{"old", "new"}
			if c.p == good { // a bad phase: a record found needs none
				keys = keys[1:]
			}
			for _, key := range keys {
				for _, mode := range []driver.Mode{driver.ModeLimit, driver.ModeCheck} {
					var v driver.Verdict
					var err error
					require.NotPanics(t, func() { v, err = bad.Decide(ctx, key, mode, t0+1, 1, false) }, "key %s, mode %d", key, mode)
					require.ErrorIs(t, err, driver.ErrInvalidOp, "key %s, mode %d: granted %v", key, mode, v.OK)
				}
			}
			requireFreeAndCharged(t, s.Bind("l", good, noPhase), "old", t0+2, 8, "call")
			require.Equal(t, 1, s.Len(), "a refused call added a record")
		})
	}
}

// TestNewRefusesANilClock: a nil clock, or one holding a nil pointer (a
// mock left unset), is refused by New, with an error matching
// ratelimit.ErrInvalidOption. Taken, the nil pointer made the store's
// first call panic.
func TestNewRefusesANilClock(t *testing.T) {
	for _, c := range []clock.Clock{nil, (*clock.Mock)(nil)} {
		var s *memstore.Store
		var err error
		require.NotPanics(t, func() { s, err = memstore.New(memstore.WithClock(c)) }, "%T", c)
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "%T", c)
		assert.ErrorContains(t, err, "memstore: WithClock")
		assert.Nil(t, s)
	}
}

// requireFreeAndCharged requires that a call of 1 token on key by bound,
// at now, is decided within 10 s (no refused op or call left the record
// locked) and granted, leaving remaining: the refused ones (what) charged
// nothing.
func requireFreeAndCharged(t *testing.T, bound driver.BoundLimit, key string, now int64, remaining float64, what string) {
	t.Helper()
	done := make(chan driver.Verdict, 1)
	go func() {
		v, err := bound.Decide(context.Background(), key, driver.ModeLimit, now, 1, false)
		assert.NoError(t, err)
		done <- v
	}()
	select {
	case v := <-done:
		require.True(t, v.OK)
		require.Equal(t, remaining, v.Remaining, "the refused %ss charged nothing", what)
	case <-time.After(10 * time.Second):
		t.Fatalf("the record is still locked by the refused %s", what)
	}
}

// endingCtx is a context that ends (its Err turns context.Canceled) once
// Err has been asked after times.
type endingCtx struct {
	context.Context
	after, asked atomic.Int32
}

func (c *endingCtx) Err() error {
	if c.asked.Add(1) > c.after.Load() {
		return context.Canceled
	}
	return nil
}

// DeleteExpired stops when its context ends midway, with what it dropped
// so far and the context's error, as a janitor's Close expects of a
// store's sweep: it went on through every stripe, however many records
// they held, and Close waited for all of it.
func TestDeleteExpiredStopsWhenItsContextEnds(t *testing.T) {
	const t0 = int64(1_700_000_000_000)
	s := must(memstore.New(memstore.WithClock(newStepClock(t0))))
	const n = 2000
	for i := range n {
		drain(t, s, "key-"+strconv.Itoa(i), t0)
	}
	later := time.UnixMilli(t0 + 1000 + driver.ExpiryGrace)
	ctx := &endingCtx{Context: context.Background()}
	ctx.after.Store(3)
	dropped, err := s.DeleteExpired(ctx, later)
	require.ErrorIs(t, err, context.Canceled)
	require.Less(t, dropped, n, "the sweep went on after its context ended")
	require.Equal(t, n-dropped, s.Len())
	rest, err := s.DeleteExpired(context.Background(), later)
	require.NoError(t, err)
	require.Equal(t, n-dropped, rest)
	require.Zero(t, s.Len())
}
