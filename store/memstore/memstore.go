// Package memstore is an in-memory ratelimit.Store for a single process.
//
// Records live in hash tables split into stripes, each under its own
// mutex, so that calls on different keys rarely contend; a call that
// touches several records locks their stripes in a fixed order. A record
// is found by one hash of its key (its limit's name is hashed once, when
// the Limiter binds the limit) and updated in place, under its stripe's
// lock for the transition alone. The store implements ratelimit.Binder:
// the Limiter decides a single limit's calls through it without building
// an Op, and allocates nothing per call. Each record takes a 48-byte slot
// of a table kept between 3/8 and 3/4 full, beside its key's bytes; the
// store also remembers each (limit name, shard) it has written, once.
//
// Memory follows the keys active recently, not every key ever seen. A
// record may be dropped once its bucket has been full again for
// ratelimit.ExpiryGrace: a stripe about to grow first drops those, every
// few writes a stripe examines a few more of its records, and a stripe
// whose table has emptied shrinks it. DeleteExpired drops them all at
// once and shrinks every stripe.
//
// Those drops follow the store's own clock (the real one by default, see
// WithClock) as well as the calls' times: a call's clock that jumps
// forward, then back, cannot make the store forget a drained record and
// hand out a full bucket for it.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
)

const (
	stripeBits = 6
	stripes    = 1 << stripeBits
	// minSlots is the smallest table a stripe holding records keeps.
	minSlots = 8
	// sweepEvery is how many writes of a stripe pass between two sweep
	// steps, each examining sweepSlots slots of its table.
	sweepEvery = 64
	sweepSlots = 16
	// insertSweep is how many slots of another stripe, taken in turn, a
	// write that adds a record examines.
	insertSweep = 8
)

// Store is an in-memory ratelimit.Store, safe for concurrent use. The zero
// value is not usable: call New.
type Store struct {
	keySeed  maphash.Seed
	nameSeed maphash.Seed
	stripes  [stripes]stripe

	// limits holds the (name, shard) pairs written, each once: a slot
	// names its record's by a number.
	limits   sync.Map // limitKey → *limitID
	limitsMu sync.Mutex
	nlimits  uint32

	// deferred holds the params of bound limits, each once: a write
	// through a bound limit leaves its record's expiry to the first sweep
	// that examines it, marking the slot with the params' place here.
	deferred   atomic.Pointer[[]*ratelimit.Params]
	deferredMu sync.Mutex

	clock    clock.Clock
	anchored atomic.Bool
	anchorMu sync.Mutex
	// The first call's time and the store's clock then: a sweep judges
	// records at the earlier of its call's time and the time that has
	// passed since on the store's clock.
	anchorNow  int64
	anchorReal time.Time
}

// Option configures a Store in New.
type Option func(*Store)

// WithClock sets the clock by which the store's own sweeps judge how much
// time has passed (default: the real clock). Tests that move a mock clock
// by hand and want records swept pass that clock.
func WithClock(c clock.Clock) Option { return func(s *Store) { s.clock = c } }

var (
	_ ratelimit.Store  = (*Store)(nil)
	_ ratelimit.Binder = (*Store)(nil)
)

// New returns an empty in-memory store.
func New(opts ...Option) *Store {
	s := &Store{keySeed: maphash.MakeSeed(), nameSeed: maphash.MakeSeed(), clock: clock.New()}
	for _, o := range opts {
		o(s)
	}
	return s
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
	return maphash.String(s.keySeed, key) ^ salt
}

func (s *Store) stripeOf(h uint64) *stripe { return &s.stripes[h>>(64-stripeBits)] }

// anchor records the first call's time and the store's clock then.
func (s *Store) anchor(now int64) {
	if !s.anchored.Load() {
		s.anchorSlow(now)
	}
}

func (s *Store) anchorSlow(now int64) {
	s.anchorMu.Lock()
	if !s.anchored.Load() {
		s.anchorNow, s.anchorReal = now, s.clock.Now()
		s.anchored.Store(true)
	}
	s.anchorMu.Unlock()
}

// sweepTime returns the time at which a sweep during a call at now may
// judge records: now, unless more of it has passed on the calls' clock
// than on the store's since the first call (the calls' clock jumped
// ahead, and may come back).
func (s *Store) sweepTime(now int64) int64 {
	s.anchor(now)
	return min(now, s.anchorNow+s.clock.Since(s.anchorReal).Milliseconds())
}

// stripe is one hash table: open addressing, linear probing, deletion by
// backward shift, so that no tombstones accumulate.
type stripe struct {
	mu    sync.Mutex
	slots []slot // a power of two long, or nil when empty
	n     int    // records held
	// writes counts writes since the last sweep step; cursor is the slot
	// the next step starts at.
	writes uint32
	cursor uint32
	// victim is the stripe the next insert examines a few slots of.
	victim uint32
	_      [64 - 8 - 24 - 8 - 8 - 4]byte // one stripe per cache line
}

