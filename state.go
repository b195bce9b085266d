package ratelimit

import (
	"math"

	"github.com/ratelimit-go/ratelimit/driver"
)

// This file is the one definition of the semantics (docs/model.md). Every
// store runs Evaluate or, where it has a native port (Lua, SQL), is proved
// equal to it by the differential tests of package storetest. Everything
// here is pure: time is a parameter, nothing is read or written.
//
// Arithmetic follows a fixed order so that Go, Lua and SQL agree to the last
// bit: multiply before dividing, left to right, every operation rounded to
// float64. Explicit float64(...) conversions around products forbid the
// compiler from fusing a multiply and an add into one instruction.

// noise is the float noise below which a negative amount counts as zero.
const noise = driver.Noise

// fresh returns the state of a missing record at now: a full bucket whose
// window (fixed window) or refill (token bucket) starts now.
func fresh(p driver.Params, now int64) driver.State {
	if p.Kind == driver.FixedWindow {
		return driver.State{Remaining: p.Capacity, TS: windowStart(p, now)}
	}
	return driver.State{Remaining: p.Capacity, TS: now}
}

// windowStart returns the start of the fixed window containing t: the
// largest Phase + k·Period ≤ t.
func windowStart(p driver.Params, t int64) int64 {
	off := (t - p.Phase) % p.Period
	if off < 0 {
		off += p.Period
	}
	return t - off
}

// refresh returns s advanced to now: the grants of every window started
// (fixed window) or the refill (token bucket) since s.TS, capped at
// Capacity. A now before s.TS (a clock stepping back) changes nothing. A
// record written under a larger capacity (a limit lowered, or split into
// shards) is cut to this one: a record never holds more than its params
// allow.
func refresh(p driver.Params, s driver.State, now int64) driver.State {
	t := max(now, s.TS)
	switch p.Kind {
	case driver.FixedWindow:
		k := (t - s.TS) / p.Period
		if k > 0 {
			s.Remaining += float64(p.Rate * float64(k))
			s.TS += k * p.Period
		}
	case driver.TokenBucket:
		s.Remaining += float64(t-s.TS) * p.Rate / float64(p.Period)
		s.TS = t
	}
	s.Remaining = math.Min(s.Remaining, p.Capacity)
	return s
}

// StateAt is the state of rec at now: refreshed if found, fresh if missing.
func StateAt(p driver.Params, rec driver.Record, now int64) driver.State {
	if rec.Found {
		return refresh(p, rec.State, now)
	}
	return fresh(p, now)
}

// wait returns the milliseconds from now until a call of count, which may
// leave a debt of allow tokens, would be granted on the record b as
// stored, whose state at now is s (StateAt; b is s itself for a record
// missing, or one written at now): the end of the first whole number of
// windows (fixed window) or milliseconds (token bucket) from s.TS at
// which b refreshed as refresh refreshes it, grants counted from b.TS and
// capped at Capacity, passes
//
//	(Remaining − count) + allow > −noise,
//
// the comparison by which the transition grants a call (denoise, and
// fitsDebt with allow = MaxReserved). The estimate from the shortfall at
// now less the noise is tried against that comparison, a step less or a
// few more, so that rounding neither adds a step nor takes one away: the
// call succeeds at the wait, and not a window or a millisecond before.
// For a debt v written at s.TS, wait(s, s, 0, 0) with s.Remaining = v is
// when the tokens owed have been granted.
func wait(p *driver.Params, b, s driver.State, now int64, count, allow float64) float64 {
	d := -((s.Remaining - count) + allow)
	if p.Kind == driver.FixedWindow {
		var k0 float64 // the windows b has had by now
		if s.TS != b.TS {
			k0 = float64((s.TS - b.TS) / p.Period) // a division only past b's window
		}
		j := math.Ceil((d - noise) / p.Rate)
		if j < 0 {
			j = 0
		}
		if j > 0 && grants(min(b.Remaining+float64(p.Rate*(k0+j-1)), p.Capacity), count, allow) {
			j--
		} else {
			for range waitTries {
				if grants(min(b.Remaining+float64(p.Rate*(k0+j)), p.Capacity), count, allow) {
					break
				}
				j++
			}
		}
		return float64(float64(p.Period)*j) + float64(s.TS-now)
	}
	e0 := float64(s.TS - b.TS) // the refill b has had by now
	dt := math.Ceil((d - noise) * float64(p.Period) / p.Rate)
	if dt < 0 {
		dt = 0
	}
	if dt > 0 && grants(min(b.Remaining+(e0+dt-1)*p.Rate/float64(p.Period), p.Capacity), count, allow) {
		dt--
	} else {
		for range waitTries {
			if grants(min(b.Remaining+(e0+dt)*p.Rate/float64(p.Period), p.Capacity), count, allow) {
				break
			}
			dt++
		}
	}
	return float64(max(now, s.TS)-now) + dt
}

