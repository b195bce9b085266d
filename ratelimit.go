package ratelimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/isnil"

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
	// plain: no deny cache and no observer, so that a bound call may take
	// doBound's few steps (when the breaker is closed).
	plain    bool
	seed     uint64
	picker   picker
	breaker  breaker
	deny     *denyCache
	observer Observer
	jobs     JobObserver // observer, if it is one
	logger   *slog.Logger
	// Tokens (settle.go): how long past its job a token may be settled;
	// the keys whose tags it accepts, the first of which signs the tokens
	// it makes (none: unsigned, and every token is taken); and whether a
	// Limiter with keys takes unsigned tokens too.
	settleWindow   time.Duration
	tokenKeys      [][]byte
	acceptUnsigned bool
	// refundTimeout bounds the refund of a Reservation.Wait that gives up,
	// past the end of its context (WithRefundTimeout).
	refundTimeout time.Duration
	// afterFuncTimeout bounds the store call by which Reservation.AfterFunc
	// marks a reservation used (WithAfterFuncTimeout).
	afterFuncTimeout time.Duration
	// mostShards holds, for each name declared (New, SetLimits,
	// SetLimit) with more than one shard, the most shards a config of it
	// has had, so that Reset deletes the records of shards a lowered
	// Shards no longer reaches; under shardsMu.
	shardsMu   sync.Mutex
	mostShards map[string]int
}

// Store keeps the state records of a Limiter: store/memstore,
// store/boltstore, store/redisstore, store/pgstore, or one of your own.
// What a store implements is the contract of package driver.
type Store = driver.Store

// ownClock returns the store's TimeSource when it uses its own clock, and
// nil otherwise.
func ownClock(s Store) driver.TimeSource {
	if ts, ok := s.(driver.TimeSource); ok && ts.OwnClock() {
		return ts
	}
	return nil
}

// Option configures a Limiter in New.
type Option func(*Limiter)

// WithClock sets the clock the Limiter reads the time from. Production
// uses the real clock (the default); tests pass clock.NewMock() and move
// time by hand. A nil clock, or one holding a nil pointer (a *clock.Mock
// never made), makes New fail with an error matching ErrInvalidOption.
func WithClock(c clock.Clock) Option {
	return func(l *Limiter) {
		if isnil.Is(c) {
			l.optErr = fmt.Errorf("ratelimit: WithClock: the clock is %s: leave WithClock out for the real clock, or pass clock.NewMock() in tests: %w", nilText(c), ErrInvalidOption)
			return
		}
		l.clock = c
	}
}

// WithPhaseSeed varies the derived per-key phases of fixed windows without
// Start. Every process sharing a store must use the same seed.
func WithPhaseSeed(seed uint64) Option { return func(l *Limiter) { l.seed = seed } }

// WithLogger sets a logger for store failures (Warn), the breaker opening
// (Error) and closing (Info), a store's refusal of an op as invalid or of
// a record it cannot read (Error), and a job that Reservation.AfterFunc
// dropped because the store did not mark its reservation used (Error;
// the code that scheduled the job learns of it with OnDropped).
// Without it nothing is logged. Keys are not logged, but a store's error is,
// as it is: one for a record the store cannot read names the record's key,
// unless the Limiter hashes keys (WithKeyHash).
func WithLogger(logger *slog.Logger) Option { return func(l *Limiter) { l.logger = logger } }

// nilText writes v, a nil interface value or one holding a nil pointer
// (isnil.Is), for an error: nil, or its type's nil (*clock.Mock(nil)),
// where %T(nil) wrote a plain nil <nil>(nil).
func nilText(v any) string {
	if v == nil {
		return "nil"
	}
	return fmt.Sprintf("%T(nil)", v)
}

// WithRand sets the source of randomness that chooses the two shards of a
// sharded limit, so that tests can make the choice deterministic. The
// source is used under a lock of the Limiter's own: give each Limiter a
// source of its own, as one shared by two Limiters is read by both at
// once (rand.Source is not safe for concurrent use). The default is the runtime's fast,
// goroutine-safe generator, which a nil src sets too; a src holding a nil
// pointer, which would panic at the first sharded call, makes New fail
// with an error matching ErrInvalidOption.
func WithRand(src rand.Source) Option {
	return func(l *Limiter) {
		if src != nil && isnil.Is(src) {
			l.optErr = fmt.Errorf("ratelimit: WithRand was given %T(nil), which would fail at the first call of a sharded limit: pass a source (rand.NewPCG(1, 2)), or nil or no WithRand for the default: %w", src, ErrInvalidOption)
			return
		}
		l.picker.src = src
	}
}

// WithBreaker sets how many consecutive store failures open the breaker,
// and for how long it then decides calls by their failure policy without
// asking the store (by default DefaultBreakerFailures and
// DefaultBreakerCooldown). A fail-closed limit's refusal meanwhile says
// to retry when the cool-down ends (RetryAfter, at most
// driver.MaxRetryAfter milliseconds however long the cool-down).
// failures ≤ 0 disables the breaker: every call asks the store. A
// breaker that opens needs a cooldown above 0: a cooldown ≤ 0 with
// failures > 0 makes New fail with an error matching ErrInvalidOption.
func WithBreaker(failures int, cooldown time.Duration) Option {
	return func(l *Limiter) {
		if failures > 0 && cooldown <= 0 {
			l.optErr = fmt.Errorf("ratelimit: WithBreaker(%d, %v): a breaker that opens after %d failures must stay open for a cooldown above 0: give one (DefaultBreakerCooldown is %v), or WithBreaker(0, 0) to disable the breaker: %w",
				failures, cooldown, failures, DefaultBreakerCooldown, ErrInvalidOption)
			return
		}
		l.breaker.threshold, l.breaker.cooldown = failures, cooldown
	}
}

// WithObserver sets the Observer that sees every decision; nil sets none.
// One that implements JobObserver learns, too, how each job of
// Reservation.AfterFunc ended.
// An Observer holding a nil pointer (or a nil ObserverFunc), which would
// panic at the first decision, makes New fail with ErrInvalidOption.
func WithObserver(o Observer) Option {
	return func(l *Limiter) {
		if o != nil && isnil.Is(o) {
			l.optErr = fmt.Errorf("ratelimit: WithObserver was given %T(nil), which would fail at the first decision: pass the observer its constructor returned, once it returned no error, or leave WithObserver out: %w", o, ErrInvalidOption)
			return
		}
		l.observer = o
	}
}

