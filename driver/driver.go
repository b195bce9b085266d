// Package driver is the contract between a ratelimit.Limiter and the
// store that keeps its state, for those who write a store, the way
// database/sql/driver is for those who write a database driver. Users of
// the limiter do not need it: they pass a store (store/memstore,
// store/boltstore, store/redisstore, store/pgstore, or one of their own)
// to ratelimit.New.
//
// A store implements Store: it reads the records an Op touches, decides
// the Op with ratelimit.Evaluate (or with a native port of it, as a Lua
// script or a SQL function, proved equal to it bit for bit by the
// differential tests of package storetest), and writes the updates, all
// in one atomic step. Optional interfaces add capabilities the Limiter or
// the user finds by type assertion: TimeSource (the store's own clock),
// RecordClock (the clock of the server that holds a record, of a store
// over several), BatchApplier (several ops in one round trip), Binder (a fast path for a
// single unsharded limit) and Expirer (dropping records whose bucket is
// full again).
//
// Every method of these interfaces that takes a context, given one already
// done, returns an error matching the context's (errors.Is) and has no
// effect.
//
// # Errors
//
// Every store answers one condition with the same error, for errors.Is
// and errors.As, whatever its medium:
//
//   - a context done before the call: the context's error
//     (context.Canceled, context.DeadlineExceeded), before any other check
//     (an invalid op, outs of the wrong length, a closed store), and no
//     effect; a context that ends during the call: an error matching it,
//     which names the store, and the call may have taken effect;
//   - an invalid op (CheckOp): ErrInvalidOp; outs of the wrong length
//     (CheckOut, CheckOuts, CheckRecords): ErrOutLength; each wrapped,
//     naming the store and the call, before anything is decided;
//   - a store used after Close, or whose database, client or pool the
//     caller closed: ErrClosed, wrapped, naming the store and saying what
//     to do; Close again does nothing, and returns what the first did;
//   - a store that its constructor did not make (the zero value of its
//     type, &memstore.Store{}, or a nil pointer to it): ErrZeroStore,
//     wrapped, naming the store and the constructor to call, from every
//     method, Close included, rather than a panic;
//   - what no release writes where a record or a settlement's mark
//     belongs: ErrBadRecord, wrapped, naming what was met and what to do;
//   - one op of a batch failing on its own (ErrBadRecord): ApplyBatch
//     decides the others and joins an *OpError for each op left out,
//     undecided (and for each it left unsent after a failure not an op's
//     own, wrapping that failure); never for an op that may have taken
//     effect (its answer lost), whose error is another (below);
//   - the medium failing (a server down, a disk full): the medium's own
//     error, wrapped, naming the store. The Limiter reports it as
//     ratelimit.ErrStoreUnavailable.
//
// A store wraps with fmt.Errorf and %w, so that every sentinel above, and
// the medium's own error, stay visible to errors.Is and errors.As; the
// message is lower case, names the store ("redisstore: Apply: …") and
// says what to do. Package storetest checks every condition it can bring
// about on any store (its Errors tests); the stores' own tests check the
// others.
//
// Every store runs the one conformance suite, storetest.Run, which checks
// the promises stated here. docs/stores.md walks through the contract and
// the writing of a store, step by step.
package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/isnil"
)

// ErrClosed is the error, wrapped, of a call of a store used after Close
// (its calls still queued at Close fail with it too, unsent), or of a
// store whose database, client or pool the caller closed: the store can
// do nothing more, and no server is down. A call whose context is done
// gets the context's error instead. Close is idempotent: again, it does
// nothing, and returns what the first did.
var ErrClosed = errors.New("ratelimit: store is closed")

// ErrZeroStore is the error, wrapped, of a call of a store that its
// constructor did not make: the zero value of its type (var s
// memstore.Store, &boltstore.Store{}) or a nil pointer to it, which
// holds none of what its New or Open sets up (a hash seed, a database, a
// client, a pool). Every method fails with it, after a done context's
// error (a Bind returns a BoundLimit whose Decide does), rather than
// panic; the message names the constructor to call. No server is down:
// build the store with its constructor, and use the store it returned
// once it returned no error. A store that implements ZeroChecker says so
// without a call, and ratelimit.New refuses it. Package storetest checks
// it (ZeroStore).
var ErrZeroStore = errors.New("ratelimit: store not made by its constructor")

