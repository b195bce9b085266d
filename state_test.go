package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// t0 is the start of the timelines below (a whole minute, so that windows
// of the fixed-window params, phase 0, start there).
const t0 int64 = 1_700_000_040_000

type step struct {
	at      int64 // ms after t0
	count   float64
	reserve bool
	ok      bool
	retry   int64   // ms
	remain  float64 // Remaining
}

func runTimeline(t *testing.T, p driver.Params, steps []step) {
	t.Helper()
	var s driver.State
	found := false
	for i, st := range steps {
		next, d := transition(p, s, found, t0+st.at, st.count, st.reserve)
		assert.Equal(t, st.ok, d.OK, "step %d: ok", i)
		assert.Equal(t, st.retry, d.RetryAfter, "step %d: retry-after", i)
		assert.InDelta(t, st.remain, d.Remaining, 1e-12, "step %d: remaining", i)
		if d.OK && st.count > 0 {
			s, found = next, true
		}
	}
}

func TestTransitionFixedWindow(t *testing.T) {
	p := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: 60_000, Capacity: 15}
	runTimeline(t, p, []step{
		{at: 0, count: 12, ok: true, remain: 3},                     // fresh: full at capacity 15
		{at: 10_000, count: 4, ok: false, retry: 50_000, remain: 3}, // one window grants 10
		{at: 10_000, count: 3, ok: true, remain: 0},
		{at: 60_000, count: 0, ok: true, remain: 10},                                   // next window: +10
		{at: 185_000, count: 15, ok: true, remain: 0},                                  // two more windows, capped at 15
		{at: 186_000, count: 25, reserve: true, ok: true, retry: 174_000, remain: -25}, // 3 windows
		{at: 187_000, count: 0, ok: false, retry: 173_000, remain: -25},                // owing
	})
}

func TestTransitionTokenBucket(t *testing.T) {
	p := driver.Params{Kind: driver.TokenBucket, Rate: 10, Period: 60_000, Capacity: 3, MaxReserved: 5}
	runTimeline(t, p, []step{
		{at: 0, count: 3, ok: true, remain: 0},
		{at: 1_000, count: 1, ok: false, retry: 5_000, remain: 10.0 / 60},
		{at: 6_000, count: 1, ok: true, remain: 0},
		{at: 6_000, count: 5, reserve: true, ok: true, retry: 30_000, remain: -5},
		{at: 6_000, count: 1, reserve: true, ok: false, retry: 6_000, remain: -5}, // until the debt fits MaxReserved
		{at: 12_000, count: 1, reserve: true, ok: true, retry: 30_000, remain: -5},
	})
}

func TestTransitionClockBackwards(t *testing.T) {
	for _, p := range []driver.Params{
		{Kind: driver.FixedWindow, Rate: 10, Period: 60_000, Capacity: 10},
		{Kind: driver.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10},
	} {
		s, d := transition(p, driver.State{}, false, t0+120_000, 4, false)
		require.True(t, d.OK)
		// 30 s back: no tokens removed, ts not moved back, none minted.
		back, d := transition(p, s, true, t0+90_000, 6, false)
		require.True(t, d.OK, p.Kind)
		assert.Equal(t, s.TS, back.TS, p.Kind)
		assert.Equal(t, 0.0, back.Remaining, p.Kind)
		_, d = transition(p, back, true, t0+90_000, 1, false)
		assert.False(t, d.OK, p.Kind)
		// the wait counts from the real now, past the stored time
		assert.Greater(t, d.RetryAfter, int64(30_000), p.Kind)
	}
}

func TestTransitionNoise(t *testing.T) {
	// 0.1 + 0.2 - 0.3 leaves 5.6e-17 of float noise; it is no debt.
	p := driver.Params{Kind: driver.TokenBucket, Rate: 1, Period: 1000, Capacity: 0.3}
	s, d := transition(p, driver.State{Remaining: 0.1 + 0.2, TS: t0}, true, t0, 0.3, false)
	require.True(t, d.OK)
	assert.Equal(t, 0.0, s.Remaining)
}

func TestWindowStartAndPhase(t *testing.T) {
	p := driver.Params{Kind: driver.FixedWindow, Period: 60_000, Phase: 7_000}
	assert.Equal(t, int64(1_020_007_000-60_000*0), windowStart(p, 1_020_007_000))
	assert.Equal(t, int64(967_000), windowStart(p, 1_000_000))
	assert.Equal(t, int64(-53_000), windowStart(p, -1)) // before the epoch: floor, not truncation
	assert.Equal(t, int64(7_000), windowStart(p, 7_000))
}

