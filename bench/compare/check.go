package compare

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Bound is what a limiter promises one key: the most tokens it may grant
// within any span of time S on its own clock. Two shapes cover every
// contender:
//
//   - a bucket (a token bucket, or GCRA, which is one): Base + PerSecond·S,
//     the bucket full at the start of the span plus its refill;
//   - windows of length Period, each granting at most PerWindow:
//     Base + PerWindow·⌈S/Period⌉. A fixed window with rollover starts the
//     span with at most its capacity (Base) and gains PerWindow at each
//     window start inside it; a plain counter of windows (one that resets
//     when its window ends, the window starting at its first call or on a
//     grid) may see the end of the window the span starts in (Base =
//     PerWindow) and one more window per Period.
type Bound struct {
	// Algorithm names the promise in the report.
	Algorithm string
	// Base is the most granted in a span of length zero.
	Base float64
	// PerSecond is a bucket's refill; 0 for windows.
	PerSecond float64
	// PerWindow and Period describe windows; 0 for a bucket.
	PerWindow float64
	Period    time.Duration
}

// BucketBound is the bound of a token bucket of the given capacity,
// refilled at perSecond tokens a second.
func BucketBound(algorithm string, capacity, perSecond float64) Bound {
	return Bound{Algorithm: algorithm, Base: capacity, PerSecond: perSecond}
}

// WindowBound is the bound of windows of length period granting at most
// perWindow each, base being the most granted in a span of length zero.
func WindowBound(algorithm string, base, perWindow float64, period time.Duration) Bound {
	return Bound{Algorithm: algorithm, Base: base, PerWindow: perWindow, Period: period}
}

// Allows returns the most tokens b allows within a span of length s.
func (b Bound) Allows(s time.Duration) float64 {
	if b.Period > 0 {
		return b.Base + b.PerWindow*math.Ceil(float64(s)/float64(b.Period))
	}
	return b.Base + b.PerSecond*s.Seconds()
}

// String writes the bound as a report shows it: the algorithm and its
// formula in the span S.
func (b Bound) String() string {
	if b.Period > 0 {
		return fmt.Sprintf("%s: %g + %g·⌈S/%v⌉", b.Algorithm, b.Base, b.PerWindow, b.Period)
	}
	return fmt.Sprintf("%s: %g + %g/s·S", b.Algorithm, b.Base, b.PerSecond)
}

// The checker never knows the moment a limiter decided a call, only that it
// lies between the call and its answer on this machine's monotonic clock.
// Every span is widened before it is judged, so that the check never
// blames a limiter for a moment it cannot know:
//
//   - clockGrain covers clocks that count whole milliseconds (the
//     library's, a counter's window number): two moments S apart may read
//     up to 1 ms further apart;
//   - clockRate covers clocks that run at a slightly different rate from
//     this machine's monotonic one (wall clocks under NTP slew, at most
//     0.05%; a server's clock).
const (
	clockGrain = time.Millisecond
	clockRate  = 1e-3
)

// widen returns the longest span, on the limiter's clock, of moments
// within a span s of the monotonic clock.
func widen(s int64) float64 { return float64(s)*(1+clockRate) + float64(clockGrain) }

// grant is one granted call, for the key of index key: made from
// nanoseconds after the cell's start and answered within lat
// microseconds (rounded up, so never placed earlier than it came).
type grant struct {
	from int64
	key  int32
	lat  uint32
}

// to returns when g was answered, in nanoseconds after the cell's start.
func (g grant) to() int64 { return g.from + int64(g.lat)*int64(time.Microsecond) }

// Check is the verdict on one contender's grants in one cell.
type Check struct {
	// Grants and Keys count the grants checked and the keys they were for.
	Grants, Keys int
	// Excess is the worst run found: its grants less what the bound allows
	// over its span. Negative is headroom; above zero a violation.
	Excess float64
	// Worst describes that run: key, grants, span and bound.
	Worst string
}

// Violated reports whether a run of grants exceeded the bound.
func (c Check) Violated() bool { return c.Excess > 1e-9 }

// check judges grants (of keys keys) against b. It sorts grants.
func check(b Bound, grants []grant, keys []string) Check {
	c := Check{Grants: len(grants), Excess: math.Inf(-1)}
	var fast []grant
	slices.SortFunc(grants, func(x, y grant) int {
		if x.key != y.key {
			return int(x.key - y.key)
		}
		switch {
		case x.from < y.from:
			return -1
		case x.from > y.from:
			return 1
		}
		return 0
	})
	for lo := 0; lo < len(grants); {
		hi := lo + 1
		for hi < len(grants) && grants[hi].key == grants[lo].key {
			hi++
		}
		c.Keys++
		gs, key := grants[lo:hi], keys[grants[lo].key]
		checkKey(b, gs, key, &c)
		// A grant answered late widens every run that holds it, so that
		// the grants made on either side of it while it waited may be
		// too many for the span they were made in and pass all the
		// same. Any of a key's grants are a run of grants too: the key's
		// grants answered within each of a ladder of latencies are
		// judged again, without the slower ones.
		var longest uint32
		for _, g := range gs {
			longest = max(longest, g.lat)
		}
		prev := len(gs)
		for within := uint64(fastest); within < uint64(longest); within *= ladder {
			fast = fast[:0]
			for _, g := range gs {
				if uint64(g.lat) <= within {
					fast = append(fast, g)
				}
			}
			if len(fast) > 0 && len(fast) < prev {
				checkKey(b, fast, key, &c)
				prev = len(fast)
			}
		}
		lo = hi
	}
	return c
}