// WithDenyCache enables the local deny cache, holding at most size keys
// (when full, an arbitrary entry makes room); a size ≤ 0 leaves it off. It applies to declared,
// unsharded limits called one at a time (not to a config given inline
// with WithConfig), and is ignored with a store that keeps its own time
// (TimeSource), whose clock the Limiter cannot read locally.
//
// It helps where the same keys are called again and again while refused
// (a client retrying flat out, an attack on one account or address): after
// the store's first refusal, their calls are refused in memory, without a
// round trip, until one could succeed. It costs:
//
//   - a read of the record (Store.Load) after every refusal the store
//     makes of a key the cache did not answer: a second round trip, which
//     the refused call waits for. Keys that change at every call (rotated
//     by a client, a scan of addresses) are each refused once and never
//     looked up again: there the cache doubles the store's work for
//     refusals and saves none, and a flood of them evicts the entries of
//     the keys it did help with;
//   - on every call of a limit it applies to, granted or not, a hash, a
//     lock of one of its stripes and a map look-up, and the Limiter's
//     shortest path for a call is left for its full one: a few hundred
//     nanoseconds a call on memstore, nothing next to a network round trip;
//   - memory: about 160 bytes an entry, plus its key (a copy, never the
//     caller's string), so size bounds it.
//
// See docs/production.md, "The local deny cache".
func WithDenyCache(size int) Option {
	return func(l *Limiter) {
		if size > 0 {
			l.deny = newDenyCache(size)
		}
	}
}

// WithKeyHash makes the Limiter give the store, in place of each key, a
// keyed hash of it: HMAC-SHA256 of the key under secret, its first 16
// bytes written in 22 characters of unpadded base64url. API keys, user
// IDs and addresses then appear neither in the store's record names
// (Redis keys, PostgreSQL rows, bbolt keys) nor in what the store logs or
// replicates; what the Limiter returns (Result.Key, LimitError) and tells
// its Observer keeps the key as given. Without it, a key longer than 256
// bytes reaches the store as an unkeyed SHA-256 digest, which bounds its
// size but hides nothing: anyone can compute it from a guessed key.
//
// Every process sharing a store must use the same secret, and so must
// the ratelimit command's inspect and reset (--key-secret, or the
// RATELIMIT_KEY_SECRET environment variable), which read and reset a key
// by its clear form. Changing the secret, or turning hashing on or off,
// starts every key afresh: its records are then others, and the old ones
// expire unused. A fixed window's derived phase comes from the hashed key,
// so it changes too. The secret must hold at least MinKeySecret bytes (32
// random ones are best); a shorter one, or one of zero bytes only (a
// buffer never filled), makes New fail with an error matching
// ErrInvalidOption. See docs/production.md for what hashing
// costs.
func WithKeyHash(secret []byte) Option {
	return func(l *Limiter) {
		if len(secret) < MinKeySecret {
			l.optErr = fmt.Errorf("ratelimit: WithKeyHash: the secret has %d bytes, fewer than %d: use at least %d random bytes (32 from crypto/rand are best), the same in every process sharing the store: %w",
				len(secret), MinKeySecret, MinKeySecret, ErrInvalidOption)
			return
		}
		if zeroKey(secret) {
			l.optErr = fmt.Errorf("ratelimit: WithKeyHash: the secret holds zero bytes only, which anyone can hash keys under (a buffer never filled?): use %d or more random bytes (32 from crypto/rand are best), the same in every process sharing the store: %w",
				MinKeySecret, ErrInvalidOption)
			return
		}
		l.keys = newKeyHasher(secret)
	}
}

// WithSettleWindow sets how long past the time its job may run a token
// may still be settled (default DefaultSettleWindow): a worker that takes
// a job off a queue later than that can no longer mark it used
// (ErrTokenExpired), and a cancel that late hands nothing back. The store
// keeps a marker of each settled token for that long (and ExpiryGrace
// more), so a longer window costs store memory. The window is written
// into each token when it is made: processes may differ. It counts in
// whole milliseconds (a finer part is dropped). With d 0 a token may
// still be settled until the later of its job's time and the time by
// which its limits will have granted its amounts again since the charge,
// one period more (Token.Expires without the window); a negative d
// counts as 0.
func WithSettleWindow(d time.Duration) Option {
	return func(l *Limiter) { l.settleWindow = max(d, 0) }
}

// WithRefundTimeout bounds the refund of a Reservation.Wait that gives
// up: its context ended, or its deadline comes before the job's time.
// Wait hands the tokens back on a context of its own, which keeps the
// values of Wait's but ends d after the later of Wait's deadline and the
// moment Wait gives up; so Wait returns at most d after its context's
// deadline, or after it saw its context canceled (the stores of this
// module, as the driver contract asks, end a call when its context
// ends). A refund the store has not made by then is reported: Wait's
// error matches ErrNotRefunded beside the context's, and Cancel, with a
// context of the caller's, hands the tokens back. With d 0, Wait sends no
// refund once its context has ended, and returns at once with such an
// error, unless no refund is due (a reservation of the failure policy,
// which holds no tokens, or one canceled meanwhile); it still hands the
// tokens back within a deadline not passed yet.
// The same bound holds for the tokens that Reserve hands back when its
// Observer panics (see Observer), from the moment of the panic: with d 0
// they go back within the deadline of Reserve's context, if it has not
// passed; with no deadline, none is left, and they are not sent but stay
// spent, which the logger (WithLogger) reports.
// The default is DefaultRefundTimeout; a negative d counts as 0.
func WithRefundTimeout(d time.Duration) Option {
	return func(l *Limiter) { l.refundTimeout = max(d, 0) }
}

