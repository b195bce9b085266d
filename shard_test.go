package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// applyPair decides one call on two records of a sharded limit, as a
// store would, and writes the updates.
func applyPair(recs []driver.Record, p driver.Params, a, b int, now int64, count float64, reserve bool) driver.Decision {
	op := &driver.Op{Now: now, Reserve: reserve, Items: []driver.Item{{Count: count, Shards: []driver.Shard{{Index: a, Params: p}, {Index: b, Params: p}}}}}
	prev := []driver.Record{recs[a], recs[b]}
	out := make([]driver.Decision, 1)
	next := make([]driver.Update, 2)
	Evaluate(op, prev, out, next)
	if next[0].Write {
		recs[a] = driver.Record{State: next[0].State, Found: true}
	}
	if next[1].Write {
		recs[b] = driver.Record{State: next[1].State, Found: true}
	}
	return out[0]
}

// Reservations on a sharded fixed window schedule no more jobs into a
// window than the unsharded limit would: 100 per window for a limit of 100
// split over shards whose shares are whole tokens. A debt spread over two
// shards left half tokens on each, and jobs that later took them ran in
// the next window with tokens of this one: 101–103 jobs in a window.
func TestShardedReservationsKeepEveryWindowWithinTheLimit(t *testing.T) {
	for _, shards := range []int{2, 4, 5} {
		for _, maxReserved := range []float64{50, 200} {
			t.Run(fmt.Sprintf("shards=%d/maxReserved=%v", shards, maxReserved), func(t *testing.T) {
				cfg := Config{Kind: driver.FixedWindow, Rate: 100, Period: time.Second, MaxReserved: maxReserved, Shards: shards}
				p := cfg.params() // Start shared: phase 0
				rng := rand.New(rand.NewPCG(uint64(shards), uint64(maxReserved)))
				recs := make([]driver.Record, shards)
				jobs := map[int64]int{}
				now := t0
				for range 20_000 {
					now += rng.Int64N(12)
					a := rng.IntN(shards)
					b := (a + 1 + rng.IntN(shards-1)) % shards
					d := applyPair(recs, p, a, b, now, 1, true)
					if d.OK {
						jobs[(now+d.RetryAfter)/1000]++
					}
				}
				for w, n := range jobs {
					require.LessOrEqual(t, n, 100, "window %d: %d jobs", w, n)
				}
			})
		}
	}
}

// okAt reports whether a call of count on shards a and b, judged at t,
// would be OK: the oracle of the least-wait tests.
func okAt(recs []driver.Record, p, q driver.Params, t int64, count float64, reserve bool) bool {
	_, _, _, _, ok := split(p, q, StateAt(p, recs[0], t), StateAt(q, recs[1], t), t, count, reserve)
	return ok
}

// A refused sharded call is told the least wait after which the same call
// on the same two shards succeeds, found here by trying every candidate
// time: each window start of either shard, or every millisecond of a
// token bucket. TestShardedRetryAfterIsTheLeastWait asks it through the
// Limiter.
func TestPairRetryAfterIsTheLeastWait(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	exact, refused := 0, 0
	for i := range 4000 {
		kind := driver.FixedWindow
		if i%3 == 2 {
			kind = driver.TokenBucket
		}
		shards := 2 + rng.IntN(4)
		cfg := Config{Kind: kind, Rate: []float64{100, 10, 7, 2.5}[rng.IntN(4)], Period: time.Duration(1+rng.IntN(3)) * time.Second, Shards: shards}
		if rng.IntN(2) == 0 {
			cfg.Capacity = cfg.Rate * (1 + 2*rng.Float64())
		}
		if rng.IntN(2) == 0 {
			cfg.MaxReserved = cfg.Rate * rng.Float64() * 2
		}
		p, q := cfg.params(), cfg.params()
		if kind == driver.FixedWindow && rng.IntN(2) == 0 { // derived phases differ per shard
			p.Phase, q.Phase = rng.Int64N(p.Period), rng.Int64N(q.Period)
		}
		// Two records somewhere between their debt bound and full.
		low := -p.Capacity
		if cfg.MaxReserved > 0 {
			low = -p.MaxReserved
		}
		now := t0 + rng.Int64N(p.Period)
		recs := make([]driver.Record, 2)
		for j, pr := range []driver.Params{p, q} {
			v := low + rng.Float64()*(pr.Capacity-low)
			recs[j] = driver.Record{State: fresh(pr, now-rng.Int64N(pr.Period)), Found: true}
			recs[j].State.Remaining = v
		}
		reserve := rng.IntN(3) == 0
		reach := 2 * p.Capacity
		if reserve && cfg.MaxReserved > 0 {
			reach = 2 * (p.Capacity + p.MaxReserved)
		}
		count := rng.Float64() * reach
		if rng.IntN(3) == 0 {
			count = float64(int(count))
		}
		d, _, _ := pair(p, q, recs[0], recs[1], now, count, reserve)
		if d.OK {
			continue
		}
		refused++
		where := fmt.Sprintf("case %d: %+v %+v recs %+v now %d count %v reserve %v: retry %d", i, p, q, recs, now, count, reserve, d.RetryAfter)
		// Never longer: no earlier candidate succeeds.
		horizon := now + d.RetryAfter
		if kind == driver.FixedWindow {
			for _, pr := range []driver.Params{p, q} {
				for w := windowStart(pr, now) + pr.Period; w < horizon && w < now+1000*pr.Period; w += pr.Period {
					require.False(t, okAt(recs, p, q, w, count, reserve), "%s: OK already at %d", where, w)
				}
			}
		} else {
			for tt := now; tt < horizon && tt < now+20*p.Period; tt++ {
				require.False(t, okAt(recs, p, q, tt, count, reserve), "%s: OK already at %d", where, tt)
			}
		}
		if okAt(recs, p, q, horizon, count, reserve) {
			exact++
		}
	}
	t.Logf("%d refused calls, %d told exactly the least wait", refused, exact)
	require.Greater(t, refused, 500)
	require.Equal(t, refused, exact, "every refused call is told exactly when it would succeed")
}

