package ratelimit

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
)

// Limiter decides calls against named limits, keeping their state in a
// Store. It is safe for concurrent use; build it with New.
type Limiter struct {
	store  Store
	limits map[string]*limit
	clock  clock.Clock
	seed   uint64
	picker picker
}

// Option configures a Limiter in New.
type Option func(*Limiter)

// WithClock sets the clock the Limiter reads the time from. Production
// uses the real clock (the default); tests pass clock.NewMock() and move
// time by hand.
func WithClock(c clock.Clock) Option { return func(l *Limiter) { l.clock = c } }

// WithPhaseSeed varies the derived per-key phases of fixed windows without
// Start. Every process sharing a store must use the same seed.
func WithPhaseSeed(seed uint64) Option { return func(l *Limiter) { l.seed = seed } }

// WithRand sets the source of randomness that chooses the two shards of a
// sharded limit, so that tests can make the choice deterministic. The
// source is used under a lock. The default is the runtime's fast,
// goroutine-safe generator.
func WithRand(src rand.Source) Option { return func(l *Limiter) { l.picker.src = src } }

// New returns a Limiter that keeps state in store and knows the given
// limits. Every config is validated: an invalid one is reported as a
// *ConfigError naming the limit and the field.
func New(store Store, limits Limits, opts ...Option) (*Limiter, error) {
	if store == nil {
		return nil, fmt.Errorf("ratelimit: New needs a Store: pass memstore.New() or another store")
	}
	l := &Limiter{store: store, limits: make(map[string]*limit, len(limits)), clock: clock.New()}
	for _, o := range opts {
		o(l)
	}
	for name, c := range limits {
		lim, err := compile(name, c)
		if err != nil {
			return nil, err
		}
		l.limits[name] = lim
	}
	return l, nil
}

// limit is a validated config, ready for calls.
type limit struct {
	name     string
	cfg      Config
	base     Params // one shard's share, phase unset
	shards   int
	start    int64 // Start in Unix ms; used when hasStart
	hasStart bool
	maxPlain float64 // largest count a plain call may ask
	maxDebt  float64 // largest count a reserving call may ask; +Inf when unbounded
}

