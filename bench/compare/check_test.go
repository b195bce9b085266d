package compare

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// A stream of calls on one key, as a limiter would see them: call i is
// made at from, decided at decide (what the limiter's clock reads, in ns
// since the start) and answered at to.
type call struct{ from, decide, to int64 }

// calls returns a hot key's calls for d: one every gap on average, in
// bursts separated by pauses (as slices of a run are), each decided a
// random moment after it is made and answered a random moment later.
func calls(rng *rand.Rand, d time.Duration, gap time.Duration) []call {
	var out []call
	t := int64(0)
	for t < int64(d) {
		burstEnd := t + int64(50*time.Millisecond)
		for ; t < burstEnd; t += rng.Int64N(2 * int64(gap)) {
			decide := t + rng.Int64N(int64(20*time.Microsecond))
			out = append(out, call{from: t, decide: decide, to: decide + rng.Int64N(int64(20*time.Microsecond))})
		}
		t += rng.Int64N(int64(300 * time.Millisecond))
	}
	return out
}

// grantsOf runs calls through decide and returns the grants it made.
func grantsOf(cs []call, decide func(c call) bool) []grant {
	var gs []grant
	for _, c := range cs {
		if decide(c) {
			lat := (c.to - c.from + int64(time.Microsecond) - 1) / int64(time.Microsecond)
			gs = append(gs, grant{from: c.from, lat: uint32(lat)})
		}
	}
	return gs
}

// transition decides calls with the library's pure transition, on whole
// milliseconds since an epoch of epoch ms, as its stores do.
func transition(l Limit, phase, epoch int64) func(c call) bool {
	cfg := ratelimit.Config{Kind: l.Kind, Rate: float64(l.Rate), Period: l.Period}
	p := driver.Params{Kind: l.Kind, Rate: cfg.Rate, Period: l.Period.Milliseconds(), Capacity: cfg.Rate, Phase: phase}
	var (
		st    driver.State
		found bool
	)
	return func(c call) bool {
		var d driver.Decision
		next := ratelimit.TransitionInto(&d, &p, st, found, epoch+c.decide/int64(time.Millisecond), 1, false)
		if d.OK {
			st, found = next, true
		}
		return d.OK
	}
}

func TestCheckPassesExactLimiters(t *testing.T) {
	l := Limit{Rate: 100, Period: time.Second, Kind: ratelimit.TokenBucket}
	fw := l
	fw.Kind = ratelimit.FixedWindow
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		cs := calls(rng, 5*time.Second, 20*time.Microsecond)
		epoch := rng.Int64N(1 << 40)
		xr := rate.NewLimiter(rate.Limit(l.PerSecond()), l.Rate)
		start := time.Unix(0, 0)
		cases := []struct {
			name   string
			bound  Bound
			decide func(call) bool
			tight  bool
		}{
			{"ratelimit token bucket", libraryBound(l), transition(l, 0, epoch), true},
			{"ratelimit fixed window", libraryBound(fw), transition(fw, rng.Int64N(1000), epoch), true},
			{"x/time/rate, one goroutine", xrateBound(l), func(c call) bool { return xr.AllowN(start.Add(time.Duration(c.decide)), 1) }, true},
			// Its windows start at a call, so no span shorter than a
			// period holds two windows' grants: it stays a window below
			// a bound that must hold for windows of any phase.
			{"window counter", counterBound(l), firstCallWindows(l), false},
		}
		for _, tc := range cases {
			gs := grantsOf(cs, tc.decide)
			c := check(tc.bound, gs, []string{"k"})
			require.Falsef(t, c.Violated(), "seed %d, %s: %s", seed, tc.name, c.Worst)
			if tc.tight {
				// The check is tight: a limiter that spends its allowance
				// comes within a token of the bound.
				assert.Greaterf(t, c.Excess, -1.0, "seed %d, %s: %s", seed, tc.name, c.Worst)
			}
			assert.Equal(t, len(gs), c.Grants)
		}
	}
}