// WithAfterFuncTimeout bounds the store call by which
// Reservation.AfterFunc, when the job's time comes, marks a reservation
// used (once its token was taken; before that, the use is local and asks
// no store). AfterFunc has no caller's context to end that call; without
// a bound, a store that does not answer (a partitioned Redis without read
// timeouts, a locked PostgreSQL row) would hold it for good: the function
// would never run, nor the job be let go. A use the store has not made
// within d fails as any store failure does (and one it answers only past
// d, even as taken, does not run the function either): the function does
// not run, the failure is logged (WithLogger) and told to the OnDropped
// function of the AfterFunc, and the AfterFunc lets go of the job, so that a new AfterFunc or a Wait may try the use again (if the
// store took the first after all, it finds that use its own and lets the
// job run). So d is how late a job may run for a slow store before it is
// dropped. The default is DefaultAfterFuncTimeout; a d ≤ 0 (which would
// never let a job run) makes New fail with an error matching
// ErrInvalidOption.
func WithAfterFuncTimeout(d time.Duration) Option {
	return func(l *Limiter) {
		if d <= 0 {
			l.optErr = fmt.Errorf("ratelimit: WithAfterFuncTimeout: the timeout is %v: AfterFunc could never mark a reservation used in the store, and no job would run: give how late a job may run for a slow store before it is dropped (a few seconds), or leave the option out for DefaultAfterFuncTimeout: %w", d, ErrInvalidOption)
			return
		}
		l.afterFuncTimeout = d
	}
}

// WithTokenKey makes the Limiter authenticate its tokens: every token it
// makes carries an HMAC-SHA-256 tag under key, and every token it is
// given to settle must carry a valid one (ErrInvalidToken otherwise).
// Every process that makes or settles the tokens needs the same key.
// Without it a token is a bearer capability: whoever can present it can
// settle it, and its amounts are taken on trust (see docs/reservations.md).
//
// A token tagged under one of accepted is taken too, though no token is
// signed with them: this is how a fleet rotates its key without refusing
// the tokens already queued. First every process accepts the new key,
// then every process signs with it and accepts the old one, and once the
// last token signed with the old key has expired, the old key goes
// (docs/reservations.md, "Rotating the token key"). A token that carries
// no valid tag under key or under any of accepted is refused; each key
// tried costs an HMAC of the token, so keep accepted to the key or two of
// a rotation.
//
// The key and each of accepted must hold at least MinKeySecret bytes (32
// random ones are best): a shorter one, or none (an unset environment
// variable), makes New fail with an error matching ErrInvalidOption
// rather than leave the tokens unsigned; so does one of zero bytes alone
// (a buffer for the secret never filled), which HMAC takes for the empty
// key. So does a key given twice (an accepted key equal to key, or to
// another accepted key, or that HMAC takes for it: the same bytes
// followed by zero bytes, or the SHA-256 of a key longer than 64 bytes):
// a rotation's keys are two different secrets, and two equal ones mean a
// configuration that did not change what it meant to. Given twice, the
// last WithTokenKey counts, accepted keys and all; one with a bad key
// makes New fail wherever it stands, the last or not.
func WithTokenKey(key []byte, accepted ...[]byte) Option {
	return func(l *Limiter) {
		if fault := tokenKeyFault(key, accepted); fault != "" {
			l.optErr = fmt.Errorf("ratelimit: WithTokenKey: %s; the same keys in every process that makes or settles tokens, or leave WithTokenKey out for unsigned tokens: %w", fault, ErrInvalidOption)
			return
		}
		keys := make([][]byte, 0, 1+len(accepted))
		keys = append(keys, bytes.Clone(key))
		for i, k := range accepted {
			for j, o := range keys {
				// Constant time: not that a comparison at start-up
				// leaks much, but these are secrets.
				if sameMACKey(k, o) {
					what := "the signing key (the first argument)"
					if j > 0 {
						what = fmt.Sprintf("accepted key %d", j)
					}
					l.optErr = fmt.Errorf("ratelimit: WithTokenKey: accepted key %d is the same as %s: a rotation accepts the old or the next key beside the signing key, each once; check which secrets the configuration reads: %w",
						i+1, what, ErrInvalidOption)
					return
				}
			}
			keys = append(keys, bytes.Clone(k))
		}
		l.tokenKeys = keys
	}
}

// WithUnsignedTokensAccepted makes a Limiter with WithTokenKey take
// unsigned tokens too (made by a Limiter without a token key), for the
// time a fleet moves from unsigned tokens to signed ones, or back, without
// refusing the tokens already queued: a Limiter without a key takes every
// token, signed or not, but one with a key refuses those that carry no
// tag. It still signs the tokens it makes, and still refuses a token
// whose tag is not valid under any of its keys.
//
// While it is on, tokens are not authenticated at all: anyone can strip a
// token's tag and forge one, as without a key, and forged tokens lift the
// limits of any key they name (see Token). Turn it on only for the
// move, and off again once every unsigned token has expired
// (docs/reservations.md, "Rotating the token key"). Without WithTokenKey
// it changes nothing.
func WithUnsignedTokensAccepted() Option {
	return func(l *Limiter) { l.acceptUnsigned = true }
}

// New returns a Limiter that keeps state in store and knows the given
// limits. Every config is validated: an invalid one is reported as a
// *ConfigError naming the limit and the field. No store (nil, or a nil
// pointer of a store's type), a nil Option, or a bad option argument, is
// reported as an error matching ErrInvalidOption; so is a store that its
// constructor did not make (&memstore.Store{}), which says so
// (driver.ZeroChecker), itself or through a wrapper: the error matches
// driver.ErrZeroStore too.
func New(store Store, limits Limits, opts ...Option) (*Limiter, error) {
	if isnil.Is(store) {
		err := fmt.Errorf("ratelimit: New needs a Store, and was given %s: pass the store that memstore.New (or another store's New) returned, once it returned no error: %w", nilText(store), ErrInvalidOption)
		if store != nil && driver.CheckZero(store) != nil {
			err = fmt.Errorf("%w: %w", err, driver.ErrZeroStore) // as its calls would fail
		}
		return nil, err
	}
	if err := driver.CheckZero(store); err != nil {
		return nil, fmt.Errorf("ratelimit: New was given a store that its constructor did not make, whose every call would fail (%w): %w", err, ErrInvalidOption)
	}
	wall := clock.New()
	l := &Limiter{store: store, clock: wall,
		breaker:      breaker{threshold: DefaultBreakerFailures, cooldown: DefaultBreakerCooldown},
		settleWindow: DefaultSettleWindow, refundTimeout: DefaultRefundTimeout,
		afterFuncTimeout: DefaultAfterFuncTimeout}
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("ratelimit: New was given a nil Option (option %d): leave it out, or pass the option it was meant to be: %w", i+1, ErrInvalidOption)
		}
		o(l)
	}
	if l.optErr != nil {
		return nil, l.optErr
	}
	l.wall = l.clock == wall
	l.breaker.clock = l.now
	l.binder, _ = store.(driver.Binder)
	if ownClock(store) != nil {
		l.deny = nil   // its clock is the store's, which cannot be read locally
		l.binder = nil // a Verdict does not carry the store's time
	}
	l.plain = l.deny == nil && l.observer == nil
	l.jobs, _ = l.observer.(JobObserver)
	set, _, err := l.compileSet(limits, nil)
	if err != nil {
		return nil, err
	}
	l.noteShards(set.byName)
	l.limits.Store(set)
	return l, nil
}

