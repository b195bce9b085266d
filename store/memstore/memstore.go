// Package memstore is an in-memory ratelimit.Store for a single process.
//
// Records live in hash tables split into stripes. A record is found by
// one hash of its key (its limit's name is hashed once, when the Limiter
// binds the limit) and decided and updated in place under its own lock,
// held for the transition alone: calls on different keys share no lock
// and write no common memory, so they scale across cores. A call finds
// its record without a lock, and checks, once it holds the record's lock,
// that no record has moved meanwhile (a stripe's version, changed by
// whoever moves records under the stripe's mutex); adding, moving and
// dropping records take the stripe's mutex. An op of several records
// (Apply) holds the mutexes of their stripes, in a fixed order, and their
// records' locks. The store implements driver.Binder: the Limiter
// decides a single limit's calls through it without building an Op, and
// allocates nothing per call. Each record takes a slot of 64 bytes, one
// cache line holding what finds it, its lock, its state and its last
// refusal (given again to the calls of the same millisecond that would get
// it, as on a key under attack), beside its key's bytes, in a table that
// doubles when 7/8 full; the store also remembers each (limit name,
// shard) it has written, and the params of the limits bound, once each:
// params that no bound limit uses any more (the Limiter bound new ones on
// SetLimit) are forgotten, a few dozen at a time, by a later Bind.
//
// Memory follows the keys active recently, not every key ever seen. A
// record may be dropped once its bucket has been full again for
// driver.ExpiryGrace: a stripe about to grow first drops those, every
// record added examines a few slots of another stripe, in turn, and a
// stripe written to examines a few of its own every 100 ms of the calls'
// time, and a few of another's, in turn, so that calls on keys still
// active, with no new ones, drop the records of those gone idle anywhere
// (the calls of clocks far apart, up to seven, each on its own clock's
// time);
// a table at most 1/8 full shrinks, and an empty one is freed. The marks
// of settlements past their expiry go likewise, once every
// driver.ExpiryGrace of the calls' time. DeleteExpired drops them all at
// once and shrinks every stripe.
//
// Those drops follow the store's own clock (the real one by default, see
// WithClock) as well as the calls' times: a call's clock that jumps
// forward, then back, cannot make the store forget a drained record and
// hand out a full bucket for it, even when it was already ahead at the
// store's first call, and drained the key there: a call earlier than
// every one before, a refusal too, is seen at once. The price is memory:
// calls of clocks far apart on one store (a Limiter's clock a day behind
// another's) keep the records of the clock ahead that much longer, since
// the clock behind may still need them; DeleteExpired drops them at the
// time it is given. The sweeps take every calls' clock they have seen to
// run at least as fast as the store's: one that falls behind it by a lag
// L longer than driver.ExpiryGrace since the sweeps last saw it (a mock
// left still for minutes of real time, with no call, or none that steps a
// sweep), and meanwhile jumps ahead or shares the store with a clock
// ahead, may find, once back, a record it drained dropped, if that was
// full again less than L less the grace after the clock's time. A lag of
// at most the grace loses nothing. A bound on memory allows no more: a
// clock left still is, until it calls, the same to the store as one gone
// for good, for which keeping the records written since its last call
// would keep every key the other clocks write.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/isnil"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
)

const (
	stripeBits = 6
	stripes    = 1 << stripeBits
	// minSlots is the smallest table a stripe holding records keeps.
	minSlots = 8
	// sweepEvery is how much of the calls' time (ms) passes between two
	// sweep steps of a stripe that is written to; a step examines
	// sweepSlots slots.
	sweepEvery = 100
	sweepSlots = 16
	// insertSweep is how many slots of another stripe, taken in turn, a
	// write that adds a record examines.
	insertSweep = 16
	// otherSweep is how many slots of another stripe, taken in turn, a
	// stripe that steps its own sweep examines too, so that the records
	// of keys gone idle go while only other keys are written.
	otherSweep = 64
	// tries is how many times a call looks for its record without the
	// stripe's mutex before it takes it.
	tries = 3
)

// Store is an in-memory ratelimit.Store, safe for concurrent use. Build
// it with New: every call of the zero value, or of a nil *Store, fails
// with an error matching driver.ErrZeroStore (Len reports 0).
type Store struct {
	keySeed  uint64 // hashString's seed
	nameSeed maphash.Seed
	stripes  [stripes]stripe

	// limits holds the (name, shard) pairs written, each once: a slot
	// names its record's by a number.
	limits   sync.Map // limitKey → *limitID
	limitsMu sync.Mutex
	nlimits  uint32

	// deferred holds the params of bound limits, each once: a write
	// through a bound limit leaves its record's expiry to the first sweep
	// that examines it, marking the slot with the params' place here. A
	// place is nil once no bound limit uses its params and no record
	// carries its mark (reclaimDeferred); Bind gives it to other params.
	// Copied on write, under deferredMu.
	deferred   atomic.Pointer[[]*driver.Params]
	deferredMu sync.Mutex
	// Under deferredMu: the bounds that use each place of deferred, held
	// weakly (a bound that the Limiter dropped is collected), how many
	// places were in use after the last reclaimDeferred, and how many
	// params were added since.
	deferredUsers [][]weak.Pointer[bound]
	deferredLive  int
	deferredAdded int

	clock    clock.Clock
	anchored atomic.Bool
	anchorMu sync.Mutex
	// low is the earliest calls' time seen (math.MaxInt64 before the
	// first call): a call earlier still is observed at once, whatever it
	// does, as a sweep step is. A clock come back below every time seen
	// may find only refusals (its keys drained ahead), which write
	// nothing and step no sweep.
	low atomic.Int64
	// The store's clock at the first call, and the earliest the calls'
	// clock read, less the store's time passed since then (offset): a
	// sweep judges records at the earlier of its call's time and offset
	// plus the time passed on the store's clock. offset is lowered by
	// every sweep step and sweep (observe), and by a call earlier than
	// every one before (low), not by a call otherwise.
	anchorReal time.Time
	offset     atomic.Int64

	// marks holds the settlements (driver.Settlement) made, by ID, until
	// their expiry; markMu is held across a settle op, so that finding no
	// mark, refunding and marking are one step.
	markMu sync.Mutex
	marks  map[[16]byte]mark
	// expiries holds the marks' IDs in a heap of their expiries, the
	// earliest first: dropping the marks expired looks at those alone, so
	// that a look when none is costs no more than one at the earliest.
	expiries []expiry
	// marksDue is when a sweep step next drops the marks expired
	// (stepMarks).
	marksDue schedule
	// marksMost is the most marks held since marks was made: a Go map
	// keeps the memory of its most however many go (dropMarks).
	marksMost int

	// chunked, for tests, is called between two chunks of a stripe's scan
	// by DeleteExpired, its mutex free; nil in use.
	chunked func(st *stripe)
}

// mark is a settlement: how it was settled, by whom (Settlement.Settler),
// and when it may be dropped.
type mark struct {
	kind    driver.SettleKind
	expires int64
	settler [16]byte
}

