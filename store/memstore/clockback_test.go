package memstore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// A calls' clock ahead at the store's first call, which drains a key
// there and comes back, is refused on that key (its window lies ahead):
// refusals write nothing, and the sweeps never saw the clock come back.
// When it went ahead again, minutes later, they dropped the record, and
// once it came back the key was full (the Model, which keeps every
// record, refuses).
func TestClockBackWithRefusalsOnlyMintsNothing(t *testing.T) {
	ctx := context.Background()
	const start = int64(1_700_000_040_000)
	const ahead = start + 3*3_600_000
	c := newStepClock(0)
	s := must(memstore.New(memstore.WithClock(c)))
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: 60_000, Capacity: 10}
	b := s.Bind("l", p, func(string) int64 { return 0 })
	v, err := b.Decide(ctx, "drained", driver.ModeLimit, ahead, 10, false)
	require.NoError(t, err)
	require.True(t, v.OK)

	// The clock comes back: the key's window is ahead, and it is refused.
	for i := range 3 {
		v, err := b.Decide(ctx, "drained", driver.ModeLimit, start+int64(i)*10, 1, false)
		require.NoError(t, err)
		require.False(t, v.OK)
	}

	// Five minutes later the clock is ahead again, and calls on other keys
	// sweep.
	const later = 5 * 60_000
	c.ms.Store(later)
	for i := range 5000 {
		_, err := b.Decide(ctx, "other-"+strconv.Itoa(i), driver.ModeLimit, ahead+later, 1, false)
		require.NoError(t, err)
	}
	v, err = b.Decide(ctx, "drained", driver.ModeLimit, start+later, 1, false)
	require.NoError(t, err)
	require.False(t, v.OK, "the key's window, drained ahead of the clock, was full again")
}

// The store decides as the Model, which never drops a record, decision by
// decision, while the calls come from clocks apart (Limiters on one store,
// or one clock that jumps ahead and back between them): each clock runs
// with the store's, from its own offset, give or take a few milliseconds
// out of order, and the first call is on a random one of them, ahead or
// not. Pauses of minutes let the sweeps drop records, and thousands of
// keys make them sweep. A clock may stand still for up to half a grace
// while the store's runs (a mock not moved), which the sweeps must not
// take for a clock gone ahead. Every clock makes a call before any record may
// be dropped: a clock the store has never seen, behind the others, may
// find a record of theirs dropped, as any store's expiry would.
func TestClocksApartDifferential(t *testing.T) {
	seeds, steps := 24, 2000
	if testing.Short() {
		seeds = 6
	}
	offsets := []int64{-2 * 3_600_000, -10 * 60_000, 0, 90_000, 5 * 60_000, 3 * 3_600_000, 24 * 3_600_000}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { clocksApart(t, seed, steps, offsets, 2, 4) })
	}
}

// More clocks than a sweep schedule keeps apart (backs, behind the
// latest): five to nine, whose calls take each other's back times. They
// step more often, and the sweeps still judge records by the earliest.
func TestManyClocksApartDifferential(t *testing.T) {
	seeds, steps := 12, 3000
	if testing.Short() {
		seeds = 4
	}
	offsets := []int64{-24 * 3_600_000, -5 * 3_600_000, -2 * 3_600_000, -10 * 60_000, -3 * 60_000, 0,
		90_000, 5 * 60_000, 20 * 60_000, 3 * 3_600_000, 7 * 3_600_000, 24 * 3_600_000}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { clocksApart(t, seed, steps, offsets, 5, 9) })
	}
}