// noteShards remembers the shards of the limits declared: Reset deletes
// the records of the most shards each name has had.
func (l *Limiter) noteShards(lims map[string]*limit) {
	l.shardsMu.Lock()
	defer l.shardsMu.Unlock()
	for name, lim := range lims {
		if lim.shards > max(l.mostShards[name], 1) {
			if l.mostShards == nil {
				l.mostShards = make(map[string]int)
			}
			l.mostShards[name] = lim.shards
		}
	}
}

// shardsHad returns the most shards a config declared as name has had
// (noteShards), or 1.
func (l *Limiter) shardsHad(name string) int {
	l.shardsMu.Lock()
	defer l.shardsMu.Unlock()
	return max(l.mostShards[name], 1)
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

// Limit asks for tokens (one, or Count(n)) of the named limit for key, and
// spends them when the call is allowed or reserved. A denied call changes
// nothing. The key may be any string; one longer than 256 bytes reaches
// the store as a digest of 50 bytes (see the package's Keys). The error is
// non-nil only for bad input (ErrUnknownLimit, ErrInvalidConfig,
// ErrInvalidCount), a done context, or a store failure; being rate limited
// is Result.OK false (or Result.Err). On a store failure (an error
// matching ErrStoreUnavailable) the Result is the limit's failure policy's
// answer, Degraded: OK for a limit with Config.FailOpen, refused otherwise
// (ExampleConfig_failOpen). A store that its constructor did not make
// (driver.ErrZeroStore) is no store failure: the call fails, not OK, as
// for bad input, whatever the policy.
func (l *Limiter) Limit(ctx context.Context, name, key string, opts ...CallOption) (res Result, err error) {
	// Small enough for Go to inline into the caller: answer then writes
	// the Result where the caller keeps it. A Result returned by a call
	// that is not inlined goes back through memory, and the caller copies
	// it twice more, which costs more than deciding it.
	err = l.answer(&res, ctx, driver.ModeLimit, name, key, opts)
	return res, err
}

// Check returns the answer Limit would give now, without spending anything.
// For a sharded limit it is the answer of the two shards Check draws; the
// next Limit draws its own, which may answer otherwise (docs/sharding.md).
func (l *Limiter) Check(ctx context.Context, name, key string, opts ...CallOption) (res Result, err error) {
	err = l.answer(&res, ctx, driver.ModeCheck, name, key, opts)
	return res, err
}

// answer is Limit (mode ModeLimit) or Check (ModeCheck), filling *res,
// which its caller has zeroed.
func (l *Limiter) answer(res *Result, ctx context.Context, mode driver.Mode, name, key string, opts []CallOption) error {
	// The commonest call, without options, on a bound limit: a path of
	// its own, kept small, so that the compiler keeps its values in
	// registers rather than saving all of them for the other paths' calls.
	lim := l.declared(name)
	if len(opts) == 0 && l.plain && lim != nil && lim.bound != nil && l.breaker.closed() {
		v, now, failed, err := l.doBound(ctx, mode, lim, key, 1, false)
		if err == nil {
			// boundInto, spelled out: it is over the inlining budget.
			res.OK = v.OK
			res.RetryAfter = time.Duration(v.RetryAfter) * time.Millisecond
			res.Remaining = v.Remaining
			res.ResetAfter = lim.resetOne(v.Remaining, now, v.TS)
			res.Name, res.Key, res.Count = lim.name, key, 1
			return nil
		}
		return l.boundErr(res, ctx, mode, lim, key, call{count: 1}, now, failed, err)
	}
	return l.answerCall(res, ctx, mode, lim, name, key, newCall(opts))
}

// answerCall is answer for the call c; lim is the limit declared as name,
// or nil.
func (l *Limiter) answerCall(res *Result, ctx context.Context, mode driver.Mode, lim *limit, name, key string, c call) error {
	if lim != nil && lim.bound != nil && c.cfg == nil && (mode == driver.ModeCheck || !c.receipt) {
		if !l.plain || !l.breaker.closed() {
			r, err := l.boundFull(ctx, mode, lim, key, c)
			*res = r
			return err
		}
		v, now, failed, err := l.doBound(ctx, mode, lim, key, c.count, c.reserve)
		if err == nil {
			boundInto(res, lim, key, c.count, v, now)
			return nil
		}
		return l.boundErr(res, ctx, mode, lim, key, c, now, failed, err)
	}
	r, err := l.decide(ctx, mode, name, key, c)
	*res = r
	return err
}

// boundInto writes into *res, which is zero, field by field, the Result of
// the verdict v of a call of count on lim, judged at now.
func boundInto(res *Result, lim *limit, key string, count float64, v driver.Verdict, now int64) {
	res.OK = v.OK
	res.RetryAfter = time.Duration(v.RetryAfter) * time.Millisecond
	res.Remaining = v.Remaining
	res.ResetAfter = lim.resetOne(v.Remaining, now, v.TS)
	res.Name, res.Key, res.Count = lim.name, key, count
}

// boundErr ends answer for a call c whose doBound returned err at now:
// failed, a store failure, answered as the breaker says.
func (l *Limiter) boundErr(res *Result, ctx context.Context, mode driver.Mode, lim *limit, key string, c call, now int64, failed bool, err error) error {
	if failed {
		r, err := l.boundFailedResult(ctx, mode, lim, key, c, now, err)
		*res = r
		return err
	}
	return err
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
			return Result{}, fmt.Errorf("ratelimit: LimitAll names limit %s twice: name it once: %w", written(n), ErrInvalidConfig)
		}
	}
	res, _, err := l.do(ctx, driver.ModeLimit, names, key, c)
	return res, err
}

