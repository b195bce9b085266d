package ratelimit

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
)

// A Limiter's limits may change while it serves calls: a new limits file
// read on SIGHUP, a control plane pushing configs. The declared limits are
// one immutable limitSet behind an atomic pointer; SetLimits and SetLimit
// build a new set and publish it whole, so that a call reads its limits
// with one atomic load and sees either the old set or the new one, never a
// mix, and LimitAll decides all its names from the same set.
//
// The state records stay where they are: a record is named by the limit's
// name and the key, not by its config. A changed limit applies its new
// config to the records as they are, at the next call of each key
// (docs/model.md, "Changing limits").

// limitSet is the declared limits of a Limiter at one moment. It is never
// modified once published.
type limitSet struct {
	byName map[string]*limit
	// few holds the limits too, in the order of their names, when there
	// are at most fewLimits of them: a call finds its limit by comparing
	// names, which costs less than hashing its name for the map.
	few []*limit
}

// fewLimits is the most limits a set keeps in few.
const fewLimits = 8

// publish fills set.few from set.byName; the set is then ready to be
// published.
func (set *limitSet) publish() *limitSet {
	if len(set.byName) <= fewLimits {
		set.few = make([]*limit, 0, len(set.byName))
		for _, name := range slices.Sorted(maps.Keys(set.byName)) {
			set.few = append(set.few, set.byName[name])
		}
	}
	return set
}

// lookup returns the limit of the set called name, or nil.
func (set *limitSet) lookup(name string) *limit {
	if len(set.byName) > fewLimits {
		return set.byName[name]
	}
	for _, lim := range set.few {
		// The same bytes first: a name passed as a constant is usually
		// the very string declared (the linker keeps one copy of each
		// string constant), which needs no comparison of bytes.
		if len(lim.name) == len(name) && (unsafe.StringData(lim.name) == unsafe.StringData(name) || lim.name == name) {
			return lim
		}
	}
	return nil
}

// declared returns the limit declared as name, or nil.
func (l *Limiter) declared(name string) *limit { return l.limits.Load().lookup(name) }

// SetLimits replaces the Limiter's limits by limits, as if they had been
// given to New, while it serves calls: limits it does not name are
// removed (their calls then fail with ErrUnknownLimit unless they pass
// WithConfig), limits it adds or changes apply from the next call. Every
// config is validated first, as New does: on an error (a *ConfigError
// naming the limit and the field) nothing changes. Limits whose config is
// unchanged keep their compiled form, and nothing of theirs is reset.
//
// SetLimits is safe to call concurrently with calls and with itself.
// Calls that started before it returns may still be decided by the old
// configs; every call that starts after it has returned sees the new ones.
// The state of each key stays in the store and meets the new config at
// the key's next call: a lowered Capacity cuts the tokens held down to it,
// a raised one lets them grow; see docs/model.md for a changed Kind,
// Period, Start or Shards, where Reset or a new name may be wiser. The
// deny cache (WithDenyCache) forgets what it knew of the limits changed,
// added or removed.
func (l *Limiter) SetLimits(limits Limits) error {
	l.limitsMu.Lock()
	defer l.limitsMu.Unlock()
	old := l.limits.Load()
	set, stale, err := l.compileSet(limits, old)
	if err != nil {
		return err
	}
	l.noteShards(set.byName)
	l.limits.Store(set)
	l.forgetLimits(stale)
	return nil
}

// SetLimit adds the limit name with config c, or replaces its config, as
// SetLimits would with the Limiter's limits and this one changed; other
// limits are left as they are. An invalid c is reported as a *ConfigError
// and changes nothing.
func (l *Limiter) SetLimit(name string, c Config) error {
	l.limitsMu.Lock()
	defer l.limitsMu.Unlock()
	old := l.limits.Load()
	if prev, ok := old.byName[name]; ok && sameConfig(prev.cfg, c) {
		return nil
	}
	lim, err := compile(name, c)
	if err != nil {
		return err
	}
	lim.declared = true
	l.bind(lim)
	set := &limitSet{byName: make(map[string]*limit, len(old.byName)+1)}
	maps.Copy(set.byName, old.byName)
	set.byName[name] = lim
	l.noteShards(map[string]*limit{name: lim})
	l.limits.Store(set.publish())
	l.forgetLimits([]string{name})
	return nil
}