// clocksApart is one run of TestClocksApartDifferential: from least to
// most clocks, each at one of offsets.
func clocksApart(t *testing.T, seed uint64, steps int, offsets []int64, least, most int) {
	ctx := context.Background()
	const base = int64(1_700_000_000_000)
	rng := rand.New(rand.NewPCG(seed, 43))
	p := driver.Params{
		Kind:   []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket}[rng.IntN(2)],
		Rate:   []float64{1, 3, 10}[rng.IntN(3)],
		Period: []int64{1000, 10_000, 60_000}[rng.IntN(3)],
	}
	p.Capacity = p.Rate * []float64{1, 2}[rng.IntN(2)]
	if rng.IntN(2) == 0 {
		p.MaxReserved = p.Capacity
	}
	if p.Kind == ratelimit.FixedWindow {
		p.Phase = rng.Int64N(p.Period)
	}
	// The first call is on any of the clocks.
	clocks := make([]int64, 0, most)
	for _, i := range rng.Perm(len(offsets))[:least+rng.IntN(most-least+1)] {
		clocks = append(clocks, offsets[i])
	}
	real := int64(0)
	c := newStepClock(real)
	s, model := must(memstore.New(memstore.WithClock(c))), storetest.NewModel()
	b := s.Bind("l", p, func(string) int64 { return p.Phase })
	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	// A clock may stand still, with no call, while the store's runs, for
	// up to half the grace (the package doc's bound is the grace), once a
	// sweep step has seen it since it last stood still: a granted write
	// three steps of its time later.
	still, seen := make([]int64, len(clocks)), make([]bool, len(clocks))
	for i := range seen {
		seen[i] = true
	}
	cur := 0
	for step := range steps {
		switch r := rng.IntN(200); {
		case r == 0: // a pause: records of the clocks behind may go
			real += driver.ExpiryGrace + rng.Int64N(3*driver.ExpiryGrace)
		case r == 1 && step >= len(clocks) && seen[cur]: // the clock stands still
			pause := 1 + rng.Int64N(driver.ExpiryGrace/2)
			real += pause
			clocks[cur] -= pause
			still[cur], seen[cur] = base+clocks[cur]+real, false
			if rng.IntN(2) == 0 {
				cur = rng.IntN(len(clocks))
			}
		case r < 20:
			real += rng.Int64N(2000)
		default:
			real += rng.Int64N(30)
		}
		c.ms.Store(real)
		switch {
		case step < len(clocks): // every clock is seen before anything may go
			cur = step
		case rng.IntN(100) == 0:
			cur = rng.IntN(len(clocks))
		}
		now := base + clocks[cur] + real - rng.Int64N(4)
		key := keys[min(rng.IntN(len(keys)), rng.IntN(len(keys)))] // some keys hotter
		count := []float64{1, 1, 1, 0, 0.5, p.Capacity}[rng.IntN(6)]
		reserve := rng.IntN(8) == 0
		mode := driver.ModeLimit
		if rng.IntN(5) == 0 || step < len(clocks) && rng.IntN(2) == 0 { // a clock's first call may write nothing
			mode = driver.ModeCheck
		}
		op := &driver.Op{Mode: mode, Now: now, Reserve: reserve,
			Items: []driver.Item{{Name: "l", Key: key, Count: count, Shards: []driver.Shard{{Params: p}}}}}
		want := make([]driver.Decision, 1)
		require.NoError(t, model.Apply(ctx, op, want))
		var got driver.Decision
		if rng.IntN(2) == 0 {
			v, err := b.Decide(ctx, key, mode, now, count, reserve)
			require.NoError(t, err)
			got = v.Decision(now, count)
		} else {
			out := make([]driver.Decision, 1)
			require.NoError(t, s.Apply(ctx, op, out))
			got = out[0]
		}
		require.Equal(t, want[0], got, "step %d: clocks %v, on %v at %d (real %d), key %s, count %v, mode %d, reserve %v, params %+v",
			step, clocks, clocks[cur], now, real, key, count, mode, reserve, p)
		if mode == driver.ModeLimit && count > 0 && got.OK && now >= still[cur]+3*100 {
			seen[cur] = true
		}
	}
	lowest := base + slices.Min(clocks) + real
	compareAll(t, ctx, s, model, map[string]driver.Params{"l": p}, keys, lowest, "end")
}

// Two Limiters on one store, one clock a day behind the other: the sweeps
// judge every record by the clock behind (it may still need any of
// them), so those of the clock ahead are kept a day longer. The store
// then holds a day of the clock ahead's keys, not more, and DeleteExpired
// at the time of the clock ahead drops them.
func TestClockADayBehindKeepsADayOfKeys(t *testing.T) {
	ctx := context.Background()
	const base = int64(1_700_000_000_000)
	const day = 24 * 3_600_000
	c := newStepClock(0)
	s := must(memstore.New(memstore.WithClock(c)))
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}
	b := s.Bind("l", p, func(string) int64 { return 0 })
	const perMinute = 10 // new keys of the clock ahead, a minute
	most, key := 0, 0
	for real := int64(0); real < 3*day; real += 60_000 {
		c.ms.Store(real)
		for i := range perMinute {
			now := base + real + int64(i)*1000
			v, err := b.Decide(ctx, "ahead-"+strconv.Itoa(key), driver.ModeLimit, now, 1, false)
			require.NoError(t, err)
			require.True(t, v.OK)
			key++
			v, err = b.Decide(ctx, "behind-"+strconv.Itoa(i), driver.ModeLimit, now-day, 1, false)
			require.NoError(t, err)
		}
		most = max(most, s.Len())
	}
	const kept = day / 60_000 * perMinute // a day of the clock ahead's keys
	t.Logf("%d keys of the clock ahead, at most %d records held", key, most)
	require.Greater(t, most, kept, "the records of the clock ahead went before the clock behind reached them")
	require.Less(t, most, kept+kept/4, "the store held more than a day of the clock ahead's keys")
	n, err := s.DeleteExpired(ctx, time.UnixMilli(base+3*day))
	require.NoError(t, err)
	require.Greater(t, n, kept-kept/10)
	require.Less(t, s.Len(), 2*perMinute, "records kept after DeleteExpired at the time of the clock ahead")
}

