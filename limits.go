package ratelimit

import (
	"maps"
	"slices"
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
}

// declared returns the limit declared as name, or nil.
func (l *Limiter) declared(name string) *limit { return l.limits.Load().byName[name] }

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
// deny cache (WithDenyCache) forgets what it knew of the limits changed or
// removed.
func (l *Limiter) SetLimits(limits Limits) error {
	l.limitsMu.Lock()
	defer l.limitsMu.Unlock()
	old := l.limits.Load()
	set, stale, err := l.compileSet(limits, old)
	if err != nil {
		return err
	}
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
	l.bind(lim)
	set := &limitSet{byName: make(map[string]*limit, len(old.byName)+1)}
	maps.Copy(set.byName, old.byName)
	set.byName[name] = lim
	l.limits.Store(set)
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
// the names of old's limits changed or removed. It validates every config,
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
		l.bind(lim)
	}
	var stale []string
	if old != nil {
		for name, prev := range old.byName {
			if set.byName[name] != prev {
				stale = append(stale, name)
			}
		}
	}
	return set, stale, nil
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

// forgetLimits drops what the deny cache knows of the limits names. Its
// entries would not refuse a call against an old config anyway (an entry
// is used only with the params it was learnt with); dropping them frees
// the room at once.
func (l *Limiter) forgetLimits(names []string) {
	if l.deny == nil {
		return
	}
	for _, name := range names {
		l.deny.forgetLimit(name)
	}
}