// expiry is a mark's place in the heap of expiries: when the mark of id
// may be dropped.
type expiry struct {
	at int64
	id [16]byte
}

// Option configures a Store in New.
type Option func(*options)

type options struct {
	clock clock.Clock
}

// WithClock sets the clock by which the store's own sweeps judge how much
// time has passed (default: the real clock). Tests that move a mock clock
// by hand and want records swept pass that clock. The store takes it as
// never going back: a mock that is also the calls' clock, set back, lets
// the sweeps drop records the calls still need; one that never moves
// lets them drop next to none (DeleteExpired still does). A nil clock, or one
// holding a nil pointer, makes New fail with an error matching
// ratelimit.ErrInvalidOption.
func WithClock(c clock.Clock) Option { return func(o *options) { o.clock = c } }

var (
	_ ratelimit.Store    = (*Store)(nil)
	_ driver.Binder      = (*Store)(nil)
	_ driver.Expirer     = (*Store)(nil)
	_ driver.ZeroChecker = (*Store)(nil)
)

// New returns an empty in-memory store. The error is for a bad option;
// an in-memory store has nothing else that can fail.
func New(opts ...Option) (*Store, error) {
	o := options{clock: clock.New()}
	for _, opt := range opts {
		opt(&o)
	}
	if o.clock == nil {
		return nil, fmt.Errorf("memstore: WithClock needs a clock: pass clock.New() or a mock: %w", ratelimit.ErrInvalidOption)
	}
	if isnil.Is(o.clock) {
		return nil, fmt.Errorf("memstore: WithClock was given %T(nil): pass clock.New() or a mock: %w", o.clock, ratelimit.ErrInvalidOption)
	}
	s := &Store{keySeed: rand.Uint64(), nameSeed: maphash.MakeSeed(), clock: o.clock}
	s.marksDue.init(math.MinInt64)
	s.low.Store(math.MaxInt64)
	for i := range s.stripes {
		// Each stripe's inserts examine the stripes after it, in turn, so
		// that inserts anywhere cover every stripe alike.
		s.stripes[i].victim = uint32(i)
		s.stripes[i].sweepDue.init(0)
	}
	return s, nil
}

// CheckZero implements driver.ZeroChecker: an error matching
// driver.ErrZeroStore for the zero Store or a nil *Store, which New did
// not make, else nil.
func (s *Store) CheckZero() error {
	if s == nil || s.clock == nil {
		return s.unmade("CheckZero")
	}
	return nil
}

// unmade returns the error of call on s, nil or a Store that New did not
// make (its clock is nil), which has none of what New sets up (the hash
// seeds, the stripes' schedules) and would panic.
func (s *Store) unmade(call string) error {
	what := "the zero memstore.Store"
	if s == nil {
		what = "a nil *memstore.Store"
	}
	return fmt.Errorf("memstore: %s: the store is %s, which New did not make: build it with memstore.New, and use the store it returns: %w", call, what, driver.ErrZeroStore)
}

type limitKey struct {
	name  string
	shard int
}

// limitID is a (name, shard) the store has written: its number in the
// slots (from 1; 0 marks an empty slot), and the part of its records'
// hashes that it makes.
type limitID struct {
	id   uint32
	salt uint64
}

// limitOf returns the limitID of (name, shard), registering it if create
// is set; nil if it is not registered and create is not set.
func (s *Store) limitOf(name string, shard int, create bool) *limitID {
	k := limitKey{name, shard}
	if v, ok := s.limits.Load(k); ok {
		return v.(*limitID)
	}
	if !create {
		return nil
	}
	s.limitsMu.Lock()
	defer s.limitsMu.Unlock()
	if v, ok := s.limits.Load(k); ok {
		return v.(*limitID)
	}
	s.nlimits++
	h := maphash.String(s.nameSeed, name) ^ uint64(shard)*0x9e3779b97f4a7c15
	h ^= h >> 31
	h *= 0xbf58476d1ce4e5b9
	l := &limitID{id: s.nlimits, salt: h ^ h>>29}
	s.limits.Store(k, l)
	return l
}

// hash returns the hash of a record of key whose limit makes salt. Its top
// stripeBits choose the stripe, its low 32 bits the home slot.
func (s *Store) hash(key string, salt uint64) uint64 {
	return hashString(s.keySeed, key) ^ salt
}

func (s *Store) stripeOf(h uint64) *stripe { return &s.stripes[h>>(64-stripeBits)] }

// anchor is called by every call at now (Decide, Apply): the first
// records the store's clock then, and a call earlier than every one
// before is observed (observe), as a sweep step is.
func (s *Store) anchor(now int64) {
	if now < s.low.Load() {
		s.observe(now)
	}
}

func (s *Store) anchorSlow(now int64) {
	s.anchorMu.Lock()
	if !s.anchored.Load() {
		s.anchorReal = s.clock.Now()
		s.offset.Store(now)
		s.anchored.Store(true)
	}
	s.anchorMu.Unlock()
}

// sweepTime returns the time at which a sweep during a call at now may
// judge records: now, unless more of it has passed on the calls' clock
// than on the store's since the earliest the calls' clock read, as far as
// the sweeps saw (observe): the calls' clock jumped ahead, and may come
// back. That earliest reading is not the first call's: a clock ahead at
// the first call, which came back and went ahead again, would drop at the
// second jump records drained in between.
func (s *Store) sweepTime(now int64) int64 {
	passed := s.observe(now)
	return min(now, s.offset.Load()+passed)
}

// observe notes a call at now against the store's clock, lowering offset
// if the calls' clock is behind where it was, and returns the store's
// time passed since the first call, in milliseconds. Sweep steps call it,
// once every sweepEvery of the calls' time at most, sweeps, and calls
// earlier than every one before (anchor).
func (s *Store) observe(now int64) int64 {
	if !s.anchored.Load() {
		s.anchorSlow(now)
	}
	for {
		low := s.low.Load()
		if now >= low || s.low.CompareAndSwap(low, now) {
			break
		}
	}
	passed := s.clock.Since(s.anchorReal).Milliseconds()
	at := now - passed
	for {
		off := s.offset.Load()
		if at >= off || s.offset.CompareAndSwap(off, at) {
			return passed
		}
	}
}

// stripe is one hash table: open addressing, linear probing, deletion by
// backward shift, so that no tombstones accumulate. A table is an array of
// records, one per cache line, each with its lock, written by the calls
// that decide it alone, and beside it an array of the slots' metas (hash
// bits and limit number in one word), which a call probes: a call reads
// the metas' line, written only when records are added, moved or
// dropped, and then its own record's.
//
// The table, and which slot holds which record, change only under mu.
// Whoever moves records (a delete's shift, a resize) makes version odd
// first and even again after, and locks each record it moves; a call that
// found its record without mu holds the record's lock and checks that the
// version is the one it started with.
type stripe struct {
	mu      sync.Mutex
	version atomic.Uint32
	table   atomic.Pointer[table] // nil when empty
	// sweepDue is when a write next steps the sweep of this stripe.
	sweepDue schedule
	// Under mu: the records held, the slot the next sweep step starts
	// at, the stripe the next insert examines a few slots of.
	n      int
	cursor uint32
	victim uint32
	_      [64 - 8 - 4 - 4 - 8 - 16 - 8 - 4 - 4]byte // one stripe per cache line
}