// grants reports whether a record holding v tokens grants a call of count
// that may leave a debt of allow: the transition's comparison, the noise
// included.
func grants(v, count, allow float64) bool {
	return (v-count)+allow > -noise
}

// waitTries bounds the search of wait past an estimate that rounding left
// short; beyond it the steps are below float precision, and the wait
// stands.
const waitTries = driver.WaitTries

// retryMillis rounds a wait up to whole milliseconds, within
// [0, MaxRetryAfter].
func retryMillis(w float64) int64 {
	w = math.Ceil(w)
	switch {
	case !(w > 0): // also NaN
		return 0
	case w >= float64(driver.MaxRetryAfter):
		return driver.MaxRetryAfter
	}
	return int64(w)
}

// denoise maps float noise just below zero to exactly zero.
func denoise(v float64) float64 {
	if v < 0 && v > -noise {
		return 0
	}
	return v
}

// fitsDebt reports whether a value v may be written by a reservation: a
// debt within MaxReserved, with the tolerance of denoise, so that a debt
// beyond it by float noise alone (1 − 1.3 = −0.30000000000000004 against
// a MaxReserved of 0.3) is within it.
func fitsDebt(p driver.Params, v float64) bool {
	return p.MaxReserved == 0 || v+p.MaxReserved > -noise
}

// transition is TransitionInto with the decision returned by value.
func transition(p driver.Params, prev driver.State, found bool, now int64, count float64, reserve bool) (driver.State, driver.Decision) {
	var d driver.Decision
	s := TransitionInto(&d, &p, prev, found, now, count, reserve)
	return s, d
}

// TransitionInto decides one call on one record: given the limit's params,
// the record as stored (found false for a missing record), the time now in
// Unix milliseconds, the count of tokens asked for and whether the call may
// reserve, it writes the decision to *d (every field; Now and TS zero) and
// returns the record's next state. The next state must be stored only when
// the decision is OK and count > 0. It reads p.Phase only when found is
// false: a stored record carries its windows in its TS. The decision is
// written in place because a Decision returned by value is copied through
// memory, which costs more than the transition itself; stores that decide
// one record at a time on a hot path call it (memstore's Binder).
//
// TransitionInto does not validate its inputs: the Limiter rejects invalid
// configs and counts before any store sees them.
//
// It is the semantics' StateAt (refresh or fresh) followed by settle, with
// the commonest cases taken first: a refresh within the record's window,
// or a token bucket's within its millisecond (no division), then a count
// the bucket holds (no wait to compute), then a refusal of a call that
// does not reserve (no branches of settle).
// FuzzTransitionFastPath proves it equal to StateAt and settle, which the Lua
// and SQL ports mirror.
func TransitionInto(d *driver.Decision, p *driver.Params, prev driver.State, found bool, now int64, count float64, reserve bool) driver.State {
	var s driver.State
	switch {
	case !found:
		s = fresh(*p, now)
	case p.Kind == driver.TokenBucket && now <= prev.TS:
		// refreshFast within the record's millisecond (a hot key), or
		// before it: 0·Rate divided by a Period ≥ 1 is 0·Rate, sign and
		// NaN alike, so the refill needs no division.
		s = driver.State{Remaining: min(prev.Remaining+0*p.Rate, p.Capacity), TS: prev.TS}
	default:
		s = refreshFast(p, prev, now)
	}
	// The v >= 0 case of settle, where denoise leaves v as it is, for a
	// call that is not a reservation of a caller lagging the record.
	v := s.Remaining - count
	if v >= 0 && (!reserve || s.TS <= now) {
		*d = driver.Decision{OK: true, Remaining: v, Charged: [2]float64{count, 0}}
		return driver.State{Remaining: v, TS: s.TS}
	}
	// The refusal of a call that does not reserve and falls short by more
	// than the noise (which denoise leaves as it is): settle's last case,
	// the commonest on a limit under attack.
	if v <= -noise && !reserve {
		if !found {
			prev = s
		}
		*d = driver.Decision{RetryAfter: retryMillis(wait(p, prev, s, now, count, 0)), Remaining: s.Remaining}
		return s
	}
	if !found {
		prev = s
	}
	return settle(d, p, prev, s, now, count, reserve)
}