// A store clock that never moves, or moves back, or leaps by centuries,
// with calls at ±driver.MaxTime: the time passed saturates (a
// time.Duration holds ±292 years) and the sweeps' time stays far within
// int64, and a store clock that never moves or moves back lets no sweep
// drop a record the calls may need.
func TestStoreClockAtItsExtremes(t *testing.T) {
	ctx := context.Background()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}
	for _, tc := range []struct {
		name        string
		first, then int64 // the store's clock at the first call, and after
	}{
		{"still", 0, 0},
		{"back", 0, -3_600_000},
		{"back by centuries", math.MaxInt64 / 2, math.MinInt64 / 2},
		{"ahead by centuries", math.MinInt64 / 2, math.MaxInt64 / 2},
	} {
		for _, first := range []int64{-driver.MaxTime, 0, driver.MaxTime} {
			t.Run(fmt.Sprint(tc.name, "/first=", first), func(t *testing.T) {
				c := newStepClock(tc.first)
				s := must(memstore.New(memstore.WithClock(c)))
				b := s.Bind("l", p, func(string) int64 { return 0 })
				_, err := b.Decide(ctx, "first", driver.ModeLimit, first, 1, false)
				require.NoError(t, err)
				c.ms.Store(tc.then)
				const at = int64(1_700_000_000_000)
				v, err := b.Decide(ctx, "drained", driver.ModeLimit, at, 1, false)
				require.NoError(t, err)
				require.True(t, v.OK)
				// Calls at the end of time, on keys of every stripe, sweep.
				calls(t, s, b, p, driver.MaxTime)
				v, err = b.Decide(ctx, "drained", driver.ModeLimit, at+500, 1, false)
				require.NoError(t, err)
				if tc.then <= tc.first {
					require.False(t, v.OK, "a drained record was dropped")
				}
				// And at its start, then DeleteExpired at either end.
				calls(t, s, b, p, -driver.MaxTime)
				must(s.DeleteExpired(ctx, time.UnixMilli(math.MinInt64)))
				must(s.DeleteExpired(ctx, time.UnixMilli(math.MaxInt64)))
				require.LessOrEqual(t, s.Len(), 6001, "records held but those of the end of time, full only past it")
			})
		}
	}
}

// calls makes 3,000 calls at now on new keys, half through a bound limit
// and half through Apply.
func calls(t *testing.T, s *memstore.Store, b driver.BoundLimit, p driver.Params, now int64) {
	t.Helper()
	ctx := context.Background()
	for i := range 3000 {
		_, err := b.Decide(ctx, fmt.Sprint("k", now, "-", i), driver.ModeLimit, now, 1, false)
		require.NoError(t, err)
		op := &driver.Op{Now: now, Items: []driver.Item{{Name: "l", Key: fmt.Sprint("a", now, "-", i), Count: 1, Shards: []driver.Shard{{Params: p}}}}}
		require.NoError(t, s.Apply(ctx, op, make([]driver.Decision, 1)))
	}
}

// A calls' clock left still, with no call, while the store's clock runs
// (a mock not moved for minutes of real time), then ahead, where calls on
// other keys sweep, then back: the sweeps took the clock to have run with
// the store's, and judge records by where it would be. A record it
// drained is kept while the lag is at most the grace past the time the
// record is full again, as the package doc says; past that it is dropped,
// and the clock, back, finds a full bucket. No store that keeps bounded
// memory keeps them for any lag: a clock left still is, until it calls,
// the same to the store as one gone for good, for which keeping every
// record written since its last call would hold every key that other
// clocks write, without end.
func TestClockLeftStillKeepsRecordsForTheGrace(t *testing.T) {
	ctx := context.Background()
	const start = int64(1_700_000_040_000) // a window's start
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: 60_000, Capacity: 10}
	const full = 60_000 // the drained window is full again a period after start
	for _, tc := range []struct {
		lag  int64
		kept bool
	}{
		{10_000, true},
		{driver.ExpiryGrace, true},
		{full + driver.ExpiryGrace - 1, true},
		{full + driver.ExpiryGrace, false}, // the limit the package doc states
	} {
		t.Run(fmt.Sprint("lag=", tc.lag), func(t *testing.T) {
			c := newStepClock(0)
			s := must(memstore.New(memstore.WithClock(c)))
			b := s.Bind("l", p, func(string) int64 { return 0 })
			v, err := b.Decide(ctx, "drained", driver.ModeLimit, start, 10, false)
			require.NoError(t, err)
			require.True(t, v.OK)
			c.ms.Store(tc.lag) // the calls' clock stands still at start
			for i := range 5000 {
				_, err := b.Decide(ctx, "other-"+strconv.Itoa(i), driver.ModeLimit, start+3*3_600_000, 1, false)
				require.NoError(t, err)
			}
			v, err = b.Decide(ctx, "drained", driver.ModeLimit, start+1000, 1, false)
			require.NoError(t, err)
			require.Equal(t, !tc.kept, v.OK, "the drained window was full again: %v", v.OK)
		})
	}
}

