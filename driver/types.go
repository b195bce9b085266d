package driver

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// The vocabulary of the contract: what an Op asks, the records it reads
// and writes, and the Decision it gets back. The transition that decides
// an Op is ratelimit.Evaluate (state.go in package ratelimit), the one
// definition of the semantics; a store runs it, or a native port of it
// proved equal by package storetest.

// Noise is the float noise below which a negative amount counts as zero:
// -1e-9 < v < 0 reads as 0. Native ports use this value.
const Noise = 1e-9

// PairTries bounds how many candidate times past an estimate the least
// wait of a refused two-shard call tries (see ratelimit.Evaluate). Native
// ports use this value.
const PairTries = 4

// WaitTries bounds how many windows or milliseconds past an estimate
// that rounding left short the wait of a call tries (see
// ratelimit.Evaluate). Native ports use this value.
const WaitTries = 3

// MaxRetryAfter is the longest retry-after, in milliseconds, that a
// decision reports; longer waits are clamped to it. It still converts to a
// time.Duration without overflow (about 292 years).
const MaxRetryAfter int64 = math.MaxInt64 / 1_000_000

// Params is one record's share of a limit, in the units of the transition:
// milliseconds and tokens. The Limiter computes it for a shard of a
// Config: Rate, Capacity and MaxReserved divided by the shard count.
//
// Its fields have the ranges below, those of the limits ratelimit.New
// accepts, shared among at most ratelimit.MaxShards shards: within them
// every store decides alike. An Op with params outside them is invalid
// (ErrInvalidOp, CheckOp); NaN and infinities are outside every range.
type Params struct {
	// Kind is FixedWindow or TokenBucket.
	Kind Kind
	// Rate is the tokens granted per Period: from 1e-9/1024 (the least
	// Rate of a Config over the most shards) to 1e15
	// (ratelimit.MaxTokens).
	Rate float64
	// Period is the window or refill period in milliseconds: from 1 to
	// 100 years (ratelimit.MaxPeriod).
	Period int64
	// Capacity is the most tokens the record may hold: from 0 to 1e15.
	Capacity float64
	// MaxReserved is the most tokens the record may owe, from 0 to 1e15;
	// 0 is unlimited.
	MaxReserved float64
	// Phase places the windows of a fixed window: they begin at
	// Phase + k·Period. In [0, Period), whatever the kind; unused by a
	// token bucket.
	Phase int64
}

// State is what a store keeps for one record.
type State struct {
	// Remaining is the tokens in the bucket at TS; negative while it owes
	// reserved tokens.
	Remaining float64
	// TS is a Unix time in milliseconds: the start of the current window
	// (fixed window) or the time of the last update (token bucket).
	TS int64
}

// Record is a stored state as a store reads it. A missing record is
// Record{} (Found false) and means a full bucket.
type Record struct {
	State State
	Found bool
}

// Update is what a store must do with one record after Evaluate: write
// State when Write is set, otherwise leave the record as it is.
type Update struct {
	State State
	Write bool
}

// Decision is the answer for one item of an Op.
type Decision struct {
	// OK is true when the item is allowed or reserved.
	OK bool
	// RetryAfter is in whole milliseconds, rounded up: for a reserved item
	// the wait until its tokens have been granted, for a denied one the wait
	// until the same call would succeed; 0 when allowed outright.
	RetryAfter int64
	// Remaining is the tokens left after an OK item (negative: debt), or the
	// tokens available now after a denied one. For a sharded limit it counts
	// the two shards the call evaluated.
	Remaining float64
	// Charged holds the tokens taken from each of the item's shards, in the
	// order of Item.Shards (negative: handed back by a refund); a
	// reservation hands them back on cancel.
	Charged [2]float64
	// Now is the time (Unix ms) the item was judged at: Op.Now, or the
	// store's own clock (TimeSource). A refund of the charge names it in
	// Item.At.
	Now int64
	// TS is the time of the item's first record after the call: for a
	// fixed window the start of its current window, as the record holds it
	// (its next grant is at TS + Period); for a token bucket the time of
	// its last refill.
	TS int64
	// Settled is set, in an op that carries a Settlement, when the
	// settlement's ID had been settled before: how it was. The op then did
	// nothing, and every field of its decisions but Now, Settled and Own
	// is zero (see Op.SettledBefore).
	Settled SettleKind
	// Own is set, with Settled, when the mark found records the op's own
	// Settlement.Settler, not zero: the settlement found is the sender's
	// own earlier attempt (one whose answer it did not get), not another
	// settler's. A mark of no settler (the zero Settler, or a mark written
	// by a release that kept none) is never Own.
	Own bool
}

// SettleKind says how a reservation or a receipt was settled.
type SettleKind uint8