// slot is one record, or empty (limit == 0). 48 bytes.
type slot struct {
	key     string
	value   float64
	ts      int64
	expires int64  // when the record is full again, by the params of its last write; or deferred (see deferred)
	hash    uint32 // low bits of the record's hash: its home slot
	limit   uint32 // the limitID.id of its (name, shard)
}

// find returns the slot of the record (limit, key) of hash h, and whether
// it holds it; if not, the empty slot where probing stopped (only
// meaningful when the table is not nil).
func (st *stripe) find(h uint64, limit uint32, key string) (int, bool) {
	if st.slots == nil {
		return 0, false
	}
	mask := uint32(len(st.slots) - 1)
	lo := uint32(h)
	for i := lo & mask; ; i = (i + 1) & mask {
		sl := &st.slots[i]
		if sl.limit == 0 {
			return int(i), false
		}
		if sl.hash == lo && sl.limit == limit && sl.key == key {
			return int(i), true
		}
	}
}

// insert writes a new record at the empty slot i returned by find, first
// making room if the table is full (dropping expired records, then
// growing), and then finding its slot again. Then, so that records added
// anywhere drop expired ones everywhere, it examines a few slots of
// another stripe, in turn, if its lock is free.
func (st *stripe) insert(s *Store, i int, h uint64, limit uint32, key string, state ratelimit.State, expires, now int64) {
	if st.slots == nil || 4*(st.n+1) > 3*len(st.slots) {
		st.makeRoom(s, now)
		i, _ = st.find(h, limit, key)
	}
	st.slots[i] = slot{key: key, value: state.Value, ts: state.TS, expires: expires, hash: uint32(h), limit: limit}
	st.n++

	st.victim = (st.victim + 1) % stripes
	switch v := &s.stripes[st.victim]; {
	case v == st:
		v.step(s, now, insertSweep)
	case v.mu.TryLock():
		v.step(s, now, insertSweep)
		v.mu.Unlock()
	}
}

// step examines the next count slots of the stripe from its cursor on,
// and shrinks its table if that emptied it.
func (st *stripe) step(s *Store, now int64, count int) {
	from := int(st.cursor)
	st.cursor += uint32(count)
	if st.sweep(s, now, from, count) > 0 {
		st.shrink()
	}
}

// makeRoom is called when an insert would fill the table past 3/4: it
// drops the records that may be dropped, and doubles the table unless
// that left it at most half full. Each call costs O(len(slots)) and comes
// at least len(slots)/4 inserts after the last, so inserts stay O(1).
func (st *stripe) makeRoom(s *Store, now int64) {
	if st.slots == nil {
		st.slots = make([]slot, minSlots)
		return
	}
	st.sweep(s, now, 0, len(st.slots))
	if 2*(st.n+1) > len(st.slots) {
		st.resize(2 * len(st.slots))
	}
}

// resize moves the records to a table of size slots (a power of two
// holding them with room), or drops the table when it is empty.
func (st *stripe) resize(size int) {
	old := st.slots
	st.cursor = 0
	if st.n == 0 {
		st.slots = nil
		return
	}
	st.slots = make([]slot, size)
	mask := uint32(size - 1)
	for k := range old {
		sl := &old[k]
		if sl.limit == 0 {
			continue
		}
		i := sl.hash & mask
		for st.slots[i].limit != 0 {
			i = (i + 1) & mask
		}
		st.slots[i] = *sl
	}
}

// shrink gives back a table at most 1/8 full: the new one is at most half
// full, or nil when no record is left.
func (st *stripe) shrink() {
	if st.slots == nil || 8*st.n > len(st.slots) {
		return
	}
	size := minSlots
	if st.n > 0 {
		size = max(minSlots, 1<<bits.Len(uint(2*st.n-1)))
	}
	if size < len(st.slots) || st.n == 0 {
		st.resize(size)
	}
}

// remove empties slot i, shifting back the records after it that probed
// past it, so that every record stays reachable from its home slot.
func (st *stripe) remove(i int) {
	mask := uint32(len(st.slots) - 1)
	hole := uint32(i)
	for j := (hole + 1) & mask; st.slots[j].limit != 0; j = (j + 1) & mask {
		home := st.slots[j].hash & mask
		// The record at j may fill the hole if its home is not in
		// (hole, j], cyclically.
		if (j-home)&mask >= (j-hole)&mask {
			st.slots[hole] = st.slots[j]
			hole = j
		}
	}
	st.slots[hole] = slot{}
	st.n--
}