// table is a stripe's slots: a power of two of them. Each slot's meta,
// its record's hash bits << 32 | limit number (0: the slot is empty),
// is kept apart from the record, in an array of its own: a call probes
// the slots by their metas, which change only when records are added,
// moved or dropped, and so stay in every core's cache, and writes only
// its own record's line. (With the meta in the record, a probe that
// passed another key's record fetched that record's line from the core
// that last decided it.)
type table struct {
	meta []atomic.Uint64 // written under the stripe's mutex, read without it
	recs []record
}

func metaOf(lo, limit uint32) uint64 { return uint64(lo)<<32 | uint64(limit) }

// record is the record in a slot. 64 bytes, one cache line.
type record struct {
	mu sync.Mutex // held while its state is read or written
	// key is written under the stripe's mutex, before the slot's meta,
	// or with mu.
	key string
	// The state, and when the record is full again (by the params of its
	// last write), or deferred (see Store.deferred); under mu.
	value   float64
	ts      int64
	expires int64
	// The last refusal decided here by a bound call of one token (see
	// recall), and its Remaining; memo 0 when none. Every write of the
	// state clears it. Under mu.
	memo    uint64
	memoRem float64
}

func (st *stripe) tab() *table { return st.table.Load() }

// find returns the slot of the record (limit, key) of hash h in t, and
// whether it holds it; if not, the empty slot where probing stopped. The
// caller holds mu: no slot changes, and keys read are stable.
func (t *table) find(h uint64, limit uint32, key string) (int, bool) {
	mask := uint32(len(t.recs) - 1)
	lo := uint32(h)
	want := metaOf(lo, limit)
	for i := lo & mask; ; i = (i + 1) & mask {
		m := t.meta[i].Load()
		if m == 0 {
			return int(i), false
		}
		if m == want && t.recs[i].key == key {
			return int(i), true
		}
	}
}

// lockRecord finds the record (limit, key) of hash h without mu, and
// returns it locked; nil when it may be missing or records are moving,
// for the caller to look again under mu.
func (st *stripe) lockRecord(h uint64, limit uint32, key string) *record {
	lo := uint32(h)
	want := metaOf(lo, limit)
	for range tries {
		v := st.version.Load()
		if v&1 != 0 {
			return nil
		}
		t := st.tab()
		if t == nil {
			return nil
		}
		mask := uint32(len(t.recs) - 1)
	probe:
		for i := lo & mask; ; i = (i + 1) & mask {
			switch m := t.meta[i].Load(); {
			case m == 0:
				return nil // missing, or moved while probing: ask under mu
			case m != want:
				continue
			}
			r := &t.recs[i]
			switch claim(st, r, v, key) {
			case claimed:
				return r
			case moved:
				break probe // look again
			}
		}
	}
	return nil
}

// What claim found.
const (
	claimed = iota // the record, now locked
	moved          // records moved since version v: look again
	another        // another record with the same hash bits
)

// claim locks r, found by probing the table read at version v, and checks
// that it is the record of key: that no record has moved since (a resize
// leaves copies in the old table, a delete's shift in the slots it
// moved), and that the key is the one asked. It returns with r locked only
// when it claimed it.
func claim(st *stripe, r *record, v uint32, key string) int {
	r.mu.Lock()
	if st.version.Load() != v {
		r.mu.Unlock()
		return moved
	}
	if r.key != key {
		r.mu.Unlock()
		return another
	}
	return claimed
}

// insert writes a new record where find stopped (i), first making room
// if the table is full (dropping expired records, then growing), and
// finding its slot again. The caller holds mu and no record lock. Then,
// so that records added anywhere drop expired ones everywhere, it examines
// a few slots of another stripe, in turn, if its mutex is free.
func (st *stripe) insert(s *Store, i int, h uint64, limit uint32, key string, state driver.State, expires, now int64) {
	t := st.tab()
	if t == nil || 8*(st.n+1) > 7*len(t.recs) {
		st.makeRoom(s, now)
		t = st.tab()
		i, _ = t.find(h, limit, key)
	}
	r := &t.recs[i]
	r.key, r.value, r.ts, r.expires, r.memo = key, state.Remaining, state.TS, expires, 0
	t.meta[i].Store(metaOf(uint32(h), limit)) // published: a call may find it from now on
	st.n++
	st.stepOther(s, now, insertSweep)
}

// stepOther steps the sweep of the next stripe in turn (st's victim) by
// count slots, if its mutex is free. The caller holds mu.
func (st *stripe) stepOther(s *Store, now int64, count int) {
	st.victim = (st.victim + 1) % stripes
	switch v := &s.stripes[st.victim]; {
	case v == st:
		v.step(s, now, count)
	case v.mu.TryLock():
		v.step(s, now, count)
		v.mu.Unlock()
	}
}

// makeRoom is called when an insert would fill the table past 7/8: it
// drops the records that may be dropped, and doubles the table unless
// that left it at most 5/8 full. Each call costs O(len) and comes at
// least len/4 inserts after the last, so inserts stay O(1).
func (st *stripe) makeRoom(s *Store, now int64) {
	t := st.tab()
	if t == nil {
		st.table.Store(newTable(minSlots))
		return
	}
	st.sweep(s, now, 0, len(t.recs))
	if size := len(st.tab().recs); 8*(st.n+1) > 5*size {
		st.resize(2 * size)
	}
}

func newTable(size int) *table {
	return &table{meta: make([]atomic.Uint64, size), recs: make([]record, size)}
}

// resize moves the records to a table of size slots (a power of two
// holding them with room), or drops the table when it is empty. The
// caller holds mu and no record lock.
func (st *stripe) resize(size int) {
	old := st.tab()
	st.cursor = 0
	st.version.Add(1)
	for k := range old.recs {
		if old.meta[k].Load() != 0 {
			old.recs[k].mu.Lock() // a call deciding it finishes first
		}
	}
	if st.n == 0 {
		st.table.Store(nil)
	} else {
		t := newTable(size)
		mask := uint32(size - 1)
		for k := range old.recs {
			m := old.meta[k].Load()
			if m == 0 {
				continue
			}
			i := uint32(m>>32) & mask
			for t.meta[i].Load() != 0 {
				i = (i + 1) & mask
			}
			copyRecord(&t.recs[i], &old.recs[k])
			t.meta[i].Store(m)
		}
		st.table.Store(t)
	}
	st.version.Add(1)
	for k := range old.recs {
		if old.meta[k].Load() != 0 {
			old.recs[k].mu.Unlock() // a call that waited finds the version changed
		}
	}
}

