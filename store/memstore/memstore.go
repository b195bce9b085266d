// Package memstore is an in-memory ratelimit.Store for a single process.
//
// Records live in maps split into stripes, each under its own mutex, so
// that calls on different keys rarely contend; a call that touches several
// records locks their stripes in a fixed order. A record reads as missing
// once its bucket would be full again (ratelimit.FullAt), which is the same
// full bucket, and every write also probes a couple of records of a stripe
// and drops those full for longer than ratelimit.ExpiryGrace, so memory
// follows the keys active recently, not every key ever seen.
//
// Those drops follow the store's own clock (the real one by default, see
// WithClock) as well as the calls' times: a call's clock that jumps
// forward, then back, cannot make the store forget a drained record and
// hand out a full bucket for it.
package memstore

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
)

const (
	stripes = 64 // a power of two
	// probes is how many records a write examines for expiry.
	probes = 4
)

// Store is an in-memory ratelimit.Store, safe for concurrent use. The zero
// value is not usable: call New.
type Store struct {
	seed    maphash.Seed
	stripes [stripes]stripe
	sweeps  atomic.Uint32 // which stripe the next write sweeps

	clock  clock.Clock
	anchor sync.Once
	// The first call's time and the store's clock then: a write's sweep
	// judges records at the earlier of its call's time and the time that
	// has passed since on the store's clock.
	anchorNow  int64
	anchorReal time.Time
}

// Option configures a Store in New.
type Option func(*Store)

// WithClock sets the clock by which the store's own sweeps judge how much
// time has passed (default: the real clock). Tests that move a mock clock
// by hand and want records swept pass that clock.
func WithClock(c clock.Clock) Option { return func(s *Store) { s.clock = c } }

type stripe struct {
	mu   sync.Mutex
	recs map[ratelimit.RecordID]entry
	_    [40]byte // keep stripes on separate cache lines
}

type entry struct {
	state   ratelimit.State
	expires int64 // Unix ms from which the record reads as missing
}

var _ ratelimit.Store = (*Store)(nil)

// New returns an empty in-memory store.
func New(opts ...Option) *Store {
	s := &Store{seed: maphash.MakeSeed(), clock: clock.New()}
	for _, o := range opts {
		o(s)
	}
	for i := range s.stripes {
		s.stripes[i].recs = make(map[ratelimit.RecordID]entry)
	}
	return s
}

// sweepTime returns the time at which a sweep during a call at now may
// judge records: now, unless more of it has passed on the calls' clock
// than on the store's since the first call (the calls' clock jumped
// ahead, and may come back).
func (s *Store) sweepTime(now int64) int64 {
	s.anchor.Do(func() { s.anchorNow, s.anchorReal = now, s.clock.Now() })
	return min(now, s.anchorNow+s.clock.Since(s.anchorReal).Milliseconds())
}

func (s *Store) stripeOf(id ratelimit.RecordID) int {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(id.Name)
	h.WriteByte(0)
	h.WriteString(id.Key)
	return int((h.Sum64() + uint64(id.Shard)) & (stripes - 1))
}

// lock locks the stripes idx (each record's stripe) in ascending order,
// once each, and returns the stripes locked, for unlock.
func (s *Store) lock(idx, order []int) []int {
	order = append(order, idx...)
	if len(order) > 1 {
		slices.Sort(order)
		order = slices.Compact(order)
	}
	for _, i := range order {
		s.stripes[i].mu.Lock()
	}
	return order
}

func (s *Store) unlock(order []int) {
	for _, i := range order {
		s.stripes[i].mu.Unlock()
	}
}