// sweep examines count slots from slot from on (cyclically) and drops the
// records that may be dropped at a call at now: full again for
// ratelimit.ExpiryGrace by the store's sweep time. It returns how many it
// dropped. The store's clock is read only if some record is a candidate.
func (st *stripe) sweep(s *Store, now int64, from, count int) int {
	if st.slots == nil {
		return 0
	}
	mask := len(st.slots) - 1
	count = min(count, len(st.slots))
	judged := int64(math.MinInt64)
	dropped := 0
	for i, seen := from&mask, 0; seen < count && st.n > 0; {
		sl := &st.slots[i]
		// A record is full again no sooner than its TS: one written
		// within the grace is kept without computing when.
		if sl.limit != 0 && sl.ts <= now-ratelimit.ExpiryGrace && sl.expires <= now-ratelimit.ExpiryGrace &&
			(sl.expires >= deferredLimit || s.expiry(sl) <= now-ratelimit.ExpiryGrace) {
			if judged == math.MinInt64 {
				judged = s.sweepTime(now)
			}
			if sl.expires <= judged-ratelimit.ExpiryGrace {
				st.remove(i) // a later record may have moved into i: examine it
				dropped++
				continue
			}
		}
		i = (i + 1) & mask
		seen++
	}
	return dropped
}

// wrote counts a write of the stripe, and every sweepEvery writes examines
// the next sweepSlots slots, shrinking the table if that emptied it.
func (st *stripe) wrote(s *Store, now int64) {
	st.writes++
	if st.writes < sweepEvery {
		return
	}
	st.writes = 0
	st.step(s, now, sweepSlots)
}

// put writes state as the record (limit, key) of hash h.
func (st *stripe) put(s *Store, h uint64, limit uint32, key string, state ratelimit.State, expires, now int64) {
	i, found := st.find(h, limit, key)
	if found {
		sl := &st.slots[i]
		sl.value, sl.ts, sl.expires = state.Value, state.TS, expires
	} else {
		st.insert(s, i, h, limit, key, state, expires, now)
	}
	st.wrote(s, now)
}

func (st *stripe) get(h uint64, limit uint32, key string) ratelimit.Record {
	i, found := st.find(h, limit, key)
	if !found {
		return ratelimit.Record{}
	}
	sl := &st.slots[i]
	return ratelimit.Record{State: ratelimit.State{Value: sl.value, TS: sl.ts}, Found: true}
}

// Bind implements ratelimit.Binder.
func (s *Store) Bind(name string, p ratelimit.Params, phase func(key string) int64) ratelimit.BoundLimit {
	p.Phase = 0
	l := s.limitOf(name, 0, true)
	return &bound{s: s, limit: l.id, salt: l.salt, p: p, phase: phase, deferred: s.deferParams(p)}
}

// Expiries left to the sweeps are marked by numbers far below any time
// (times are within ±2^52 ms): deferredBase plus the place of the params
// that decide them in Store.deferred.
const (
	deferredBase  = math.MinInt64
	deferredLimit = math.MinInt64 + 1<<32
)

// deferParams returns the mark of the expiries of records written with p.
func (s *Store) deferParams(p ratelimit.Params) int64 {
	s.deferredMu.Lock()
	defer s.deferredMu.Unlock()
	var list []*ratelimit.Params
	if l := s.deferred.Load(); l != nil {
		list = *l
	}
	for i, q := range list {
		if *q == p {
			return deferredBase + int64(i)
		}
	}
	list = append(list[:len(list):len(list)], &p)
	s.deferred.Store(&list)
	return deferredBase + int64(len(list)-1)
}

// expiry returns the time from which the record in sl, whose expiry is
// deferred (marked), is a full bucket again: it is then kept in the slot.
func (s *Store) expiry(sl *slot) int64 {
	p := (*s.deferred.Load())[sl.expires-deferredBase]
	sl.expires = ratelimit.FullAt(*p, ratelimit.State{Value: sl.value, TS: sl.ts})
	return sl.expires
}

// bound is a limit bound to the store: its name registered and hashed,
// its params ready.
type bound struct {
	s     *Store
	limit uint32
	salt  uint64
	p     ratelimit.Params // Phase unset: set per key, for a missing record
	phase func(key string) int64
	// deferred marks the expiries of its writes: computed by the sweep
	// that first examines the record, not on every write.
	deferred int64
}

// Store implements ratelimit.BoundLimit.
func (b *bound) Store() ratelimit.Store { return b.s }

