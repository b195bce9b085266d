package ratelimit

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"

	"github.com/benbjohnson/clock"
)

// Limiter decides calls against named limits, keeping their state in a
// Store. It is safe for concurrent use; build it with New. Its limits may
// be changed while it serves calls (SetLimits, SetLimit).
type Limiter struct {
	store Store
	// limits is the set of declared limits, replaced whole by SetLimits
	// and SetLimit under limitsMu, so that a call reads it with one atomic
	// load and sees either the old set or the new one.
	limits   atomic.Pointer[limitSet]
	limitsMu sync.Mutex
	binder   driver.Binder // the store's fast path; nil if it has none or may not be used
	keys     *keyHasher    // nil: keys reach the store as given (WithKeyHash)
	optErr   error         // an option's bad argument, reported by New
	clock    clock.Clock
	wall     bool // clock is the real one: read time.Now without the interface
	seed     uint64
	picker   picker
	breaker  breaker
	deny     *denyCache
	observer Observer
	logger   *slog.Logger
	// Tokens (settle.go): how long past its job a token may be settled,
	// and the key that signs them (none: unsigned).
	settleWindow time.Duration
	tokenKey     []byte
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

// WithLogger sets a logger for store failures and for the breaker opening
// and closing. Keys are not logged.
func WithLogger(logger *slog.Logger) Option { return func(l *Limiter) { l.logger = logger } }

// WithRand sets the source of randomness that chooses the two shards of a
// sharded limit, so that tests can make the choice deterministic. The
// source is used under a lock. The default is the runtime's fast,
// goroutine-safe generator.
func WithRand(src rand.Source) Option { return func(l *Limiter) { l.picker.src = src } }

// New returns a Limiter that keeps state in store and knows the given
// limits. Every config is validated: an invalid one is reported as a
// *ConfigError naming the limit and the field. A bad option argument is
// reported as an error matching ErrInvalidOption.
func New(store Store, limits Limits, opts ...Option) (*Limiter, error) {
	if store == nil {
		return nil, fmt.Errorf("ratelimit: New needs a Store: pass memstore.New() or another store")
	}
	wall := clock.New()
	l := &Limiter{store: store, clock: wall,
		breaker:      breaker{threshold: DefaultBreakerFailures, cooldown: DefaultBreakerCooldown},
		settleWindow: DefaultSettleWindow}
	for _, o := range opts {
		o(l)
	}
	if l.optErr != nil {
		return nil, l.optErr
	}
	l.wall = l.clock == wall
	l.binder, _ = store.(driver.Binder)
	if ownClock(store) != nil {
		l.deny = nil   // its clock is the store's, which cannot be read locally
		l.binder = nil // a Verdict does not carry the store's time
	}
	set, _, err := l.compileSet(limits, nil)
	if err != nil {
		return nil, err
	}
	l.limits.Store(set)
	return l, nil
}

// now reads the Limiter's clock.
func (l *Limiter) now() time.Time {
	if l.wall {
		return time.Now()
	}
	return l.clock.Now()
}

// nowMillis reads the Limiter's clock in Unix milliseconds: for the real
// clock, its wall reading alone, where the platform reads that faster
// than time.Now.
func (l *Limiter) nowMillis() int64 {
	if l.wall {
		return wallMillis()
	}
	return l.clock.Now().UnixMilli()
}

// timeAt returns start, the time a call read in full, or, when it read
// only the milliseconds now, their time.
func timeAt(start time.Time, now int64) time.Time {
	if start.IsZero() {
		return time.UnixMilli(now)
	}
	return start
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
	if !(count >= 0) || math.IsInf(count, 1) {
		return &CountError{Name: lim.name, Count: count, Problem: "is not a finite number ≥ 0"}
	}
	if reserve {
		switch {
		case count > lim.maxDebt && lim.maxDebt == MaxTokens:
			return &CountError{Name: lim.name, Count: count, Max: lim.maxDebt,
				Problem: fmt.Sprintf("exceeds %v, the most tokens one call may ask for: split the call", MaxTokens)}
		case count > lim.maxDebt:
			return &CountError{Name: lim.name, Count: count, Max: lim.maxDebt,
				Problem: fmt.Sprintf("exceeds %v, Capacity plus MaxReserved%s: the limit can never grant it; raise MaxReserved or split the call",
					lim.maxDebt, lim.shardNote())}
		}
		return nil
	}
	if count > lim.maxPlain {
		hint := "raise Capacity, split the call, or ask with WithReserve()"
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
func (lim *limit) ids(key string, dst []driver.RecordID) []driver.RecordID {
	for i := 0; i < lim.shards; i++ {
		dst = append(dst, driver.RecordID{Name: lim.name, Key: key, Shard: i})
	}
	return dst
}

// CallOption modifies one call of Limit, Check or Reserve.
// It is a value, so that options cost no allocation.
type CallOption struct {
	set   callField
	count float64
	cfg   *Config
}

type callField uint8

const (
	setCount callField = iota + 1
	setReserve
	setConfig
	setReceipt
)

type call struct {
	count   float64
	reserve bool
	receipt bool
	cfg     *Config
}

// Count sets how many tokens the call asks for (default 1). It must be a
// finite number ≥ 0; 0 asks whether any capacity is left.
func Count(n float64) CallOption { return CallOption{set: setCount, count: n} }

// WithReserve lets the call take tokens it cannot have yet: it is OK with a
// RetryAfter that says when the tokens will have been granted, up to the
// limit's MaxReserved.
func WithReserve() CallOption { return CallOption{set: setReserve} }

// WithConfig gives the config of a limit not declared (in New, SetLimits or
// SetLimit). Using it with a declared name is an error unless the configs
// are equal.
func WithConfig(cfg Config) CallOption { return CallOption{set: setConfig, cfg: &cfg} }

// newCall returns the call that opts describe.
func newCall(opts []CallOption) call {
	c := call{count: 1}
	for _, o := range opts {
		switch o.set {
		case setCount:
			c.count = o.count
		case setReserve:
			c.reserve = true
		case setConfig:
			c.cfg = o.cfg
		case setReceipt:
			c.receipt = true
		}
	}
	return c
}

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
	// ResetAfter is how long until the limit next replenishes: for a fixed
	// window, until its next window starts (for a sharded one, the window
	// of the first shard evaluated); for a token bucket, until it is full
	// again. It feeds the "t" of the IETF RateLimit header (package
	// httplimit). Whole milliseconds, rounded up.
	ResetAfter time.Duration
	// Name, Key and Count repeat the call. For LimitAll, Name is the limit
	// that decided the answer: the one with the longest wait.
	Name  string
	Key   string
	Count float64
	// Degraded is true when the store could not decide and the limit's
	// failure policy did (Config.FailOpen); the call's error says why.
	Degraded bool
	// Local is true when the deny cache refused the call without asking
	// the store (WithDenyCache).
	Local bool
	// All holds, for LimitAll, each limit's own answer in the order named.
	All []Result
	// Token is, for an OK call made WithReceipt() that the store decided,
	// the receipt of its charge: settle it by its outcome (Settle, Use,
	// Refund) from any process. Nil otherwise.
	//
	// It also makes a Result 112 bytes, a multiple of 16: Go copies a
	// returned Result by 16-byte moves, and at 104 bytes the last move
	// overlaps the one before it, so that the next copy (callers make
	// two) waits for both to be stored.
	Token *Token
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
//
// Limit and Check build their Result where they return it, from what
// decide leaves in registers: a Result built elsewhere is copied through
// memory on its way back, which costs more than deciding the call.
func (l *Limiter) Limit(ctx context.Context, name, key string, opts ...CallOption) (Result, error) {
	c := newCall(opts)
	if lim := l.declared(name); lim != nil && lim.bound != nil && c.cfg == nil && !c.receipt {
		var res Result
		v, now, plain, err := l.doBound(ctx, driver.ModeLimit, lim, key, c, &res, nil)
		if plain {
			return Result{
				OK:         v.OK,
				RetryAfter: time.Duration(v.RetryAfter) * time.Millisecond,
				Remaining:  v.Remaining,
				ResetAfter: lim.resetOne(v.Remaining, now, v.TS),
				Name:       lim.name,
				Key:        key,
				Count:      c.count,
			}, nil
		}
		return res, err
	}
	return l.decide(ctx, driver.ModeLimit, name, key, c)
}

// Check returns the answer Limit would give now, without spending anything.
func (l *Limiter) Check(ctx context.Context, name, key string, opts ...CallOption) (Result, error) {
	c := newCall(opts)
	if lim := l.declared(name); lim != nil && lim.bound != nil && c.cfg == nil {
		var res Result
		v, now, plain, err := l.doBound(ctx, driver.ModeCheck, lim, key, c, &res, nil)
		if plain {
			return Result{
				OK:         v.OK,
				RetryAfter: time.Duration(v.RetryAfter) * time.Millisecond,
				Remaining:  v.Remaining,
				ResetAfter: lim.resetOne(v.Remaining, now, v.TS),
				Name:       lim.name,
				Key:        key,
				Count:      c.count,
			}, nil
		}
		return res, err
	}
	return l.decide(ctx, driver.ModeCheck, name, key, c)
}

// decide decides a call of Limit or Check through Apply.
func (l *Limiter) decide(ctx context.Context, mode driver.Mode, name, key string, c call) (Result, error) {
	names := [1]string{name}
	res, _, err := l.do(ctx, mode, names[:], key, c)
	return res, err
}

// LimitAll decides several named limits for one key all or nothing: either
// every limit grants the count (or reserves it, with Reserve) and all are
// charged, or none is charged and the Result is refused with the longest
// wait and the name of the limit that imposed it. Stacking windows this
// way (say 2,000 per hour and 33 per minute) smooths the bursts a single
// fixed window allows. Result.All holds each limit's own answer. WithConfig
// is not accepted: every name must be declared (New, SetLimits).
func (l *Limiter) LimitAll(ctx context.Context, key string, names []string, opts ...CallOption) (Result, error) {
	c := newCall(opts)
	switch {
	case len(names) == 0:
		return Result{}, fmt.Errorf("ratelimit: LimitAll needs at least one limit name: %w", ErrUnknownLimit)
	case c.cfg != nil:
		return Result{}, fmt.Errorf("ratelimit: LimitAll takes declared limits only: drop WithConfig: %w", ErrInvalidConfig)
	}
	for i, n := range names {
		if slices.Contains(names[:i], n) {
			return Result{}, fmt.Errorf("ratelimit: LimitAll names limit %q twice: name it once: %w", n, ErrInvalidConfig)
		}
	}
	res, _, err := l.do(ctx, driver.ModeLimit, names, key, c)
	return res, err
}

// charge records which shards an OK call charged, and how much, so that a
// reservation can hand the tokens back.
type charge struct {
	lim    *limit
	key    string // the key as the store knows it (WithKeyHash)
	shards [2]int // shard indexes
	amount [2]float64
	n      int
	at     int64     // when the store judged the call (Decision.Now)
	start  time.Time // when the Limiter read its clock for the call
}

// doBound decides one call of a declared, unsharded limit through its
// BoundLimit: what do does for such a call, without an Op. It fills *ch
// when ch is not nil (Reserve). When the store decided the call and no
// observer is to be told, plain is true and the caller makes the Result
// of the verdict v, judged at now, by boundResult (so that it is built
// where it is returned, not copied there); otherwise doBound fills *res.
//
// The commonest call (no deny cache, observer or Reservation, the breaker
// closed, the store answering) takes the few steps it needs here; any
// other goes to doBoundFull, which does the same steps and the others.
func (l *Limiter) doBound(ctx context.Context, mode driver.Mode, lim *limit, key string, c call, res *Result, ch *charge) (v driver.Verdict, now int64, plain bool, err error) {
	if ch != nil || l.deny != nil || l.observer != nil || !l.breaker.closed() {
		return l.doBoundFull(ctx, mode, lim, key, c, res, ch)
	}
	if err := lim.checkCount(c.count, c.reserve); err != nil {
		return v, 0, false, err
	}
	if err := ctx.Err(); err != nil {
		return v, 0, false, limitErr(lim.name, err)
	}
	now = l.nowMillis()
	if err := checkTime(now); err != nil {
		return v, 0, false, limitErr(lim.name, err)
	}
	skey := l.storeKey(key)
	if v, err = lim.bound.Decide(ctx, skey, mode, now, c.count, c.reserve); err != nil {
		return l.boundFailed(ctx, mode, lim, key, c, res, time.Time{}, now, false, err)
	}
	if l.breaker.answered(now) && l.logger != nil {
		l.logger.Info("ratelimit: store answers again; the breaker is closed")
	}
	return v, now, true, nil
}

// limitErr wraps err with the limit's name.
func limitErr(name string, err error) error { return fmt.Errorf("ratelimit: limit %q: %w", name, err) }

// boundFailed answers a bound call whose store failed with err, as do
// does: the caller's own error if it gave up, else the failure policy's.
func (l *Limiter) boundFailed(ctx context.Context, mode driver.Mode, lim *limit, key string, c call, res *Result, start time.Time, now int64, probe bool, err error) (driver.Verdict, int64, bool, error) {
	if l.breaker.callerGaveUp(ctx, timeAt(start, now), l.now()) {
		l.breaker.abandon(probe)
		return driver.Verdict{}, now, false, callerError(ctx, lim.name, err)
	}
	l.storeFailed(lim.name, err)
	lims := [1]*limit{lim}
	r, _, err := l.degraded(ctx, mode, lims[:], key, c, timeAt(start, now), &StoreError{Name: lim.name, Err: err})
	*res = r
	return driver.Verdict{}, now, false, err
}

// doBoundFull is doBound with every step.
func (l *Limiter) doBoundFull(ctx context.Context, mode driver.Mode, lim *limit, key string, c call, res *Result, ch *charge) (v driver.Verdict, now int64, plain bool, err error) {
	if err := lim.checkCount(c.count, c.reserve); err != nil {
		return v, 0, false, err
	}
	if err := ctx.Err(); err != nil {
		return v, 0, false, fmt.Errorf("ratelimit: limit %q: %w", lim.name, err)
	}
	// The time in full only where it is needed: a Reservation's keeps the
	// monotonic reading (for Delay), an observer's latency the fraction of
	// a millisecond. Otherwise the milliseconds alone, and timeAt.
	var start time.Time
	if ch != nil || l.observer != nil {
		start = l.now()
		if ch != nil {
			ch.start = start
		}
		now = start.UnixMilli()
	} else {
		now = l.nowMillis()
	}
	if err := checkTime(now); err != nil {
		return v, 0, false, fmt.Errorf("ratelimit: limit %q: %w", lim.name, err)
	}
	skey := l.storeKey(key)
	if l.deny != nil {
		p := lim.params(l.seed, skey, 0)
		if d, ok := l.deny.refuse(lim.name, skey, p, now, c.count, c.reserve); ok {
			*res = l.result(lim.name, key, c, d)
			res.ResetAfter = resetAfter(p, 1, d)
			res.Local = true
			l.observe(ctx, mode, *res, timeAt(start, now), nil)
			return v, now, false, nil
		}
	}
	var probe bool
	if !l.breaker.closed() {
		if start.IsZero() {
			start = l.now() // for the wait until the breaker's probe
		}
		var ok bool
		var until time.Time
		if ok, probe, until = l.breaker.allow(start); !ok {
			lims := [1]*limit{lim}
			r, _, err := l.degraded(ctx, mode, lims[:], key, c, start, &StoreError{Name: lim.name, Until: until})
			*res = r
			return v, now, false, err
		}
	}
	v, err = lim.bound.Decide(ctx, skey, mode, now, c.count, c.reserve)
	if err != nil {
		return l.boundFailed(ctx, mode, lim, key, c, res, start, now, probe, err)
	}
	if l.breaker.answered(now) && l.logger != nil {
		l.logger.Info("ratelimit: store answers again; the breaker is closed")
	}
	if v.OK {
		if ch != nil {
			ch.lim, ch.key, ch.n, ch.amount[0], ch.at = lim, skey, 1, c.count, now
		}
	} else if l.deny != nil {
		l.deny.learn(ctx, l.store, lim.name, skey, lim.params(l.seed, skey, 0))
	}
	if l.observer != nil {
		*res = boundResult(lim, key, c, v, now)
		l.observe(ctx, mode, *res, start, nil)
		return v, now, false, nil
	}
	return v, now, true, nil
}

// boundResult is the Result of a call of lim that the store decided as v,
// judged at now.
func boundResult(lim *limit, key string, c call, v driver.Verdict, now int64) Result {
	return Result{
		OK:         v.OK,
		RetryAfter: time.Duration(v.RetryAfter) * time.Millisecond,
		Remaining:  v.Remaining,
		ResetAfter: lim.resetOne(v.Remaining, now, v.TS),
		Name:       lim.name,
		Key:        key,
		Count:      c.count,
	}
}

// do decides one call of one or more limits.
func (l *Limiter) do(ctx context.Context, mode driver.Mode, names []string, key string, c call) (Result, charge, error) {
	start := l.now()
	ch := charge{start: start}
	var one [1]*limit
	lims := one[:]
	if len(names) > 1 {
		lims = make([]*limit, len(names))
	}
	set := l.limits.Load() // one set for every name of the call
	for i, name := range names {
		lim, err := set.resolve(name, c.cfg)
		if err != nil {
			return Result{}, ch, err
		}
		if err := lim.checkCount(c.count, c.reserve); err != nil {
			return Result{}, ch, err
		}
		lims[i] = lim
	}
	if err := ctx.Err(); err != nil {
		return Result{}, ch, fmt.Errorf("ratelimit: limit %q: %w", names[0], err)
	}
	now := start.UnixMilli()
	if err := checkTime(now); err != nil {
		return Result{}, ch, fmt.Errorf("ratelimit: limit %q: %w", names[0], err)
	}
	skey := l.storeKey(key)
	single := len(lims) == 1 && lims[0].shards == 1
	if single && l.deny != nil {
		p := lims[0].params(l.seed, skey, 0)
		if d, ok := l.deny.refuse(names[0], skey, p, now, c.count, c.reserve); ok {
			res := l.result(names[0], key, c, d)
			res.ResetAfter = resetAfter(p, 1, d)
			res.Local = true
			l.observe(ctx, mode, res, start, nil)
			return res, ch, nil
		}
	}
	ok, probe, until := l.breaker.allow(start)
	if !ok {
		return l.degraded(ctx, mode, lims, key, c, start, &StoreError{Name: names[0], Until: until})
	}

	b := opBufs.Get().(*opBuf)
	defer b.release()
	items, out := b.items[:], b.out[:]
	if len(lims) > 1 {
		items, out = make([]driver.Item, len(lims)), make([]driver.Decision, len(lims))
	}
	for i, lim := range lims {
		var shards []driver.Shard
		if len(lims) == 1 {
			shards = b.shards[:0]
		}
		items[i] = driver.Item{Name: names[i], Key: skey, Count: c.count, Shards: l.pickShards(lim, skey, shards)}
	}
	b.op = driver.Op{Mode: mode, Now: now, Reserve: c.reserve, Items: items}
	if err := l.store.Apply(ctx, &b.op, out); err != nil {
		if l.breaker.callerGaveUp(ctx, start, l.now()) {
			l.breaker.abandon(probe)
			return Result{}, ch, callerError(ctx, names[0], err)
		}
		l.storeFailed(names[0], err)
		return l.degraded(ctx, mode, lims, key, c, start, &StoreError{Name: names[0], Err: err})
	}
	if l.breaker.success(start) && l.logger != nil {
		l.logger.Info("ratelimit: store answers again; the breaker is closed")
	}

	if len(lims) == 1 {
		res := l.result(names[0], key, c, out[0])
		res.ResetAfter = resetAfter(items[0].Shards[0].Params, len(items[0].Shards), out[0])
		if out[0].OK {
			ch.lim, ch.key, ch.n = lims[0], skey, len(items[0].Shards)
			for i, sh := range items[0].Shards {
				ch.shards[i] = sh.Index
			}
			ch.amount, ch.at, ch.key = out[0].Charged, out[0].Now, items[0].Key
			if c.receipt {
				its, ls := chargeItems(&ch)
				res.Token = l.newToken(ch.storeKey(), ch.at, ch.at+out[0].RetryAfter, its, ls)
			}
		} else if single && l.deny != nil {
			l.deny.learn(ctx, l.store, names[0], skey, items[0].Shards[0].Params)
		}
		l.observe(ctx, mode, res, start, nil)
		return res, ch, nil
	}
	all := make([]Result, len(lims))
	ok = true
	for i := range lims {
		all[i] = l.result(names[i], key, c, out[i])
		all[i].ResetAfter = resetAfter(items[i].Shards[0].Params, len(items[i].Shards), out[i])
		ok = ok && all[i].OK
	}
	// The answer is the binding limit's: the longest wait among the refused
	// (or, when all are OK, among the reserved), then the fewest tokens left.
	pick := -1
	for i, r := range all {
		if r.OK != ok {
			continue
		}
		if pick < 0 || r.RetryAfter > all[pick].RetryAfter ||
			(r.RetryAfter == all[pick].RetryAfter && r.Remaining < all[pick].Remaining) {
			pick = i
		}
	}
	res := all[pick]
	res.OK = ok
	res.All = all
	if ok && c.receipt {
		res.Token = l.receiptOf(lims, items, out)
	}
	for i := range all {
		if !ok && all[i].OK {
			// Granted alone but not charged: report the tokens as they are.
			all[i].Remaining += c.count
		}
		l.observe(ctx, mode, all[i], start, nil)
	}
	return res, ch, nil
}

// resetAfter computes Result.ResetAfter for a limit of n shards of params p
// from the decision d: for a fixed window, until the next window of the
// record as the store holds it (its phase may predate a change of Start
// or of the phase seed); for a token bucket, until the shards the call
// evaluated are full again.
func resetAfter(p driver.Params, n int, d driver.Decision) time.Duration {
	return resetMillis(&p, n, d.Remaining, d.Now, d.TS)
}

// resetOne is resetMillis of one record of lim, without a division when
// it can do without. A token bucket's wait until full, w =
// max(Capacity-remaining, 0)·Period/Rate rounded up, is estimated as
// max(Capacity-remaining, 0)·msPerToken. Each is within 2 roundings (a
// relative 2^-52) of the exact quotient, so they are within 5·2^-53 of
// the estimate of each other; when the estimate is further than that from
// every whole number, both round up to the same one. Otherwise, and for
// waits too small or too large for that reasoning, it divides.
func (lim *limit) resetOne(remaining float64, now, ts int64) time.Duration {
	p := &lim.base
	if p.Kind == driver.TokenBucket {
		x := max(p.Capacity-remaining, 0)
		if x == 0 {
			return 0
		}
		est := x * lim.msPerToken
		if est >= 1e-290 && est < 1<<42 { // below MaxRetryAfter: never clamped
			whole := math.Floor(est)
			frac, margin := est-whole, est*6e-16
			if frac > margin && frac < 1-margin {
				return time.Duration(whole+1) * time.Millisecond
			}
		}
	}
	return resetMillis(p, 1, remaining, now, ts)
}

// resetMillis is resetAfter of a decision's Remaining, Now and TS.
func resetMillis(p *driver.Params, n int, remaining float64, now, ts int64) time.Duration {
	var ms float64
	if p.Kind == driver.FixedWindow {
		ms = float64(ts + p.Period - now)
	} else {
		capacity := p.Capacity * float64(min(n, 2))
		ms = max(capacity-remaining, 0) * float64(p.Period) / p.Rate / float64(min(n, 2))
	}
	return time.Duration(retryMillis(ms)) * time.Millisecond
}

func (l *Limiter) result(name, key string, c call, d driver.Decision) Result {
	return Result{
		OK:         d.OK,
		RetryAfter: time.Duration(d.RetryAfter) * time.Millisecond,
		Remaining:  d.Remaining,
		Name:       name,
		Key:        key,
		Count:      c.count,
	}
}

// degraded answers a call the store could not decide, by the failure
// policy: allowed only if every limit named fails open.
func (l *Limiter) degraded(ctx context.Context, mode driver.Mode, lims []*limit, key string, c call, start time.Time, serr *StoreError) (Result, charge, error) {
	open := true
	for _, lim := range lims {
		open = open && lim.cfg.FailOpen
	}
	var retry time.Duration
	if !open {
		retry = l.breaker.cooldown
		if !serr.Until.IsZero() {
			retry = serr.Until.Sub(start)
		}
		// Whole milliseconds, rounded up, as every RetryAfter.
		retry = max((retry + time.Millisecond - 1).Truncate(time.Millisecond), time.Millisecond)
	}
	res := Result{OK: open, RetryAfter: retry, Name: lims[0].name, Key: key, Count: c.count, Degraded: true}
	for _, lim := range lims {
		r := res
		r.Name, r.OK = lim.name, lim.cfg.FailOpen
		l.observe(ctx, mode, r, start, serr)
	}
	return res, charge{start: start}, serr
}

func (l *Limiter) storeFailed(name string, err error) {
	opened := l.breaker.failure(l.now())
	if l.logger == nil {
		return
	}
	l.logger.Warn("ratelimit: store failed; the failure policy decides", "limit", name, "err", err)
	if opened {
		l.logger.Error("ratelimit: store failing repeatedly; not asking it during the cool-down",
			"failures", l.breaker.threshold, "cooldown", l.breaker.cooldown)
	}
}

func (l *Limiter) observe(ctx context.Context, mode driver.Mode, res Result, start time.Time, err error) {
	if l.observer == nil {
		return
	}
	l.observer.Observe(ctx, Event{Result: res, Outcome: outcomeOf(res, err != nil), Check: mode == driver.ModeCheck,
		Latency: l.clock.Since(start), Err: err})
}

// opBuf holds the op of one single-limit call, reused across calls so
// that the hot path does not allocate it.
type opBuf struct {
	op     driver.Op
	items  [1]driver.Item
	shards [2]driver.Shard
	out    [1]driver.Decision
}

var opBufs = sync.Pool{New: func() any { return new(opBuf) }}

func (b *opBuf) release() {
	*b = opBuf{} // drop references to names and keys
	opBufs.Put(b)
}

// pickShards appends the shard(s) a call on (lim, key) evaluates; key is
// the store's (WithKeyHash), from which a fixed window's phase derives.
func (l *Limiter) pickShards(lim *limit, key string, dst []driver.Shard) []driver.Shard {
	if lim.shards == 1 {
		return append(dst, driver.Shard{Index: 0, Params: lim.params(l.seed, key, 0)})
	}
	a, b := l.picker.pick(lim.shards)
	return append(dst,
		driver.Shard{Index: a, Params: lim.params(l.seed, key, a)},
		driver.Shard{Index: b, Params: lim.params(l.seed, key, b)})
}

// checkTime reports a clock reading outside ±driver.MaxTime.
func checkTime(ms int64) error {
	if ms < -driver.MaxTime || ms > driver.MaxTime {
		return fmt.Errorf("the clock reads %d ms since 1970, beyond ±%d that every store computes exactly: check the clock given to WithClock: %w",
			ms, driver.MaxTime, ErrTimeRange)
	}
	return nil
}

// resolve finds the limit called name: declared (in New, SetLimits or
// SetLimit), or given inline.
func (set *limitSet) resolve(name string, inline *Config) (*limit, error) {
	lim, ok := set.byName[name]
	switch {
	case ok && inline != nil && !sameConfig(lim.cfg, *inline):
		return nil, fmt.Errorf("ratelimit: limit %q is declared with another config: drop WithConfig or use another name: %w", name, ErrInvalidConfig)
	case ok:
		return lim, nil
	case inline != nil:
		return compile(name, *inline)
	}
	return nil, fmt.Errorf("ratelimit: limit %q is not declared: declare it in New or SetLimits, or pass WithConfig: %w", name, ErrUnknownLimit)
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

// Reset forgets the state of (name, key) in every shard: the next call
// finds a full bucket. The phase of a fixed window stays.
func (l *Limiter) Reset(ctx context.Context, name, key string, opts ...CallOption) error {
	lim, err := l.resolveOpts(name, opts)
	if err != nil {
		return err
	}
	skey := l.storeKey(key)
	if l.deny != nil {
		l.deny.forget(name, skey)
	}
	if err := l.store.Delete(ctx, lim.ids(skey, nil)); err != nil {
		return fmt.Errorf("ratelimit: reset limit %q: store: %w", name, err)
	}
	return nil
}

func (l *Limiter) resolveOpts(name string, opts []CallOption) (*limit, error) {
	return l.limits.Load().resolve(name, newCall(opts).cfg)
}

// Status describes the state of (name, key) now, as Value reports it.
type Status struct {
	// Remaining is the tokens available now, summed over all shards; negative
	// while reservations are owed.
	Remaining float64
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
	Remaining   float64
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
	skey := l.storeKey(key)
	ids := lim.ids(skey, nil)
	recs := make([]driver.Record, len(ids))
	if err := l.store.Load(ctx, ids, recs); err != nil {
		return Status{}, fmt.Errorf("ratelimit: value of limit %q: store: %w", name, err)
	}
	now := l.now().UnixMilli()
	if err := checkTime(now); err != nil {
		return Status{}, fmt.Errorf("ratelimit: value of limit %q: %w", name, err)
	}
	if ts := ownClock(l.store); ts != nil {
		if now, err = ts.Now(ctx); err != nil {
			return Status{}, fmt.Errorf("ratelimit: value of limit %q: store time: %w", name, err)
		}
	}
	st := Status{Capacity: lim.cfg.capacity(), Shards: make([]ShardStatus, len(ids))}
	for i, rec := range recs {
		p := lim.params(l.seed, skey, i)
		s := StateAt(p, rec, now)
		sh := ShardStatus{Index: i, Remaining: s.Remaining, Stored: rec.Found}
		if p.Kind == driver.FixedWindow {
			sh.WindowStart = time.UnixMilli(s.TS)
			sh.NextGrant = time.UnixMilli(s.TS + p.Period)
			if st.NextGrant.IsZero() || sh.NextGrant.Before(st.NextGrant) {
				st.WindowStart, st.NextGrant = sh.WindowStart, sh.NextGrant
			}
		}
		st.Remaining += s.Remaining
		st.Shards[i] = sh
	}
	return st, nil
}