// refreshFast is refresh, the same arithmetic in the same order, without
// the integer division of a fixed window while now is still in the
// record's window, and with the builtin min (which agrees with math.Min on
// every input, signed zeros and NaN included) rather than a call.
func refreshFast(p *driver.Params, s driver.State, now int64) driver.State {
	t := max(now, s.TS)
	if p.Kind == driver.FixedWindow {
		if el := t - s.TS; el >= p.Period {
			k := el / p.Period
			s.Remaining += float64(p.Rate * float64(k))
			s.TS += k * p.Period
		}
	} else {
		s.Remaining += float64(t-s.TS) * p.Rate / float64(p.Period)
		s.TS = t
	}
	s.Remaining = min(s.Remaining, p.Capacity)
	return s
}

// settle decides a call of count on s, the record rec refreshed to now (by
// StateAt; rec is s for a missing record): it writes the decision to *d
// and returns the record's next state.
func settle(d *driver.Decision, p *driver.Params, rec, s driver.State, now int64, count float64, reserve bool) driver.State {
	v := denoise(s.Remaining - count)
	*d = driver.Decision{}
	switch {
	case v >= 0 && reserve:
		// A reservation's time is when its tokens were granted: for a
		// caller whose clock lags the record's, that is still ahead.
		d.OK = true
		d.RetryAfter = retryMillis(float64(s.TS - now))
	case v >= 0:
		d.OK = true
	case reserve && fitsDebt(*p, v):
		d.OK = true
		debt := driver.State{Remaining: v, TS: s.TS}
		d.RetryAfter = retryMillis(wait(p, debt, debt, now, 0, 0))
	default:
		// Until the call would fit: for a reservation, until its debt
		// would fit MaxReserved.
		var allow float64
		if reserve {
			allow = p.MaxReserved
		}
		d.RetryAfter = retryMillis(wait(p, rec, s, now, count, allow))
		d.Remaining = s.Remaining
		return s
	}
	d.Remaining = v
	d.Charged[0] = count
	s.Remaining = v
	return s
}

// Evaluate decides op over the records it touches. prev holds them as
// stored, in the order of AppendRecordIDs; Evaluate fills out (one Decision
// per item) and next (one Update per record) and reports whether every
// item is OK. A store that runs Evaluate reads prev, calls it, and writes
// the updates marked Write, all atomically.
func Evaluate(op *driver.Op, prev []driver.Record, out []driver.Decision, next []driver.Update) bool {
	all := true
	r := 0
	for i := range op.Items {
		it := &op.Items[i]
		n := len(it.Shards)
		switch {
		case op.Mode == driver.ModeRefund:
			out[i], next[r] = refund(it.Shards[0].Params, prev[r], op.Now, it.At, it.Run, it.Count)
		case n == 1:
			next[r] = single(&out[i], &it.Shards[0].Params, prev[r], op.Now, it.Count, op.Reserve)
		default:
			out[i], next[r], next[r+1] = pair(it.Shards[0].Params, it.Shards[1].Params,
				prev[r], prev[r+1], op.Now, it.Count, op.Reserve)
		}
		out[i].Now, out[i].TS = op.Now, next[r].State.TS
		all = all && out[i].OK
		r += n
	}
	if op.Mode == driver.ModeCheck || (op.Mode == driver.ModeLimit && !all) {
		for j := range next[:r] {
			next[j].Write = false
		}
	}
	return all
}