// Limits returns a copy of the Limiter's declared limits: those given to
// New, as SetLimits and SetLimit have changed them since.
func (l *Limiter) Limits() Limits {
	set := l.limits.Load()
	out := make(Limits, len(set.byName))
	for name, lim := range set.byName {
		out[name] = lim.cfg
	}
	return out
}

// Config returns the config of the limit declared as name (in New,
// SetLimits or SetLimit), and whether there is one.
func (l *Limiter) Config(name string) (Config, bool) {
	lim := l.declared(name)
	if lim == nil {
		return Config{}, false
	}
	return lim.cfg, true
}

// compileSet validates and compiles limits, taking from old (which may be
// nil) the limits whose config is unchanged, and returns the new set and
// the names of the limits changed, added or removed. It validates every config,
// in the order of the names so that the error reported is always the
// same, before it binds any.
func (l *Limiter) compileSet(limits Limits, old *limitSet) (*limitSet, []string, error) {
	names := slices.Sorted(maps.Keys(limits))
	set := &limitSet{byName: make(map[string]*limit, len(limits))}
	var fresh []*limit
	for _, name := range names {
		c := limits[name]
		if old != nil {
			if prev, ok := old.byName[name]; ok && sameConfig(prev.cfg, c) {
				set.byName[name] = prev
				continue
			}
		}
		lim, err := compile(name, c)
		if err != nil {
			return nil, nil, err
		}
		set.byName[name] = lim
		fresh = append(fresh, lim)
	}
	for _, lim := range fresh {
		lim.declared = true
		l.bind(lim)
	}
	// Stale: every name compiled afresh (changed, or added: calls with
	// configs given inline may have used it before), and every name
	// removed.
	stale := make([]string, 0, len(fresh))
	for _, lim := range fresh {
		stale = append(stale, lim.name)
	}
	if old != nil {
		for name := range old.byName {
			if _, ok := set.byName[name]; !ok {
				stale = append(stale, name)
			}
		}
	}
	return set.publish(), stale, nil
}

// bind gives lim the store's fast path, when the store has one that the
// Limiter may use and lim is unsharded.
func (l *Limiter) bind(lim *limit) {
	if l.binder == nil || lim.shards != 1 {
		return
	}
	if b := l.binder.Bind(lim.name, lim.base, lim.phaseFunc(l.seed)); b != nil && b.Store() == l.store {
		lim.bound = b
	}
}

// forgetLimits drops what the deny cache knows of the limits names, and
// the learns under way. An entry answers only calls of the compiled limit
// whose call learnt it, so an entry of an old config refuses no call of
// the new one, even between the publication of the new limits and this
// forget; but a learn of the old config that waited for the store across
// the change, and across a change back to the old config, would keep a
// record read before calls of the other config changed it
// (denyCache.forgetLimit). Dropping the entries frees their room at once.
func (l *Limiter) forgetLimits(names []string) {
	if l.deny == nil {
		return
	}
	for _, name := range names {
		l.deny.forgetLimit(name)
	}
}

// limit is a validated config, ready for calls.
type limit struct {
	name     string
	cfg      Config
	base     driver.Params // one shard's share, phase unset
	shards   int
	start    int64 // Start in Unix ms; used when hasStart
	hasStart bool
	maxPlain float64 // largest count a plain call may ask
	maxDebt  float64 // largest count a reserving call may ask
	// msPerToken is Period/Rate of one shard, for resetOne.
	msPerToken float64
	// bound decides the single calls of a declared, unsharded limit when
	// the store is a Binder; nil otherwise.
	bound driver.BoundLimit
	// declared is whether the limit was declared (New, SetLimits,
	// SetLimit), not given inline (WithConfig).
	declared bool
}