// firstCallWindows is a counter whose window starts at a key's first call
// after the last window ended (as ulule/limiter's and a bare INCR with
// PEXPIRE are).
func firstCallWindows(l Limit) func(call) bool {
	var (
		end int64 = -1
		n   int
	)
	return func(c call) bool {
		if c.decide >= end {
			end, n = c.decide+int64(l.Period), 0
		}
		n++
		return n <= l.Rate
	}
}

func TestCheckCatchesExcess(t *testing.T) {
	l := Limit{Rate: 100, Period: time.Second, Kind: ratelimit.TokenBucket}
	rng := rand.New(rand.NewPCG(7, 7))
	cs := calls(rng, 3*time.Second, 20*time.Microsecond)
	cases := []struct {
		name   string
		bound  Bound
		decide func(call) bool
	}{
		{"grants everything", libraryBound(l), func(call) bool { return true }},
		{"a bucket one token larger", libraryBound(l), transition(Limit{Rate: 101, Period: l.Period, Kind: l.Kind}, 0, 0)},
		{"a bucket refilled 1% faster", BucketBound("token bucket", 100, 100),
			func() func(call) bool {
				xr := rate.NewLimiter(101, 100)
				return func(c call) bool { return xr.AllowN(time.Unix(0, c.decide), 1) }
			}()},
		{"windows of half the period", counterBound(l), firstCallWindows(Limit{Rate: 100, Period: l.Period / 2})},
		// Without the phase, a span shorter than a period may hold the end
		// of one window and the start of the next: twice the rate. More is
		// caught at once.
		{"a fixed window granting 2.5 times the rate", libraryBound(Limit{Rate: 100, Period: l.Period, Kind: ratelimit.FixedWindow}),
			transition(Limit{Rate: 250, Period: l.Period, Kind: ratelimit.FixedWindow}, 0, 0)},
	}
	for _, tc := range cases {
		gs := grantsOf(cs, tc.decide)
		c := check(tc.bound, gs, []string{"k"})
		assert.Truef(t, c.Violated(), "%s: %d grants, worst %s", tc.name, len(gs), c.Worst)
	}
}

func TestCheckKeysApart(t *testing.T) {
	// 100 grants at once on each of two keys: within a bucket of 100
	// each, though 200 together.
	var gs []grant
	for i := range 200 {
		gs = append(gs, grant{from: int64(i), key: int32(i % 2), lat: 1})
	}
	b := BucketBound("token bucket", 100, 100)
	c := check(b, gs, []string{"a", "b"})
	assert.False(t, c.Violated(), c.Worst)
	assert.Equal(t, 2, c.Keys)
	gs = append(gs, grant{from: 300, key: 1, lat: 1})
	c = check(b, gs, []string{"a", "b"})
	assert.True(t, c.Violated())
	assert.Contains(t, c.Worst, `key "b": 101 grants`)
}

func TestCheckSlowAnswerWidensSpan(t *testing.T) {
	// 101 grants made within 1 ms: too many for a bucket of 100 at 100/s,
	// unless one answer came 20 ms later: that grant may have been decided
	// when the bucket held a token again.
	var gs []grant
	for i := range 101 {
		gs = append(gs, grant{from: int64(i) * 10_000, lat: 1})
	}
	b := BucketBound("token bucket", 100, 100)
	assert.True(t, check(b, slicesClone(gs), []string{"k"}).Violated())
	gs[100].lat = 20_000 // µs
	c := check(b, gs, []string{"k"})
	assert.False(t, c.Violated(), c.Worst)
}

func slicesClone(gs []grant) []grant { return append([]grant(nil), gs...) }

func TestBoundAllows(t *testing.T) {
	b := WindowBound("window counter", 100, 100, time.Second)
	assert.Equal(t, 100.0, b.Allows(0))
	assert.Equal(t, 200.0, b.Allows(time.Second))
	assert.Equal(t, 300.0, b.Allows(time.Second+1))
	assert.InDelta(t, 150.0, BucketBound("token bucket", 100, 100).Allows(500*time.Millisecond), 1e-9)
}