// ZeroChecker is implemented by a store that can tell, without I/O, that
// its constructor did not make it (ErrZeroStore). ratelimit.New and
// janitor.New ask it (CheckZero), and refuse such a store rather than
// build a Limiter or a janitor whose every call fails: a Limiter over it
// would otherwise start, and each of its calls fail at once. It is
// optional, and a store of one's own need not implement it: a Limiter
// over a store without it is built, and every call fails with the
// store's own ErrZeroStore error, never decided by the failure policy; a
// janitor reports each sweep's. Every store of this project implements
// it.
type ZeroChecker interface {
	// CheckZero returns an error matching ErrZeroStore, the one every
	// call of the store returns, when the store is the zero value of its
	// type or a nil pointer to it; otherwise nil, closed or not. It does
	// no I/O, does not block, and does not panic. Make it a method of the
	// pointer type, so that a nil pointer can answer it: Go cannot call a
	// value method through one.
	CheckZero() error
}

// CheckZero returns the error of s's CheckZero (ZeroChecker), or, when s
// is a wrapper (an Unwrap() Store method, as ratelimitotel.WrapStore's),
// that of the first store it wraps, at any depth, that implements
// ZeroChecker; nil when none does. A nil pointer of a wrapper's type, or
// a wrapper that wraps a nil Store, ends the search (nil); so does a nil
// pointer of a type whose CheckZero cannot be called on one (a value
// method): it panics, and says nothing.
func CheckZero(s any) error {
	for range maxUnwrap {
		if zc, ok := s.(ZeroChecker); ok {
			if err := checkZero(zc, isnil.Is(s)); err != nil {
				return err
			}
		}
		u, ok := s.(interface{ Unwrap() Store })
		if !ok || isnil.Is(s) {
			return nil // a nil wrapper's Unwrap may panic
		}
		if s = u.Unwrap(); s == nil {
			return nil
		}
	}
	return nil
}

// checkZero returns zc's CheckZero. When zc is a nil pointer (isNil), a
// panic of the call is nil: Go panics calling a value method through a
// nil pointer, before the method can answer, and a caller given a nil
// store (ratelimit.New, janitor.New) refuses it as no store anyway.
func checkZero(zc ZeroChecker, isNil bool) (err error) {
	if isNil {
		defer func() {
			if recover() != nil {
				err = nil
			}
		}()
	}
	return zc.CheckZero()
}

// maxUnwrap bounds the wrappers CheckZero looks through: one that
// unwraps to itself would loop for ever.
const maxUnwrap = 100

// Expirer is implemented by a store that keeps records until told to drop
// them (an in-memory map, a file, a table), rather than letting its medium
// expire them (Redis). DeleteExpired drops every record whose bucket has
// been full again for ExpiryGrace at now, and every settlement's mark
// expired for as long, and returns how many records and marks it dropped;
// it counts nothing else it may remove (such as rows of its own that no
// write made records). A record it keeps reads the same either way under
// the config that wrote it; after a change of a fixed window's phase
// (Start, or the Period its derived phase depends on) a kept record keeps
// its old alignment where a dropped one takes the new, so stores that
// sweep at different times may answer a call near a window's edge
// differently, each within the bound (docs/model.md, "Changing limits").
// Call it periodically, or let package store/janitor do it.
type Expirer interface {
	DeleteExpired(ctx context.Context, now time.Time) (int, error)
}

