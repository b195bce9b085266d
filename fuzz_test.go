package ratelimit

import (
	"math"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
)

// FuzzTransition checks the invariants of the transition on arbitrary
// valid inputs: a record never holds more than its capacity nor owes more
// than MaxReserved, retry-after is never negative, an OK call always fits
// (the tokens it takes were there, or are a debt within MaxReserved), a
// denied call changes nothing, and a pair of shards never gains tokens nor
// grants other than the count asked.
//
//	go test -fuzz FuzzTransition -run ^$ .
func FuzzTransition(f *testing.F) {
	f.Add(true, 10.0, int64(60_000), 1.5, 0.0, int64(7), 3.0, int64(-5_000), true, int64(90_000), 4.0, false, 2.0)
	f.Add(false, 2.5, int64(1_000), 1.0, 4.0, int64(0), -3.0, int64(0), true, int64(400), 6.0, true, -1.0)
	f.Add(true, 0.1, int64(7), 3.0, 0.5, int64(3), 0.0, int64(0), false, int64(1), 0.0, true, 0.3)
	f.Add(false, 1e9, int64(1), 1.0, 0.0, int64(0), 1e9, int64(1<<40), true, int64(-1<<40), 1e9, false, 5e8)
	f.Fuzz(func(t *testing.T, fixed bool, rate float64, period int64, capFactor, maxRes float64,
		phase int64, value float64, tsOff int64, found bool, nowOff int64, count float64, reserve bool, other float64) {
		if !finitePositive(rate) || period < 1 || period > 1<<40 || !finitePositive(capFactor) ||
			(maxRes != 0 && !finitePositive(maxRes)) || !(count >= 0) || math.IsInf(count, 0) ||
			math.IsNaN(value) || math.IsInf(value, 0) || math.IsNaN(other) || math.IsInf(other, 0) ||
			tsOff < -1<<42 || tsOff > 1<<42 || nowOff < -1<<42 || nowOff > 1<<42 {
			t.Skip()
		}
		p := driver.Params{Kind: driver.TokenBucket, Rate: rate, Period: period, Capacity: rate * capFactor, MaxReserved: maxRes}
		if fixed {
			p.Kind = driver.FixedWindow
			p.Phase = floorMod(phase, period)
		}
		if !finitePositive(p.Capacity) {
			t.Skip()
		}
		const base = int64(1_700_000_000_000)
		// A stored record is one the transition could have written: at most
		// the capacity, at most MaxReserved in debt, a fixed window's ts on
		// a window start.
		clamp := func(v float64) float64 {
			v = math.Min(v, p.Capacity)
			if p.MaxReserved > 0 {
				v = math.Max(v, -p.MaxReserved)
			}
			return v
		}
		prev := driver.State{Remaining: clamp(value), TS: base + tsOff}
		if fixed {
			prev.TS = windowStart(p, prev.TS)
		}
		now := base + nowOff
		if !reserve && count > p.Capacity {
			count = p.Capacity // larger plain counts are rejected before a store sees them
		}

		next, d := transition(p, prev, found, now, count, reserve)
		have := StateAt(p, driver.Record{State: prev, Found: found}, now).Remaining
		if have > p.Capacity {
			t.Fatalf("refreshed value %v above capacity %v", have, p.Capacity)
		}
		if d.RetryAfter < 0 {
			t.Fatalf("negative retry-after %d", d.RetryAfter)
		}
		if d.OK {
			if next.Remaining > p.Capacity {
				t.Fatalf("value %v above capacity %v", next.Remaining, p.Capacity)
			}
			if next.Remaining < 0 && !reserve {
				t.Fatalf("a plain call left a debt of %v", -next.Remaining)
			}
			if p.MaxReserved > 0 && -next.Remaining > p.MaxReserved {
				t.Fatalf("debt %v above MaxReserved %v", -next.Remaining, p.MaxReserved)
			}
			if next.Remaining > have-count+noise {
				t.Fatalf("granted %v from %v but left %v", count, have, next.Remaining)
			}
			if next.Remaining < 0 && d.RetryAfter == 0 && have-count < -noise {
				t.Fatalf("a reservation with debt %v reports no wait", -next.Remaining)
			}
		} else {
			if next.Remaining != have {
				t.Fatalf("a denied call changed the value from %v to %v", have, next.Remaining)
			}
			if d.RetryAfter == 0 {
				t.Fatalf("a denied call reports no wait")
			}
		}
		if !(next.TS >= prev.TS || !found) {
			t.Fatalf("ts moved back from %d to %d", prev.TS, next.TS)
		}

		// The same call against two shards.
		q := p
		if fixed {
			q.Phase = floorMod(phase*7+3, period)
		}
		sb := driver.State{Remaining: clamp(other), TS: base}
		if fixed {
			sb.TS = windowStart(q, sb.TS)
		}
		if !reserve && count > 2*p.Capacity {
			count = 2 * p.Capacity
		}
		op := &driver.Op{Now: now, Reserve: reserve, Items: []driver.Item{{Count: count, Shards: []driver.Shard{{Params: p}, {Index: 1, Params: q}}}}}
		prevs := []driver.Record{{State: prev, Found: found}, {State: sb, Found: true}}
		out := make([]driver.Decision, 1)
		ups := make([]driver.Update, 2)
		Evaluate(op, prevs, out, ups)
		ha, hb := have, StateAt(q, prevs[1], now).Remaining
		for i, h := range []float64{ha, hb} {
			u := ups[i]
			if !u.Write {
				continue
			}
			if !out[0].OK {
				t.Fatalf("a denied pair wrote shard %d", i)
			}
			if u.State.Remaining > h || u.State.Remaining > p.Capacity {
				t.Fatalf("shard %d went from %v to %v: tokens minted", i, h, u.State.Remaining)
			}
			if p.MaxReserved > 0 && -u.State.Remaining > p.MaxReserved*(1+1e-12) {
				t.Fatalf("shard %d owes %v, above MaxReserved %v", i, -u.State.Remaining, p.MaxReserved)
			}
		}
		if out[0].OK {
			taken := out[0].Charged[0] + out[0].Charged[1]
			if math.Abs(taken-count) > 1e-9*math.Max(1, count) && math.Abs(taken-count) > noise {
				t.Fatalf("pair charged %v for a count of %v", taken, count)
			}
		}
		if out[0].RetryAfter < 0 {
			t.Fatalf("negative pair retry-after")
		}
	})
}