// The case of the report: a 4-shard limit of 100 per hour whose shards
// share one Start, count 30 at 00:30. Every pair is full again at 01:00,
// when the call succeeds on any two shards; it used to be told 1h30m.
func TestShardedRetryAfterSharedStart(t *testing.T) {
	cfg := Config{Kind: driver.FixedWindow, Rate: 100, Period: time.Hour, Shards: 4, Start: time.UnixMilli(0)}
	p := cfg.params()
	hour := int64(3_600_000)
	start := (t0 / hour) * hour
	for _, vals := range [][2]float64{{10, 5}, {0, 0}, {25, 4}, {14.5, 15}, {1, 28.9 - 25}} {
		recs := []driver.Record{
			{State: driver.State{Remaining: vals[0], TS: start}, Found: true},
			{State: driver.State{Remaining: vals[1], TS: start}, Found: true},
		}
		d, _, _ := pair(p, p, recs[0], recs[1], start+hour/2, 30, false)
		require.False(t, d.OK, "%v", vals)
		assert.Equal(t, hour/2, d.RetryAfter, "shards holding %v: retry-after", vals)
	}
}

// The least wait of a refused sharded call holds with rates, records and
// counts in tenths, whose arithmetic leaves float noise: a shard's
// capacity (the limit's over the shards) may fall a hair short of a count
// of the same tenths, which one shard alone still grants, by the noise.
// The wait counted on both shards together for such a count, later than
// one shard's alone.
func TestShardedRetryAfterIsTheLeastWaitInTenths(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 17))
	refused := 0
	for i := range 10_000 {
		kind := driver.FixedWindow
		if i%2 == 1 {
			kind = driver.TokenBucket
		}
		shards := 2 + rng.IntN(3)
		tenth := []float64{0.2, 0.6, 0.7, 1.4, 0.1, 0.3}[rng.IntN(6)]
		cfg := Config{Kind: kind, Rate: tenth * float64(shards), Period: time.Duration([]int64{7, 1000, 60_000}[rng.IntN(3)]) * time.Millisecond, Shards: shards}
		if rng.IntN(2) == 0 {
			cfg.MaxReserved = float64(1+rng.IntN(10)) / 10 * float64(shards)
		}
		p, q := cfg.params(), cfg.params()
		if kind == driver.FixedWindow && rng.IntN(2) == 0 {
			p.Phase, q.Phase = rng.Int64N(p.Period), rng.Int64N(q.Period)
		}
		now := t0 + rng.Int64N(p.Period)
		recs := make([]driver.Record, 2)
		for j, pr := range []driver.Params{p, q} {
			recs[j] = driver.Record{State: fresh(pr, now-rng.Int64N(pr.Period)), Found: true}
			recs[j].State.Remaining = math.Round(pr.Capacity*10*rng.Float64())/10 - math.Round(10*pr.MaxReserved*rng.Float64())/10
		}
		reserve := rng.IntN(3) == 0
		count := tenth // a shard's capacity in tenths
		if rng.IntN(2) == 0 {
			reach := 2 * p.Capacity
			if reserve && cfg.MaxReserved > 0 {
				reach = 2 * (p.Capacity + p.MaxReserved)
			}
			count = math.Min(math.Round(rng.Float64()*reach*10)/10, reach)
		} else if reserve {
			count += p.MaxReserved
		}
		d, _, _ := pair(p, q, recs[0], recs[1], now, count, reserve)
		if d.OK || d.RetryAfter == driver.MaxRetryAfter {
			continue
		}
		refused++
		where := fmt.Sprintf("case %d: %+v %+v recs %+v now %d count %v reserve %v: retry %d", i, p, q, recs, now, count, reserve, d.RetryAfter)
		horizon := now + d.RetryAfter
		require.True(t, okAt(recs, p, q, horizon, count, reserve), "%s: not OK at the wait", where)
		if kind == driver.FixedWindow {
			for _, pr := range []driver.Params{p, q} {
				for w := windowStart(pr, now) + pr.Period; w < horizon && w < now+1000*pr.Period; w += pr.Period {
					require.False(t, okAt(recs, p, q, w, count, reserve), "%s: OK already at %d", where, w)
				}
			}
		} else {
			for tt := max(now, horizon-100); tt < horizon; tt++ { // the last 100 ms
				require.False(t, okAt(recs, p, q, tt, count, reserve), "%s: OK already at %d", where, tt)
			}
		}
	}
	require.Greater(t, refused, 2500)
}