func compile(name string, c Config) (*limit, error) {
	if err := c.validate(name); err != nil {
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
	lim.maxPlain = reach * lim.base.Capacity
	lim.maxDebt = math.Inf(1)
	if c.MaxReserved > 0 {
		lim.maxDebt = reach * (lim.base.Capacity + lim.base.MaxReserved)
	}
	return lim, nil
}

// params returns the params of one shard of the limit for key.
func (lim *limit) params(seed uint64, key string, shard int) Params {
	p := lim.base
	if p.Kind == FixedWindow {
		if lim.hasStart {
			p.Phase = floorMod(lim.start, p.Period)
		} else {
			p.Phase = phaseHash(seed, lim.name, key, shard, p.Period)
		}
	}
	return p
}

func (lim *limit) checkCount(count float64, reserve bool) error {
	if !(count >= 0) || math.IsInf(count, 1) {
		return &CountError{Name: lim.name, Count: count, Problem: "is not a finite number ≥ 0"}
	}
	if reserve {
		if count > lim.maxDebt {
			return &CountError{Name: lim.name, Count: count, Max: lim.maxDebt,
				Problem: fmt.Sprintf("exceeds %v, Capacity plus MaxReserved%s: the limit can never grant it; raise MaxReserved or split the call",
					lim.maxDebt, lim.shardNote())}
		}
		return nil
	}
	if count > lim.maxPlain {
		hint := "raise Capacity, split the call, or ask with Reserve()"
		if lim.shards > 1 {
			hint = lim.shardHint(count)
		}
		return &CountError{Name: lim.name, Count: count, Max: lim.maxPlain,
			Problem: fmt.Sprintf("exceeds %v, the most the limit can grant at once%s: %s", lim.maxPlain, lim.shardNote(), hint)}
	}
	return nil
}

func (lim *limit) shardNote() string {
	if lim.shards > 1 {
		return fmt.Sprintf(" (two of its %d shards together)", lim.shards)
	}
	return ""
}

// shardHint suggests a shard count or capacity that would admit count.
func (lim *limit) shardHint(count float64) string {
	c := lim.cfg.capacity()
	if n := int(math.Floor(2 * c / count)); n >= 2 {
		return fmt.Sprintf("use at most %d shards, or raise Capacity to %v", n, count*float64(lim.shards)/2)
	}
	return fmt.Sprintf("use one shard, or raise Capacity to %v", count*float64(lim.shards)/2)
}

// ids appends the record ids of every shard of (lim, key).
func (lim *limit) ids(key string, dst []RecordID) []RecordID {
	for i := 0; i < lim.shards; i++ {
		dst = append(dst, RecordID{Name: lim.name, Key: key, Shard: i})
	}
	return dst
}

// CallOption modifies one call of Limit, Check or Reserve.
type CallOption func(*call)

type call struct {
	count   float64
	reserve bool
	cfg     *Config
}

// Count sets how many tokens the call asks for (default 1). It must be a
// finite number ≥ 0; 0 asks whether any capacity is left.
func Count(n float64) CallOption { return func(c *call) { c.count = n } }

// Reserve lets the call take tokens it cannot have yet: it is OK with a
// RetryAfter that says when the tokens will have been granted, up to the
// limit's MaxReserved.
func Reserve() CallOption { return func(c *call) { c.reserve = true } }

// WithConfig gives the config of a limit not declared in New. Using it with
// a declared name is an error unless the configs are equal.
func WithConfig(cfg Config) CallOption { return func(c *call) { c.cfg = &cfg } }

// Result is the answer to Limit or Check.
type Result struct {
	// OK is true when the call is allowed, or reserved (then RetryAfter > 0).
	OK bool
	// RetryAfter is, for a reserved call, when its tokens will have been
	// granted, and for a denied call, how long until the same call would
	// succeed; 0 when allowed outright. Whole milliseconds, rounded up.
	RetryAfter time.Duration
	// Remaining is the tokens left after an OK call (negative: owed through
	// reservations), or the tokens available now after a denied one. For a
	// sharded limit it counts the two shards the call evaluated.
	Remaining float64
	// Name, Key and Count repeat the call.
	Name  string
	Key   string
	Count float64
}

// Reserved reports whether the call was OK only by reserving tokens that
// will be granted after RetryAfter.
func (r Result) Reserved() bool { return r.OK && r.RetryAfter > 0 }

// Err returns nil when r is OK, and otherwise a *LimitError that matches
// ErrLimited, for callers who prefer errors.
func (r Result) Err() error {
	if r.OK {
		return nil
	}
	return &LimitError{Name: r.Name, Key: r.Key, Count: r.Count, RetryAfter: r.RetryAfter}
}

// Limit asks for tokens (one, or Count(n)) of the named limit for key, and
// spends them when the call is allowed or reserved. A denied call changes
// nothing. The error is non-nil only for bad input (ErrUnknownLimit,
// ErrInvalidConfig, ErrInvalidCount), a done context, or a store failure;
// being rate limited is Result.OK false (or Result.Err).
func (l *Limiter) Limit(ctx context.Context, name, key string, opts ...CallOption) (Result, error) {
	return l.decide(ctx, ModeLimit, name, key, opts)
}

// Check returns the answer Limit would give now, without spending anything.
func (l *Limiter) Check(ctx context.Context, name, key string, opts ...CallOption) (Result, error) {
	return l.decide(ctx, ModeCheck, name, key, opts)
}

func (l *Limiter) decide(ctx context.Context, mode Mode, name, key string, opts []CallOption) (Result, error) {
	c := call{count: 1}
	for _, o := range opts {
		o(&c)
	}
	res, _, err := l.do(ctx, mode, name, key, c)
	return res, err
}

// charge records which shards an OK call charged, and how much, so that a
// reservation can hand the tokens back.
type charge struct {
	shards [2]Shard
	amount [2]float64
	n      int
}

// do decides one call of one limit.
func (l *Limiter) do(ctx context.Context, mode Mode, name, key string, c call) (Result, charge, error) {
	var ch charge
	lim, err := l.resolve(name, c.cfg)
	if err != nil {
		return Result{}, ch, err
	}
	if err := lim.checkCount(c.count, c.reserve); err != nil {
		return Result{}, ch, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, ch, fmt.Errorf("ratelimit: limit %q: %w", name, err)
	}
	b := opBufs.Get().(*opBuf)
	defer b.release()
	b.items[0] = Item{Name: name, Key: key, Count: c.count, Shards: l.pickShards(lim, key, b.shards[:0])}
	b.op = Op{Mode: mode, Now: l.clock.Now().UnixMilli(), Reserve: c.reserve, Items: b.items[:]}
	if err := l.store.Apply(ctx, &b.op, b.out[:]); err != nil {
		return Result{}, ch, fmt.Errorf("ratelimit: limit %q: store: %w", name, err)
	}
	d := b.out[0]
	if d.OK {
		ch.n = copy(ch.shards[:], b.items[0].Shards)
		ch.amount = d.Charged
	}
	return Result{
		OK:         d.OK,
		RetryAfter: time.Duration(d.RetryAfter) * time.Millisecond,
		Remaining:  d.Remaining,
		Name:       name,
		Key:        key,
		Count:      c.count,
	}, ch, nil
}

// opBuf holds the op of one single-limit call, reused across calls so
// that the hot path does not allocate it.
type opBuf struct {
	op     Op
	items  [1]Item
	shards [2]Shard
	out    [1]Decision
}

var opBufs = sync.Pool{New: func() any { return new(opBuf) }}

func (b *opBuf) release() {
	*b = opBuf{} // drop references to names and keys
	opBufs.Put(b)
}

// pickShards appends the shard(s) a call on (lim, key) evaluates.
func (l *Limiter) pickShards(lim *limit, key string, dst []Shard) []Shard {
	if lim.shards == 1 {
		return append(dst, Shard{Index: 0, Params: lim.params(l.seed, key, 0)})
	}
	a, b := l.picker.pick(lim.shards)
	return append(dst,
		Shard{Index: a, Params: lim.params(l.seed, key, a)},
		Shard{Index: b, Params: lim.params(l.seed, key, b)})
}

// resolve finds the limit called name: declared in New, or given inline.
func (l *Limiter) resolve(name string, inline *Config) (*limit, error) {
	lim, ok := l.limits[name]
	switch {
	case ok && inline != nil && !sameConfig(lim.cfg, *inline):
		return nil, fmt.Errorf("ratelimit: limit %q is declared in New with another config: drop WithConfig or use another name: %w", name, ErrInvalidConfig)
	case ok:
		return lim, nil
	case inline != nil:
		return compile(name, *inline)
	}
	return nil, fmt.Errorf("ratelimit: limit %q is not declared: declare it in New or pass WithConfig: %w", name, ErrUnknownLimit)
}

func sameConfig(a, b Config) bool {
	return a.Kind == b.Kind && a.Rate == b.Rate && a.Period == b.Period && a.Capacity == b.Capacity &&
		a.MaxReserved == b.MaxReserved && a.Shards == b.Shards && a.Start.Equal(b.Start)
}

// Reset forgets the state of (name, key) in every shard: the next call
// finds a full bucket. The phase of a fixed window stays.
func (l *Limiter) Reset(ctx context.Context, name, key string, opts ...CallOption) error {
	lim, err := l.resolveOpts(name, opts)
	if err != nil {
		return err
	}
	if err := l.store.Delete(ctx, lim.ids(key, nil)); err != nil {
		return fmt.Errorf("ratelimit: reset limit %q: store: %w", name, err)
	}
	return nil
}

func (l *Limiter) resolveOpts(name string, opts []CallOption) (*limit, error) {
	var c call
	for _, o := range opts {
		o(&c)
	}
	return l.resolve(name, c.cfg)
}

// Status describes the state of (name, key) now, as Value reports it.
type Status struct {
	// Tokens is the tokens available now, summed over all shards; negative
	// while reservations are owed.
	Tokens float64
	// Capacity is the most tokens the limit holds (all shards together).
	Capacity float64
	// WindowStart is the start of the current window, and NextGrant the
	// time of the next grant, of a fixed window (for a sharded limit, the
	// shard whose next grant comes first). Both are zero for a token bucket.
	WindowStart time.Time
	NextGrant   time.Time
	// Shards holds each record's part; one element when unsharded.
	Shards []ShardStatus
}

// ShardStatus is one record's part of a Status.
type ShardStatus struct {
	Index       int
	Tokens      float64
	WindowStart time.Time // fixed window only
	NextGrant   time.Time // fixed window only
	// Stored reports whether the store holds a record; a missing one is a
	// full bucket.
	Stored bool
}

// Value reports the tokens available now for (name, key), each shard
// refreshed to now and a missing shard counting as full. It writes nothing.
func (l *Limiter) Value(ctx context.Context, name, key string, opts ...CallOption) (Status, error) {
	lim, err := l.resolveOpts(name, opts)
	if err != nil {
		return Status{}, err
	}
	ids := lim.ids(key, nil)
	recs := make([]Record, len(ids))
	if err := l.store.Load(ctx, ids, recs); err != nil {
		return Status{}, fmt.Errorf("ratelimit: value of limit %q: store: %w", name, err)
	}
	now := l.clock.Now().UnixMilli()
	if ts, ok := l.store.(TimeSource); ok {
		if now, err = ts.Now(ctx); err != nil {
			return Status{}, fmt.Errorf("ratelimit: value of limit %q: store time: %w", name, err)
		}
	}
	st := Status{Capacity: lim.cfg.capacity(), Shards: make([]ShardStatus, len(ids))}
	for i, rec := range recs {
		p := lim.params(l.seed, key, i)
		s := load(p, rec, now)
		sh := ShardStatus{Index: i, Tokens: s.Value, Stored: rec.Found}
		if p.Kind == FixedWindow {
			sh.WindowStart = time.UnixMilli(s.TS)
			sh.NextGrant = time.UnixMilli(s.TS + p.Period)
			if st.NextGrant.IsZero() || sh.NextGrant.Before(st.NextGrant) {
				st.WindowStart, st.NextGrant = sh.WindowStart, sh.NextGrant
			}
		}
		st.Tokens += s.Value
		st.Shards[i] = sh
	}
	return st, nil
}