// charge records which shards an OK call charged, and how much, so that a
// reservation can hand the tokens back.
type charge struct {
	// lim is the limit charged; for Reserve, also the one the failure
	// policy granted, which charged nothing (n 0).
	lim    *limit
	key    string // the key as the store knows it (WithKeyHash)
	shards [2]int // shard indexes
	amount [2]float64
	n      int
	at     int64     // when the store judged the call (Decision.Now)
	start  time.Time // when the Limiter read its clock for the call
}

// doBound decides the commonest call of a declared, unsharded limit
// through its BoundLimit (no deny cache, observer or Reservation, the
// breaker closed: Limiter.plain and breaker.closed, which the caller
// checks): what do does for such a call, without an Op, in the few steps
// it needs. When the store decided the call, err is nil and the caller
// makes the Result of the verdict v, judged at now, where it returns it
// (so that it is not copied there). Otherwise err is the call's: bad
// input or a done context, or, with failed true, the store's failure,
// which the caller answers by boundFailedResult.
//
// It takes the call's count and reserve, not the call, and returns no
// Result, so that its arguments and results all pass in registers.
func (l *Limiter) doBound(ctx context.Context, mode driver.Mode, lim *limit, key string, count float64, reserve bool) (v driver.Verdict, now int64, failed bool, err error) {
	if err := lim.checkCount(count, reserve); err != nil {
		return v, 0, false, err
	}
	if err := ctx.Err(); err != nil {
		return v, 0, false, limitErr(lim.name, err)
	}
	if l.wall { // nowMillis, without its call
		now = wallMillis()
	} else {
		now = l.nowMillis()
	}
	if err := checkTime(now); err != nil {
		return v, 0, false, limitErr(lim.name, err)
	}
	skey := l.storeKey(key)
	if v, err = lim.bound.Decide(ctx, skey, mode, now, count, reserve); err != nil {
		return v, now, true, storeError("Decide", err)
	}
	if !l.breaker.current(now) && l.breaker.answered(now) && l.logger != nil {
		l.logger.Info("ratelimit: store answers again; the breaker is closed")
	}
	return v, now, false, nil
}

// boundFailedResult answers, as do does, a call of doBound whose store
// failed with err at now.
func (l *Limiter) boundFailedResult(ctx context.Context, mode driver.Mode, lim *limit, key string, c call, now int64, err error) (Result, error) {
	var res Result
	_, _, _, err = l.boundFailed(ctx, mode, lim, key, c, &res, time.Time{}, now, 0, err)
	return res, err
}

// boundFull decides by doBoundFull a call of a declared, unsharded limit
// that doBound does not take.
func (l *Limiter) boundFull(ctx context.Context, mode driver.Mode, lim *limit, key string, c call) (Result, error) {
	var res Result
	v, now, plain, err := l.doBoundFull(ctx, mode, lim, key, c, &res, nil)
	if plain {
		return boundResult(lim, key, c, v, now), nil
	}
	return res, err
}

// limitErr wraps err with the limit's name.
func limitErr(name string, err error) error {
	return fmt.Errorf("ratelimit: limit %s: %w", written(name), err)
}

// boundFailed answers a bound call whose store failed with err, as do
// does: the error of a store its constructor did not make (zeroStore),
// the caller's own error if it gave up, else the failure policy's.
func (l *Limiter) boundFailed(ctx context.Context, mode driver.Mode, lim *limit, key string, c call, res *Result, start time.Time, now int64, probe uint64, err error) (driver.Verdict, int64, bool, error) {
	if zerr := l.zeroStore(lim.name, probe, err); zerr != nil {
		return driver.Verdict{}, now, false, zerr
	}
	if l.gaveUp(ctx, timeAt(start, now), lim.name, l.storeKey(key), probe) {
		return driver.Verdict{}, now, false, callerError(ctx, lim.name, err)
	}
	l.storeErr(lim.name, probe, err)
	lims := [1]*limit{lim}
	r, _, err := l.degraded(ctx, mode, lims[:], key, c, timeAt(start, now), &StoreError{Name: lim.name, Err: err})
	*res = r
	return driver.Verdict{}, now, false, err
}