func compile(name string, c Config) (*limit, error) {
	if err := c.validate(name, true); err != nil {
		return nil, err
	}
	lim := &limit{name: name, cfg: c, base: c.params(), shards: c.shards()}
	if !c.Start.IsZero() {
		lim.start, lim.hasStart = c.Start.UnixMilli(), true
	}
	reach := 1.0 // records one call may draw on
	if lim.shards > 1 {
		reach = 2
	}
	lim.maxPlain = min(reach*lim.base.Capacity, MaxTokens)
	lim.maxDebt = min(reach*(lim.base.Capacity+lim.base.MaxReserved), MaxTokens)
	lim.msPerToken = float64(lim.base.Period) / lim.base.Rate
	return lim, nil
}

// phaseFunc returns the phase of the limit's records (shard 0) by key, as
// params sets it, for Binder.Bind.
func (lim *limit) phaseFunc(seed uint64) func(key string) int64 {
	if lim.base.Kind != driver.FixedWindow {
		return func(string) int64 { return 0 }
	}
	if lim.hasStart {
		phase := floorMod(lim.start, lim.base.Period)
		return func(string) int64 { return phase }
	}
	return func(key string) int64 { return phaseHash(seed, lim.name, key, 0, lim.base.Period) }
}

// params returns the params of one shard of the limit for key.
func (lim *limit) params(seed uint64, key string, shard int) driver.Params {
	p := lim.base
	if p.Kind == driver.FixedWindow {
		if lim.hasStart {
			p.Phase = floorMod(lim.start, p.Period)
		} else {
			p.Phase = phaseHash(seed, lim.name, key, shard, p.Period)
		}
	}
	return p
}

func (lim *limit) checkCount(count float64, reserve bool) error {
	// Every count in [MinCount, maxPlain] is valid, reserving or not
	// (maxDebt ≥ maxPlain, and both are finite): the common case, inlined.
	if count >= MinCount && count <= lim.maxPlain {
		return nil
	}
	return lim.countError(count, reserve)
}

// countError is checkCount for a count outside [MinCount, maxPlain].
func (lim *limit) countError(count float64, reserve bool) error {
	switch {
	case count == 0:
		return nil
	case !(count >= 0) || math.IsInf(count, 1):
		return &CountError{Name: lim.name, Count: count, Problem: countFault(count) + ": a count is a number from 0 to " + numtext.Format(MaxTokens)}
	case count < MinCount:
		return &CountError{Name: lim.name, Count: count,
			Problem: fmt.Sprintf("is below %s, the least count above 0 a call may ask for (MinCount), which a decision could not tell from the noise of its arithmetic: count in a smaller unit (ask 1 where you asked 0.001, with Rate and Capacity a thousand times larger)", numtext.Format(MinCount))}
	case count > MaxTokens:
		// No config grants it: raising Capacity or MaxReserved, or fewer
		// shards, would not do.
		most := lim.maxPlain
		if reserve {
			most = lim.maxDebt
		}
		return &CountError{Name: lim.name, Count: count, Max: most,
			Problem: fmt.Sprintf("exceeds %s, the most tokens one call may ask for: split the call", numtext.Format(MaxTokens))}
	}
	if reserve {
		if count > lim.maxDebt {
			return &CountError{Name: lim.name, Count: count, Max: lim.maxDebt,
				Problem: fmt.Sprintf("exceeds %s, Capacity plus MaxReserved%s: the limit can never grant it; raise MaxReserved or split the call",
					numtext.Format(lim.maxDebt), lim.shardNote())}
		}
		return nil
	}
	if count > lim.maxPlain {
		// WithReserve only where it would pass: a count above Capacity
		// plus MaxReserved is refused that way too.
		hint := "raise Capacity, or split the call"
		if count <= lim.maxDebt {
			hint = "raise Capacity, split the call, or ask with WithReserve()"
		}
		if lim.shards > 1 {
			hint = lim.shardHint(count)
		}
		return &CountError{Name: lim.name, Count: count, Max: lim.maxPlain,
			Problem: fmt.Sprintf("exceeds %s, the most the limit can grant at once%s: %s", numtext.Format(lim.maxPlain), lim.shardNote(), hint)}
	}
	return nil
}