const (
	// SettleCancel hands the tokens back: the job will not run.
	SettleCancel SettleKind = 1
	// SettleUse spends them, wholly or in part: the job ran, or may run.
	SettleUse SettleKind = 2
)

// String returns "cancel", "use", or "SettleKind(n)".
func (k SettleKind) String() string {
	switch k {
	case SettleCancel:
		return "cancel"
	case SettleUse:
		return "use"
	}
	return fmt.Sprintf("SettleKind(%d)", uint8(k))
}

// Settlement makes a refund op the settlement of one reservation or
// receipt, which a store applies at most once, whoever sends it and
// however often.
//
// In the atomic step that decides the op, the store looks for a marker of
// ID. If there is one, the op does nothing: it writes no record, and each
// decision says how the ID was settled (Decision.Settled, the marker's
// kind) and whether the marker records this op's Settler (Decision.Own).
// If there is none, the store decides the op as any refund and writes the
// marker, recording Kind and Settler. It keeps the marker at least until
// Until + ExpiryGrace on the op's clock (the store's own, for a
// TimeSource), and may drop it after, as it drops expired records: the
// Limiter no longer settles the token then (by the refund rule, nothing
// would come back). A marker never reads as a record, nor a record as a
// marker. A settle op has at least one item (a store refuses one without:
// ErrInvalidOp), and every op that carries one ID has the same Key (a token names one), so that a store may keep
// the marker with the key's records (in their Redis Cluster slot).
type Settlement struct {
	// ID names the reservation or receipt: 128 random bits.
	ID [16]byte
	// Kind is how this op settles it: SettleCancel or SettleUse.
	Kind SettleKind
	// Until is a Unix time in milliseconds, within ±MaxTime (beyond, the
	// op is invalid: ErrInvalidOp): the marker's expiry, less ExpiryGrace.
	Until int64
	// Settler names who settles: 128 random bits that one sender keeps
	// across the retries of one settlement (a Reservation's Wait and
	// Cancel; or a digest of the ID, the token and the settlement that a
	// holder of the token names with ratelimit.Settler), so that a retry
	// whose first attempt took effect, its answer lost, finds its own
	// marker (Decision.Own) and tells it from another settler's of the
	// same token. Zero names no settler: the marker then records none,
	// and is nobody's own. Any value is valid.
	Settler [16]byte
}

// SettledBy reports whether a marker of s's ID that records the settler
// kept (zero for one that records none) is the sender's own
// (Decision.Own): kept is s.Settler, and not zero.
func (s *Settlement) SettledBy(kept [16]byte) bool {
	return kept != [16]byte{} && kept == s.Settler
}

// Mode is what an Op asks of a store: one of the three below (an Op of
// any other is invalid: ErrInvalidOp).
type Mode uint8

const (
	// ModeLimit decides and, when every item is OK, writes.
	ModeLimit Mode = iota
	// ModeCheck decides and writes nothing.
	ModeCheck
	// ModeRefund hands tokens back: each item has one shard, and gives back
	// the Count tokens it was charged at Item.At, less what the limit has
	// granted the record since, capped at Capacity; and nothing while the
	// record owes tokens granted after Item.Run, the job's time, which
	// reservations made after the charge were scheduled on
	// (docs/reservations.md).
	ModeRefund
)

// Op is one atomic call against a store: one or more items, decided
// together. In ModeLimit either every item is OK and all their updates are
// written, or nothing is written.
//
// An Op that breaks a rule of its fields below (a mode that is none of
// the three, a time beyond ±MaxTime, a refund's At or Run beyond it, a count
// that is NaN, negative or infinite, or, but in a refund, above 0 and below
// ratelimit.MinCount or above ratelimit.MaxTokens, an item of no shards or of more than
// two, a refund's of two, an item of one shard twice, items of different
// keys, two items of one record, params out of the ranges of Params, a
// Settle outside ModeRefund, without items, of a Kind that is neither
// SettleCancel nor SettleUse or of an Until beyond ±MaxTime) is invalid: every store refuses it, with an error matching
// ErrInvalidOp, and decides, writes and marks nothing (CheckOp). The
// Limiter never sends one.
type Op struct {
	// Mode is what the op asks: ModeLimit, ModeCheck or ModeRefund.
	Mode Mode
	// Now is the time of the call in Unix milliseconds, within ±MaxTime.
	Now int64
	// Reserve lets the items take tokens they cannot have yet.
	Reserve bool
	// Items are the limits decided. They all have the same Key (so that a
	// store may keep all records of one key together, e.g. in one Redis
	// Cluster slot, where items of two keys would fail with CROSSSLOT),
	// and no two name the same record (Name and shard index): an op of
	// either is invalid (ErrInvalidOp). Calls of several keys are several
	// ops (BatchApplier).
	Items []Item
	// Settle, in ModeRefund only, makes the refund a settlement, applied
	// at most once (see Settlement); nil for a plain refund, and in the
	// other modes (a store refuses an op of another mode that carries one:
	// ErrInvalidOp).
	Settle *Settlement
}