// The ladder of latencies, in microseconds, within which a key's grants
// are judged again apart from the slower ones: from fastest up, each
// ladder times the last.
const (
	fastest = 16
	ladder  = 4
)

// checkKey judges one key's grants, sorted by call time, and records its
// worst run in c.
//
// Grants i..j (in call order) were decided within [from_i, M(i,j)],
// M(i,j) the latest answer among grants i..j, so within a span of at most
// widen(M(i,j) - from_i). A grant answered late widens only the runs it
// belongs to: the grants made while it waited, on other goroutines, are
// judged over their own spans. Scans in linear time find the worst run:
//
//   - for every bound, the linear bound Base' + r·S (Base' = Base for a
//     bucket, where it is the bound itself; Base + PerWindow for windows,
//     as ⌈x⌉ < x + 1): the run i..j exceeds it by (j-i+1) - Base' -
//     r·widen(M(i,j) - from_i). A stack of the runs' ends holds, for each
//     stretch of i over which M(i,j) is the same answer, the best
//     r'·from_i - i, and below it the best of the stretches beneath;
//   - for windows, the staircase itself over spans of up to maxSteps
//     periods: for each k, runs whose widened span is at most k periods
//     may hold Base + k·PerWindow. The earliest such i only moves forward
//     with j, and a queue of the latest answers after it gives M(i,j).
//     Beyond maxSteps periods, the linear bound allows less than
//     PerWindow more than the staircase, a share under 1/maxSteps of it.
func checkKey(b Bound, gs []grant, key string, c *Check) {
	note := func(excess float64, i, j int, span int64, allows float64) {
		if excess > c.Excess {
			c.Excess = excess
			c.Worst = fmt.Sprintf("key %q: %d grants within %v, where %s allows %.2f",
				key, j-i+1, time.Duration(widen(span)).Round(time.Microsecond), b, allows)
		}
	}
	base, perNs := b.Base, b.PerSecond/1e9
	var firsts []stair // firsts[k-1]: the staircase scan for k periods
	if b.Period > 0 {
		base, perNs = b.Base+b.PerWindow, b.PerWindow/float64(b.Period)
		latest := int64(0)
		for _, g := range gs {
			latest = max(latest, g.to())
		}
		steps := math.Ceil(widen(latest-gs[0].from) / float64(b.Period))
		firsts = make([]stair, int(min(steps, maxSteps)))
	}
	stretch := perNs * (1 + clockRate)
	var ends []runEnd // from the earliest i up; M(i,j) falls along it
	for j, g := range gs {
		// The stretch of i whose latest answer is g's: j, and every
		// stretch beneath whose latest answer came no later.
		e := runEnd{to: g.to(), best: stretch*float64(g.from) - float64(j), bestI: j}
		for len(ends) > 0 && ends[len(ends)-1].to <= e.to {
			if top := ends[len(ends)-1]; top.best > e.best {
				e.best, e.bestI = top.best, top.bestI
			}
			ends = ends[:len(ends)-1]
		}
		e.upTo, e.upToI, e.upToEnd = e.best-stretch*float64(e.to), e.bestI, e.to
		if len(ends) > 0 {
			if below := ends[len(ends)-1]; below.upTo > e.upTo {
				e.upTo, e.upToI, e.upToEnd = below.upTo, below.upToI, below.upToEnd
			}
		}
		ends = append(ends, e)
		excess := float64(j+1) - base - perNs*float64(clockGrain) + e.upTo
		if excess > c.Excess {
			span := e.upToEnd - gs[e.upToI].from
			note(excess, e.upToI, j, span, base+perNs*widen(span))
		}
		for k := range firsts {
			s := &firsts[k]
			s.push(gs, j)
			// A single slow answer may leave no run short enough.
			limit := float64(k+1) * float64(b.Period)
			for s.first <= j && widen(s.latest(gs)-gs[s.first].from) > limit {
				s.advance()
			}
			if s.first <= j {
				allows := b.Base + float64(k+1)*b.PerWindow
				if excess := float64(j-s.first+1) - allows; excess > c.Excess {
					note(excess, s.first, j, s.latest(gs)-gs[s.first].from, allows)
				}
			}
		}
	}
}

// runEnd is a stretch of the first grants i of runs ending at the current
// j over which M(i,j) is the same answer, to.
type runEnd struct {
	to    int64
	best  float64 // the best r'·from_i - i over the stretch
	bestI int
	// upTo is the best r'·from_i - i - r'·M(i,j) over this stretch and
	// those beneath it, for the i upToI, whose M(i,j) is upToEnd.
	upTo    float64
	upToI   int
	upToEnd int64
}

// stair is the staircase scan for one number of periods: the earliest
// grant first of the runs that fit, and the indices after it whose
// answers no later grant's answer passes, latest answer first.
type stair struct {
	first int
	queue []int
	head  int
}

func (s *stair) push(gs []grant, j int) {
	to := gs[j].to()
	for len(s.queue) > s.head && gs[s.queue[len(s.queue)-1]].to() <= to {
		s.queue = s.queue[:len(s.queue)-1]
	}
	if s.head > 0 && s.head*2 >= len(s.queue) {
		s.queue = s.queue[:copy(s.queue, s.queue[s.head:])]
		s.head = 0
	}
	s.queue = append(s.queue, j)
}

// latest returns M(first, j), j the last pushed; first ≤ j.
func (s *stair) latest(gs []grant) int64 { return gs[s.queue[s.head]].to() }

func (s *stair) advance() {
	if s.queue[s.head] == s.first {
		s.head++
	}
	s.first++
}

// maxSteps is how many periods the staircase scan of windows covers.
const maxSteps = 64