// copyRecord copies the record src into dst; the caller holds mu and the
// lock of src (dst is not yet published, or locked too).
func copyRecord(dst, src *record) {
	dst.key, dst.value, dst.ts, dst.expires = src.key, src.value, src.ts, src.expires
	dst.memo, dst.memoRem = src.memo, src.memoRem
}

// shrink gives back a table at most 1/8 full: the new one is at most half
// full, or nil when no record is left. The caller holds mu, no record
// lock.
func (st *stripe) shrink() {
	t := st.tab()
	if t == nil || 8*st.n > len(t.recs) {
		return
	}
	size := minSlots
	if st.n > 0 {
		size = max(minSlots, 1<<bits.Len(uint(2*st.n-1)))
	}
	if size < len(t.recs) || st.n == 0 {
		st.resize(size)
	}
}

// remove empties slot i of t, whose record's lock the caller holds (with
// mu), shifting back the records after it that probed past it, so that
// every record stays reachable from its home slot. It unlocks slot i.
func (st *stripe) remove(t *table, i int) {
	mask := uint32(len(t.recs) - 1)
	st.version.Add(1)
	locked := [8]uint32{uint32(i)}
	moved := locked[:1]
	hole := uint32(i)
	for j := (hole + 1) & mask; ; j = (j + 1) & mask {
		m := t.meta[j].Load()
		if m == 0 {
			break
		}
		home := uint32(m>>32) & mask
		// The record at j may fill the hole if its home is not in
		// (hole, j], cyclically.
		if (j-home)&mask >= (j-hole)&mask {
			t.recs[j].mu.Lock()
			moved = append(moved, j)
			copyRecord(&t.recs[hole], &t.recs[j])
			t.meta[hole].Store(m)
			hole = j
		}
	}
	t.meta[hole].Store(0)
	t.recs[hole].key = "" // let the key's bytes go
	st.n--
	st.version.Add(1)
	for _, k := range moved {
		t.recs[k].mu.Unlock()
	}
}

// sweep examines count slots from slot from on (cyclically) and drops the
// records that may be dropped at a call at now: full again for
// driver.ExpiryGrace by the store's sweep time. It returns how many it
// dropped. The store's clock is read only if some record is a candidate.
// The caller holds mu and no record lock.
func (st *stripe) sweep(s *Store, now int64, from, count int) int {
	t := st.tab()
	if t == nil {
		return 0
	}
	mask := len(t.recs) - 1
	count = min(count, len(t.recs))
	judged := int64(math.MinInt64)
	dropped := 0
	for i, seen := from&mask, 0; seen < count && st.n > 0; {
		if t.meta[i].Load() != 0 {
			r := &t.recs[i]
			r.mu.Lock()
			if st.droppable(s, r, now, &judged) {
				st.remove(t, i) // unlocks r; a later record may have moved into i: examine it
				dropped++
				continue
			}
			r.mu.Unlock()
		}
		i = (i + 1) & mask
		seen++
	}
	return dropped
}

// droppable reports whether the record r, whose lock the caller holds,
// may be dropped at a call at now; judged caches the sweep time.
func (st *stripe) droppable(s *Store, r *record, now int64, judged *int64) bool {
	// A record is full again no sooner than its TS: one written within
	// the grace is kept without computing when.
	if r.ts > now-driver.ExpiryGrace || r.expires > now-driver.ExpiryGrace {
		return false
	}
	if r.expires < deferredLimit && s.expiry(r) > now-driver.ExpiryGrace {
		return false
	}
	if *judged == math.MinInt64 {
		*judged = s.sweepTime(now)
	}
	return r.expires <= *judged-driver.ExpiryGrace
}

// step examines the next count slots of the stripe from its cursor on,
// and shrinks its table if that emptied it. The caller holds mu.
func (st *stripe) step(s *Store, now int64, count int) {
	from := int(st.cursor)
	st.cursor += uint32(count)
	if st.sweep(s, now, from, count) > 0 {
		st.shrink()
	}
}

// wrote is called after a write of the stripe at now, holding no lock:
// once every sweepEvery of the calls' time, if mu is free, it steps the
// sweep (stepped).
func (st *stripe) wrote(s *Store, now int64) {
	if st.sweepDue.waiting(now, sweepEvery) || st.sweepDue.due(now, sweepEvery) == nil || !st.mu.TryLock() {
		return
	}
	st.stepped(s, now)
	st.mu.Unlock()
}

// stepped steps the sweep of the stripe, written at now, and that of
// another in turn, once every sweepEvery of the calls' time: records of
// keys gone idle go while other keys are written, wherever they are. The
// caller holds mu.
func (st *stripe) stepped(s *Store, now int64) {
	if st.sweepDue.waiting(now, sweepEvery) {
		return
	}
	if next := st.sweepDue.due(now, sweepEvery); next != nil {
		next.Store(now + sweepEvery)
		s.observe(now)
		st.step(s, now, sweepSlots)
		st.stepOther(s, now, otherSweep)
		s.stepMarks(now)
	}
}

// schedule is when a step, due every so often of the calls' time, is due
// next: for the calls at the latest time seen (next), and for those of up
// to backs clocks behind it by more than two steps (back), each on its
// own. A calls' clock that jumped ahead, then came back, stops no step
// until it reaches the jump's time again, and calls of clocks far apart
// (Limiters on one store, their clocks off) each step on their own
// clock's schedule: with one, each call of either of two clocks took it
// back or forth to its own time, and stepped, and with one time behind
// next, so did each call of three clocks.
type schedule struct {
	next atomic.Int64 // from the latest calls' time seen
	// back is out of line, read by the calls of clocks behind alone, so
	// that a stripe keeps to one cache line.
	back *[backs]atomic.Int64
}

// backs is how many clocks behind next a schedule keeps apart; the calls
// of more step more often than every so often, each clock once its step
// is due at least.
const backs = 6

// unscheduled is a back time no clock has taken: below every call's.
const unscheduled = -2 * driver.MaxTime

func (sc *schedule) init(next int64) {
	sc.next.Store(next)
	sc.back = new([backs]atomic.Int64)
	for i := range sc.back {
		sc.back[i].Store(unscheduled)
	}
}

// due returns the time of sc to move on, by every, if a step due every
// every is due at now, and nil if none is. A call at next or later is
// due; one less than two steps behind next is not (calls a little out of
// order). A call further behind is of a clock behind: it is not due less
// than two steps before one of the back times (its clock's step is
// ahead); otherwise it is, and moves the latest back time at or below it
// (its clock's, reached), or, below them all (a clock come back again, or
// one not seen before), one chosen by its time.
func (sc *schedule) due(now, every int64) *atomic.Int64 {
	next := sc.next.Load()
	switch {
	case now >= next:
		return &sc.next
	case now >= next-2*every:
		return nil
	}
	var below *atomic.Int64
	at := int64(math.MinInt64)
	for i := range sc.back {
		b := sc.back[i].Load()
		switch {
		case now >= b-2*every && now < b:
			return nil
		case b <= now && b > at:
			below, at = &sc.back[i], b
		}
	}
	if below == nil {
		below = &sc.back[uint64(now/every)%backs]
	}
	return below
}

