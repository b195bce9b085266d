package driver

import (
	"errors"
	"fmt"
	"math"

	"github.com/ratelimit-go/ratelimit/internal/numtext"
)

// ErrOutLength is the error, wrapped, of a call whose out has a place for
// fewer than each of its items or ids, or a batch without one out per op.
// A store refuses such a call before it decides, reads or writes anything:
// a decision it could not report must not be made.
var ErrOutLength = errors.New("outs of the wrong length")

// ErrInvalidOp is the error, wrapped, of a call with an op that breaks a
// rule of Op (CheckOp lists them), or of a batch holding one. A store
// refuses such a call before it decides, reads or writes anything: the
// stores would each decide it their own way, and the Limiter never sends
// one.
var ErrInvalidOp = errors.New("invalid op")

// CheckOut returns nil if out has a place for each item of op and op is
// valid (CheckOp), and otherwise an error matching ErrOutLength or
// ErrInvalidOp: what Apply returns, wrapped, before anything else.
func CheckOut(op *Op, out []Decision) error {
	if op != nil && len(out) < len(op.Items) {
		return outError("an op of %d items and an out of %d decisions: pass one per item", len(op.Items), len(out))
	}
	return CheckOp(op)
}

// CheckOuts returns nil if outs holds one out per op, each with a place for
// each of its op's items, and every op is valid (CheckOp), and otherwise an
// error matching ErrOutLength or ErrInvalidOp: what ApplyBatch returns,
// wrapped, before anything else. One invalid op refuses the whole batch.
func CheckOuts(ops []*Op, outs [][]Decision) error {
	if len(outs) != len(ops) {
		return outError("%d ops and %d outs: pass one out per op", len(ops), len(outs))
	}
	for i, op := range ops {
		if op != nil && len(outs[i]) < len(op.Items) {
			return outError("op %d of %d items and an out of %d decisions: pass one per item", i, len(op.Items), len(outs[i]))
		}
	}
	for i, op := range ops {
		if err := CheckOp(op); err != nil {
			return fmt.Errorf("op %d of the batch: %w", i, err)
		}
	}
	return nil
}