func TestCheckMillisecondClock(t *testing.T) {
	// The library judges calls at whole milliseconds: 100 calls decided at
	// 0.999 ms (read as 0) empty the bucket, and the one decided at
	// 10.000 ms (read as 10) finds the token refilled in those 10 ms,
	// though only 9.001 ms passed.
	l := Limit{Rate: 100, Period: time.Second, Kind: ratelimit.TokenBucket}
	var cs []call
	for range 100 {
		cs = append(cs, call{from: 999_000, decide: 999_000, to: 999_000})
	}
	cs = append(cs, call{from: 10_000_000, decide: 10_000_000, to: 10_000_000})
	gs := grantsOf(cs, transition(l, 0, 0))
	require.Len(t, gs, 101)
	c := check(libraryBound(l), gs, []string{"k"})
	assert.False(t, c.Violated(), c.Worst)
}

// TestXRateOutOfOrderTimes shows why x/time/rate may fail its check when
// goroutines share a limiter: Allow reads the time before it takes the
// limiter's lock, and a granted call whose time is older than the last
// one moves the limiter's clock back, so the next call is credited again
// for time already credited. The checker reports it.
func TestXRateOutOfOrderTimes(t *testing.T) {
	l := Limit{Rate: 100, Period: time.Second}
	lim := rate.NewLimiter(rate.Limit(l.PerSecond()), l.Rate)
	at := func(ms int64) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	var gs []grant
	take := func(ms int64, n int) {
		for range n {
			if lim.AllowN(at(ms), 1) {
				gs = append(gs, grant{from: ms * int64(time.Millisecond)})
			}
		}
	}
	take(1000, 100) // empties the bucket
	take(1300, 29)  // 30 tokens refilled: 1 left
	take(1000, 1)   // a call whose time was read at 1000 and lock taken at 1300: granted, last moves back
	take(1300, 30)  // credited the same 300 ms again
	require.Len(t, gs, 160)
	c := check(xrateBound(l), gs, []string{"k"})
	assert.True(t, c.Violated())
	assert.Contains(t, c.Worst, "160 grants")
}

// TestCheckWindowsOverSeveralPeriods requires the check to hold windows to
// their staircase, N + N·⌈S/P⌉, over spans longer than a period, not only
// to the line above it, N + N + N·S/P, which allows up to N more.
func TestCheckWindowsOverSeveralPeriods(t *testing.T) {
	b := WindowBound("window counter", 100, 100, time.Second)
	at := func(gs []grant, ms int64, n int) []grant {
		for range n {
			gs = append(gs, grant{from: ms * int64(time.Millisecond), lat: 1})
		}
		return gs
	}
	// 200 grants at 0 and 180 at 1.9 s: each group within what one
	// period's span allows (200), but 380 within 1.9 s, which touches at
	// most three windows: 300 at most.
	gs := at(at(nil, 0, 200), 1900, 180)
	c := check(b, gs, []string{"k"})
	assert.True(t, c.Violated(), c.Worst)
	assert.InDelta(t, 80, c.Excess, 1e-9)
	assert.Contains(t, c.Worst, "380 grants")

	// 601 grants within 4.1 s (five windows at most: 600), each part
	// within its own bound: 0 to 1.4 s 300 of 300, 1.4 to 4.1 s 401 of
	// 400.
	gs = at(at(at(at(nil, 0, 200), 1400, 100), 2800, 101), 4100, 200)
	c = check(b, gs, []string{"k"})
	assert.True(t, c.Violated(), c.Worst)
	assert.InDelta(t, 1, c.Excess, 1e-9)

	// A counter whose windows start at 0, 1, 2 and 3 s, spending each at
	// its ends: 400 grants from 0.999 s to 3 s, three windows and a bit.
	gs = at(at(at(at(nil, 999, 100), 1000, 100), 2000, 100), 3000, 100)
	c = check(b, gs, []string{"k"})
	assert.False(t, c.Violated(), c.Worst)
	assert.InDelta(t, 0, c.Excess, 1e-9, c.Worst)
}

