package ratelimit

import "context"

// Store keeps the state records of a Limiter. The Limiter decides what to
// ask; a Store reads, decides (by Evaluate, or by a native port of it
// proved equal by package storetest) and writes, atomically.
//
// Implementations must be safe for concurrent use by many goroutines and,
// for shared stores, by many processes: under any interleaving, no more
// tokens are granted than the semantics allow. Records of different
// RecordIDs must never be confused, whatever bytes the names and keys hold.
type Store interface {
	// Apply decides op as Evaluate does over the records op touches, and
	// writes the updates Evaluate marks, all in one atomic step. It fills
	// out, which has one element per op item.
	Apply(ctx context.Context, op *Op, out []Decision) error
	// Load reads the records ids into out (same length); a missing record
	// is Record{}. A store may report as missing a record whose bucket is
	// full again (see FullAt).
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

// ownClock returns the store's TimeSource when it uses its own clock, and
// nil otherwise.
func ownClock(s Store) TimeSource {
	if ts, ok := s.(TimeSource); ok && ts.OwnClock() {
		return ts
	}
	return nil
}

// BatchApplier is implemented by a store that can decide several ops in
// one round trip; stores that coalesce concurrent calls send their batches
// through it, and package storetest proves it equal to Apply called once
// per op. It is optional: the Limiter only ever calls Apply.
type BatchApplier interface {
	// ApplyBatch decides ops[0], ops[1], … one after another, exactly as
	// that many calls of Apply in that order would, each op atomic, and
	// fills outs[i] (one Decision per item of ops[i]). On an error, any op
	// of the batch may or may not have taken effect, as for any call over
	// a network.
	ApplyBatch(ctx context.Context, ops []*Op, outs [][]Decision) error
}
