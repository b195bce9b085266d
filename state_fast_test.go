package ratelimit

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
)

// transitionGeneral is the transition as the semantics define it and the
// Lua and SQL ports mirror it: StateAt (refresh or fresh), then settle.
// TransitionInto takes shortcuts; it must agree with this to the last bit.
func transitionGeneral(p driver.Params, prev driver.State, found bool, now int64, count float64, reserve bool) (driver.State, driver.Decision) {
	var d driver.Decision
	st := StateAt(p, driver.Record{State: prev, Found: found}, now)
	if !found {
		prev = st
	}
	s := settle(&d, &p, prev, st, now, count, reserve)
	return s, d
}

// sameBits reports whether two results are equal bit for bit (so that -0
// and 0 differ, and NaN equals the same NaN).
func sameBits(s1 driver.State, d1 driver.Decision, s2 driver.State, d2 driver.Decision) bool {
	f := math.Float64bits
	return f(s1.Remaining) == f(s2.Remaining) && s1.TS == s2.TS &&
		d1.OK == d2.OK && d1.RetryAfter == d2.RetryAfter && f(d1.Remaining) == f(d2.Remaining) &&
		f(d1.Charged[0]) == f(d2.Charged[0]) && f(d1.Charged[1]) == f(d2.Charged[1]) &&
		d1.Now == d2.Now && d1.TS == d2.TS
}

// checkFastPath fails t when transition or TransitionInto (which must
// overwrite every field of its Decision) and transitionGeneral disagree on
// one input, or when TransitionInto of a found record depends on p.Phase.
func checkFastPath(t *testing.T, p driver.Params, prev driver.State, found bool, now int64, count float64, reserve bool) {
	t.Helper()
	s1, d1 := transition(p, prev, found, now, count, reserve)
	s2, d2 := transitionGeneral(p, prev, found, now, count, reserve)
	d4 := driver.Decision{OK: true, RetryAfter: -1, Remaining: -1, Charged: [2]float64{-1, -1}, Now: -1, TS: -1}
	s4 := TransitionInto(&d4, &p, prev, found, now, count, reserve)
	if !sameBits(s1, d1, s2, d2) {
		t.Fatalf("Transition(%+v, %+v, %v, %d, %v, %v)\n fast:    %+v %+v\n general: %+v %+v",
			p, prev, found, now, count, reserve, s1, d1, s2, d2)
	}
	if !sameBits(s4, d4, s2, d2) {
		t.Fatalf("TransitionInto(%+v, %+v, %v, %d, %v, %v)\n into:    %+v %+v\n general: %+v %+v",
			p, prev, found, now, count, reserve, s4, d4, s2, d2)
	}
	if found && p.Kind == driver.FixedWindow {
		q := p
		q.Phase = (p.Phase + p.Period/2 + 1) % p.Period
		s3, d3 := transition(q, prev, found, now, count, reserve)
		if !sameBits(s1, d1, s3, d3) {
			t.Fatalf("Transition of a found record read the phase: %+v %+v with phase %d, %+v %+v with %d",
				s1, d1, p.Phase, s3, d3, q.Phase)
		}
	}
}