// waiting reports whether a call at now is one at the latest time whose
// step is not yet due (due would return nil), the case of nearly every
// call: small enough to be inlined where due is not, so that the calls of
// a single clock pay no more than before the clocks behind were kept
// apart.
func (sc *schedule) waiting(now, every int64) bool {
	next := sc.next.Load()
	return now < next && now >= next-2*every
}

// stepMarks drops the settlements' marks expired, once every
// driver.ExpiryGrace of the calls' time, if markMu is free: marks go while
// calls go on, as the records of idle keys do, not only when later
// settlements or DeleteExpired come. It costs a look at the earliest
// expiry, and a step of the heap for each mark dropped; the calls of
// clocks far apart, more than the schedule keeps apart, may take it at
// every call. The caller may hold stripes' mutexes, which a settlement
// takes while it holds markMu: hence TryLock.
func (s *Store) stepMarks(now int64) {
	if s.marksDue.due(now, driver.ExpiryGrace) == nil || !s.markMu.TryLock() {
		return
	}
	if next := s.marksDue.due(now, driver.ExpiryGrace); next != nil {
		next.Store(now + driver.ExpiryGrace)
		s.dropMarksAt(now)
	}
	s.markMu.Unlock()
}

// Bind implements driver.Binder. Params that no valid op carries
// (driver.CheckParams) make a bound limit whose every Decide fails with an
// error matching driver.ErrInvalidOp, as Apply refuses such an op; a store
// that New did not make, one whose every Decide fails with an error
// matching driver.ErrZeroStore.
func (s *Store) Bind(name string, p driver.Params, phase func(key string) int64) driver.BoundLimit {
	if s == nil || s.clock == nil {
		return badBound{s: s, err: s.unmade(fmt.Sprintf("Decide of limit %q", name))}
	}
	p.Phase = 0
	if err := driver.CheckParams(p); err != nil {
		return badBound{s: s, err: fmt.Errorf("memstore: Decide of limit %q: %w", name, err)}
	}
	l := s.limitOf(name, 0, true)
	b := &bound{s: s, limit: l.id, salt: l.salt, p: p, phase: phase}
	b.deferred = s.deferParams(b)
	if n := b.deferred - deferredBase + 1; n < 1<<16 {
		b.params = uint64(n)
	}
	return b
}

// Expiries left to the sweeps are marked by numbers far below any time
// (times are within ±2^52 ms): deferredBase plus the place of the params
// that decide them in Store.deferred.
const (
	deferredBase  = math.MinInt64
	deferredLimit = math.MinInt64 + 1<<32
)

// deferredReclaim is how many params, at least, are added to
// Store.deferred between two reclaimDeferred.
const deferredReclaim = 64

// deferParams returns the mark of the expiries of records written with
// b's params, and records that b uses them. Params not yet bound take the
// first free place; every so many (deferredReclaim, or as many as were
// in use after the last time, whichever is more) the places of params no
// bound limit uses any more are freed first, so that a control plane that
// sets new configs again and again does not grow the list, nor the cost
// of a Bind, with every config ever bound.
func (s *Store) deferParams(b *bound) int64 {
	s.deferredMu.Lock()
	defer s.deferredMu.Unlock()
	var list []*driver.Params
	if l := s.deferred.Load(); l != nil {
		list = *l
	}
	for i, q := range list {
		if q != nil && *q == b.p {
			s.deferredUsers[i] = appendUser(s.deferredUsers[i], b)
			return deferredBase + int64(i)
		}
	}
	if s.deferredAdded++; s.deferredAdded >= max(deferredReclaim, s.deferredLive) {
		s.reclaimDeferred()
		list = *s.deferred.Load()
	}
	i := slices.Index(list, nil)
	if i < 0 {
		i = len(list)
		list = append(list, nil)
		s.deferredUsers = append(s.deferredUsers, nil)
	}
	p := b.p
	list = slices.Clone(list)
	list[i] = &p
	s.deferred.Store(&list)
	s.deferredUsers[i] = appendUser(nil, b)
	return deferredBase + int64(i)
}

// appendUser appends b to users, the bounds of one params, first dropping
// those collected if users is full: the bounds of params bound again and
// again (a config set back and forth) are as many as are alive, give or
// take twice.
func appendUser(users []weak.Pointer[bound], b *bound) []weak.Pointer[bound] {
	if len(users) == cap(users) {
		users = slices.DeleteFunc(users, func(w weak.Pointer[bound]) bool { return w.Value() == nil })
	}
	return append(users, weak.Make(b))
}

// reclaimDeferred frees the places of Store.deferred whose params no bound
// limit uses any more (every bound of them has been collected: no call
// can write their mark again). First every stripe's records are walked:
// an expiry still marked with such params is computed, as a sweep would,
// and a refusal remembered under their number is dropped (a memo is only
// a shortcut), so that the params that take the place next share nothing
// with them. The walk costs a look at every slot, once per deferredReclaim
// params bound at least, and only when some params were dropped; calls
// pay nothing for it. The caller holds deferredMu.
func (s *Store) reclaimDeferred() {
	s.deferredAdded = 0
	l := s.deferred.Load()
	if l == nil {
		return
	}
	list := *l
	dead := make([]bool, len(list))
	found, live := false, 0
	for i, q := range list {
		if q == nil {
			continue
		}
		users := slices.DeleteFunc(s.deferredUsers[i], func(w weak.Pointer[bound]) bool { return w.Value() == nil })
		if s.deferredUsers[i] = users; len(users) == 0 {
			dead[i], found = true, true
			s.deferredUsers[i] = nil
		} else {
			live++
		}
	}
	s.deferredLive = live
	if !found {
		return
	}
	for i := range s.stripes {
		s.stripes[i].undefer(s, dead)
	}
	next := slices.Clone(list)
	for i, d := range dead {
		if d {
			next[i] = nil
		}
	}
	n := len(next)
	for n > 0 && next[n-1] == nil {
		n--
	}
	next = slices.Clip(next[:n])
	s.deferredUsers = slices.Clip(s.deferredUsers[:n])
	s.deferred.Store(&next)
}

// undefer computes, in the stripe's records, the expiries marked with the
// places of Store.deferred that dead flags, and drops the refusals
// remembered under their numbers, for reclaimDeferred. Like
// deleteExpired, it examines expiredChunk slots per hold of mu, and starts
// the stripe over when records moved meanwhile (after expiredRestarts
// times, it holds mu to the end): no record escapes it by moving behind
// the walk. Records added meanwhile carry no such mark: no bound of those
// params is left to write one.
func (st *stripe) undefer(s *Store, dead []bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for k, restarts := 0, 0; ; {
		t := st.tab()
		if t == nil {
			return
		}
		end := len(t.recs)
		if restarts < expiredRestarts {
			end = min(end, k+expiredChunk)
		}
		for ; k < end; k++ {
			if t.meta[k].Load() == 0 {
				continue
			}
			r := &t.recs[k]
			r.mu.Lock()
			if r.expires < deferredLimit && dead[r.expires-deferredBase] {
				s.expiry(r)
			}
			if n := r.memo >> 32 & (1<<16 - 1); n != 0 && dead[n-1] {
				r.memo = 0
			}
			r.mu.Unlock()
		}
		if k >= len(t.recs) {
			return
		}
		v := st.version.Load()
		st.mu.Unlock()
		st.mu.Lock()
		if st.version.Load() != v || st.tab() != t {
			k, restarts = 0, restarts+1
		}
	}
}