// The calls of five to nine clocks far apart, each on its own goroutine,
// race on the sweep schedules' back times (the stripes' and the marks'):
// two calls may both find one due and both move it, and a clock not seen
// before takes another's. That may only make clocks step more often: the
// store decides as the Model, each clock on keys of its own, while
// records and settlements' marks of every clock go, and a settlement made
// again within the grace of its expiry finds its mark. The
// store's clock moves with the calls' (a pause of minutes waits for the
// calls under way, so that none reads a time left behind).
func TestClocksApartConcurrently(t *testing.T) {
	ctx := context.Background()
	const base = int64(1_700_000_000_000)
	offsets := []int64{-24 * 3_600_000, -5 * 3_600_000, -2 * 3_600_000, -10 * 60_000, 0,
		90_000, 5 * 60_000, 3 * 3_600_000, 24 * 3_600_000}
	steps := 3000
	if testing.Short() {
		steps = 1000
	}
	for _, clocks := range []int{5, 9} {
		t.Run(fmt.Sprint("clocks=", clocks), func(t *testing.T) {
			c := newStepClock(0)
			s := must(memstore.New(memstore.WithClock(c)))
			p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 2, Period: 1000, Capacity: 2}
			b := s.Bind("l", p, func(string) int64 { return 0 })
			var paused sync.RWMutex // a pause holds it; a call, reading the time, shares it
			var wg sync.WaitGroup
			errs := make(chan error, clocks)
			for g := range clocks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 47))
					model := storetest.NewModel()
					var settled []*driver.Op
					for step := range steps {
						if rng.IntN(400) == 0 {
							paused.Lock()
							c.ms.Add(driver.ExpiryGrace + rng.Int64N(2*driver.ExpiryGrace))
							paused.Unlock()
						}
						paused.RLock()
						now := base + offsets[g] + c.ms.Add(rng.Int64N(3)) - rng.Int64N(4)
						key := fmt.Sprint("c", g, "-", min(rng.IntN(300), rng.IntN(300)))
						count := []float64{1, 1, 2, 0.5}[rng.IntN(4)]
						op := &driver.Op{Now: now, Items: []driver.Item{{Name: "l", Key: key, Count: count, Shards: []driver.Shard{{Params: p}}}}}
						switch r := rng.IntN(20); {
						case r == 0: // a settlement
							var id [16]byte
							binary.BigEndian.PutUint64(id[:], uint64(g)<<32|uint64(step)+1)
							op.Mode, op.Items[0].At = driver.ModeRefund, now-rng.Int64N(1000)
							op.Settle = &driver.Settlement{ID: id, Kind: driver.SettleCancel, Until: now + rng.Int64N(5000), Settler: id}
							settled = append(settled, op)
						case r == 1 && len(settled) > 0: // one again, its mark still needed
							i := rng.IntN(len(settled))
							if again := settled[i]; now <= again.Settle.Until+driver.ExpiryGrace/2 {
								op = again
								op.Now = now
							} else {
								settled = slices.Delete(settled, i, i+1)
							}
						}
						want := make([]driver.Decision, 1)
						err := model.Apply(ctx, op, want)
						var got driver.Decision
						if err == nil && op.Mode == driver.ModeLimit && rng.IntN(2) == 0 {
							var v driver.Verdict
							v, err = b.Decide(ctx, key, driver.ModeLimit, now, count, false)
							got = v.Decision(now, count)
						} else if err == nil {
							out := make([]driver.Decision, 1)
							err = s.Apply(ctx, op, out)
							got = out[0]
						}
						paused.RUnlock()
						if err == nil && got != want[0] {
							err = fmt.Errorf("clock %d, step %d: key %s at %d, count %v, settlement %v: got %+v, want %+v",
								g, step, key, now, count, op.Settle != nil, got, want[0])
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			t.Logf("%d records held", s.Len())
		})
	}
}