// SettledBefore fills out with the decisions of op, a refund carrying a
// Settlement, when the store found the settlement's ID settled before, by
// kind, by a settler it does not know (a marker that records none): the op
// does nothing, and each decision says so. It is SettledBeforeBy with the
// zero settler.
func (op *Op) SettledBefore(kind SettleKind, out []Decision) {
	op.SettledBeforeBy(kind, [16]byte{}, out)
}

// SettledBeforeBy fills out with the decisions of op, a refund carrying a
// Settlement, when the store found the settlement's ID settled before, by
// kind, and the marker records the settler kept (zero: none): the op does
// nothing, and each decision says so, and whether the marker is the
// sender's own (Settlement.SettledBy). Stores that run ratelimit.Evaluate
// call it instead when they find the marker; native ports answer the same.
func (op *Op) SettledBeforeBy(kind SettleKind, kept [16]byte, out []Decision) {
	own := op.Settle.SettledBy(kept)
	for i := range op.Items {
		out[i] = Decision{Now: op.Now, Settled: kind, Own: own}
	}
}

// Item is one limit of an Op: the tokens asked of one (name, key) and the
// records that may grant them.
type Item struct {
	// Name is the limit's name and Key the call's key: with the Index of
	// each of Shards, they name the item's records (RecordID). A Limiter
	// gives keys of at most 256 bytes, but a store must take any.
	Name string
	Key  string
	// Count is the tokens asked for, or handed back in ModeRefund: a
	// finite number ≥ 0 (NaN, a negative count or an infinite one make
	// the op invalid: ErrInvalidOp). In ModeLimit and ModeCheck it is 0
	// or at least 1e-8, ratelimit.MinCount (a count above 0 and below it,
	// which a decision could not tell from Noise, makes the op invalid),
	// and at most 1e15, ratelimit.MaxTokens, the most one call may ask
	// for, even of two shards; a refund is held to neither bound.
	Count float64
	// At is, in ModeRefund, the time (Unix ms) the tokens handed back were
	// charged: Decision.Now of the call that took them, within ±MaxTime
	// (an At beyond makes a refund invalid: ErrInvalidOp). Unused in the
	// other modes.
	At int64
	// Run is, in ModeRefund, the time (Unix ms) the job of the charge may
	// run, on the clock of At: At plus the Decision.RetryAfter of the
	// call that took the tokens, for a reservation; At for a plain charge.
	// Within ±MaxTime (a Run beyond makes a refund invalid:
	// ErrInvalidOp); a Run before At reads as At. While the record owes
	// tokens that are granted after Run, reservations made after the
	// charge stand behind it, and the refund gives back nothing (see
	// ModeRefund). Unused in the other modes.
	Run int64
	// Shards holds one record, or two of different indexes for a sharded
	// limit (power of two choices: the call may be granted by either or by
	// both together); a refund's, one.
	Shards []Shard
}

// Shard is one record of an Item and its params.
type Shard struct {
	// Index is the shard's, in [0, MaxShards): 0 for an unsharded limit.
	Index int
	// Params are the limit's params for this shard: its share of Rate,
	// Capacity and MaxReserved, and its phase.
	Params Params
}

// MaxShards bounds a Shard's Index (an index of MaxShards or more, or
// below 0, makes the op invalid): ratelimit.MaxShards, the most shards a
// limit may have.
const MaxShards = 1024

// RecordID names one record: a (limit name, key, shard). Two different
// RecordIDs never share a record in any store.
type RecordID struct {
	Name  string
	Key   string
	Shard int
}

// AppendKey appends an encoding of id to dst that no other RecordID
// shares, whatever bytes the name and key hold: the uvarint length of the
// name, the name, the uvarint shard, then the key. Stores use it (or a
// digest of it) as the record's key.
func (id RecordID) AppendKey(dst []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(id.Name)))
	dst = append(dst, id.Name...)
	dst = binary.AppendUvarint(dst, uint64(id.Shard))
	return append(dst, id.Key...)
}

// NumRecords returns how many records op touches.
func (op *Op) NumRecords() int {
	n := 0
	for i := range op.Items {
		n += len(op.Items[i].Shards)
	}
	return n
}