// countFault says what makes count, a count no call may ask for, other
// than a number ≥ 0: NaN, negative (-Inf too, which is negative before it
// is infinite) or +Inf; "" for a number ≥ 0, which is a count.
func countFault(count float64) string {
	switch {
	case math.IsNaN(count):
		return "is not a number"
	case count < 0:
		return "is negative"
	case math.IsInf(count, 1):
		return "is infinite"
	}
	return ""
}

func (lim *limit) shardNote() string {
	if lim.shards > 1 {
		return fmt.Sprintf(" (two of its %d shards together)", lim.shards)
	}
	return ""
}

// shardHint suggests what would admit count, a plain call's count above
// what two shards hold together: fewer shards, a larger Capacity, a
// reservation, or a split call. Never one shard: it holds Capacity, no
// more than two shards of any count hold together, and a count above
// that share of every shard count needs a larger Capacity.
func (lim *limit) shardHint(count float64) string {
	c := lim.cfg.capacity()
	var hints []string
	if n := math.Floor(2 * c / count); n >= 2 {
		hints = append(hints, fmt.Sprintf("use at most %d shards", int(n)))
	}
	if need := count * float64(lim.shards) / 2; need <= MaxTokens {
		hints = append(hints, fmt.Sprintf("raise Capacity to %s", numtext.Format(need)))
	} else if count > c {
		// No Capacity within MaxTokens admits it over this many shards:
		// two shards hold Capacity together, as one does.
		hints = append(hints, fmt.Sprintf("use 2 shards with Capacity %s", numtext.Format(count)))
	}
	// Worded as the unsharded advice is, the reservation last, which the
	// command line drops or rewrites (cmd/ratelimit).
	if count > lim.maxDebt {
		return strings.Join(hints, ", ") + ", or split the call"
	}
	return strings.Join(hints, ", ") + ", split the call, or ask with WithReserve()"
}

// ids appends the record ids of every shard of (lim, key).
func (lim *limit) ids(key string, dst []driver.RecordID) []driver.RecordID {
	for i := 0; i < lim.shards; i++ {
		dst = append(dst, driver.RecordID{Name: lim.name, Key: key, Shard: i})
	}
	return dst
}

// resolve finds the limit called name: declared (in New, SetLimits or
// SetLimit), or given inline.
func (set *limitSet) resolve(name string, inline *Config) (*limit, error) {
	lim := set.lookup(name)
	ok := lim != nil
	switch {
	case ok && inline != nil && !sameConfig(lim.cfg, *inline):
		return nil, fmt.Errorf("ratelimit: limit %s is declared with another config: drop WithConfig or use another name: %w", written(name), ErrInvalidConfig)
	case ok:
		return lim, nil
	case inline != nil:
		return compile(name, *inline)
	}
	return nil, fmt.Errorf("ratelimit: limit %s is not declared: declare it in New or SetLimits, or pass WithConfig: %w", written(name), ErrUnknownLimit)
}

// sameConfig reports whether a and b configure the same limit: every
// field equal, Start as an instant. It compares the structs whole, so that
// a field added to Config takes part without a change here.
func sameConfig(a, b Config) bool {
	if !a.Start.Equal(b.Start) {
		return false
	}
	a.Start, b.Start = time.Time{}, time.Time{}
	return a == b
}

func (l *Limiter) resolveOpts(name string, opts []CallOption) (*limit, error) {
	return l.limits.Load().resolve(name, newCall(opts).cfg)
}