// expiry returns the time from which the record r (whose lock the caller
// holds), its expiry deferred (marked), is a full bucket again: it is
// then kept in the record.
func (s *Store) expiry(r *record) int64 {
	p := (*s.deferred.Load())[r.expires-deferredBase]
	r.expires = ratelimit.FullAt(*p, driver.State{Remaining: r.value, TS: r.ts})
	return r.expires
}

// badBound is a limit bound with params that no valid op carries, or by
// a store that New did not make: it decides nothing, so that the
// transition never runs on them (a fixed window of period 0 would divide
// by zero holding the record's lock).
type badBound struct {
	s   *Store
	err error
}

// Store implements driver.BoundLimit.
func (b badBound) Store() ratelimit.Store { return b.s }

// Decide implements driver.BoundLimit: it returns the params' error, or
// the store's.
func (b badBound) Decide(ctx context.Context, key string, mode driver.Mode, now int64, count float64, reserve bool) (driver.Verdict, error) {
	if err := ctx.Err(); err != nil {
		return driver.Verdict{}, err
	}
	return driver.Verdict{}, b.err
}

// bound is a limit bound to the store: its name registered and hashed,
// its params ready.
type bound struct {
	s     *Store
	limit uint32
	salt  uint64
	p     driver.Params // Phase unset: set per key, for a missing record
	phase func(key string) int64
	// deferred marks the expiries of its writes: computed by the sweep
	// that first examines the record, not on every write.
	deferred int64
	// params numbers its params among those the store has bound (1 + their
	// place in Store.deferred), for the refusals it remembers: 0 when it
	// remembers none (a place from 65,535 on: more params bound at once).
	params uint64
}

// A refusal remembered. A key under attack is refused many times a
// millisecond, and a token bucket's refusal costs two divisions, one
// after the other (the refill, then the wait), a fixed window's one. So
// a record keeps the last refusal of a bound call of one token, and a
// call of one token with the same params in the same millisecond, on the
// record unwritten since, is given it without the transition.
// TransitionInto's answer depends on nothing else (the params, the
// record's state, the time, the count, and reserve, which is false), so
// it is the one the transition would give, bit for bit. The refusal's
// record time, which the memo does not keep, is the call's for a token
// bucket (refilled to then) and the record's for a fixed window (within
// its window; a refusal that starts a new window is not kept).
//
// memo holds, from the high bits, the call's time less the record's (16
// bits, ≥ 1), the params' number (16 bits, ≥ 1) and the refusal's
// RetryAfter (32 bits).

// recall returns the refusal r remembers for a call of one token at now
// by b, if any. The caller holds r's lock and has seen r.memo != 0.
func (b *bound) recall(r *record, now int64) (driver.Verdict, bool) {
	// The elapsed time matches only if its 16 bits are all of it (el>>16
	// is 0): el<<16 alone drops the rest, and a call 2^48 ms away would
	// match.
	if el, m := uint64(now-r.ts), r.memo; (m>>32^(el<<16|b.params))|el>>16 == 0 {
		return driver.Verdict{RetryAfter: int64(uint32(m)), Remaining: r.memoRem, TS: b.refusedAt(r, now)}, true
	}
	return driver.Verdict{}, false
}

// refusedAt is the record's time after a refusal remembered at now.
func (b *bound) refusedAt(r *record, now int64) int64 {
	if b.p.Kind == ratelimit.FixedWindow {
		return r.ts
	}
	return now
}

// remember keeps in r the refusal d of a call of one token at now by b,
// whose next state (the record refreshed) has time ts, when the memo can
// hold it. The caller holds r's lock.
func (b *bound) remember(r *record, now, ts int64, d *driver.Decision) {
	if el := uint64(now - r.ts); b.params != 0 && ts == b.refusedAt(r, now) && el-1 < 1<<16-1 && uint64(d.RetryAfter) < 1<<32 {
		r.memo, r.memoRem = el<<48|b.params<<32|uint64(d.RetryAfter), d.Remaining
	}
}

// Store implements driver.BoundLimit.
func (b *bound) Store() ratelimit.Store { return b.s }

// Decide implements driver.BoundLimit.
func (b *bound) Decide(ctx context.Context, key string, mode driver.Mode, now int64, count float64, reserve bool) (driver.Verdict, error) {
	if err := ctx.Err(); err != nil {
		return driver.Verdict{}, err
	}
	if mode != driver.ModeLimit && mode != driver.ModeCheck {
		return driver.Verdict{}, fmt.Errorf("memstore: Decide takes ModeLimit or ModeCheck, not mode %d: refunds go through Apply", mode)
	}
	// The bounds of driver.CheckOp, which the Limiter checked: for a
	// caller of Decide that did not, a count below MinCount would be
	// granted on an empty bucket again and again.
	if !(count == 0 || count >= ratelimit.MinCount && count <= ratelimit.MaxTokens) || now < -driver.MaxTime || now > driver.MaxTime {
		return driver.Verdict{}, badCall(key, now, count)
	}
	s := b.s
	s.anchor(now)
	h := s.hash(key, b.salt)
	st := s.stripeOf(h)
	write := mode == driver.ModeLimit && count > 0
	var d driver.Decision
	if r := st.lockRecord(h, b.limit, key); r != nil {
		if r.memo != 0 && count == 1 && !reserve {
			if v, ok := b.recall(r, now); ok {
				r.mu.Unlock()
				return v, nil
			}
		}
		next := ratelimit.TransitionInto(&d, &b.p, driver.State{Remaining: r.value, TS: r.ts}, true, now, count, reserve)
		switch {
		case write && d.OK:
			r.value, r.ts, r.expires, r.memo = next.Remaining, next.TS, b.deferred, 0
		case !d.OK && count == 1 && !reserve:
			b.remember(r, now, next.TS, &d)
		}
		r.mu.Unlock()
		if write && d.OK {
			st.wrote(s, now)
		}
		return driver.Verdict{OK: d.OK, RetryAfter: d.RetryAfter, Remaining: d.Remaining, TS: next.TS}, nil
	}
	return b.decideLocked(st, h, key, mode, now, count, reserve)
}

// badCall is the error, matching driver.ErrInvalidOp, of a call of
// Decide with a count or a time that no valid op carries.
func badCall(key string, now int64, count float64) error {
	return fmt.Errorf("memstore: Decide of key %q at %d with a count of %s: give a time within ±driver.MaxTime "+
		"and a count of 0 or from ratelimit.MinCount (%s) to ratelimit.MaxTokens (%s): %w",
		key, now, numtext.Format(count), numtext.Format(ratelimit.MinCount), numtext.Format(ratelimit.MaxTokens), driver.ErrInvalidOp)
}