// doBoundFull decides one call of a declared, unsharded limit through
// its BoundLimit, with every step doBound leaves out. It fills *ch when ch
// is not nil (Reserve). When the store decided the call and no observer
// is to be told, plain is true and the caller makes the Result of the
// verdict v, judged at now, by boundResult; otherwise doBoundFull fills
// *res.
func (l *Limiter) doBoundFull(ctx context.Context, mode driver.Mode, lim *limit, key string, c call, res *Result, ch *charge) (v driver.Verdict, now int64, plain bool, err error) {
	if err := lim.checkCount(c.count, c.reserve); err != nil {
		return v, 0, false, err
	}
	if err := ctx.Err(); err != nil {
		return v, 0, false, fmt.Errorf("ratelimit: limit %s: %w", written(lim.name), err)
	}
	// The time in full only where it is needed: a Reservation's keeps the
	// monotonic reading (for Delay), an observer's latency the fraction of
	// a millisecond. Otherwise the milliseconds alone, and timeAt.
	var start time.Time
	if ch != nil || l.observer != nil {
		start = l.now()
		if ch != nil {
			ch.start, ch.lim = start, lim
		}
		now = start.UnixMilli()
	} else {
		now = l.nowMillis()
	}
	if err := checkTime(now); err != nil {
		return v, 0, false, fmt.Errorf("ratelimit: limit %s: %w", written(lim.name), err)
	}
	skey := l.storeKey(key)
	if c.receipt && mode == driver.ModeLimit {
		// As in do: a receipt ParseToken could not read back is refused
		// before the call charges anything.
		lims := [1]*limit{lim}
		if err := receiptFits(skey, lims[:]); err != nil {
			return v, 0, false, err
		}
	}
	if l.deny != nil {
		p := lim.params(l.seed, skey, 0)
		if d, ok := l.deny.refuse(lim, skey, p, now, c.count, c.reserve); ok {
			*res = l.result(lim.name, key, c, d)
			res.ResetAfter = resetAfter(p, 1, d)
			res.Local = true
			l.observe(ctx, mode, lim, *res, timeAt(start, now), nil)
			return v, now, false, nil
		}
	}
	var probe uint64
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
	if probe != 0 {
		v, err = l.probeDecide(ctx, probe, lim, skey, mode, now, c)
	} else {
		v, err = lim.bound.Decide(ctx, skey, mode, now, c.count, c.reserve)
	}
	if err != nil {
		err = storeError("Decide", err)
		return l.boundFailed(ctx, mode, lim, key, c, res, start, now, probe, err)
	}
	if l.breaker.answered(now) && l.logger != nil {
		l.logger.Info("ratelimit: store answers again; the breaker is closed")
	}
	if v.OK {
		if ch != nil {
			ch.lim, ch.key, ch.n, ch.amount[0], ch.at = lim, skey, 1, c.count, now
		}
		if l.deny != nil && mode == driver.ModeLimit {
			l.grantedStale(lim, skey)
		}
	} else if l.deny != nil {
		l.deny.learn(ctx, l.store, lim, skey, lim.params(l.seed, skey, 0), now)
	}
	if l.observer != nil {
		*res = boundResult(lim, key, c, v, now)
		if c.reservation && v.OK {
			l.observeCharged(ctx, mode, lim, *res, start, ch)
		} else {
			l.observe(ctx, mode, lim, *res, start, nil)
		}
		return v, now, false, nil
	}
	return v, now, true, nil
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
		return Result{}, ch, fmt.Errorf("ratelimit: limit %s: %w", written(names[0]), err)
	}
	now := start.UnixMilli()
	if err := checkTime(now); err != nil {
		return Result{}, ch, fmt.Errorf("ratelimit: limit %s: %w", written(names[0]), err)
	}
	skey := l.storeKey(key)
	// A receipt is of a charge: a Check charges nothing and gets none
	// (combine reads c too).
	c.receipt = c.receipt && mode == driver.ModeLimit
	if c.receipt {
		if err := receiptFits(skey, lims); err != nil {
			return Result{}, ch, err
		}
	}
	// The deny cache keeps declared, unsharded limits called alone. Not
	// a config given inline: calls of a name declared nowhere may each
	// give another one, and nothing tells the cache when a call of one
	// config changed the record that an entry, or a learn under way, of
	// another holds (grantedStale).
	cached := l.deny != nil && len(lims) == 1 && lims[0].shards == 1 && lims[0].declared
	if l.deny != nil && !cached {
		l.deny.seen(now) // a time the store may judge records by
	}
	if cached {
		p := lims[0].params(l.seed, skey, 0)
		if d, ok := l.deny.refuse(lims[0], skey, p, now, c.count, c.reserve); ok {
			res := l.result(names[0], key, c, d)
			res.ResetAfter = resetAfter(p, 1, d)
			res.Local = true
			l.observe(ctx, mode, lims[0], res, start, nil)
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
	var err error
	if probe != 0 {
		err = l.probeApply(ctx, probe, &b.op, out)
	} else {
		err = l.store.Apply(ctx, &b.op, out)
	}
	if err != nil {
		err = storeError("Apply", err)
		if zerr := l.zeroStore(names[0], probe, err); zerr != nil {
			return Result{}, ch, zerr
		}
		if l.gaveUp(ctx, start, names[0], skey, probe) {
			return Result{}, ch, callerError(ctx, names[0], err)
		}
		l.storeErr(names[0], probe, err)
		return l.degraded(ctx, mode, lims, key, c, start, &StoreError{Name: names[0], Err: err})
	}
	// The time of the answer, not of the call's start: the store may have
	// kept the call waiting, while another call's deadline passed, and
	// that call's caller must learn that the store answered meanwhile.
	if l.breaker.answered(l.nowMillis()) && l.logger != nil {
		l.logger.Info("ratelimit: store answers again; the breaker is closed")
	}

	if len(lims) == 1 {
		res := l.result(names[0], key, c, out[0])
		res.ResetAfter = resetAfter(items[0].Shards[0].Params, len(items[0].Shards), out[0])
		if out[0].OK {
			ch.lim, ch.n = lims[0], len(items[0].Shards)
			for i, sh := range items[0].Shards {
				ch.shards[i] = sh.Index
			}
			ch.amount, ch.at, ch.key = out[0].Charged, out[0].Now, items[0].Key
			if c.receipt {
				its, ls := chargeItems(&ch)
				res.Token = l.newToken(ch.key, ch.at, ch.at+out[0].RetryAfter, its, ls, false)
			}
			if l.deny != nil && mode == driver.ModeLimit {
				l.grantedStale(lims[0], skey)
			}
		} else if cached {
			l.deny.learn(ctx, l.store, lims[0], skey, items[0].Shards[0].Params, now)
		}
		if c.reservation && out[0].OK {
			l.observeCharged(ctx, mode, lims[0], res, start, &ch)
		} else {
			l.observe(ctx, mode, lims[0], res, start, nil)
		}
		return res, ch, nil
	}
	res := l.combine(ctx, mode, names, key, c, lims, items, out, start)
	if res.OK && l.deny != nil && mode == driver.ModeLimit {
		for _, lim := range lims {
			l.grantedStale(lim, skey)
		}
	}
	return res, ch, nil
}

// probeApply is the store's Apply for the call that probes it (the
// breaker is open). A panic of the store goes on to the caller, who may
// recover it (as net/http does for a handler); the probe is abandoned on
// its way, so that the next call probes: it stayed under way for good,
// and the breaker open.
func (l *Limiter) probeApply(ctx context.Context, probe uint64, op *driver.Op, out []driver.Decision) error {
	returned := false
	defer func() {
		if !returned {
			l.breaker.abandon(probe)
		}
	}()
	err := l.store.Apply(ctx, op, out)
	returned = true
	return err
}

// probeDecide is probeApply for a call of a bound limit.
func (l *Limiter) probeDecide(ctx context.Context, probe uint64, lim *limit, key string, mode driver.Mode, now int64, c call) (driver.Verdict, error) {
	returned := false
	defer func() {
		if !returned {
			l.breaker.abandon(probe)
		}
	}()
	v, err := lim.bound.Decide(ctx, key, mode, now, c.count, c.reserve)
	returned = true
	return v, err
}

// grantedStale drops the deny cache's memory of (lim, key), key the
// store's, after the store granted and charged a call of lim, if lim is no
// longer the limit declared under its name: a call decided under an old
// config (it started before SetLimits or SetLimit returned) that reached
// the store late. The old config may refill faster than the new one, and
// leave the record more tokens than an entry learnt under the new config
// meanwhile, from the record as it was before, would show: that entry
// would refuse calls that the store grants. Forgetting also stops a learn
// under way (denyCache.forget). A late call of a removed limit drops the
// key's entry too: a late call refused meanwhile may have left one of the
// removed config, which other late calls would read. Calls given a config
// inline are not cached (do): a call given inline of a name still
// undeclared drops nothing. The check costs a granted call a look-up of
// its name, and only with a deny cache.
func (l *Limiter) grantedStale(lim *limit, key string) {
	if cur := l.declared(lim.name); cur != lim && (cur != nil || lim.declared) {
		l.deny.forget(lim.name, key)
	}
}

// combine makes the Result of a LimitAll call from its limits' decisions:
// the binding limit's answer, with every limit's own in All.
func (l *Limiter) combine(ctx context.Context, mode driver.Mode, names []string, key string, c call,
	lims []*limit, items []driver.Item, out []driver.Decision, start time.Time) Result {
	all := make([]Result, len(lims))
	ok := true
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
		l.observe(ctx, mode, lims[i], all[i], start, nil)
	}
	return res
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
// policy: allowed only if every limit named fails open. A refusal is the
// first fail-closed limit's; for LimitAll, All holds each limit's own
// answer by its policy.
func (l *Limiter) degraded(ctx context.Context, mode driver.Mode, lims []*limit, key string, c call, start time.Time, serr *StoreError) (Result, charge, error) {
	decider := -1 // the first limit that fails closed
	for i, lim := range lims {
		if !lim.cfg.FailOpen {
			decider = i
			break
		}
	}
	var retry time.Duration
	if decider >= 0 {
		retry = l.breaker.cooldown
		if !serr.Until.IsZero() {
			retry = serr.Until.Sub(start)
		}
		retry = policyWait(retry)
	}
	own := func(lim *limit) Result {
		r := Result{OK: lim.cfg.FailOpen, Name: lim.name, Key: key, Count: c.count, Degraded: true}
		if !r.OK {
			r.RetryAfter = retry
		}
		return r
	}
	if len(lims) == 1 {
		res := own(lims[0])
		l.observe(ctx, mode, lims[0], res, start, serr)
		return res, charge{lim: lims[0], start: start}, serr
	}
	all := make([]Result, len(lims))
	for i, lim := range lims {
		all[i] = own(lim)
		l.observe(ctx, mode, lim, all[i], start, serr)
	}
	res := all[max(decider, 0)]
	res.All = all
	return res, charge{start: start}, serr
}

// zeroStore returns, when err, the error of a store call of limit name
// (the probe's, numbered probe, or 0), matches driver.ErrZeroStore, the
// call's error, which wraps it, and nil otherwise. Such a store is no
// outage but a program's error (the zero value of a store's type, in
// place of the store its constructor returns), and no call over it will
// ever succeed: the failure policy would answer every call for as long
// as the process runs, a fail-open limit granting them all. So the call
// is not decided by the policy, but fails with a zero Result, as for bad
// input, and its error does not match ErrStoreUnavailable; nor does the
// breaker count it, the probe's place freed. New refuses a store that
// says so (driver.ZeroChecker); this is for one that does not.
func (l *Limiter) zeroStore(name string, probe uint64, err error) error {
	if !errors.Is(err, driver.ErrZeroStore) {
		return nil
	}
	l.breaker.abandon(probe)
	return limitErr(name, err)
}

// storeErr accounts for err, the error of a store call of limit name, that
// the failure policy is to answer. Two refusals say nothing of the store's
// health, and the breaker must not judge it by them (it would open for
// every limit and key on the calls of one): an op the store refused as
// invalid (driver.ErrInvalidOp), which the Limiter never sends, so a bug;
// and a record it cannot read (driver.ErrBadRecord), one key's damage.
// Both are logged at error level; any other error counts as a failure,
// but that of a store its constructor did not make (driver.ErrZeroStore),
// which the calls return (zeroStore): it is logged at error level too.
func (l *Limiter) storeErr(name string, probe uint64, err error) {
	var msg string
	switch {
	case errors.Is(err, driver.ErrZeroStore):
		msg = "ratelimit: the store was not made by its constructor, and every call fails: see the error for what to do"
	case errors.Is(err, driver.ErrInvalidOp):
		msg = "ratelimit: the store refused an invalid op, which is a bug: please report it; the failure policy decides"
	case errors.Is(err, driver.ErrBadRecord):
		msg = "ratelimit: the store holds a record it cannot read: see the error for what to do; the failure policy decides"
	default:
		l.storeFailed(name, probe, err)
		return
	}
	l.breaker.abandon(probe)
	if l.logger != nil {
		l.logger.Error(msg, "limit", name, "err", err)
	}
}

func (l *Limiter) storeFailed(name string, probe uint64, err error) {
	opened := l.breaker.failure(l.now(), probe)
	if l.logger == nil {
		return
	}
	l.logger.Warn("ratelimit: store failed; the failure policy decides", "limit", name, "err", err)
	if opened {
		l.logger.Error("ratelimit: store failing repeatedly; not asking it during the cool-down",
			"failures", l.breaker.threshold, "cooldown", l.breaker.cooldown)
	}
}

// observe tells the observer, if any, of res, the answer of lim.
func (l *Limiter) observe(ctx context.Context, mode driver.Mode, lim *limit, res Result, start time.Time, err error) {
	if l.observer == nil {
		return
	}
	res.Token = nil // the caller's (Event.Result)
	// The latency by Now, as start was read: a clock's Since may count
	// from another time than its Now (one that overrides Now alone).
	// Floored at 0: a clock that stepped back meanwhile says nothing of
	// how long the decision took, and a negative duration would take
	// from an observer's sums.
	l.observer.Observe(ctx, Event{Result: res, Outcome: outcomeOf(res, err != nil), Check: mode == driver.ModeCheck,
		Inline: !lim.declared, Latency: max(l.now().Sub(start), 0), Err: err})
}

// observeCharged is observe for the decision of a Reserve that charged
// ch. Should the observer panic, the tokens go back before the panic goes
// on: the Reservation that could hand them back never reaches its
// caller, and they would stay spent, or owed, for a job that never runs.
// The hand-back waits on the store no longer than a Wait's refund does
// (refundContext).
func (l *Limiter) observeCharged(ctx context.Context, mode driver.Mode, lim *limit, res Result, start time.Time, ch *charge) {
	returned := false
	defer func() {
		if returned {
			return
		}
		r := &Reservation{lim: l, res: res, charge: *ch}
		// Within the refund timeout, as Wait's refund: a store that does
		// not answer must not hold the panic back for good. With a
		// timeout of 0 and no deadline of the caller's left, there is no
		// time: not sent, as Wait's refund (giveUp), rather than sent on
		// a context already ended, which the store refuses.
		rctx, cancel := l.refundContext(ctx)
		defer cancel()
		var err error
		if rctx.Err() != nil {
			err = fmt.Errorf("ratelimit: cancel reservation of limit %s: not sent: the context has no deadline left, and the refund timeout (WithRefundTimeout) is 0", written(lim.name))
		} else {
			err = r.Cancel(rctx)
		}
		if err != nil && l.logger != nil {
			l.logger.Error("ratelimit: the Observer panicked as it was told of a reservation, whose tokens could not be handed back",
				"limit", lim.name, "err", err)
		}
	}()
	l.observe(ctx, mode, lim, res, start, nil)
	returned = true
}

// observeJob tells the observer, if it is a JobObserver, that the job of
// r that AfterFunc scheduled ended as o (err: why, for a drop or a failed
// refund).
func (l *Limiter) observeJob(ctx context.Context, r *Reservation, o JobOutcome, err error) {
	if l.jobs == nil {
		return
	}
	res := r.res
	res.Token = nil // the caller's (JobEvent.Result)
	l.jobs.ObserveJob(ctx, JobEvent{Result: res, Outcome: o, Inline: r.charge.lim != nil && !r.charge.lim.declared, Err: err})
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
		return timeError(ms)
	}
	return nil
}