// AppendRecordIDs appends the records op touches to dst, item by item and
// shard by shard: the order of Evaluate's prev and next.
func (op *Op) AppendRecordIDs(dst []RecordID) []RecordID {
	for i := range op.Items {
		it := &op.Items[i]
		for _, sh := range it.Shards {
			dst = append(dst, RecordID{Name: it.Name, Key: it.Key, Shard: sh.Index})
		}
	}
	return dst
}

// ExpiryGrace is how long, in milliseconds, a store keeps a record past
// its FullAt (ratelimit.FullAt) before deleting it. Reading a record past
// FullAt as missing is always exact: at that call's now the bucket is full
// either way. Deleting it is exact only for calls judged at FullAt or
// later, and concurrent calls are judged at times read a moment apart: a
// call whose now was read just before FullAt, arriving after the deletion,
// would find a full bucket while the record says otherwise. The grace
// covers how far the nows of calls in flight may lag behind the deleter's.
const ExpiryGrace int64 = 60_000

// MaxTime bounds the times of an Op, in Unix milliseconds either side of
// 1970 (about 142,000 years): within it, times and the windows around them
// stay exact in the arithmetic of every store (doubles hold integers to
// 2^53). The Limiter refuses a clock beyond it (ratelimit.ErrTimeRange),
// and a store an Op whose Now is beyond it (ErrInvalidOp).
const MaxTime int64 = 1 << 52

// ClampMilli returns t in Unix milliseconds, within ±MaxTime. An Expirer
// takes its now so before it subtracts ExpiryGrace: from a time far
// enough back (or one whose milliseconds do not fit in an int64) the
// difference wraps around to a time far ahead, at which every record
// would be dropped.
func ClampMilli(t time.Time) int64 {
	switch {
	case t.Before(time.UnixMilli(-MaxTime)):
		return -MaxTime
	case t.After(time.UnixMilli(MaxTime)):
		return MaxTime
	}
	return t.UnixMilli()
}

// Never is the FullAt (ratelimit.FullAt) of a record whose refill is too
// slow to compute: keep it.
const Never int64 = math.MaxInt64

// Kind selects how a limit grants tokens.
//
// The zero Kind is invalid, so that a Config must say which kind it means.
type Kind uint8

const (
	// FixedWindow grants Rate tokens at the start of every window of length
	// Period, capped at Capacity; unused tokens roll over up to the cap.
	FixedWindow Kind = 1
	// TokenBucket refills continuously at Rate tokens per Period, capped at
	// Capacity.
	TokenBucket Kind = 2
)

// String returns "fixed window", "token bucket", or "Kind(n)" for an invalid
// value.
func (k Kind) String() string {
	switch k {
	case FixedWindow:
		return "fixed window"
	case TokenBucket:
		return "token bucket"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MarshalText encodes the kind as "fixed window" or "token bucket", the
// spelling used by configuration files.
func (k Kind) MarshalText() ([]byte, error) {
	if k != FixedWindow && k != TokenBucket {
		return nil, fmt.Errorf("ratelimit: cannot encode %v: use FixedWindow or TokenBucket", k)
	}
	return []byte(k.String()), nil
}

// UnmarshalText decodes "fixed window" or "token bucket": the two words
// in any case (ASCII), with one space, underscore or hyphen between them
// or none ("Fixed Window", "fixed_window", "token-bucket", "TokenBucket").
// Other spellings are an error that lists these, rather than read as one:
// space around the words, two separators, or one within a word ("fixed
// win dow") is more likely a slip than a kind.
func (k *Kind) UnmarshalText(b []byte) error {
	switch kindWords(string(b)) {
	case "fixed window":
		*k = FixedWindow
	case "token bucket":
		*k = TokenBucket
	default:
		return fmt.Errorf("ratelimit: unknown kind %q: write \"fixed window\" or \"token bucket\" (in any case, with a space, _, - or nothing between the words)", b)
	}
	return nil
}

// kindWords returns s, a kind as written, in lower case with one space
// between its words, when it is one of the kinds' two words, with a
// single separator between them or none; "" otherwise.
func kindWords(s string) string {
	// In ASCII alone: strings.ToLower reads the Kelvin sign (U+212A) as k.
	lower := []byte(s)
	for i, c := range lower {
		if 'A' <= c && c <= 'Z' {
			lower[i] = c + 'a' - 'A'
		}
	}
	for _, words := range [...][2]string{{"fixed", "window"}, {"token", "bucket"}} {
		rest, ok := bytes.CutPrefix(lower, []byte(words[0]))
		if !ok {
			continue
		}
		if len(rest) > 0 && (rest[0] == ' ' || rest[0] == '_' || rest[0] == '-') {
			rest = rest[1:]
		}
		if string(rest) == words[1] {
			return words[0] + " " + words[1]
		}
	}
	return ""
}
