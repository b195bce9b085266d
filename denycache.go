package ratelimit

import (
	"context"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ratelimit-go/ratelimit/driver"
)

// The deny cache (WithDenyCache) spares the store the calls of a key under
// attack. When the store refuses a call of an unsharded limit, the Limiter
// reads the record as stored and keeps it; later calls on that (name, key)
// run the transition locally on that record, exactly as the store would,
// and are refused without a round trip while it refuses them. The first
// call it would allow drops the entry and goes to the store. Calls of this
// process that the store allowed in between cannot exist (they would have
// dropped the entry), and other processes can only have spent more, so a
// local refusal is one the store would make — unless another process reset
// the key or cancelled a reservation, which only this process's own Reset
// and Cancel invalidate, or a store dropped the record as expired by a time
// the clock went back from (denyCache.latest).
//
// An entry answers only the calls of the compiled limit whose call learnt
// it, not of another with the same params: a limit changed by SetLimits
// or SetLimit (or removed, and declared again) is compiled afresh, and
// calls of the configs in force between may have changed the record
// without dropping the entry (a late call of the old config learns it
// while they are granted; calls given a config inline are not cached).
// SetLimits forgets the name's entries too, but only after it has
// published the new limits: between the two, such an entry would refuse
// calls of the new config that the store grants.

// denyStripes is the most stripes the cache is split into, each under its
// own lock; a cache of fewer keys has one stripe a key.
const denyStripes = 16

type denyKey struct{ name, key string }

type denyEntry struct {
	lim *limit // the limit whose call learnt it: it answers no other's
	p   driver.Params
	rec driver.Record
}

type denyCache struct {
	seed  maphash.Seed
	n     uint64 // stripes in use: parts[:n]
	parts [denyStripes]denyPart
	// latest is the latest time of a call seen (seen), in Unix ms on the
	// Limiter's clock. A store drops a record a grace after it is full
	// again (driver.ExpiryGrace), by its calls' time (memstore's sweep) or
	// by a clock of its own (Redis' expiry, a janitor). Once the clock
	// went back further than that behind a time it reached, the record an
	// entry holds may be gone from the store, which grants a full bucket
	// where the entry refuses: entries answer nothing until the clock
	// comes back within the grace.
	latest atomic.Int64
}

// denyPart is a stripe of the cache.
type denyPart struct {
	mu  sync.Mutex
	m   map[denyKey]denyEntry
	max int // entries it holds at most; the stripes' add up to the size
	// gen counts the forgets of the stripe. learn reads it before it
	// loads a record and keeps the record only if it has not moved: a
	// Reset or Cancel in between may have given back what the record
	// shows spent, and a change of limits let calls of another config
	// spend it otherwise (forgetLimit).
	gen atomic.Uint64
}

// newDenyCache returns a cache of at most size keys, size > 0.
func newDenyCache(size int) *denyCache {
	n := min(size, denyStripes)
	c := &denyCache{seed: maphash.MakeSeed(), n: uint64(n)}
	c.latest.Store(math.MinInt64)
	for i := range n {
		pt := &c.parts[i]
		pt.m = make(map[denyKey]denyEntry)
		pt.max = size / n
		if i < size%n {
			pt.max++
		}
	}
	return c
}

func (c *denyCache) part(k denyKey) *denyPart {
	return &c.parts[maphash.Comparable(c.seed, k)%c.n]
}

// seen notes a call at now, and reports whether the entries may answer
// it: now is within driver.ExpiryGrace of the latest time seen (latest).
// latest moves forward only, once a millisecond at most; two calls racing
// may set it back by the little between their readings.
func (c *denyCache) seen(now int64) bool {
	last := c.latest.Load()
	if now > last {
		c.latest.Store(now)
		return true
	}
	return last-now <= driver.ExpiryGrace
}