// timeError is checkTime's error, apart so that checkTime is inlined.
func timeError(ms int64) error {
	return fmt.Errorf("the clock reads %d ms since 1970, beyond ±%d that every store computes exactly: check the clock given to WithClock: %w",
		ms, driver.MaxTime, ErrTimeRange)
}

// storeTime reads the clock of ts, a store that keeps its own
// (ownClock), for the record id: that of the server that holds it, when
// ts is a driver.RecordClock. It checks it as checkTime checks the
// Limiter's: a server whose clock reads beyond ±driver.MaxTime is an
// error, not a time to judge records or tokens by.
func storeTime(ctx context.Context, ts driver.TimeSource, id driver.RecordID) (int64, error) {
	var now int64
	var err error
	if rc, ok := ts.(driver.RecordClock); ok {
		now, err = rc.RecordNow(ctx, id)
		err = storeError("RecordNow", err)
	} else {
		now, err = ts.Now(ctx)
		err = storeError("Now", err)
	}
	if err != nil {
		return 0, fmt.Errorf("store time: %w", err)
	}
	if now < -driver.MaxTime || now > driver.MaxTime {
		return 0, fmt.Errorf("the store's clock reads %d ms since 1970, beyond ±%d that every store computes exactly: check the clock of the store's server: %w",
			now, driver.MaxTime, ErrTimeRange)
	}
	return now, nil
}