func TestFullAt(t *testing.T) {
	fw := driver.Params{Kind: driver.FixedWindow, Rate: 0.1, Period: 1000, Capacity: 0.3}
	tb := driver.Params{Kind: driver.TokenBucket, Rate: 0.1, Period: 1000, Capacity: 0.3}
	for _, p := range []driver.Params{fw, tb} {
		for _, v := range []float64{-1.7, 0, 0.1, 0.2, 0.29999999999999993} {
			s := driver.State{Remaining: v, TS: t0}
			at := FullAt(p, s)
			require.GreaterOrEqual(t, at, s.TS)
			// Full at FullAt, exactly as a fresh record would be...
			assert.Equal(t, p.Capacity, refresh(p, s, at).Remaining, "%v from %v", p.Kind, v)
			// ...and not a millisecond (fixed window: a window) earlier.
			before := at - 1
			if p.Kind == driver.FixedWindow {
				before = at - p.Period
			}
			assert.Less(t, refresh(p, s, before).Remaining, p.Capacity, "%v from %v", p.Kind, v)
		}
	}
	assert.Equal(t, int64(t0), FullAt(fw, driver.State{Remaining: 0.3, TS: t0}))
	// A refill too slow to compute never expires.
	assert.Equal(t, driver.Never, FullAt(driver.Params{Kind: driver.TokenBucket, Rate: 1e-300, Period: 1, Capacity: 1}, driver.State{TS: t0}))
}

func TestRetryMillis(t *testing.T) {
	assert.Equal(t, int64(0), retryMillis(math.NaN()))
	assert.Equal(t, int64(0), retryMillis(-3))
	assert.Equal(t, int64(167), retryMillis(166.00000001))
	assert.Equal(t, driver.MaxRetryAfter, retryMillis(math.Inf(1)))
}

// decimalRates are rates whose arithmetic with counts in tenths leaves
// float noise.
var decimalRates = []float64{0.1, 0.3, 0.7, 1, 1.3, 2.5, 1.0 / 3, 10}

// tenths draws a count in tenths of a token in [0, most], or most itself.
func tenths(rng *rand.Rand, most float64) float64 {
	if rng.IntN(8) == 0 {
		return most
	}
	return math.Min(float64(rng.IntN(int(most*10)+1))/10, most)
}

// reach is the largest count a call may ask of one record of p.
func reach(p driver.Params, reserve bool) float64 {
	switch {
	case !reserve:
		return p.Capacity
	case p.MaxReserved == 0:
		return 2 * p.Capacity
	}
	return p.Capacity + p.MaxReserved
}

// A refused call is told the least wait after which the same call
// succeeds on the record as stored: it succeeds exactly then, under the
// transition's own comparison, and not a window (fixed window) or a
// millisecond (token bucket) before. A reservation is told when its
// tokens will have been granted: then, and not a step before, the record
// it wrote owes nothing beyond the noise (a call of no tokens succeeds).
// Rates, counts and debts in tenths leave float noise in every shortfall,
// which used to cost a fixed window a whole window more, and a token
// bucket a millisecond.
func TestRetryAfterIsTheLeastWait(t *testing.T) {
	for _, kind := range []driver.Kind{driver.FixedWindow, driver.TokenBucket} {
		t.Run(kind.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(kind)))
			refused, reserved := 0, 0
			for i := range 30_000 {
				rate := decimalRates[rng.IntN(len(decimalRates))]
				p := driver.Params{Kind: kind, Rate: rate, Period: []int64{1000, 60_000, 7}[rng.IntN(3)],
					Capacity: rate * []float64{1, 3, 1.5}[rng.IntN(3)]}
				if i%4 == 3 {
					// A few times the noise per step: the tokens of a whole
					// number of steps land on the noise itself, and only the
					// transition's own arithmetic, refilling the record as
					// stored, tells the step that grants from the one before.
					p.Rate, p.Period = []float64{1e-6, 2e-6, 3e-9}[rng.IntN(3)], []int64{1, 7, 1000}[rng.IntN(3)]
					p.Capacity = float64(1+rng.IntN(5)) / 10
				}
				if rng.IntN(2) == 0 {
					p.MaxReserved = tenths(rng, p.Capacity)
				}
				// The record as a few calls, each a while after the last,
				// left it.
				now := t0
				var rec driver.State
				found := false
				for range 1 + rng.IntN(4) {
					now += rng.Int64N(2 * p.Period)
					reserve := rng.IntN(3) == 0
					next, d := transition(p, rec, found, now, tenths(rng, reach(p, reserve)), reserve)
					if d.OK {
						rec, found = next, true
					}
				}
				now += rng.Int64N(p.Period)
				reserve := rng.IntN(3) == 0
				count := tenths(rng, reach(p, reserve))
				next, d := transition(p, rec, found, now, count, reserve)
				where := func() string {
					return fmt.Sprintf("case %d: %+v record %+v (found %v) now %d count %v reserve %v: %+v",
						i, p, rec, found, now, count, reserve, d)
				}
				if d.RetryAfter == 0 || d.RetryAfter == driver.MaxRetryAfter {
					continue
				}
				// The call that succeeds at the wait, and not a step before.
				on, c, r := rec, count, reserve
				switch {
				case !d.OK:
					refused++
				case next.Remaining < 0:
					on, c, r = next, 0, false // the tokens owed granted
					reserved++
				default:
					continue
				}
				okAt := func(at int64) bool {
					_, d := transition(p, on, true, at, c, r)
					return d.OK
				}
				at := now + d.RetryAfter
				require.True(t, okAt(at), "%s: not OK at the wait", where())
				before := at - 1
				if kind == driver.FixedWindow {
					before = at - p.Period
				}
				if before > now {
					require.False(t, okAt(before), "%s: OK already a step before the wait", where())
				}
			}
			t.Logf("%d refused calls, %d reservations", refused, reserved)
			require.Greater(t, refused, 1000)
			require.Greater(t, reserved, 1000)
		})
	}
}