// leastOK returns the first time in (now, end] at which the call succeeds
// on recs, given that it succeeds at end: a binary search, since a call
// that succeeds at t succeeds later too (the shards only gain tokens).
func leastOK(recs []driver.Record, p, q driver.Params, now, end int64, count float64, reserve bool) int64 {
	lo, hi := now, end
	for hi-lo > 1 {
		m := lo + (hi-lo)/2
		if okAt(recs, p, q, m, count, reserve) {
			hi = m
		} else {
			lo = m
		}
	}
	return hi
}

// pairSpace is a space of random calls on two shards of a limit, for the
// least-wait tests: what they draw differently.
type pairSpace struct {
	fixedEvery int     // the i-th limit is a fixed window if i%fixedEvery == 0, else a token bucket
	shards     []int   // the limit's Shards, one drawn
	periods    []int64 // its Period in milliseconds, one drawn
	// limit sets the Rate and Capacity of cfg, whose Kind, Period and
	// Shards are drawn.
	limit func(rng *rand.Rand, cfg *Config)
	// skewed: now and then a record is in debt, and now and then it was
	// written by a clock ahead.
	skewed bool
}

// pairCall is a call of count at now on two shards, whose params are p
// and q and records recs.
type pairCall struct {
	p, q    driver.Params
	recs    []driver.Record
	now     int64
	count   float64
	reserve bool
}

func (c pairCall) String() string {
	return fmt.Sprintf("%+v %+v recs %+v now %d count %v reserve %v", c.p, c.q, c.recs, c.now, c.count, c.reserve)
}

// decide returns the decision of the call.
func (c pairCall) decide() driver.Decision {
	d, _, _ := pair(c.p, c.q, c.recs[0], c.recs[1], c.now, c.count, c.reserve)
	return d
}

// draw returns the i-th call of s drawn by rng: a count of up to twice a
// shard's capacity, a reservation one time in four, on a limit of s with
// a MaxReserved half the time and, if a fixed window, half the time
// phases that differ per shard; or false if Validate refuses the limit
// drawn.
func (s pairSpace) draw(rng *rand.Rand, i int) (pairCall, bool) {
	kind := driver.TokenBucket
	if i%s.fixedEvery == 0 {
		kind = driver.FixedWindow
	}
	shards := s.shards[rng.IntN(len(s.shards))]
	period := s.periods[rng.IntN(len(s.periods))]
	cfg := Config{Kind: kind, Period: time.Duration(period) * time.Millisecond, Shards: shards}
	s.limit(rng, &cfg)
	if rng.IntN(2) == 0 {
		cfg.MaxReserved = cfg.capacity() * rng.Float64()
	}
	if cfg.Validate() != nil {
		return pairCall{}, false
	}
	p, q := cfg.params(), cfg.params()
	if kind == driver.FixedWindow && rng.IntN(2) == 0 { // derived phases differ per shard
		p.Phase, q.Phase = rng.Int64N(p.Period), rng.Int64N(q.Period)
	}
	now := t0 + rng.Int64N(p.Period)
	recs := make([]driver.Record, 2)
	for j, pr := range []driver.Params{p, q} {
		recs[j] = driver.Record{State: fresh(pr, now-rng.Int64N(pr.Period)), Found: true}
		recs[j].State.Remaining = rng.Float64() * pr.Capacity
		if !s.skewed {
			continue
		}
		if rng.IntN(4) == 0 {
			recs[j].State.Remaining = -rng.Float64() * pr.MaxReserved
		}
		if rng.IntN(8) == 0 {
			recs[j].State.TS += rng.Int64N(3 * pr.Period) // written by a clock ahead
		}
	}
	reserve := rng.IntN(4) == 0
	count := rng.Float64() * 2 * p.Capacity
	return pairCall{p: p, q: q, recs: recs, now: now, count: count, reserve: reserve}, true
}