// refuse decides a call of lim locally, p its params for key: ok reports
// a local refusal, with its decision; otherwise the call must go to the
// store.
func (c *denyCache) refuse(lim *limit, key string, p driver.Params, now int64, count float64, reserve bool) (driver.Decision, bool) {
	// Past the grace, the store may have dropped the record: it decides,
	// and the entry goes, as when the call could succeed, since the store
	// may grant this call and others, spending what the entry shows left.
	back := !c.seen(now)
	k := denyKey{lim.name, key}
	pt := c.part(k)
	pt.mu.Lock()
	defer pt.mu.Unlock()
	e, ok := pt.m[k]
	if !ok {
		return driver.Decision{}, false
	}
	if back || e.lim != lim || e.p != p {
		delete(pt.m, k)
		return driver.Decision{}, false
	}
	s, d := transition(p, e.rec.State, e.rec.Found, now, count, reserve)
	d.Now, d.TS = now, s.TS
	if d.OK {
		delete(pt.m, k) // the store may grant it now
		return driver.Decision{}, false
	}
	return d, true
}

// learn reads the record of a call of lim the store just refused at now
// (p its params for key) and keeps it, unless this process forgot the key
// (Reset, Cancel) while it read: the record read may predate what was
// given back.
//
// The read is made with the refused call's ctx, though it serves the
// calls after it: that call waits for it, and its deadline bounds it. A
// read bound to no caller would keep a refused call past its deadline. A
// caller that gives up meanwhile fails only the read: nothing is kept,
// and the next call refused by the store learns in its place.
func (c *denyCache) learn(ctx context.Context, store Store, lim *limit, key string, p driver.Params, now int64) {
	if c.latest.Load()-now > driver.ExpiryGrace {
		return // refuse would drop the entry (seen): spare the read
	}
	k := denyKey{lim.name, key}
	pt := c.part(k)
	gen := pt.gen.Load()
	ids := [1]driver.RecordID{{Name: lim.name, Key: key}}
	var recs [1]driver.Record
	if store.Load(ctx, ids[:], recs[:]) != nil || !recs[0].Found {
		return // nothing to learn; the store is asked again next time
	}
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.gen.Load() != gen {
		return // forgotten meanwhile; the store is asked again next time
	}
	if _, ok := pt.m[k]; !ok && len(pt.m) >= pt.max {
		for victim := range pt.m {
			delete(pt.m, victim)
			break
		}
	}
	// A copy of the key, not the caller's string: a key cut from a larger
	// one (a header, a token's claim) would keep all of it alive while the
	// entry lives. Only here, after a round trip; and every time, since
	// storing to a present key replaces the key the map holds too.
	k.key = strings.Clone(key)
	pt.m[k] = denyEntry{lim: lim, p: p, rec: recs[0]}
}

// forget drops the entry of (name, key), and any learn of it under way.
// Its caller calls it once the store has taken what this process gave
// back (Reset, Cancel, a refund), so that a learn that read the record
// before cannot keep it.
func (c *denyCache) forget(name, key string) {
	k := denyKey{name, key}
	pt := c.part(k)
	pt.mu.Lock()
	pt.gen.Add(1)
	delete(pt.m, k)
	pt.mu.Unlock()
}

// forgetLimit drops every entry of the limit name, and every learn under
// way (of any limit: a learn does not say which it is of). SetLimits and
// SetLimit call it once the changed limit is published. A learn of a call
// decided under the old config keeps its record for the old limit, which
// no call of the new config uses (refuse); but calls of the old limit
// that started before the change may still be under way, and calls of
// the new config may be granted on the record after the learn read it: a
// looser config leaves it more tokens than the old one's refill of the
// record read, and the entry would refuse those late calls where the
// store grants them.
func (c *denyCache) forgetLimit(name string) {
	for i := range c.n {
		pt := &c.parts[i]
		pt.mu.Lock()
		pt.gen.Add(1)
		for k := range pt.m {
			if k.name == name {
				delete(pt.m, k)
			}
		}
		pt.mu.Unlock()
	}
}
