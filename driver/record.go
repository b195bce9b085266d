package driver

import "errors"

// ErrBadRecord is the error, wrapped, of a call that met, where a record
// or a settlement's mark of the store belongs, what no release of the
// store writes there: a value of another form or size, or a mark of a
// kind other than SettleCancel and SettleUse; written there by something
// else, or damaged. A store that reads what it did not keep in its own
// memory (a file, a server) refuses it, rather than take it for a missing
// record (a full bucket) or for no mark: the call decides and writes
// nothing, and every call on that record or mark fails until it is
// removed. A mark that cannot be read fails its settlement: its token may
// have been settled already. The error names what was met and says what
// to do.
var ErrBadRecord = errors.New("not a record of this store")