// CheckOp returns nil if op keeps the rules of its fields, and otherwise an
// error matching ErrInvalidOp that says which it breaks:
//
//   - op is not nil;
//   - Mode is ModeLimit, ModeCheck or ModeRefund;
//   - Now is within ±MaxTime, and so are every item's At and Run in
//     ModeRefund (they are unused, and unchecked, in the other modes);
//   - every item's Count is a finite number ≥ 0, and, in ModeLimit and
//     ModeCheck, 0 or from 1e-8 (ratelimit.MinCount) to 1e15
//     (ratelimit.MaxTokens), as the Limiter asks: a decision forgives a
//     shortfall below Noise, so that a smaller count would be granted on
//     an empty bucket, again and again, and no call may ask for more than
//     MaxTokens, however many shards its item has (a refund's count, a
//     share of a charge handed back, is held to neither bound);
//   - every item has one shard or two, and one in ModeRefund; an item's
//     two shards have different indexes, and the same params but for
//     their phases (a limit's shares);
//   - every item has the Key of the first, and no two items name the same
//     record (Name and shard index);
//   - every shard's Params are in range (see Params): Kind FixedWindow or
//     TokenBucket; Period from 1 ms to 100 years (ratelimit.MaxPeriod);
//     Phase in [0, Period); Rate from 1e-9/1024 to 1e15; Capacity and
//     MaxReserved from 0 to 1e15 (NaN and infinities are out of every
//     range);
//   - Settle is nil unless Mode is ModeRefund, and a Settlement comes with
//     at least one item, has Kind SettleCancel or SettleUse, and its Until
//     is within ±MaxTime.
//
// These are the bounds of the limits ratelimit.New accepts, divided among
// their shards: within them every store computes every decision alike,
// and the Limiter sends nothing outside them. CheckOut and CheckOuts call
// it: a store that calls those need not call it again.
func CheckOp(op *Op) error {
	if op == nil {
		return opError("a nil op: give an op (its Mode, Now and Items), or make no call")
	}
	if op.Mode > ModeRefund {
		return opError("mode %d: use ModeLimit, ModeCheck or ModeRefund", op.Mode)
	}
	if op.Now < -MaxTime || op.Now > MaxTime {
		return opError("now %d is beyond ±MaxTime (%d): give a time in Unix milliseconds within it", op.Now, MaxTime)
	}
	one := op.Mode == ModeRefund
	for i := range op.Items {
		it := &op.Items[i]
		n := len(it.Shards)
		if n != 1 && (n != 2 || one) {
			return opError("item %d (%q) of a mode %d op has %d shards: give an item one or two, a refund's one", i, it.Name, op.Mode, n)
		}
		if !(it.Count >= 0 && it.Count <= math.MaxFloat64) {
			return opError("item %d (%q) has a count of %s: give a finite number of tokens ≥ 0", i, it.Name, numtext.Format(it.Count))
		}
		if it.Count < minCount && it.Count > 0 && !one {
			return opError("item %d (%q) of a mode %d op has a count of %s, above 0 and below %s (ratelimit.MinCount), "+
				"which a decision could not tell from the noise of its arithmetic (Noise): give 0 or at least %s",
				i, it.Name, op.Mode, numtext.Format(it.Count), numtext.Format(minCount), numtext.Format(minCount))
		}
		if it.Count > maxTokens && !one {
			return opError("item %d (%q) of a mode %d op has a count of %s, above %s (ratelimit.MaxTokens), the most tokens one call may ask for: split the call",
				i, it.Name, op.Mode, numtext.Format(it.Count), numtext.Format(maxTokens))
		}
		if one && (it.At < -MaxTime || it.At > MaxTime) {
			return opError("item %d (%q) of a refund was charged at %d, beyond ±MaxTime (%d): give the time of the charge, the Decision.Now of the call that took the tokens", i, it.Name, it.At, MaxTime)
		}
		if one && (it.Run < -MaxTime || it.Run > MaxTime) {
			return opError("item %d (%q) of a refund has its job run at %d, beyond ±MaxTime (%d): give the time the job of the charge may run, its At plus the call's RetryAfter", i, it.Name, it.Run, MaxTime)
		}
		for j := range it.Shards {
			if k := it.Shards[j].Index; k < 0 || k >= MaxShards {
				return opError("item %d (%q) names shard %d: give an index in [0, MaxShards), %d", i, it.Name, k, MaxShards)
			}
		}
		if !paramsValid(&it.Shards[0].Params) {
			return paramsError(i, it, 0)
		}
		if n == 2 {
			if !paramsValid(&it.Shards[1].Params) {
				return paramsError(i, it, 1)
			}
			if it.Shards[0].Index == it.Shards[1].Index {
				return opError("item %d (%q) names shard %d twice: give a sharded item two different shards", i, it.Name, it.Shards[0].Index)
			}
			if a, b := &it.Shards[0].Params, &it.Shards[1].Params; a.Kind != b.Kind || a.Rate != b.Rate ||
				a.Period != b.Period || a.Capacity != b.Capacity || a.MaxReserved != b.MaxReserved {
				return opError("item %d (%q) has shards of different params (%+v and %+v): give the two shards of a limit the same params but their phases", i, it.Name, *a, *b)
			}
		}
	}
	if len(op.Items) > 1 {
		if err := checkDistinct(op.Items); err != nil {
			return err
		}
	}
	if st := op.Settle; st != nil {
		switch {
		case !one:
			return opError("a settlement in an op of mode %d: only a refund (ModeRefund) settles", op.Mode)
		case len(op.Items) == 0:
			return opError("a settlement without items: settle the refund of at least one")
		case st.Kind != SettleCancel && st.Kind != SettleUse:
			return opError("a settlement of kind %v: use SettleCancel or SettleUse", st.Kind)
		case st.Until < -MaxTime || st.Until > MaxTime:
			return opError("a settlement kept until %d, beyond ±MaxTime (%d): give a time in Unix milliseconds within it", st.Until, MaxTime)
		}
	}
	return nil
}

// The bounds of Params that CheckOp enforces: those of the limits
// ratelimit.New accepts (ratelimit.MaxTokens, ratelimit.MaxPeriod, the
// least Rate, 1e-9, over at most ratelimit.MaxShards shards), which the
// suite of package storetest checks against a Limiter at those bounds;
// and the least count above 0 of a limit or a check, ratelimit.MinCount,
// and its most, ratelimit.MaxTokens.
const (
	maxTokens = 1e15
	maxPeriod = 36524 * 24 * 3600 * 1000 // 100 years, in milliseconds
	minRate   = 1e-9 / 1024
	minCount  = 1e-8
)

// CheckParams returns nil if p is within the bounds of Params that
// CheckOp enforces on every shard of an op, and else an error matching
// ErrInvalidOp that says which bound p breaks. A Binder checks the params
// it binds so, once, rather than every op its BoundLimit decides.
func CheckParams(p Params) error {
	if paramsValid(&p) {
		return nil
	}
	return opError("params: %s", paramsProblem(&p))
}

