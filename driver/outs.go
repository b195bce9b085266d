package driver

import (
	"errors"
	"fmt"
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
	if len(out) < len(op.Items) {
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
		if len(outs[i]) < len(op.Items) {
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
//   - Mode is ModeLimit, ModeCheck or ModeRefund;
//   - Now is within ±MaxTime;
//   - no item's Count is NaN;
//   - every item has one shard or two, and one in ModeRefund;
//   - Settle is nil unless Mode is ModeRefund, and a Settlement comes with
//     at least one item and has Kind SettleCancel or SettleUse.
//
// CheckOut and CheckOuts call it: a store that calls those need not call
// it again.
func CheckOp(op *Op) error {
	if op.Mode > ModeRefund {
		return opError("mode %d: use ModeLimit, ModeCheck or ModeRefund", op.Mode)
	}
	if op.Now < -MaxTime || op.Now > MaxTime {
		return opError("now %d is beyond ±MaxTime (%d): give a time in Unix milliseconds within it", op.Now, MaxTime)
	}
	one := op.Mode == ModeRefund
	for i := range op.Items {
		it := &op.Items[i]
		if n := len(it.Shards); n != 1 && (n != 2 || one) {
			return opError("item %d (%q) of a mode %d op has %d shards: give an item one or two, a refund's one", i, it.Name, op.Mode, n)
		}
		if it.Count != it.Count {
			return opError("item %d (%q) has a count of NaN: give a number", i, it.Name)
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
		}
	}
	return nil
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