// Apply implements ratelimit.Store.
func (s *Store) Apply(ctx context.Context, op *ratelimit.Op, out []ratelimit.Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var (
		idBuf   [4]ratelimit.RecordID
		idxBuf  [4]int
		ordBuf  [4]int
		prevBuf [4]ratelimit.Record
		nextBuf [4]ratelimit.Update
		parBuf  [4]ratelimit.Params
	)
	ids := op.AppendRecordIDs(idBuf[:0])
	params := parBuf[:0]
	for i := range op.Items {
		for _, sh := range op.Items[i].Shards {
			params = append(params, sh.Params)
		}
	}
	prev := append(prevBuf[:0], make([]ratelimit.Record, len(ids))...)
	next := append(nextBuf[:0], make([]ratelimit.Update, len(ids))...)
	idx := idxBuf[:0]
	for _, id := range ids {
		idx = append(idx, s.stripeOf(id))
	}
	order := s.lock(idx, ordBuf[:0])
	defer s.unlock(order)
	for i, id := range ids {
		prev[i] = s.stripes[idx[i]].get(id, op.Now)
	}
	ratelimit.Evaluate(op, prev, out, next)
	wrote := false
	for i, u := range next {
		if u.Write {
			s.stripes[idx[i]].recs[ids[i]] = entry{state: u.State, expires: ratelimit.FullAt(params[i], u.State)}
			wrote = true
		}
	}
	if wrote {
		s.sweep(s.sweepTime(op.Now), idx)
	}
	return nil
}

// sweep examines a few records of the next stripe in turn (map iteration
// starts at random) and drops those that have expired. locked holds the
// stripes the caller has locked; another stripe is swept only if its lock
// is free, so that a write never waits for a sweep.
func (s *Store) sweep(now int64, locked []int) {
	i := int(s.sweeps.Add(1) & (stripes - 1))
	st := &s.stripes[i]
	if slices.Contains(locked, i) {
		st.sweep(now)
		return
	}
	if st.mu.TryLock() {
		st.sweep(now)
		st.mu.Unlock()
	}
}

func (st *stripe) get(id ratelimit.RecordID, now int64) ratelimit.Record {
	e, ok := st.recs[id]
	if !ok || e.expires <= now {
		return ratelimit.Record{}
	}
	return ratelimit.Record{State: e.state, Found: true}
}

func (st *stripe) sweep(now int64) {
	n := 0
	for id, e := range st.recs {
		if deletable(e, now) {
			delete(st.recs, id)
		}
		if n++; n == probes {
			return
		}
	}
}

// Load implements ratelimit.Store. Records whose bucket is full again by
// the time of the last write are reported as missing only once swept; the
// Limiter refreshes what Load returns, so either answer is the same.
func (s *Store) Load(ctx context.Context, ids []ratelimit.RecordID, out []ratelimit.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, id := range ids {
		st := &s.stripes[s.stripeOf(id)]
		st.mu.Lock()
		e, ok := st.recs[id]
		st.mu.Unlock()
		out[i] = ratelimit.Record{State: e.state, Found: ok}
	}
	return nil
}

// Delete implements ratelimit.Store.
func (s *Store) Delete(ctx context.Context, ids []ratelimit.RecordID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, id := range ids {
		st := &s.stripes[s.stripeOf(id)]
		st.mu.Lock()
		delete(st.recs, id)
		st.mu.Unlock()
	}
	return nil
}

// deletable reports whether e may be deleted at now: full again for
// longer than ratelimit.ExpiryGrace.
func deletable(e entry, now int64) bool {
	return e.expires <= now-ratelimit.ExpiryGrace
}

// DeleteExpired drops every record whose bucket has been full again for
// ratelimit.ExpiryGrace (a minute) at now, and returns how many it
// dropped. Writes already drop expired records a few
// at a time; call this to reclaim memory at once, e.g. after a burst of
// one-off keys.
func (s *Store) DeleteExpired(now time.Time) int {
	ms := now.UnixMilli()
	n := 0
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		for id, e := range st.recs {
			if deletable(e, ms) {
				delete(st.recs, id)
				n++
			}
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
		n += len(st.recs)
		st.mu.Unlock()
	}
	return n
}