// Store keeps the state records of a Limiter. The Limiter decides what to
// ask; a Store reads, decides (by ratelimit.Evaluate, or by a native port
// of it proved equal by package storetest) and writes, atomically.
//
// Implementations must be safe for concurrent use by many goroutines and,
// for shared stores, by many processes: under any interleaving, no more
// tokens are granted than the semantics allow. Records of different
// RecordIDs must never be confused, whatever bytes the names and keys hold.
type Store interface {
	// Apply decides op as ratelimit.Evaluate does over the records op
	// touches, and writes the updates Evaluate marks, all in one atomic
	// step. It fills out, which has one element per op item: an out
	// shorter than that is refused with an error matching ErrOutLength,
	// and an op that breaks a rule of Op (CheckOp: a settlement outside
	// ModeRefund, say) with one matching ErrInvalidOp, both before
	// anything is decided or written (CheckOut makes both checks). A valid
	// op without items decides and writes nothing, and Apply returns nil.
	Apply(ctx context.Context, op *Op, out []Decision) error
	// Load reads the records ids into out, which has one element per id (a
	// shorter out is refused with ErrOutLength: CheckRecords); a missing
	// record is Record{}, whatever out held, and an id given twice reads
	// the same record at both positions. A store may report as missing a
	// record whose bucket is full again (see ratelimit.FullAt).
	Load(ctx context.Context, ids []RecordID, out []Record) error
	// Delete removes the records ids; a missing one is not an error.
	Delete(ctx context.Context, ids []RecordID) error
}

// TimeSource is implemented by a store that can take the time from its own
// clock (a server's) rather than from the Limiter's. When OwnClock reports
// true, Apply ignores Op.Now, and the Limiter asks Now when it needs the
// time itself (Value); when false, the store uses Op.Now like any other.
type TimeSource interface {
	// OwnClock reports whether the store is configured to use its own
	// clock. It must not change during the store's life.
	OwnClock() bool
	// Now returns the store's current time in Unix milliseconds.
	Now(ctx context.Context) (int64, error)
}

// RecordClock is implemented by a TimeSource whose own clock is several
// servers' (a Redis Ring or Cluster): each judges the ops on the records
// it holds at its own time, and their clocks may disagree. When the store
// implements it, the Limiter asks RecordNow rather than Now wherever it
// judges a record or a token by the store's clock (Value, a settlement),
// with a record of that key, so that it reads the time the ops on the key
// are judged at: that of another server, ahead, would take a token for
// expired that its own server still settles, or, behind, one for valid
// whose settlement's mark its own server has dropped, and settle it a
// second time.
type RecordClock interface {
	// RecordNow returns, in Unix milliseconds, the current time of the
	// server that holds the record id.
	RecordNow(ctx context.Context, id RecordID) (int64, error)
}

// BatchApplier is implemented by a store that can decide several ops in
// one round trip; stores that coalesce concurrent calls send their batches
// through it, and package storetest proves it equal to Apply called once
// per op. It is optional: the Limiter only ever calls Apply.
type BatchApplier interface {
	// ApplyBatch decides ops[0], ops[1], … one after another, exactly as
	// that many calls of Apply in that order would, each op atomic, and
	// fills outs[i] (one Decision per item of ops[i]). Outs of the wrong
	// length (not one per op, or one shorter than its op's items) are
	// refused with ErrOutLength, and a batch holding an invalid op
	// (CheckOp) with ErrInvalidOp, before any op is decided: its valid ops
	// too are left undecided (CheckOuts makes both checks). No ops, or
	// valid ops without items, return nil. An op that fails on its own (a
	// record or a mark the store cannot read: ErrBadRecord) is left
	// undecided, the others decided, and the error joins an *OpError for
	// each op left out. A store that decides the others apart from it
	// (each op sent again alone) may leave ops unsent once a failure not
	// of an op (the context ended, the store or its client closed, the
	// medium down) has met one: those are left out too, each an *OpError
	// wrapping that failure. An op that may have taken effect (its answer
	// lost) is never an *OpError: the error is then another. On any other
	// error, any op of the batch may or may not have taken effect, as for
	// any call over a network.
	ApplyBatch(ctx context.Context, ops []*Op, outs [][]Decision) error
}

// OpError is the error of one op of a batch that failed on its own (a
// record or a settlement's mark that the store cannot read: ErrBadRecord)
// while the batch's other ops were decided and their outs filled, or that
// the store left unsent after such a batch met a failure not of an op
// (see BatchApplier). Its op was not decided: it took no effect. Such an
// ApplyBatch returns the errors.Join of one *OpError for each op left
// out: errors.As finds the first, the joined error's Unwrap() []error
// lists them all, and errors.Is matches each op's failure (ErrBadRecord,
// or the failure that left it unsent).
type OpError struct {
	Index int   // the op's index in the batch
	Err   error // the op's failure, which names the store
}

