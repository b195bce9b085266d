package driver

import (
	"errors"
	"fmt"

	"github.com/ratelimit-go/ratelimit/internal/numtext"
)

// ErrBadRecord is the error, wrapped, of a call that met, where a record
// or a settlement's mark of the store belongs, what no release of the
// store writes there: a value of another form or size, a record whose
// state CheckState refuses, or a mark of a kind other than SettleCancel
// and SettleUse; written there by something else, or damaged. A store
// that reads what it did not keep in its own memory (a file, a server)
// refuses it, rather than take it for a missing record (a full bucket) or
// for no mark, or decide on it: the call decides and writes nothing, and
// every call on that record or mark fails until it is removed. A mark
// that cannot be read fails its settlement: its token may have been
// settled already. The error names what was met and says what to do.
var ErrBadRecord = errors.New("not a record of this store")

// MinRecordTime is the earliest TS of a record that a store writes from
// valid ops (CheckOp): the start of a fixed window, at most a Period (100
// years) before an op's Now, which is at least −MaxTime. The latest is
// MaxTime: a record's time is never ahead of the latest Now of its ops.
const MinRecordTime = -MaxTime - maxPeriod

// CheckState returns nil if st is a state that a store writes from the
// ops a Limiter sends (ratelimit.Evaluate on valid ops): Remaining a
// finite number (a debt below zero, capped at Capacity above), TS from
// MinRecordTime to MaxTime. Otherwise it returns an error that says what
// is wrong, for the store to report, wrapped, as ErrBadRecord: on NaN
// tokens, infinitely many, or a time beyond those bounds, the stores'
// arithmetic (Go, Lua, SQL) would each decide its own way, a refusal
// forever or a full bucket. It is two comparisons and a subtraction when
// st is sound, for a store to call on every record it reads.
func CheckState(st State) error {
	// v−v is 0 for every finite v, NaN for NaN and the infinities.
	if st.Remaining-st.Remaining == 0 && st.TS >= MinRecordTime && st.TS <= MaxTime {
		return nil
	}
	return stateError(st)
}

// stateError is CheckState's error for st, apart so that CheckState is
// inlined.
func stateError(st State) error {
	if st.Remaining-st.Remaining != 0 {
		return fmt.Errorf("it holds %s tokens, and a record holds a finite number", numtext.Format(st.Remaining))
	}
	return fmt.Errorf("its time is %d ms from 1970, and a record's is from %d to %d ms", st.TS, MinRecordTime, MaxTime)
}