func single(d *driver.Decision, p *driver.Params, rec driver.Record, now int64, count float64, reserve bool) driver.Update {
	s := TransitionInto(d, p, rec.State, rec.Found, now, count, reserve)
	return driver.Update{State: s, Write: d.OK && count > 0}
}

// refund hands back count tokens charged at `at`, whose job may run at
// run (a run before at reads as at), as far as the record would have them
// had it not been charged: count, less what the limit has granted the
// record since (the grants of every window started since, or the
// refill), floored at zero, then capped at Capacity; and nothing at all
// while reservations made after the charge stand behind it (queued).
//
// Tokens handed back this way never let the limit grant more than it
// would have without the charge: a charge lowers the record by count, and
// of the grants since, the record without the charge would have lost at
// most what it gained, when its capacity cut a grant short. Within the
// window of the charge (or the same millisecond of a token bucket) the
// whole count comes back; a cancel after the tokens of a reservation have
// been granted gives back nothing more than the grants since could not
// have covered, so one window cannot serve both its own grants and a late
// refund (docs/reservations.md).
//
// Nor do they give a window more jobs than the limit grants it. A debt is
// a queue: each reservation holds the tokens from the debt before it to
// the debt it left, and runs when the last of them is granted. Tokens
// handed back shorten the queue at its tail, while the reservations
// behind the one refunded keep their times; the tokens at the tail would
// then be reserved again, at the tail's time, and that window would run
// the jobs of its own tokens and those of the refunded one. So a refund
// gives back nothing while the record owes tokens that are granted after
// run (queued): the tokens are lost, never granted twice. When the debt is
// granted at run or before, the refunded reservation is the tail, or
// shares its window (its millisecond, for a token bucket) with the
// reservations behind it: the tokens handed back are then those of run's
// window, which the reservations made after them take again in the same
// window, or earlier, never more than the refunded one held.
func refund(p driver.Params, rec driver.Record, now, at, run int64, count float64) (driver.Decision, driver.Update) {
	if !rec.Found {
		return driver.Decision{OK: true, Remaining: p.Capacity}, driver.Update{State: fresh(p, now)}
	}
	s := refresh(p, rec.State, now)
	d := driver.Decision{OK: true, Remaining: s.Remaining}
	if queued(&p, rec.State, s, max(run, at)) {
		return d, driver.Update{State: s}
	}
	back := denoise(count - granted(p, s, at))
	if back <= 0 {
		return d, driver.Update{State: s}
	}
	v := math.Min(s.Remaining+back, p.Capacity)
	if !(v > s.Remaining) {
		return d, driver.Update{State: s} // full already: nothing comes back
	}
	d.Charged[0] = s.Remaining - v // what came back, negative
	s.Remaining, d.Remaining = v, v
	return d, driver.Update{State: s, Write: true}
}

// queued reports whether the record b as stored, whose state at the
// refund's now is s, owes tokens (beyond the noise) that are granted after
// run: the time of the debt's tail, a window's start or a millisecond, as
// the reservation that left the debt was told it (settle's wait of a
// debt), is later than run.
//
// The tail's time is computed from b, at b's own time, not from s: it is
// then the very computation that gave the last reservation its time, to
// the bit, however long ago that was. From s, refreshed by a refill that
// rounds, the estimate of a token bucket's wait starts from another
// float, and may settle a millisecond later for the very same debt: a
// refund of the tail itself would then give nothing. A reservation's time
// is at + its RetryAfter, both on the store's clock, and RetryAfter is
// that wait rounded up: b.TS plus the wait rounded up, for the same debt,
// is run exactly. A debt within the noise is no debt, as it grants a call.
//
// For a sharded limit the rule holds shard by shard: a token names each
// shard it charged, and the refund of each is judged on that shard's
// record, against the token's run. A reservation's debt lies on one shard
// (pair), whose time is the token's; a shard it charged without a debt
// holds no place in a queue, and any debt on it since stands behind. Only
// a count beyond a shard's capacity and MaxReserved spreads a debt over
// both shards, and the item's time is then the later of theirs; but split
// leaves the two the same debt, so that their times differ only by their
// phases, less than a window: a fixed window's tail at or before run is
// then in the window of the shard's own time. (A token bucket's differ
// only for a caller whose clock lags a shard's record.) A LimitAll
// reservation's token carries the latest time of its limits, which a
// limit granted its tokens earlier may have reservations behind: the
// Limiter sends its charge's time instead (settle).
func queued(p *driver.Params, b, s driver.State, run int64) bool {
	if !(denoise(s.Remaining) < 0) {
		return false
	}
	return b.TS+retryMillis(wait(p, b, b, b.TS, 0, 0)) > run
}

