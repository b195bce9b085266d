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

// CheckOut returns nil if out has a place for each item of op, and
// otherwise an error matching ErrOutLength: what Apply returns, wrapped,
// before anything else.
func CheckOut(op *Op, out []Decision) error {
	if len(out) >= len(op.Items) {
		return nil
	}
	return outError("an op of %d items and an out of %d decisions: pass one per item", len(op.Items), len(out))
}

// CheckOuts returns nil if outs holds one out per op, each with a place for
// each of its op's items, and otherwise an error matching ErrOutLength:
// what ApplyBatch returns, wrapped, before anything else.
func CheckOuts(ops []*Op, outs [][]Decision) error {
	if len(outs) != len(ops) {
		return outError("%d ops and %d outs: pass one out per op", len(ops), len(outs))
	}
	for i, op := range ops {
		if len(outs[i]) < len(op.Items) {
			return outError("op %d of %d items and an out of %d decisions: pass one per item", i, len(op.Items), len(outs[i]))
		}
	}
	return nil
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
// stay small enough to be inlined where a store calls them.
func outError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrOutLength}, args...)...)
}