// decideLocked is Decide under the stripe's mutex, for a record that may
// be missing.
func (b *bound) decideLocked(st *stripe, h uint64, key string, mode driver.Mode, now int64, count float64, reserve bool) (driver.Verdict, error) {
	s := b.s
	write := mode == driver.ModeLimit && count > 0
	var d driver.Decision
	st.mu.Lock()
	defer st.mu.Unlock()
	t := st.tab()
	i := 0
	if t != nil {
		var found bool
		if i, found = t.find(h, b.limit, key); found {
			r := &t.recs[i]
			r.mu.Lock()
			next := ratelimit.TransitionInto(&d, &b.p, driver.State{Remaining: r.value, TS: r.ts}, true, now, count, reserve)
			if write && d.OK {
				r.value, r.ts, r.expires, r.memo = next.Remaining, next.TS, b.deferred, 0
			}
			r.mu.Unlock()
			return driver.Verdict{OK: d.OK, RetryAfter: d.RetryAfter, Remaining: d.Remaining, TS: next.TS}, nil
		}
	}
	p := &b.p
	if b.p.Kind == ratelimit.FixedWindow {
		q := b.p
		if q.Phase = b.phase(key); q.Phase < 0 || q.Phase >= q.Period {
			return driver.Verdict{}, fmt.Errorf("memstore: Decide of key %q: the phase function gave %d, outside the period [0, %d): "+
				"give a phase within it, as Config.Phase does: %w", key, q.Phase, q.Period, driver.ErrInvalidOp)
		}
		p = &q
	}
	next := ratelimit.TransitionInto(&d, p, driver.State{}, false, now, count, reserve)
	if write && d.OK {
		st.insert(s, i, h, b.limit, key, next, b.deferred, now)
		st.stepped(s, now) // a write, as Apply's inserts are
	}
	return driver.Verdict{OK: d.OK, RetryAfter: d.RetryAfter, Remaining: d.Remaining, TS: next.TS}, nil
}

// Apply implements ratelimit.Store. An op that carries a settlement is
// decided under the store's settlements lock: at most once per ID. An out
// shorter than op's items, or an invalid op (driver.CheckOp), is refused
// with an error, before any lock is taken: the decision would panic while
// holding the records' locks.
func (s *Store) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil || s.clock == nil {
		return s.unmade("Apply")
	}
	if err := driver.CheckOut(op, out); err != nil {
		return fmt.Errorf("memstore: Apply: %w", err)
	}
	if op.Settle == nil {
		s.apply(op, out)
		return nil
	}
	s.markMu.Lock()
	defer s.markMu.Unlock()
	if m, ok := s.marks[op.Settle.ID]; ok {
		op.SettledBeforeBy(m.kind, m.settler, out)
		return nil
	}
	s.apply(op, out)
	if s.marks == nil {
		s.marks = make(map[[16]byte]mark)
	}
	s.marks[op.Settle.ID] = mark{kind: op.Settle.Kind, expires: op.Settle.Until, settler: op.Settle.Settler}
	s.marksMost = max(s.marksMost, len(s.marks))
	s.dropMarksAt(op.Now)
	s.pushExpiry(expiry{at: op.Settle.Until, id: op.Settle.ID})
	return nil
}

// dropMarksAt drops the marks expired for ExpiryGrace at the sweeps' time
// of a call at now (sweepTime), which is never later than now: the store's
// clock is read only when the earliest mark has expired at now. markMu is
// held.
func (s *Store) dropMarksAt(now int64) {
	if len(s.expiries) > 0 && s.expiries[0].at <= now-driver.ExpiryGrace {
		s.dropMarks(s.sweepTime(now))
	}
}

// dropMarks drops the marks expired for ExpiryGrace at now, and returns
// how many; markMu is held. Once the marks left are at most a quarter of
// the most held, they move to a map of their size, and their expiries to
// a heap of their size: a Go map never gives back the memory of the
// entries deleted from it. The copy costs at most a third of the deletes
// since the last.
func (s *Store) dropMarks(now int64) int {
	n := 0
	for len(s.expiries) > 0 && s.expiries[0].at <= now-driver.ExpiryGrace {
		delete(s.marks, s.popExpiry().id)
		n++
	}
	if s.marksMost > minMarksCopied && 4*len(s.marks) <= s.marksMost {
		var marks map[[16]byte]mark
		var expiries []expiry
		if len(s.marks) > 0 {
			expiries = append(make([]expiry, 0, len(s.expiries)), s.expiries...)
			marks = make(map[[16]byte]mark, len(s.marks))
			for id, m := range s.marks {
				marks[id] = m
			}
		}
		s.marks, s.expiries, s.marksMost = marks, expiries, len(marks)
	}
	return n
}

// minMarksCopied is the most marks held below which dropMarks keeps the
// map as it is: a small one costs little.
const minMarksCopied = 1024

// pushExpiry adds e to the heap of expiries; markMu is held. The heap is
// kept here rather than by container/heap, whose Push and Pop take and
// give an any: an expiry boxed, an allocation a settlement and a drop.
func (s *Store) pushExpiry(e expiry) {
	h := append(s.expiries, e)
	for i := len(h) - 1; i > 0; {
		up := (i - 1) / 2
		if h[up].at <= h[i].at {
			break
		}
		h[up], h[i] = h[i], h[up]
		i = up
	}
	s.expiries = h
}