// granted returns the tokens the record s, refreshed, has been granted
// since the time from, before its capacity cut them: Rate for every window
// of the record started in (from, s.TS] (a fixed window's record keeps the
// windows it was written with), or the refill from `from` to s.TS.
func granted(p driver.Params, s driver.State, from int64) float64 {
	if s.TS <= from {
		return 0
	}
	if p.Kind == driver.FixedWindow {
		k := (s.TS - from + p.Period - 1) / p.Period
		return float64(p.Rate * float64(k))
	}
	return float64(s.TS-from) * p.Rate / float64(p.Period)
}

// pair decides a call on two shards of one limit (power of two choices),
// preferring, in order:
//
//   - one shard that grants it alone: the one left with more tokens;
//   - both together: debited so that they end with equal values
//     (water-filling: a shard already below that level is not charged);
//   - for a reservation, one shard that owes it alone: the one whose debt
//     is granted first. Only a count that no shard could ever owe alone
//     (more than its Capacity plus MaxReserved) is spread as debt over both.
//     A debt spread over two shards would leave fractions of tokens on
//     each, and the jobs that later take them would run in the next window
//     with tokens of this one: more jobs in that window than the limit
//     allows (docs/sharding.md).
//
// A refused call is told the least wait after which the same call on the
// same two shards would succeed (pairWait). The wait of a reservation is
// that of the shards it charged; a reservation of 0, which charges
// neither, waits for the debt of the shard whose debt is granted first
// (zeroWait), as on one record.
func pair(pa, pb driver.Params, ra, rb driver.Record, now int64, count float64, reserve bool) (driver.Decision, driver.Update, driver.Update) {
	sa, sb := StateAt(pa, ra, now), StateAt(pb, rb, now)
	var d driver.Decision
	ua, ub := driver.Update{State: sa}, driver.Update{State: sb}
	na, nb, ca, cb, ok := split(pa, pb, sa, sb, now, count, reserve)
	if !ok {
		d.RetryAfter = retryMillis(pairWait(pa, pb, ra, rb, now, count, reserve))
		d.Remaining = sa.Remaining + sb.Remaining
		return d, ua, ub
	}
	d.OK = true
	d.Charged = [2]float64{ca, cb}
	// A reservation runs once the tokens it took from each shard were
	// granted: debts, or, for a caller whose clock lags a record's, that
	// record's time.
	var w float64
	if ca > 0 {
		if na < 0 {
			debt := driver.State{Remaining: na, TS: sa.TS}
			w = max(w, wait(&pa, debt, debt, now, 0, 0))
		} else if reserve {
			w = max(w, float64(sa.TS-now))
		}
	}
	if cb > 0 {
		if nb < 0 {
			debt := driver.State{Remaining: nb, TS: sb.TS}
			w = max(w, wait(&pb, debt, debt, now, 0, 0))
		} else if reserve {
			w = max(w, float64(sb.TS-now))
		}
	}
	if count == 0 && reserve {
		// A reservation of 0 takes nothing, so split charged neither
		// shard; its job waits, as on one record, for the debt before it:
		// on the shard whose debt (or, for a caller lagging a record, the
		// record's time) comes first, of those it fits, when a plain call
		// of 0 on the two is granted again.
		w = math.Min(zeroWait(&pa, sa, now), zeroWait(&pb, sb, now))
	}
	d.RetryAfter = retryMillis(w)
	d.Remaining = na + nb
	ua.State.Remaining, ua.Write = na, ca > 0
	ub.State.Remaining, ub.Write = nb, cb > 0
	return d, ua, ub
}