// FuzzTransitionFastPath checks that Transition's shortcuts give exactly
// the results of the general transition, on arbitrary inputs (valid or
// not: the shortcuts must not depend on validation).
//
//	go test -fuzz FuzzTransitionFastPath -run ^$ .
func FuzzTransitionFastPath(f *testing.F) {
	f.Add(true, 10.0, int64(60_000), 15.0, 0.0, int64(7), 3.0, int64(-5_000), true, int64(90_000), 4.0, false)
	f.Add(false, 2.5, int64(1_000), 2.5, 4.0, int64(0), -3.0, int64(0), true, int64(400), 6.0, true)
	f.Add(true, 0.1, int64(7), 0.3, 0.5, int64(3), math.Copysign(0, -1), int64(0), false, int64(1), 0.0, true)
	f.Add(false, 1e9, int64(1), 1e9, 0.0, int64(0), 1e9, int64(1<<40), true, int64(-1<<40), 1e9, false)
	f.Add(true, 1e12, int64(3_600_000), 1e12, 0.0, int64(5), 1e12-1, int64(0), true, int64(3_600_000), 1.0, false)
	f.Fuzz(func(t *testing.T, fixed bool, rate float64, period int64, capacity, maxRes float64,
		phase int64, value float64, ts int64, found bool, now int64, count float64, reserve bool) {
		if period < 1 {
			t.Skip() // every caller guarantees a period ≥ 1 (a division by it)
		}
		p := driver.Params{Kind: driver.TokenBucket, Rate: rate, Period: period, Capacity: capacity, MaxReserved: maxRes}
		if fixed {
			p.Kind = driver.FixedWindow
			p.Phase = floorMod(phase, period)
		}
		checkFastPath(t, p, driver.State{Remaining: value, TS: ts}, found, now, count, reserve)
	})
}

// TestTransitionFastPathRandom compares TransitionInto with the general
// transition on a million inputs drawn where the shortcuts branch: whole
// and fractional tokens, counts at and around the value, -0, calls within
// the window, at its end and windows later, clocks stepping back, missing
// records, reservations.
func TestTransitionFastPathRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 16))
	pick := func(xs ...float64) float64 { return xs[rng.IntN(len(xs))] }
	const base = int64(1_700_000_000_000)
	n := 1_000_000
	if testing.Short() {
		n = 50_000
	}
	for range n {
		p := driver.Params{
			Kind:   []driver.Kind{driver.FixedWindow, driver.TokenBucket}[rng.IntN(2)],
			Rate:   pick(1, 2, 3, 10, 100, 1e9, 1e12, 0.1, 1.0/3, 2.5, 7e-9, 1e15),
			Period: []int64{1, 7, 1000, 60_000, 3_600_000, 86_400_000}[rng.IntN(6)],
		}
		p.Capacity = p.Rate * pick(1, 1, 1.5, 3, 0.5, 1.0/3)
		if rng.IntN(2) == 0 {
			p.Capacity = math.Round(p.Capacity)
		}
		p.MaxReserved = pick(MaxTokens, 0, p.Capacity, p.Capacity/2, 1)
		p.Phase = rng.Int64N(p.Period)
		prev := driver.State{TS: base + rng.Int64N(1<<30) - 1<<29}
		if p.Kind == driver.FixedWindow && rng.IntN(8) != 0 {
			prev.TS = windowStart(p, prev.TS)
		}
		switch rng.IntN(6) {
		case 0:
			prev.Remaining = p.Capacity
		case 1:
			prev.Remaining = math.Floor(rng.Float64() * p.Capacity)
		case 2:
			prev.Remaining = -math.Floor(rng.Float64() * p.MaxReserved)
		case 3:
			prev.Remaining = math.Copysign(0, -1)
		default:
			prev.Remaining = (rng.Float64()*2 - 0.5) * p.Capacity
		}
		var now int64
		switch rng.IntN(6) {
		case 0:
			now = prev.TS
		case 1:
			now = prev.TS + p.Period - 1 // the window's last millisecond
		case 2:
			now = prev.TS + p.Period*rng.Int64N(4)
		case 3:
			now = prev.TS - rng.Int64N(2*p.Period+1) // the clock stepped back
		default:
			now = prev.TS + rng.Int64N(3*p.Period+1)
		}
		var count float64
		switch rng.IntN(6) {
		case 0:
			count = 0
		case 1:
			count = 1
		case 2:
			count = math.Max(prev.Remaining, 0)
		case 3:
			count = math.Nextafter(math.Max(prev.Remaining, 0), math.Inf(1))
		case 4:
			count = math.Floor(rng.Float64() * 2 * p.Capacity)
		default:
			count = rng.Float64() * 2 * p.Capacity
		}
		checkFastPath(t, p, prev, rng.IntN(5) != 0, now, count, rng.IntN(3) == 0)
	}
}