// popExpiry removes the earliest expiry from the heap, which is not
// empty, and returns it; markMu is held.
func (s *Store) popExpiry() expiry {
	h := s.expiries
	top, last := h[0], len(h)-1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && h[l].at < h[least].at {
			least = l
		}
		if r < len(h) && h[r].at < h[least].at {
			least = r
		}
		if least == i {
			break
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
	s.expiries = h
	return top
}

// apply decides op, which carries no settlement, atomically.
func (s *Store) apply(op *driver.Op, out []driver.Decision) {
	var (
		idBuf    [4]driver.RecordID
		hashBuf  [4]uint64
		limitBuf [4]uint32
		ordBuf   [4]int
		heldBuf  [4]*record
		prevBuf  [4]driver.Record
		nextBuf  [4]driver.Update
		parBuf   [4]*driver.Params
	)
	ids := op.AppendRecordIDs(idBuf[:0])
	params := parBuf[:0]
	for i := range op.Items {
		for j := range op.Items[i].Shards {
			params = append(params, &op.Items[i].Shards[j].Params)
		}
	}
	hashes, limits, order := hashBuf[:0], limitBuf[:0], ordBuf[:0]
	var lastKey string
	var keyHash uint64
	for i, id := range ids {
		l := s.limitOf(id.Name, id.Shard, true)
		if i == 0 || id.Key != lastKey {
			lastKey, keyHash = id.Key, hashString(s.keySeed, id.Key)
		}
		h := keyHash ^ l.salt
		hashes, limits = append(hashes, h), append(limits, l.id)
		order = append(order, int(h>>(64-stripeBits)))
	}
	prev := append(prevBuf[:0], make([]driver.Record, len(ids))...)
	next := append(nextBuf[:0], make([]driver.Update, len(ids))...)
	held := append(heldBuf[:0], make([]*record, len(ids))...)
	if len(order) > 1 {
		slices.Sort(order)
		order = slices.Compact(order)
	}
	for _, i := range order {
		s.stripes[i].mu.Lock()
	}
	defer func() {
		for _, i := range order {
			s.stripes[i].mu.Unlock()
		}
	}()
	s.anchor(op.Now)
	// The records found are locked until written: the op is atomic.
	for i := range ids {
		if t := s.stripeOf(hashes[i]).tab(); t != nil {
			if k, found := t.find(hashes[i], limits[i], ids[i].Key); found {
				r := &t.recs[k]
				r.mu.Lock()
				held[i] = r
				prev[i] = driver.Record{State: driver.State{Remaining: r.value, TS: r.ts}, Found: true}
			}
		}
	}
	ratelimit.Evaluate(op, prev, out, next)
	for i, u := range next {
		if r := held[i]; r != nil {
			if u.Write {
				r.value, r.ts, r.expires, r.memo = u.State.Remaining, u.State.TS, ratelimit.FullAt(*params[i], u.State), 0
			}
			r.mu.Unlock()
		}
	}
	// Then the records added: the stripes' mutexes keep them unseen
	// until the op is done.
	for i, u := range next {
		if u.Write && held[i] == nil {
			st := s.stripeOf(hashes[i])
			k := 0
			if t := st.tab(); t != nil {
				k, _ = t.find(hashes[i], limits[i], ids[i].Key)
			}
			st.insert(s, k, hashes[i], limits[i], ids[i].Key, u.State, ratelimit.FullAt(*params[i], u.State), op.Now)
		}
	}
	for i, u := range next {
		if u.Write {
			s.stripeOf(hashes[i]).stepped(s, op.Now)
		}
	}
}

// Load implements ratelimit.Store. A record whose bucket is full again is
// reported as stored until it is dropped; the Limiter refreshes what Load
// returns, so either answer is the same.
func (s *Store) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil || s.clock == nil {
		return s.unmade("Load")
	}
	if err := driver.CheckRecords(ids, out); err != nil {
		return fmt.Errorf("memstore: Load: %w", err)
	}
	for i, id := range ids {
		out[i] = driver.Record{}
		l := s.limitOf(id.Name, id.Shard, false)
		if l == nil {
			continue // never written
		}
		h := s.hash(id.Key, l.salt)
		st := s.stripeOf(h)
		st.mu.Lock()
		if t := st.tab(); t != nil {
			if k, found := t.find(h, l.id, id.Key); found {
				r := &t.recs[k]
				r.mu.Lock()
				out[i] = driver.Record{State: driver.State{Remaining: r.value, TS: r.ts}, Found: true}
				r.mu.Unlock()
			}
		}
		st.mu.Unlock()
	}
	return nil
}

// Delete implements ratelimit.Store.
func (s *Store) Delete(ctx context.Context, ids []driver.RecordID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil || s.clock == nil {
		return s.unmade("Delete")
	}
	for _, id := range ids {
		l := s.limitOf(id.Name, id.Shard, false)
		if l == nil {
			continue
		}
		h := s.hash(id.Key, l.salt)
		st := s.stripeOf(h)
		st.mu.Lock()
		if t := st.tab(); t != nil {
			if k, found := t.find(h, l.id, id.Key); found {
				t.recs[k].mu.Lock()
				st.remove(t, k)
				st.shrink()
			}
		}
		st.mu.Unlock()
	}
	return nil
}

// DeleteExpired drops every record whose bucket has been full again for
// driver.ExpiryGrace (a minute) at now, taken within ±driver.MaxTime, and
// every settlement's mark expired for as long, shrinks the tables the
// records leave emptier, and returns how many records and marks it
// dropped. Calls already drop expired records a few at a time, and expired
// marks once a grace; call this to reclaim memory at once, e.g. after a
// burst of one-off keys.
//
// It implements driver.Expirer; the error is ctx's, when ctx ends before
// the sweep is done: it stops before the next of its 64 stripes, and
// returns how many it dropped so far.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if s == nil || s.clock == nil {
		return 0, s.unmade("DeleteExpired")
	}
	ms := driver.ClampMilli(now)
	s.markMu.Lock()
	n := s.dropMarks(ms)
	s.markMu.Unlock()
	for i := range s.stripes {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		n += s.stripes[i].deleteExpired(s, ms)
	}
	return n, nil
}

// expiredChunk is how many slots DeleteExpired examines in one hold of a
// stripe's mutex; expiredRestarts how many times it starts a stripe over
// before it holds the mutex to the end.
const (
	expiredChunk    = 1024
	expiredRestarts = 2
)

// deleteExpired drops the stripe's records expired at ms, for
// DeleteExpired, and returns how many. It examines expiredChunk slots per
// hold of mu, so that a call that adds a record to the stripe waits for a
// chunk, not for the whole table. Between two chunks an insert fills an
// empty slot and moves no record; a delete's shift or a resize moves
// records, behind the scan too, and changes the version or the table: the
// scan then starts the stripe over (examining again the records it kept),
// and after expiredRestarts times holds mu to the end. Every record held
// from the start to the end is examined, as when the scan held mu
// throughout.
func (st *stripe) deleteExpired(s *Store, ms int64) int {
	n, restarts := 0, 0
	st.mu.Lock()
	defer st.mu.Unlock()
	for k := 0; ; {
		t := st.tab()
		if t == nil {
			return n
		}
		end := len(t.recs)
		if restarts < expiredRestarts {
			end = min(end, k+expiredChunk)
		}
		for k < end {
			if t.meta[k].Load() == 0 {
				k++
				continue
			}
			r := &t.recs[k]
			r.mu.Lock()
			exp := r.expires
			if exp < deferredLimit {
				exp = s.expiry(r)
			}
			if exp <= ms-driver.ExpiryGrace {
				st.remove(t, k) // unlocks r; a later record may have moved into k
				n++
				continue
			}
			r.mu.Unlock()
			k++
		}
		if k >= len(t.recs) {
			break
		}
		v := st.version.Load()
		st.mu.Unlock()
		if s.chunked != nil {
			s.chunked(st)
		}
		st.mu.Lock()
		if st.version.Load() != v || st.tab() != t {
			k = 0
			restarts++
		}
	}
	st.shrink()
	return n
}

// Len returns how many records the store holds, expired ones included
// until they are dropped: 0 for one that New did not make.
func (s *Store) Len() int {
	if s == nil {
		return 0
	}
	n := 0
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		n += st.n
		st.mu.Unlock()
	}
	return n
}