// zeroWait returns the milliseconds from now until the job of a
// reservation of 0 on the shard s, refreshed to now, may run, as settle
// times it on one record: its record's time, or the time its debt is
// granted; +Inf when the shard owes more than MaxReserved (a limit
// lowered since), which takes no reservation.
func zeroWait(p *driver.Params, s driver.State, now int64) float64 {
	v := denoise(s.Remaining)
	switch {
	case v >= 0:
		return float64(s.TS - now)
	case fitsDebt(*p, v):
		debt := driver.State{Remaining: v, TS: s.TS}
		return wait(p, debt, debt, now, 0, 0)
	}
	return math.Inf(1)
}

// split returns the values two shards, refreshed to now, would hold after
// a call of count as pair decides it, the tokens charged to each, and
// whether the call is OK. A shard that takes the call alone is charged the
// count itself.
func split(pa, pb driver.Params, sa, sb driver.State, now int64, count float64, reserve bool) (na, nb, ca, cb float64, ok bool) {
	va, vb := denoise(sa.Remaining-count), denoise(sb.Remaining-count)
	if va >= 0 || vb >= 0 {
		if va >= vb {
			return va, sb.Remaining, count, 0, true
		}
		return sa.Remaining, vb, 0, count, true
	}
	na, nb = sa.Remaining, sb.Remaining
	x := denoise((sa.Remaining + sb.Remaining - count) / 2)
	switch {
	case x <= sa.Remaining && x <= sb.Remaining:
		na, nb = x, x
	case sa.Remaining >= sb.Remaining:
		na = va
	default:
		nb = vb
	}
	if na >= 0 && nb >= 0 {
		return na, nb, sa.Remaining - na, sb.Remaining - nb, true
	}
	if !reserve {
		return na, nb, 0, 0, false
	}
	fa, fb := fitsDebt(pa, va), fitsDebt(pb, vb)
	da, db := driver.State{Remaining: va, TS: sa.TS}, driver.State{Remaining: vb, TS: sb.TS}
	switch {
	case fa && (!fb || wait(&pa, da, da, now, 0, 0) <= wait(&pb, db, db, now, 0, 0)):
		return va, sb.Remaining, count, 0, true
	case fb:
		return sa.Remaining, vb, 0, count, true
	case count > pa.Capacity+pa.MaxReserved || count > pb.Capacity+pb.MaxReserved:
		if fitsDebt(pa, na) && fitsDebt(pb, nb) {
			return na, nb, sa.Remaining - na, sb.Remaining - nb, true
		}
	}
	return na, nb, 0, 0, false
}

// pairTries bounds how many candidate times from an estimate pairWait
// tries before it gives the estimate up.
const pairTries = 4