// Decide implements ratelimit.BoundLimit.
func (b *bound) Decide(ctx context.Context, key string, mode ratelimit.Mode, now int64, count float64, reserve bool) (ratelimit.Verdict, error) {
	if err := ctx.Err(); err != nil {
		return ratelimit.Verdict{}, err
	}
	if mode != ratelimit.ModeLimit && mode != ratelimit.ModeCheck {
		return ratelimit.Verdict{}, fmt.Errorf("memstore: Decide takes ModeLimit or ModeCheck, not mode %d: refunds go through Apply", mode)
	}
	s := b.s
	s.anchor(now)
	h := s.hash(key, b.salt)
	st := s.stripeOf(h)
	st.mu.Lock()
	i, found := st.find(h, b.limit, key)
	var prev ratelimit.State
	p := &b.p
	if found {
		sl := &st.slots[i]
		prev = ratelimit.State{Value: sl.value, TS: sl.ts}
	} else if b.p.Kind == ratelimit.FixedWindow {
		q := b.p
		q.Phase = b.phase(key)
		p = &q
	}
	var d ratelimit.Decision
	next := ratelimit.TransitionInto(&d, p, prev, found, now, count, reserve)
	if d.OK && count > 0 && mode == ratelimit.ModeLimit {
		expires := b.deferred
		if found {
			sl := &st.slots[i]
			sl.value, sl.ts, sl.expires = next.Value, next.TS, expires
		} else {
			st.insert(s, i, h, b.limit, key, next, expires, now)
		}
		st.wrote(s, now)
	}
	st.mu.Unlock()
	return ratelimit.Verdict{OK: d.OK, RetryAfter: d.RetryAfter, Remaining: d.Remaining, TS: next.TS}, nil
}

// Apply implements ratelimit.Store.
func (s *Store) Apply(ctx context.Context, op *ratelimit.Op, out []ratelimit.Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var (
		idBuf    [4]ratelimit.RecordID
		hashBuf  [4]uint64
		limitBuf [4]uint32
		ordBuf   [4]int
		prevBuf  [4]ratelimit.Record
		nextBuf  [4]ratelimit.Update
		parBuf   [4]*ratelimit.Params
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
			lastKey, keyHash = id.Key, maphash.String(s.keySeed, id.Key)
		}
		h := keyHash ^ l.salt
		hashes, limits = append(hashes, h), append(limits, l.id)
		order = append(order, int(h>>(64-stripeBits)))
	}
	prev := append(prevBuf[:0], make([]ratelimit.Record, len(ids))...)
	next := append(nextBuf[:0], make([]ratelimit.Update, len(ids))...)
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
	for i := range ids {
		prev[i] = s.stripeOf(hashes[i]).get(hashes[i], limits[i], ids[i].Key)
	}
	ratelimit.Evaluate(op, prev, out, next)
	for i, u := range next {
		if u.Write {
			s.stripeOf(hashes[i]).put(s, hashes[i], limits[i], ids[i].Key, u.State,
				ratelimit.FullAt(*params[i], u.State), op.Now)
		}
	}
	return nil
}

// Load implements ratelimit.Store. A record whose bucket is full again is
// reported as stored until it is dropped; the Limiter refreshes what Load
// returns, so either answer is the same.
func (s *Store) Load(ctx context.Context, ids []ratelimit.RecordID, out []ratelimit.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, id := range ids {
		out[i] = ratelimit.Record{}
		l := s.limitOf(id.Name, id.Shard, false)
		if l == nil {
			continue // never written
		}
		h := s.hash(id.Key, l.salt)
		st := s.stripeOf(h)
		st.mu.Lock()
		out[i] = st.get(h, l.id, id.Key)
		st.mu.Unlock()
	}
	return nil
}

// Delete implements ratelimit.Store.
func (s *Store) Delete(ctx context.Context, ids []ratelimit.RecordID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, id := range ids {
		l := s.limitOf(id.Name, id.Shard, false)
		if l == nil {
			continue
		}
		h := s.hash(id.Key, l.salt)
		st := s.stripeOf(h)
		st.mu.Lock()
		if i, found := st.find(h, l.id, id.Key); found {
			st.remove(i)
			st.shrink()
		}
		st.mu.Unlock()
	}
	return nil
}

// DeleteExpired drops every record whose bucket has been full again for
// ratelimit.ExpiryGrace (a minute) at now, shrinks the tables they leave
// emptier, and returns how many it dropped. Writes already drop expired
// records a few at a time; call this to reclaim memory at once, e.g. after
// a burst of one-off keys.
func (s *Store) DeleteExpired(now time.Time) int {
	ms := now.UnixMilli()
	n := 0
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		if st.slots != nil {
			for k := 0; k < len(st.slots); {
				sl := &st.slots[k]
				if sl.limit != 0 && sl.expires <= ms-ratelimit.ExpiryGrace &&
					(sl.expires >= deferredLimit || s.expiry(sl) <= ms-ratelimit.ExpiryGrace) {
					st.remove(k) // a later record may have moved into k
					n++
					continue
				}
				k++
			}
			st.shrink()
		}
		st.mu.Unlock()
	}
	return n
}

// Len returns how many records the store holds, expired ones included
// until they are dropped.
func (s *Store) Len() int {
	n := 0
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		n += st.n
		st.mu.Unlock()
	}
	return n
}