// A sharded RetryAfter is the least wait within the noise too: the shards
// together grant a call whose shortfall is within twice the noise of zero
// (denoise of their water-filled level), which the estimate of both
// shards' grants counts in full, so that the estimate may be late; the
// wait is searched back from it. Here a fixed window of 1 token per shard
// per second, whose shards share one Start, is short of count 15 by 2
// tokens and 1.5e-9: the first window grants it, and it is told so (it was
// told the second); and a token bucket granting a shard 1.2e-9 tokens per
// millisecond is told the millisecond that grants it (it was told the
// next). Over rates from near the noise to ordinary ones, the wait is the
// first time the call succeeds, found by a binary search of every
// millisecond.
func TestPairRetryAfterIsTheLeastWaitWithinTheNoise(t *testing.T) {
	cfg := Config{Kind: driver.FixedWindow, Rate: 2, Capacity: 20, Period: time.Second, Shards: 2, Start: time.UnixMilli(0)}
	p := cfg.params()
	now := (t0/1000)*1000 + 500
	recs := []driver.Record{
		{State: driver.State{Remaining: 5, TS: now - 500}, Found: true},
		{State: driver.State{Remaining: 8 - 1.5e-9, TS: now - 500}, Found: true},
	}
	d, _, _ := pair(p, p, recs[0], recs[1], now, 15, false)
	require.False(t, d.OK)
	assert.Equal(t, int64(500), d.RetryAfter, "the first window")
	assert.True(t, okAt(recs, p, p, now+500, 15, false), "the first window grants it")
	assert.Greater(t, sumWait(p, p, StateAt(p, recs[0], now), StateAt(p, recs[1], now), now, 15), 500.0, "the estimate is late")

	p = driver.Params{Kind: driver.TokenBucket, Rate: 1.1757248746548565e-06, Period: 1000, Capacity: 2, MaxReserved: 1.9508223122686734}
	recs = []driver.Record{
		{State: driver.State{Remaining: 0.3302399261356892, TS: 1699999999191}, Found: true},
		{State: driver.State{Remaining: 1.5524238433548045, TS: 1699999999360}, Found: true},
	}
	now = 1700000000000
	count := 3.359681618004969
	d, _, _ = pair(p, p, recs[0], recs[1], now, count, false)
	require.False(t, d.OK)
	end := now + d.RetryAfter
	assert.True(t, okAt(recs, p, p, end, count, false))
	assert.False(t, okAt(recs, p, p, end-1, count, false), "a millisecond before RetryAfter grants it")

	space := pairSpace{
		fixedEvery: 3,
		shards:     []int{2, 3, 4, 5},
		periods:    []int64{1, 7, 1000, 60_000},
		limit: func(rng *rand.Rand, cfg *Config) {
			perMilli := math.Pow(10, -12+rng.Float64()*10) // a shard's tokens per ms
			cfg.Rate = max(perMilli*float64(cfg.Period.Milliseconds()*int64(cfg.Shards)), minRate)
			cfg.Capacity = float64(cfg.Shards) * []float64{1, 0.5, 2, 1e-6}[rng.IntN(4)]
		},
	}
	rng := rand.New(rand.NewPCG(19, 23))
	refused := 0
	for i := range 20_000 {
		c, ok := space.draw(rng, i)
		if !ok {
			continue
		}
		d := c.decide()
		if d.OK || d.RetryAfter == 0 || d.RetryAfter >= driver.MaxRetryAfter/2 {
			continue
		}
		refused++
		where := fmt.Sprintf("case %d: %v: retry %d", i, c, d.RetryAfter)
		end := c.now + d.RetryAfter
		require.True(t, okAt(c.recs, c.p, c.q, end, c.count, c.reserve), "%s: not OK at the wait", where)
		require.Equal(t, end, leastOK(c.recs, c.p, c.q, c.now, end, c.count, c.reserve), "%s: OK before the wait", where)
	}
	t.Logf("%d refused calls", refused)
	require.Greater(t, refused, 2000)
}