// pairWait returns the least wait, in milliseconds from now, after which a
// call refused on two shards would succeed on the same shards if nothing
// else happened meanwhile: the earliest of the times at which either shard
// alone, or both together, could grant it. Each shard alone gives an
// estimate never later than its true time (it ignores the other shard);
// both together give one that ignores a shard's capacity, and rounds
// down, but counts their shortfall in full, while split grants a call the
// two fall short of by less than twice the noise (the tolerance of their
// common level): it may be late. Nor does it know of a record written by
// a clock ahead of now, which gains tokens alone until the other's time
// catches up: it may then be early, or late, by many windows or
// milliseconds. Candidate times from each estimate on are tried with
// split until one succeeds, at most pairTries of them. The earliest time
// found to succeed is then searched back from (searchBack), so that the
// wait is the first millisecond at which the call succeeds and the one
// before it fails: a step back for every refused call, more only when an
// estimate was late. When no candidate succeeds (every estimate early
// past pairTries, or beyond MaxRetryAfter, as a late one of a limit of
// years may be), the call is tried at MaxRetryAfter, and if it succeeds
// there the whole range to it is bisected: the wait is never shorter than
// needed, nor longer. At most MaxRetryAfter, which a call that succeeds
// only later is told.
func pairWait(pa, pb driver.Params, ra, rb driver.Record, now int64, count float64, reserve bool) float64 {
	sa, sb := StateAt(pa, ra, now), StateAt(pb, rb, now)
	okAt := func(t int64) bool {
		_, _, _, _, ok := split(pa, pb, StateAt(pa, ra, t), StateAt(pb, rb, t), t, count, reserve)
		return ok
	}
	// next returns the first time after t at which a shard gains tokens.
	next := func(t int64) int64 {
		if pa.Kind == driver.FixedWindow {
			return min(windowStart(pa, t)+pa.Period, windowStart(pb, t)+pb.Period)
		}
		return t + 1
	}
	best := float64(driver.MaxRetryAfter)
	found := false // whether the call succeeds at now + best
	try := func(est float64) {
		if !(est < best) {
			return
		}
		t := now + int64(math.Ceil(est))
		for range pairTries {
			if !(float64(t-now) < best) {
				return
			}
			if okAt(t) {
				best, found = float64(t-now), true
				return
			}
			t = next(t)
		}
	}
	// One shard alone, once it would grant the call as it does when full:
	// a count above its capacity (plus its debt allowance) by float noise
	// alone included, as split grants it.
	single := func(p driver.Params, r driver.Record, s driver.State) {
		var allow float64
		if reserve {
			allow = p.MaxReserved
		}
		if grants(p.Capacity, count, allow) {
			b := s
			if r.Found {
				b = r.State
			}
			try(wait(&p, b, s, now, count, allow))
		}
	}
	single(pa, ra, sa)
	single(pb, rb, sb)
	// Both together: they need count tokens between them, or, for a count
	// no shard could owe alone, count less both debt allowances.
	need := count
	if reserve && (count > pa.Capacity+pa.MaxReserved || count > pb.Capacity+pb.MaxReserved) {
		need -= 2 * math.Min(pa.MaxReserved, pb.MaxReserved)
	}
	if need <= pa.Capacity+pb.Capacity {
		try(sumWait(pa, pb, sa, sb, now, need))
	}
	step := int64(1) // searchBack's first step back, from a time found
	if !found {
		// None found, best is MaxRetryAfter: is the call granted by then?
		step, found = 0, okAt(now+driver.MaxRetryAfter)
	}
	if found {
		best = float64(searchBack(okAt, now, now+int64(best), step) - now)
	}
	return best
}

// searchBack returns the first millisecond in (lo, hi] at which ok holds,
// given that it fails at lo and holds at hi, and that it only changes from
// failing to holding as time goes on (shards only gain tokens): from hi,
// it steps back by d, doubling while ok holds, then halves the interval
// between the last time it failed and the first it held. A d of 1 tries
// the millisecond before hi first, for an hi found from an estimate; a d
// of 0 halves from the start, for an hi that is only a bound. Each probe
// narrows (lo, hi], so the search ends; the doubling and the halving take
// at most 44 probes each over any wait within MaxRetryAfter (< 2^44 ms).
// For a fixed window, whose shards gain tokens only at their windows'
// starts, the millisecond found is such a start.
func searchBack(ok func(int64) bool, lo, hi, d int64) int64 {
	for hi-lo > 1 {
		t := hi - d
		if d == 0 || t <= lo {
			d, t = 0, lo+(hi-lo)/2
		}
		if ok(t) {
			hi = t
			d *= 2
		} else {
			lo, d = t, 0
		}
	}
	return hi
}