// TestCheckSlowAnswerOutsideRun requires a run's span to end at the last
// answer of its own grants: a grant answered late widens the spans of the
// runs it belongs to, not those of the grants that came after it. Here one
// grant is answered a second after it was made, and meanwhile 150 grants
// are made and answered within 1.2 ms: 50 too many for a bucket of 100 at
// 100/s, and for windows of 100 a second (200 in any span of a period).
func TestCheckSlowAnswerOutsideRun(t *testing.T) {
	for _, tc := range []struct {
		b Bound
		n int
	}{
		{BucketBound("token bucket", 100, 100), 150},
		{WindowBound("window counter", 100, 100, time.Second), 250},
	} {
		gs := []grant{{from: 0, lat: 1_000_000}} // answered at 1 s
		for i := range tc.n {
			gs = append(gs, grant{from: int64(time.Millisecond) + int64(i)*1_000, lat: 1})
		}
		c := check(tc.b, gs, []string{"k"})
		assert.Truef(t, c.Violated(), "%s: %s", tc.b, c.Worst)
		assert.Containsf(t, c.Worst, fmt.Sprintf("%d grants", tc.n), "%s", tc.b)
		assert.InDeltaf(t, 50, c.Excess, 0.5, "%s: %s", tc.b, c.Worst)
	}
}

// TestCheckMatchesEveryRun compares the linear scans of checkKey with a
// check of every run i..j of random grants, some answered late: the worst
// excess over all runs, each judged over widen(M(i,j) - from_i), M(i,j) the
// latest answer among its grants; for windows, by the staircase up to
// maxSteps periods and by the line above it beyond.
func TestCheckMatchesEveryRun(t *testing.T) {
	bounds := []Bound{
		BucketBound("token bucket", 10, 100),
		WindowBound("window counter", 10, 10, 100*time.Millisecond),
		WindowBound("fixed window", 20, 10, 3*time.Millisecond),
	}
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 3))
		var gs []grant
		t0 := int64(0)
		for range 1 + rng.IntN(120) {
			t0 += rng.Int64N(int64(3 * time.Millisecond))
			lat := uint32(rng.IntN(50))
			if rng.IntN(10) == 0 {
				lat = uint32(rng.IntN(400_000)) // up to 0.4 s
			}
			gs = append(gs, grant{from: t0, lat: lat})
		}
		for _, b := range bounds {
			want := math.Inf(-1)
			for i := range gs {
				m := int64(0)
				for j := i; j < len(gs); j++ {
					m = max(m, gs[j].to())
					w := widen(m - gs[i].from)
					var allows float64
					switch steps := math.Ceil(w / float64(b.Period)); {
					case b.Period == 0:
						allows = b.Base + b.PerSecond*w/1e9
					case steps <= maxSteps:
						allows = b.Base + b.PerWindow*steps
					default:
						allows = b.Base + b.PerWindow + b.PerWindow*w/float64(b.Period)
					}
					want = max(want, float64(j-i+1)-allows)
				}
			}
			c := Check{Excess: math.Inf(-1)}
			checkKey(b, gs, "k", &c)
			require.InDeltaf(t, want, c.Excess, 1e-6, "seed %d, %s: %s", seed, b, c.Worst)
		}
	}
}

// TestCheckSlowAnswerInsideRun requires the check to leave a slow grant
// out of a run rather than let it widen the run: 200 grants made and
// answered within 2 ms are 100 too many for a bucket of 100 at 100/s,
// though one grant made in their midst was answered a second later, which
// puts every run that holds grants on both sides of it within a second.
func TestCheckSlowAnswerInsideRun(t *testing.T) {
	var gs []grant
	for i := range 200 {
		gs = append(gs, grant{from: int64(i) * 10_000, lat: 1})
	}
	gs = append(gs, grant{from: int64(time.Millisecond), lat: 1_000_000})
	b := BucketBound("token bucket", 100, 100)
	c := check(b, gs, []string{"k"})
	assert.True(t, c.Violated(), c.Worst)
	assert.Contains(t, c.Worst, "200 grants")
	assert.InDelta(t, 100, c.Excess, 0.5, c.Worst)
}