// Reset forgets the state of (name, key) in every shard of its config in
// force, and what the deny cache knew of it: the next call finds a full
// bucket. The phase of a fixed window stays. After Shards was lowered, it
// deletes the records of the shards beyond it too, up to the most shards
// a config declared under the name (New, SetLimits, SetLimit) has had in
// this process, so that raising Shards again finds them missing; records
// of shards only another process, or this one before a restart, declared
// are not deleted: they expire. A store failure is a *StoreError
// (ErrStoreUnavailable): the delete may have taken effect or not, and
// a retry later is the answer.
func (l *Limiter) Reset(ctx context.Context, name, key string, opts ...CallOption) error {
	lim, err := l.resolveOpts(name, opts)
	if err != nil {
		return err
	}
	skey := l.storeKey(key)
	ids := lim.ids(skey, nil)
	for i := len(ids); i < l.shardsHad(name); i++ {
		ids = append(ids, driver.RecordID{Name: name, Key: skey, Shard: i})
	}
	err = storeError("Delete", l.store.Delete(ctx, ids))
	if l.deny != nil {
		// After the delete, failed or not (it may have taken effect): a
		// refused call that read the record before it is not to keep it.
		l.deny.forget(name, skey)
	}
	if err != nil {
		return storeFailure(ctx, "reset limit", name, err)
	}
	return nil
}

// storeFailure is the error of a Reset or a Value (what names it) of
// limit name whose store call failed with err: a *StoreError matching
// ErrStoreUnavailable and err; or err alone, wrapped, for a store that
// its constructor did not make (zeroStore); or, when ctx had ended, the context's
// error, the store's beside it, since the caller gave up, which says
// nothing of the store (as for a settlement, settleStoreErr).
func storeFailure(ctx context.Context, what, name string, err error) error {
	if errors.Is(err, driver.ErrZeroStore) {
		// No outage, and no retry will do: see zeroStore.
		return fmt.Errorf("ratelimit: %s %s: %w", what, written(name), err)
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("ratelimit: %s %s: store: %w", what, written(name), err)
		}
		return fmt.Errorf("ratelimit: %s %s: %w (store: %w)", what, written(name), cerr, err)
	}
	return &StoreError{Name: name, Err: err, op: what}
}

// Value reports the tokens available now for (name, key), each shard
// refreshed to now and a missing shard counting as full. It writes nothing.
// A store failure is a *StoreError (ErrStoreUnavailable).
func (l *Limiter) Value(ctx context.Context, name, key string, opts ...CallOption) (Status, error) {
	lim, err := l.resolveOpts(name, opts)
	if err != nil {
		return Status{}, err
	}
	skey := l.storeKey(key)
	ids := lim.ids(skey, nil)
	recs := make([]driver.Record, len(ids))
	if err := storeError("Load", l.store.Load(ctx, ids, recs)); err != nil {
		return Status{}, storeFailure(ctx, "value of limit", name, err)
	}
	now := l.now().UnixMilli()
	if err := checkTime(now); err != nil {
		return Status{}, fmt.Errorf("ratelimit: value of limit %s: %w", written(name), err)
	}
	if ts := ownClock(l.store); ts != nil {
		if now, err = storeTime(ctx, ts, ids[0]); err != nil {
			if !errors.Is(err, ErrTimeRange) {
				return Status{}, storeFailure(ctx, "value of limit", name, err)
			}
			return Status{}, fmt.Errorf("ratelimit: value of limit %s: %w", written(name), err)
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