// Error names the op's index in the batch and its failure.
func (e *OpError) Error() string {
	return fmt.Sprintf("op %d of the batch: %v", e.Index, e.Err)
}

// Unwrap returns the op's failure, for errors.Is and errors.As.
func (e *OpError) Unwrap() error { return e.Err }

// Binder is implemented by a store with a faster path than Apply for the
// commonest call: one unsharded limit decided alone (Limit, Check or
// Reserve of one name, without WithConfig). The Limiter binds each such
// limit when it is declared (New, SetLimits, SetLimit), again under the
// same name with other params when its config changes (the BoundLimits of
// one name share its records, as Apply does), and decides those calls
// through the BoundLimit, without building an Op; every other call (LimitAll, sharded
// limits, refunds, inline configs) goes through Apply. It is optional and
// only a shortcut: package storetest runs its differential tests through
// both paths and requires the same answers and records, bit for bit. The
// Limiter does not bind the limits of a store that uses its own clock
// (TimeSource): a Verdict does not carry the store's time. It is meant for
// a store that answers in process, within the millisecond: the Limiter
// reads its clock once for such a call, before Decide, and takes that
// reading for the time of the store's answer too (which its breaker
// compares with the start of a call whose deadline passed).
type Binder interface {
	// Bind returns the BoundLimit that decides, for every key, the record
	// RecordID{Name: name, Key: key, Shard: 0} of a limit of params p. For
	// a fixed window, the record's phase is phase(key) (p.Phase is
	// ignored); the store calls phase only when it needs the phase, for a
	// missing record (see ratelimit.TransitionInto). Params that
	// CheckParams refuses, or a phase outside [0, p.Period), make every
	// Decide fail with an error matching ErrInvalidOp, as Apply refuses
	// an op that carries them.
	Bind(name string, p Params, phase func(key string) int64) BoundLimit
}

// BoundLimit decides the calls of one limit bound by a Binder.
type BoundLimit interface {
	// Decide decides and writes, in one atomic step, exactly as Apply
	// would the op
	//
	//	Op{Mode: mode, Now: now, Reserve: reserve, Items: []Item{{
	//		Name: name, Key: key, Count: count,
	//		Shards: []Shard{{Index: 0, Params: p, its Phase phase(key)}},
	//	}}}
	//
	// and returns the op's one Decision as a Verdict (see Verdict.Decision).
	// mode is ModeLimit or ModeCheck, now within ±MaxTime and count not
	// NaN: the Limiter calls it only for a valid op (CheckOp), and a store
	// need not check again. Like Apply, it returns ctx's error if ctx is
	// done.
	Decide(ctx context.Context, key string, mode Mode, now int64, count float64, reserve bool) (Verdict, error)
	// Store returns the store that bound it. The Limiter uses a BoundLimit
	// only when that is the very store given to New: a type that embeds a
	// Binder store to wrap its Apply is not bypassed by the embedded
	// store's Bind, and has the fast path only if it implements Bind
	// itself.
	Store() Store
}

// Verdict is the Decision of a call of count on one record, as
// BoundLimit.Decide returns it: the fields that such a Decision does not
// fix (its Now is the call's, its Charged count when OK and zero
// otherwise, for one record). Four fields, so that it is returned in
// registers, where a Decision would be copied through memory.
type Verdict struct {
	OK         bool
	RetryAfter int64
	Remaining  float64
	TS         int64
}

// Verdict returns the Verdict of d, a Decision of a call on one record.
func (d *Decision) Verdict() Verdict {
	return Verdict{OK: d.OK, RetryAfter: d.RetryAfter, Remaining: d.Remaining, TS: d.TS}
}

// Decision returns the Decision that v stands for, of a call of count on
// one record judged at now.
func (v Verdict) Decision(now int64, count float64) Decision {
	d := Decision{OK: v.OK, RetryAfter: v.RetryAfter, Remaining: v.Remaining, Now: now, TS: v.TS}
	if v.OK {
		d.Charged[0] = count
	}
	return d
}