func TestEvaluatePair(t *testing.T) {
	p := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: 60_000, Capacity: 10}
	op := func(count float64, reserve bool) *driver.Op {
		return &driver.Op{Now: t0, Reserve: reserve, Items: []driver.Item{{Name: "n", Key: "k", Count: count,
			Shards: []driver.Shard{{Index: 0, Params: p}, {Index: 1, Params: p}}}}}
	}
	out := make([]driver.Decision, 1)
	next := make([]driver.Update, 2)
	prev := []driver.Record{{State: driver.State{Remaining: 4, TS: t0}, Found: true}, {State: driver.State{Remaining: 7, TS: t0}, Found: true}}

	// One shard suffices: the one left with more tokens.
	require.True(t, Evaluate(op(3, false), prev, out, next))
	assert.False(t, next[0].Write)
	assert.Equal(t, driver.Update{State: driver.State{Remaining: 4, TS: t0}, Write: true}, next[1])
	assert.Equal(t, [2]float64{0, 3}, out[0].Charged)

	// Neither alone, both together: debited to equal values.
	require.True(t, Evaluate(op(9, false), prev, out, next))
	assert.Equal(t, 1.0, next[0].State.Remaining)
	assert.Equal(t, 1.0, next[1].State.Remaining)
	assert.Equal(t, [2]float64{3, 6}, out[0].Charged)
	assert.Equal(t, 2.0, out[0].Remaining)

	// Not even together: denied, the larger wait, nothing written.
	require.False(t, Evaluate(op(12, false), prev, out, next))
	assert.False(t, next[0].Write || next[1].Write)
	assert.Equal(t, int64(60_000), out[0].RetryAfter)

	// A reservation: a shard in debt is not charged to lift the other.
	prev[0].State.Remaining = -5
	require.True(t, Evaluate(op(9, true), prev, out, next))
	assert.False(t, next[0].Write)
	assert.Equal(t, -2.0, next[1].State.Remaining)
	assert.Equal(t, int64(60_000), out[0].RetryAfter)
}

func TestEvaluateAllOrNothingAndCheck(t *testing.T) {
	p := driver.Params{Kind: driver.TokenBucket, Rate: 10, Period: 1000, Capacity: 10}
	op := &driver.Op{Now: t0, Items: []driver.Item{
		{Name: "a", Key: "k", Count: 5, Shards: []driver.Shard{{Params: p}}},
		{Name: "b", Key: "k", Count: 11, Shards: []driver.Shard{{Params: driver.Params{Kind: driver.TokenBucket, Rate: 10, Period: 1000, Capacity: 20}}}},
	}}
	prev := []driver.Record{{}, {State: driver.State{Remaining: 3, TS: t0}, Found: true}}
	out := make([]driver.Decision, 2)
	next := make([]driver.Update, 2)
	assert.False(t, Evaluate(op, prev, out, next))
	assert.True(t, out[0].OK)
	assert.False(t, out[1].OK)
	assert.False(t, next[0].Write || next[1].Write, "a refused op writes nothing")
	op.Items[1].Count = 2
	op.Mode = driver.ModeCheck
	assert.True(t, Evaluate(op, prev, out, next))
	assert.False(t, next[0].Write || next[1].Write, "a check writes nothing")
	op.Mode = driver.ModeLimit
	assert.True(t, Evaluate(op, prev, out, next))
	assert.True(t, next[0].Write && next[1].Write)
}