// paramsValid reports whether p is within the bounds of Params (CheckOp).
// A NaN fails every comparison; a negative int64 is a large uint64.
func paramsValid(p *Params) bool {
	return uint8(p.Kind-FixedWindow) <= uint8(TokenBucket-FixedWindow) &&
		uint64(p.Period-1) < maxPeriod && uint64(p.Phase) < uint64(p.Period) &&
		p.Rate >= minRate && p.Rate <= maxTokens &&
		p.Capacity >= 0 && p.Capacity <= maxTokens &&
		p.MaxReserved >= 0 && p.MaxReserved <= maxTokens
}

// paramsError is the error of item i, it, whose shard j has params that
// paramsValid refused: which bound they break.
func paramsError(i int, it *Item, j int) error {
	p := &it.Shards[j].Params
	return opError("item %d (%q), shard %d: %s", i, it.Name, it.Shards[j].Index, paramsProblem(p))
}

// paramsProblem says which bound p breaks.
func paramsProblem(p *Params) string {
	switch {
	case p.Kind != FixedWindow && p.Kind != TokenBucket:
		return fmt.Sprintf("kind %v: use FixedWindow or TokenBucket", p.Kind)
	case p.Period < 1 || p.Period > maxPeriod:
		return fmt.Sprintf("period %d: give a period from 1 to %d milliseconds (100 years)", p.Period, int64(maxPeriod))
	case p.Phase < 0 || p.Phase >= p.Period:
		return fmt.Sprintf("phase %d: give a phase in [0, Period) = [0, %d)", p.Phase, p.Period)
	case !(p.Rate >= minRate && p.Rate <= maxTokens):
		return fmt.Sprintf("rate %s: give a rate from %s to %s tokens per period", numtext.Format(p.Rate), numtext.Format(minRate), numtext.Format(maxTokens))
	case !(p.Capacity >= 0 && p.Capacity <= maxTokens):
		return fmt.Sprintf("capacity %s: give a capacity from 0 to %s tokens", numtext.Format(p.Capacity), numtext.Format(maxTokens))
	}
	return fmt.Sprintf("max reserved %s: give a number of tokens from 0 (unlimited) to %s", numtext.Format(p.MaxReserved), numtext.Format(maxTokens))
}

// fewItems is the most items of an op whose records checkDistinct
// compares pair by pair; beyond, it keeps them in a map.
const fewItems = 8

// checkDistinct returns an error matching ErrInvalidOp if items, of two
// or more, do not all have the same Key, or if two of them (each of
// different shards) name the same record.
func checkDistinct(items []Item) error {
	key := items[0].Key
	for i := 1; i < len(items); i++ {
		if items[i].Key != key {
			return opError("item %d (%q) has key %q, item 0 key %q: the items of an op share one key; send an op per key (in one ApplyBatch)", i, items[i].Name, items[i].Key, key)
		}
	}
	if len(items) <= fewItems {
		for i := 1; i < len(items); i++ {
			for j := range i {
				if items[i].Name != items[j].Name {
					continue
				}
				for _, a := range items[i].Shards {
					for _, b := range items[j].Shards {
						if a.Index == b.Index {
							return sameRecord(j, i, &items[i], a.Index)
						}
					}
				}
			}
		}
		return nil
	}
	type record struct {
		name  string
		shard int
	}
	seen := make(map[record]int, 2*len(items))
	for i := range items {
		for _, sh := range items[i].Shards {
			r := record{items[i].Name, sh.Index}
			if j, ok := seen[r]; ok && j != i {
				return sameRecord(j, i, &items[i], sh.Index)
			}
			seen[r] = i
		}
	}
	return nil
}

// sameRecord is the error of items j and i, it, both naming shard.
func sameRecord(j, i int, it *Item, shard int) error {
	return opError("items %d and %d both name the record of limit %q, key %q, shard %d: name each record once in an op", j, i, it.Name, it.Key, shard)
}

// opError is ErrInvalidOp with what was wrong.
func opError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOp}, args...)...)
}

// CheckRecords returns nil if out has a place for each of ids, and
// otherwise an error matching ErrOutLength: what Load returns, wrapped,
// before anything else.
func CheckRecords(ids []RecordID, out []Record) error {
	if len(out) >= len(ids) {
		return nil
	}
	return outError("%d ids and an out of %d records: pass one per id", len(ids), len(out))
}

// outError is ErrOutLength with what was given; apart, so that the checks
// stay small (CheckRecords is inlined where a store calls it).
func outError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrOutLength}, args...)...)
}