// sumWait estimates the milliseconds from now until two shards hold need
// tokens between them: grants that a shard's capacity would cut count in
// full until the other shard must make up the rest alone. It counts the
// shortfall in full, so that it may be later than the first time split
// grants the call, which tolerates twice the noise; pairWait searches back
// from it.
func sumWait(pa, pb driver.Params, sa, sb driver.State, now int64, need float64) float64 {
	short := need - sa.Remaining - sb.Remaining
	if short <= 0 {
		return 0
	}
	if pa.Kind == driver.FixedWindow {
		// Grants come one shard at a time, at the windows' starts: the
		// j-th grant after now is the shard first in turn's when j is odd.
		r := math.Max(pa.Rate, pb.Rate)
		fa, fb := sa.TS+pa.Period, sb.TS+pb.Period
		first, second := fa, fb
		if fb < fa {
			first, second = fb, fa
		}
		j := math.Max(math.Ceil(short/r-noise), 1)
		at := float64(second) + float64(float64(pa.Period)*(j/2-1))
		if math.Mod(j, 2) == 1 {
			at = float64(first) + float64(float64(pa.Period)*((j-1)/2))
		}
		ka, kb := math.Ceil(j/2), math.Floor(j/2)
		if fb < fa {
			ka, kb = kb, ka
		}
		// A shard full by then makes the other make up the rest alone.
		if sa.Remaining+float64(pa.Rate*ka) > pa.Capacity {
			if k := math.Ceil((need-pa.Capacity-sb.Remaining)/pb.Rate - noise); k >= 1 {
				at = math.Max(at, float64(fb)+float64(float64(pb.Period)*(k-1)))
			}
		} else if sb.Remaining+float64(pb.Rate*kb) > pb.Capacity {
			if k := math.Ceil((need-pb.Capacity-sa.Remaining)/pa.Rate - noise); k >= 1 {
				at = math.Max(at, float64(fa)+float64(float64(pa.Period)*(k-1)))
			}
		}
		return at - float64(now)
	}
	// Token buckets refill together, from the later of now and each
	// shard's time; until one is full, they gain both rates at once.
	at := float64(max(sa.TS, sb.TS)-now) + short*float64(pa.Period)/(pa.Rate+pb.Rate)
	fullA := float64(sa.TS-now) + (pa.Capacity-sa.Remaining)*float64(pa.Period)/pa.Rate
	fullB := float64(sb.TS-now) + (pb.Capacity-sb.Remaining)*float64(pb.Period)/pb.Rate
	switch {
	case fullA < at: // a full first: b makes up the rest alone
		at = math.Max(at, float64(sb.TS-now)+(need-pa.Capacity-sb.Remaining)*float64(pb.Period)/pb.Rate)
	case fullB < at:
		at = math.Max(at, float64(sa.TS-now)+(need-pb.Capacity-sa.Remaining)*float64(pa.Period)/pa.Rate)
	}
	return math.Max(math.Floor(at), 0)
}

// FullAt returns the earliest Unix millisecond at which the record s would
// be a full bucket again, so that a store may drop it from then on and
// re-create it, by fresh, exactly as it would have been.
func FullAt(p driver.Params, s driver.State) int64 {
	if s.Remaining >= p.Capacity {
		return s.TS
	}
	short := p.Capacity - s.Remaining
	if p.Kind == driver.FixedWindow {
		k := math.Ceil(short / p.Rate)
		for range fullAtTries {
			if s.Remaining+float64(p.Rate*k) >= p.Capacity {
				return addMillis(s.TS, float64(p.Period)*k)
			}
			k++ // rounding left the grant a hair short
		}
		return driver.Never
	}
	dt := math.Ceil(short * float64(p.Period) / p.Rate)
	for range fullAtTries {
		if s.Remaining+dt*p.Rate/float64(p.Period) >= p.Capacity {
			return addMillis(s.TS, dt)
		}
		dt++
	}
	return driver.Never
}

// fullAtTries bounds the search past a rounding shortfall; beyond it the
// increments are below float precision and FullAt gives up (Never).
const fullAtTries = 3

// addMillis adds a float number of milliseconds to t, a time within
// ±driver.MaxTime: Never when the sum would lie beyond Never − driver.MaxTime (some
// 290 million years ahead), so that no valid time overflows.
func addMillis(t int64, ms float64) int64 {
	if !(ms < float64(driver.Never-driver.MaxTime)) {
		return driver.Never
	}
	return t + int64(ms)
}
