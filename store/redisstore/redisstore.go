// Package redisstore is a ratelimit.Store on Redis, for a fleet of
// processes sharing limits: a single server, Sentinel, a Redis Cluster, or
// a redis.Ring.
//
// # One call decides a batch
//
// The whole transition (ratelimit.Evaluate) runs server-side, in a Redis
// Function (ratelimit.lua, loaded once with FUNCTION LOAD and called with
// FCALL; on servers without Functions, Redis before 7, the same code runs
// as a script with EVALSHA). Redis runs it atomically.
//
// Concurrent calls are coalesced, as a database's group commit does: a call
// that arrives while no round trip to its server is in flight goes at once,
// on its caller's goroutine; calls that arrive while one is in flight wait
// for it and then go together, in one call of the function that decides
// them in order of arrival, each as if alone. A lone caller waits for
// nobody; 64 callers share a few round trips. WithMaxBatch bounds a batch
// and turns coalescing off. An op the function fails on (a record it cannot
// read, a key of another type) fails alone: the function writes nothing
// before it has decided every op, and a call it failed goes again one op
// at a time. A call that may have run (its reply lost to a network error
// or a read timeout) is never sent again, by go-redis or the store, so
// that no op is applied twice: it fails. One that surely did not run (no
// connection, or Redis answered READONLY, LOADING, TRYAGAIN, ...) goes
// again, as often as the client's MaxRetries allow; but not one that
// go-redis itself sent again within a Cluster's pipeline, whose error may
// be of the earlier send.
//
// # Keys
//
// Every record is one Redis key. All records of one ratelimit key, whatever
// the limit's name or shard, share a hash tag derived from the key, so
// they live in one Cluster slot (an op's items share one key). On a
// Cluster, calls coalesce per master, and a batch is one call of the
// function over the slots of its master; when a slot moves, its ops go
// again one call per key, which the client routes. When a master dies, a
// call refused by its address, or dropped, has the client reload its map
// of the slots, so that the calls after it find the replica promoted in
// its place rather than wait for the client's ClusterStateReloadInterval.
// On a Ring, calls coalesce per shard, and a batch is one call per key.
// The store keeps a batcher, and its goroutine, per server it called
// lately: that of a master or a shard that left (a failover, a Ring's
// SetAddrs) goes, once idle, within 2048 calls of the store's to the
// others, or sooner when calls go to a server new to the store.
// Records expire once their bucket would be full again, plus a margin
// (WithExpiryMargin) for calls in flight whose time lags and for
// application clocks that disagree with each other.
//
// # What the server must keep
//
// A record Redis forgets reads as a full bucket. Run Redis with
// persistence and without eviction of the limiter's keys; CheckServer
// says where it does not, and the store logs it once (WithLogger).
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/coalesce"
	"github.com/ratelimit-go/ratelimit/internal/deadline"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix starts every key the store writes, unless WithPrefix
// gives another.
const DefaultPrefix = "ratelimit:"

// DefaultExpiryMargin is how long a record is kept past the moment its
// bucket is full again, unless WithExpiryMargin gives another: as long as
// driver.ExpiryGrace.
const DefaultExpiryMargin = time.Duration(driver.ExpiryGrace) * time.Millisecond

// DefaultMaxBatch is the most calls one round trip carries, unless
// WithMaxBatch says otherwise.
const DefaultMaxBatch = 128

// maxInFlight is the most round trips in flight at once to one server
// (to each master of a Cluster); more calls wait and go together. Three
// let a few callers (8 goroutines) overlap their round trips. The slots
// are shared fairly among all of the store's calls (coalesce.Options.Share):
// 64 callers go in three batches of about 20 rather than some alone, and
// on a Cluster whose masters are equally busy each keeps to about one
// batch in flight, while a master with every call (one hot key) gets
// three. Measured: see docs/performance.md.
const maxInFlight = 3

// probeEvery is how many calls of a store that goes by script because a
// load of its library was refused (FUNCTION LOAD, by its user's ACL) go
// before one goes by the function again (probe): one round trip more in
// as many calls, when the library is still missing, to find it once it
// is loaded again.
const probeEvery = 4096

// Store is a ratelimit.Store on Redis, safe for concurrent use. Build it
// with New: every call of the zero value, or of a nil *Store, Close
// included, fails with an error matching driver.ErrZeroStore.
type Store struct {
	client     redis.UniversalClient
	cluster    *redis.ClusterClient // when client is one
	ring       *redis.Ring          // when client is one
	single     bool                 // one server: a batch is one call
	prefix     string
	serverTime bool
	margin     int64 // ms
	maxBatch   int
	// How often, and after what pauses, a call that did not run goes
	// again: the client's MaxRetries (MaxRedirects on a Cluster) and
	// retry backoffs.
	retries                int
	minBackoff, maxBackoff time.Duration
	// ctxTimeout: the client's ContextTimeoutEnabled, with which go-redis
	// ends a read or write at its context's deadline (callerError).
	ctxTimeout bool

	scripts atomic.Bool // the server has no Functions: use EVALSHA
	// loadRefused: scripts is set because a load of the library was
	// refused (NOPERM), not FCALL: the store goes back to the function
	// when a script is refused too, or when a call sent by the function
	// to try it (probe) finds the library loaded again (leaveScripts).
	loadRefused atomic.Bool
	// scriptCalls counts the calls sent while loadRefused; every
	// probeEvery-th goes by the function instead (probe).
	scriptCalls atomic.Uint64
	probeEvery  uint64
	// routed is set once the Cluster client has told a key's master: it
	// knows the slots from then on (see master).
	routed atomic.Bool
	// The calls coalesce per server: on a Cluster per master, on a Ring
	// per shard (nodes), on one server in one batcher (one).
	nodes *coalesce.Group[string, *request, error]
	one   *coalesce.Batcher[*request, error]

	logger    *slog.Logger
	checkOnce sync.Once
	closed    atomic.Bool // Close was called
	hooks     hooks
}

// hooks let the package's tests watch the store; all nil in use.
type hooks struct {
	apply func(ctx context.Context, r *request)                      // Apply made r, for its caller of ctx
	send  func(ctx context.Context, reqs []*request) context.Context // a batcher sends reqs, with the context it returns
	// loaded: a call that found the library missing had it loaded (or
	// its load refused), before it goes again.
	loaded func()
}

var (
	_ ratelimit.Store     = (*Store)(nil)
	_ driver.TimeSource   = (*Store)(nil)
	_ driver.RecordClock  = (*Store)(nil)
	_ driver.ZeroChecker  = (*Store)(nil)
	_ driver.BatchApplier = (*Store)(nil)
)

// Option configures a Store in New.
type Option func(*options)

type options struct {
	prefix     string
	serverTime bool
	margin     int64 // ms
	maxBatch   int
	logger     *slog.Logger
}

// WithPrefix sets the prefix of every key the store writes (default
// DefaultPrefix), so that several applications may share a server. It
// must not contain '{' or '}', which would change the Cluster hash tag.
func WithPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithServerTime makes the store judge every call at the Redis server's
// time (TIME) instead of the Limiter's clock. Choose it when the
// processes of a fleet have clocks that disagree by more than the
// precision the limits need: the server is then the one clock. On a
// Cluster or a Ring, each key's is the clock of the server that holds
// it, for the calls on it and for the time the Limiter asks for it
// (RecordNow): keep the servers' clocks in step. Tests that drive the
// Limiter's clock by hand cannot use it.
func WithServerTime() Option { return func(o *options) { o.serverTime = true } }

// WithExpiryMargin sets how long a record is kept past the moment its
// bucket is full again (default DefaultExpiryMargin, the least New
// accepts). Redis expires keys on its own clock; the margin covers how far
// the nows of calls in flight may lag (driver.ExpiryGrace) and how far the
// clocks may disagree, so that no record is dropped while a call judged
// before its bucket was full may still read it. Below driver.ExpiryGrace,
// such a call would find a full bucket (in a fixed window, a second
// capacity within one window): New refuses it. Raise it by as much as the
// clocks of the processes sharing the store may disagree.
func WithExpiryMargin(d time.Duration) Option {
	return func(o *options) { o.margin = d.Milliseconds() }
}

// WithMaxBatch sets the most calls one round trip carries (default
// DefaultMaxBatch). 1 turns coalescing off: every call is sent alone, at
// once, however many are in flight. Larger batches share a round trip
// among more calls but hold the server longer in one call. ApplyBatch
// keeps to it too: its ops go in calls of the function of at most n ops,
// pipelined.
func WithMaxBatch(n int) Option { return func(o *options) { o.maxBatch = n } }

// New returns a store on client: a *redis.Client (of redis.NewClient,
// or of redis.NewFailoverClient for Sentinel), a *redis.ClusterClient, or
// a *redis.Ring, as redis.NewUniversalClient returns. A client of another
// type, or a nil one, is refused with an error: the store routes its
// calls, and loads its library, by the client's kind. The store does not
// own the client; close it yourself, after the store (Close). The error is for a bad argument or
// option; New does not talk to the server (CheckServer does).
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	o := options{prefix: DefaultPrefix, margin: DefaultExpiryMargin.Milliseconds(), maxBatch: DefaultMaxBatch,
		logger: slog.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkClient(client); err != nil {
		return nil, err
	}
	switch {
	case strings.ContainsAny(o.prefix, "{}"):
		return nil, fmt.Errorf("redisstore: prefix %q contains a brace, which would change the Cluster hash tag: remove it", o.prefix)
	case o.margin < driver.ExpiryGrace:
		return nil, fmt.Errorf("redisstore: expiry margin %v is below driver.ExpiryGrace (%v): a record would expire while a call "+
			"judged before its bucket was full may still read it, and find a full bucket; pass %v or more",
			time.Duration(o.margin)*time.Millisecond, DefaultExpiryMargin, DefaultExpiryMargin)
	case o.maxBatch < 1:
		return nil, fmt.Errorf("redisstore: max batch %d is below 1: pass 1 (no coalescing) or more", o.maxBatch)
	}
	s := &Store{client: client, prefix: o.prefix, serverTime: o.serverTime, margin: o.margin, maxBatch: o.maxBatch,
		logger: o.logger, probeEvery: probeEvery}
	switch c := client.(type) {
	case *redis.Client:
		s.single = true
		o := c.Options()
		s.retries, s.minBackoff, s.maxBackoff = o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff
		s.ctxTimeout = o.ContextTimeoutEnabled
	case *redis.ClusterClient:
		s.cluster = c
		o := c.Options()
		s.retries, s.minBackoff, s.maxBackoff = o.MaxRedirects, o.MinRetryBackoff, o.MaxRetryBackoff
		s.ctxTimeout = o.ContextTimeoutEnabled
	case *redis.Ring:
		s.ring = c
		o := c.Options()
		s.retries, s.minBackoff, s.maxBackoff = o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff
		s.ctxTimeout = o.ContextTimeoutEnabled
	}
	// Detach: go-redis bounds a read by its own ReadTimeout, not by the
	// caller's context, unless ContextTimeoutEnabled (and never by a
	// cancel); a call sent from another goroutine lets its caller leave
	// on time from a stalled server. Share: a round trip costs Redis much
	// more than a decision it carries, so the slots in flight carry fair
	// shares of many callers rather than one of them alone. Per server:
	// a server that stalls holds only the calls to it.
	co := coalesce.Options{MaxBatch: s.maxBatch, MaxInFlight: maxInFlight, Detach: true, Share: true}
	if !s.single {
		s.nodes = coalesce.NewGroup(s.sendBatch, co)
	} else {
		s.one = coalesce.New(func(ctx context.Context, reqs []*request, errs []error) error {
			return s.sendBatch(ctx, "", reqs, errs)
		}, co)
	}
	return s, nil
}

// sendBatch is the batchers' send: send, to dest.
func (s *Store) sendBatch(ctx context.Context, dest string, reqs []*request, errs []error) error {
	if s.hooks.send != nil {
		ctx = s.hooks.send(ctx, reqs)
	}
	return s.send(ctx, dest, reqs, errs)
}

// checkClient returns an error unless client is one of the kinds the
// store routes its calls for, and not nil: the store sends a batch as one
// call to a server, per master of a Cluster, or per key on a Ring, and
// loads its library on each server; a client of another kind (one that
// wraps these, say) would take its calls elsewhere, and load the library
// on one server of several.
func checkClient(client redis.UniversalClient) error {
	const pass = "pass the client of redis.NewClient, redis.NewFailoverClient, redis.NewClusterClient, redis.NewFailoverClusterClient, redis.NewRing or redis.NewUniversalClient"
	var nilClient bool
	switch c := client.(type) {
	case nil:
		return errors.New("redisstore: New needs a client: " + pass)
	case *redis.Client:
		nilClient = c == nil
	case *redis.ClusterClient:
		nilClient = c == nil
	case *redis.Ring:
		nilClient = c == nil
	default:
		return fmt.Errorf("redisstore: New does not take a client of type %T, whose calls it cannot route: %s (add behaviour to those with hooks: AddHook)", client, pass)
	}
	if nilClient {
		return fmt.Errorf("redisstore: New was given a nil %T: %s", client, pass)
	}
	return nil
}

// OwnClock implements driver.TimeSource: it reports whether the store
// was built WithServerTime: false for a store that New did not make.
func (s *Store) OwnClock() bool { return s != nil && s.serverTime }

// Now implements driver.TimeSource: the server's time in Unix ms. On a
// Cluster or a Ring, it is the time of a server at random (TIME names no
// key: the client sends it to the master of a slot at random, or to a
// shard at random), whose clock may disagree with that of the server of
// any given key. That is not the time to judge a key's records or tokens
// by: RecordNow is. A Limiter never asks it of this store, which is a
// driver.RecordClock: wherever it needs the store's time (Value, a
// settlement) it has a record of the key, and asks RecordNow; no call of
// a Limiter reads the store's time without one. Nor does package
// store/janitor, which reads the time of a store it sweeps
// (driver.Expirer), which this one is not (Redis expires the records).
// Call it for the time of one server, or on a single server.
func (s *Store) Now(ctx context.Context) (int64, error) {
	return s.now(ctx, "Now", "")
}

// RecordNow implements driver.RecordClock: the time in Unix ms of the
// server that holds the record id (the master of its slot on a Cluster,
// its shard on a Ring), whose own TIME the function judges the calls on
// the record at, WithServerTime. The servers of a Cluster or a Ring each
// keep their own clock: read at another, a token would be judged expired,
// or valid, by a clock that the server of its records and its
// settlement's mark does not keep (driver.RecordClock). It is a round
// trip of its own, before the call it serves, through the store's client
// as the store's other calls (its hooks see it; it follows a slot's move):
// on a Cluster or a Ring, a call of the library's time function (FCALL;
// see FunctionLibrary), on the record's key, so that the client sends it
// to the key's server; a slot that moves between the two is judged by the
// clock of its new master, as every call after. It asks of the store's
// user no right that its other calls do not: FCALL, or, on a server
// without Functions or for a user not allowed them, the script that
// answers TIME (EVALSHA), as the store's calls then go by theirs; and
// TIME, which both call, as the decision function does WithServerTime. A
// user allowed neither FCALL nor scripts gets an error that says so.
func (s *Store) RecordNow(ctx context.Context, id driver.RecordID) (int64, error) {
	if err := s.usable(ctx, "RecordNow"); err != nil {
		return 0, err // before Key, which a nil store has no prefix for
	}
	return s.now(ctx, "RecordNow", s.Key(id))
}

// now reads the time of the server that holds key, or of any server for
// "", through the store's client, as every other call of the store goes:
// the client's hooks (AddHook) see it, and it routes it, redirects it
// (MOVED) and sends it again as it does those. TIME names no key, which a
// Ring or a Cluster client would send to a server at random: for a key,
// the library's time function, called on the key, goes to the key's
// server. On a Ring, a read routed to a shard that left it (shardLeft)
// goes again, as a call of the function does.
func (s *Store) now(ctx context.Context, call, key string) (int64, error) {
	if err := s.usable(ctx, call); err != nil {
		return 0, err
	}
	var ms int64
	err := coalesce.Detached(ctx, func() error {
		for tries := 0; ; tries++ {
			var err error
			ms, err = s.readTime(ctx, key)
			s.rerouteAfter(err)
			if err == nil || tries >= s.retries || !s.shardLeft(err) || !sleep(ctx, backoff(tries, s.minBackoff, s.maxBackoff)) {
				return err
			}
		}
	})
	if err != nil {
		return 0, fmt.Errorf("redisstore: time: %w", s.callerError(ctx, err))
	}
	return ms, nil
}

// timeScript returns the time of the server it runs on, as TIME does: the
// library's time function, for servers without Functions.
var timeScript = redis.NewScript("return redis.call('TIME')")

// readTime sends one read of the time (see now), in Unix ms.
func (s *Store) readTime(ctx context.Context, key string) (int64, error) {
	if key == "" || s.single {
		t, err := s.client.Time(ctx).Result()
		return t.UnixMilli(), err
	}
	v, err := s.keyTime(ctx, key)
	if err != nil {
		return 0, err
	}
	if len(v) == 2 {
		sec, err1 := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
		usec, err2 := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
		if err1 == nil && err2 == nil {
			return sec*1000 + usec/1000, nil
		}
	}
	return 0, fmt.Errorf("the server answered %q to TIME, not seconds and microseconds", shown(fmt.Sprint(v), 100))
}

// keyTime calls the library's time function on key (FCALL), and answers
// its reply, TIME's. A server that lacks the library is given it, and
// called once more, as for a call of the decision function (run); when
// that load fails for a passing reason (loadMayPass), the function is
// called again after a pause, within the client's MaxRetries, as run's
// calls are (loadFailed). A server without Functions, or a user not
// allowed them, is sent the time script instead, from then on, as the
// store's calls go by their script then (s.scripts); but for a user
// refused FUNCTION LOAD alone, now and then the function is tried again
// (probe), and the script sent when the library is still missing.
func (s *Store) keyTime(ctx context.Context, key string) ([]any, error) {
	probe := s.probe()
	// byScript: the library found missing, its load refused (or probed):
	// by script from then on, whatever the store's other calls do.
	byScript := false
	for loaded, tries := false, 0; ; {
		if (byScript || s.scripts.Load()) && !probe {
			v, err := timeScript.Run(ctx, s.client, []string{key}).Slice()
			if isScriptRefused(err) && (s.leaveScripts() || byScript) {
				return nil, libraryUnloadable(err)
			}
			if isScriptRefused(err) {
				err = fmt.Errorf("reading the time of a key's server, %w", functionsRefused(lib.timeFunc, err))
			}
			return v, timeRefused(err)
		}
		cmd := redis.NewSliceCmd(ctx, "fcall", lib.timeFunc, 1, key)
		cmd.SetFirstKeyPos(3)
		_ = s.client.Process(ctx, cmd)
		v, err := cmd.Result()
		probed := probe
		probe = false
		switch {
		case probed && isFunctionMissing(err):
			// Still missing: the script, as the store's other calls.
			byScript = true
		case !loaded && isFunctionMissing(err):
			refused, err := s.loadLibrary(ctx)
			if s.hooks.loaded != nil {
				s.hooks.loaded()
			}
			byScript = byScript || refused
			if err != nil {
				if tries >= s.retries || !loadMayPass(err) || !sleep(ctx, backoff(tries, s.minBackoff, s.maxBackoff)) {
					return nil, err
				}
				tries++ // the function again: missing, or loaded meanwhile
				continue
			}
			loaded = true
		case isFunctionMissing(err):
			return nil, fmt.Errorf("the function %s is missing though the store loaded its library: if the library was deleted meanwhile "+
				"(FUNCTION FLUSH or DELETE), call again; otherwise a library of other code is loaded under its name: "+
				"delete it (FUNCTION DELETE %s), and the store loads its own: %w", lib.timeFunc, lib.name, err)
		case isUnknownFCall(err):
			s.scriptsForGood()
		default:
			if probed && err == nil {
				s.leaveScripts()
			}
			return v, timeRefused(err)
		}
	}
}

// probe reports whether a call goes by the function, to try it, though
// the store goes by script for a load of its library refused
// (loadRefused): every probeEvery-th of them does. Once the library is
// loaded again (by a user allowed FUNCTION LOAD), the function answers it,
// and the store's calls go by the function from then on (leaveScripts);
// while it is missing, the call, which did not run ("Function not found"),
// goes by script, one round trip later. Without it, a store that met the
// library missing once went by script for its life: more costly per
// call, and on a Cluster one call per hash tag, not per master.
func (s *Store) probe() bool {
	return s.scripts.Load() && s.loadRefused.Load() && s.scriptCalls.Add(1)%s.probeEvery == 0
}

// scriptsForGood sends the store's calls by script from then on: FCALL
// was refused as such (isUnknownFCall).
func (s *Store) scriptsForGood() {
	s.loadRefused.Store(false)
	s.scripts.Store(true)
}

// leaveScripts sends the store's calls by the function again when they
// went by script for a load of the library refused (loadRefused), and
// reports whether they did: a call by the function found the library
// loaded again (probe), or a script was refused too, so the user may
// call the function alone, and its next call finds the library if it was
// loaded meanwhile (by a user allowed FUNCTION LOAD). Otherwise a user
// allowed FCALL but neither FUNCTION LOAD nor scripts, whose server lost
// the library loaded beforehand (FUNCTION FLUSH, a restart without
// persistence, a new Cluster node), had every call fail for scripts for
// the store's life, though the library was loaded again.
func (s *Store) leaveScripts() bool {
	if !s.loadRefused.CompareAndSwap(true, false) {
		return false
	}
	s.scripts.Store(false)
	return true
}

// libraryUnloadable returns err, a script's refusal after a load of the
// library was refused, with what to do.
func libraryUnloadable(err error) error {
	return fmt.Errorf("the server lacks the store's function library %s, which the store's user may neither load (FUNCTION LOAD) "+
		"nor run as a script (EVALSHA): have it loaded by a user allowed FUNCTION LOAD (a store of that user loads it on its first "+
		"call; the store's next call finds it), or allow this one FUNCTION LOAD (ACL +function|load) or EVALSHA and EVAL "+
		"(+evalsha +eval): %w", lib.name, err)
}

// functionsRefused returns err, a script's refusal (isScriptRefused) to a
// store that goes by script for its function fn refused (isUnknownFCall),
// with what to allow: no call of the store's can be served.
func functionsRefused(fn string, err error) error {
	return fmt.Errorf("the store's user may call neither the library's function (FCALL %s) nor scripts (EVALSHA): allow it FCALL "+
		"(ACL +fcall, and FUNCTION LOAD or a library loaded beforehand: see FunctionLibrary), or, on a server without Functions, "+
		"EVALSHA and EVAL (+evalsha +eval), as all the store's calls need: %w", fn, err)
}

// timeRefused returns err, a read of the time's, with what to do when it
// is Redis refusing, to a user not allowed it by an ACL, the command that
// the time function or script calls, TIME: Redis checks what a function
// calls against its user's ACL ("The user executing the script can't run
// this command", "ACL failure in script" in later releases).
func timeRefused(err error) error {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return err
	}
	if msg := rerr.Error(); strings.Contains(msg, "can't run this command") || strings.Contains(msg, "ACL failure") {
		return fmt.Errorf("the store's user may not read the server's clock: allow it TIME (ACL +time), which the store's "+
			"time function calls, as its decision function does WithServerTime: %w", err)
	}
	return err
}

// isScriptRefused reports whether err is the server's refusal of a
// script before it ran: a user not allowed it (NOPERM, by an ACL), or a
// proxy or server that does not know EVALSHA or EVAL.
func isScriptRefused(err error) bool {
	if err == nil {
		return false
	}
	msg := strings.ToLower(err.Error())
	return (redis.HasErrorPrefix(err, "NOPERM") || strings.Contains(msg, "unknown command")) && strings.Contains(msg, "eval")
}

// Key returns the Redis key of a record. Every record of one ratelimit key
// carries the same hash tag, a digest of the key, so that they share a
// Cluster slot; then come the fields of driver.RecordID.AppendKey in the
// same order, written as text so that redis-cli shows them: the name's
// length, the name, the shard, the key. So no two records share a Redis
// key whatever bytes their names and keys hold. The layout is kept from
// one version to the next (TestKeyLayout): a store that looked elsewhere
// would find every limit full again.
func (s *Store) Key(id driver.RecordID) string {
	h := uint64(fnvOffset) // FNV-1a, as hash/fnv's New64a, without its allocations
	for i := 0; i < len(id.Key); i++ {
		h ^= uint64(id.Key[i])
		h *= fnvPrime
	}
	var prefix string // none for a nil Store, as for the zero one
	if s != nil {
		prefix = s.prefix
	}
	var num [20]byte
	var b strings.Builder
	b.Grow(len(prefix) + 48 + len(id.Name) + len(id.Key))
	b.WriteString(prefix)
	b.WriteByte('{')
	b.Write(strconv.AppendUint(num[:0], h, 16))
	b.WriteByte('}')
	b.Write(strconv.AppendInt(num[:0], int64(len(id.Name)), 10))
	b.WriteByte(':')
	b.WriteString(id.Name)
	b.WriteByte(':')
	b.Write(strconv.AppendInt(num[:0], int64(id.Shard), 10))
	b.WriteByte(':')
	b.WriteString(id.Key)
	return b.String()
}

// The 64-bit FNV-1a parameters.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// usable returns ctx's error if it is done (as the store contract asks
// of every method, closed or not), else, for a store that New did not
// make, an error matching driver.ErrZeroStore, else, once the store is
// closed, an error matching driver.ErrClosed, each naming call, else nil.
func (s *Store) usable(ctx context.Context, call string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil || s.client == nil {
		return s.unmade(call)
	}
	if s.closed.Load() {
		return fmt.Errorf("redisstore: %s: the store was closed (Close): make calls before Close, or on a new store (New): %w", call, driver.ErrClosed)
	}
	return nil
}

// CheckZero implements driver.ZeroChecker: an error matching
// driver.ErrZeroStore for the zero Store or a nil *Store, which New did
// not make, else nil, closed or not.
func (s *Store) CheckZero() error {
	if s == nil || s.client == nil {
		return s.unmade("CheckZero")
	}
	return nil
}

// unmade returns the error of call on s, nil or a Store that New did not
// make (it has no client), which would panic.
func (s *Store) unmade(call string) error {
	what := "the zero redisstore.Store"
	if s == nil {
		what = "a nil *redisstore.Store"
	}
	return fmt.Errorf("redisstore: %s: the store is %s, which New did not make: build it with redisstore.New, and use the store it returns: %w", call, what, driver.ErrZeroStore)
}

// Close ends the goroutines that send the store's calls in the background
// (one per server: per master of a Cluster, per shard of a Ring), each once it has sent what it
// is sending; calls in flight are answered. A call still queued, or
// waiting to go again after Redis refused it, is not sent: it fails with
// driver.ErrClosed, and charged nothing. It does not close the client,
// which the store does not own. It is idempotent; the store's methods
// return driver.ErrClosed afterwards. Close of a store that New did not
// make does nothing, and returns the error of its every call
// (driver.ErrZeroStore).
func (s *Store) Close() error {
	if s == nil || s.client == nil {
		return s.unmade("Close")
	}
	s.closed.Store(true)
	if s.nodes != nil {
		s.nodes.Close()
	} else {
		s.one.Close()
	}
	return nil
}

// callerError returns err, the error of a call made with ctx, wrapped so
// that it matches ctx's error too (errors.Is) when ctx has ended: the
// caller's deadline or cancel then ended the call, not the server. On a
// client with ContextTimeoutEnabled, go-redis stops a read or write at
// ctx's deadline with a network timeout ("i/o timeout"), often a moment
// before ctx itself reports its end, and its goroutine may report it
// before the caller sees ctx end: the error then read as the server's
// failure, and a Limiter counted it against the store. So such a timeout,
// once the wall clock is past ctx's deadline, matches
// context.DeadlineExceeded too. Only that one: go-redis read the deadline
// as a time of the wall clock, which other errors owe nothing to, and a
// deadline may be of another clock (a test's mock.WithTimeout, or the
// Limiter's check of the store on a mock clock), which the wall clock
// may be past long before the context ends (the rule of
// internal/deadline: such a deadline is Unmet); a connection refused, or
// a read timeout of a client without ContextTimeoutEnabled (the server's
// slowness), then read as the caller's deadline. nil stays nil: a call
// answered is answered, even if ctx ended meanwhile. The error of a
// client the caller closed (redis.ErrClosed) matches driver.ErrClosed
// too, as a closed store's does: the store can do nothing more. Not that
// of a shard's client on a Ring still open (shardLeft): the shard left
// the Ring under the call each time it was sent, as often as the
// client's MaxRetries allow, and a call made again goes to the shards of
// the Ring then. The error of an ApplyBatch that joins a *driver.OpError
// for each op left out keeps that shape: each op's failure is wrapped, not
// the join, so that the joined error's Unwrap() []error still lists the
// ops, as the driver's contract says (errors.Is matches the wrapping all
// the same).
func (s *Store) callerError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ops := opErrors(err); ops != nil {
		errs := make([]error, len(ops))
		for i, oe := range ops {
			errs[i] = &driver.OpError{Index: oe.Index, Err: s.callerError(ctx, oe.Err)}
		}
		return errors.Join(errs...)
	}
	if errors.Is(err, redis.ErrClosed) && !errors.Is(err, driver.ErrClosed) {
		if s.shardLeft(err) {
			err = fmt.Errorf("a shard left the Ring (SetAddrs) under the call each time the store sent it, as often as the client's MaxRetries "+
				"allow: call again: %w", err)
		} else {
			err = fmt.Errorf("the store's client was closed: close the client after the store's last call: %w: %w", driver.ErrClosed, err)
		}
	}
	cerr := ctx.Err()
	if cerr == nil && s.ctxTimeout && isTimeout(err) {
		if _, st := deadline.Of(ctx); st.Past() {
			// The context's timer is due, and runs a moment later:
			// without the wait, a Limiter given an error matching
			// context.DeadlineExceeded, from a context not ended yet,
			// took the caller's deadline for the store's failure and
			// counted it towards the breaker. A context not ended
			// in time (deadline.Await) has a deadline of another clock
			// (a mock's); the timeout matches context.DeadlineExceeded
			// all the same.
			if cerr = deadline.Await(ctx); cerr == nil {
				cerr = context.DeadlineExceeded
			}
		}
	}
	if cerr == nil || errors.Is(err, cerr) {
		return err
	}
	return fmt.Errorf("%w: %w", cerr, err)
}

// opErrors returns the *driver.OpErrors that err joins, if it is a join
// of nothing else (ApplyBatch's error for the ops it left out), else nil.
func opErrors(err error) []*driver.OpError {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return nil
	}
	errs := j.Unwrap()
	ops := make([]*driver.OpError, 0, len(errs))
	for _, e := range errs {
		oe, ok := e.(*driver.OpError)
		if !ok {
			return nil
		}
		ops = append(ops, oe)
	}
	if len(ops) == 0 {
		return nil
	}
	return ops
}

// isTimeout reports whether err is a network timeout: a read, write or
// dial that passed its deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Load implements ratelimit.Store: one pipeline of GETs, which a Cluster
// client splits by node. It returns when ctx ends, whatever the server.
func (s *Store) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	if err := s.usable(ctx, "Load"); err != nil {
		return err
	}
	if err := driver.CheckRecords(ids, out); err != nil {
		return fmt.Errorf("redisstore: Load: %w", err)
	}
	cmds := make([]redis.Cmder, len(ids))
	err := coalesce.Detached(ctx, func() error {
		return s.pipeline(ctx, cmds, func(i int) redis.Cmder { return redis.NewStringCmd(ctx, "get", s.Key(ids[i])) })
	})
	if err != nil && !errors.Is(err, redis.Nil) && !isWrongType(err) {
		return fmt.Errorf("redisstore: load: %w", s.callerError(ctx, err))
	}
	for i, c := range cmds {
		raw, err := c.(*redis.StringCmd).Result()
		if errors.Is(err, redis.Nil) {
			out[i] = driver.Record{}
			continue
		}
		if isWrongType(err) {
			key := s.Key(ids[i])
			return fmt.Errorf("redisstore: load: %w", badRecord(fmt.Sprintf("key %q holds %s, not a string", shown(key, 1000), s.typeOf(ctx, key))))
		}
		if err != nil {
			return fmt.Errorf("redisstore: load: %w", s.callerError(ctx, err))
		}
		st, err := parseState(raw)
		if err != nil {
			return fmt.Errorf("redisstore: load: %w", badRecord(fmt.Sprintf("key %q holds %q (%v)", shown(s.Key(ids[i]), 1000), shown(raw, 40), err)))
		}
		out[i] = driver.Record{State: st, Found: true}
	}
	return nil
}

// isWrongType reports whether err is Redis's answer to GET on a key of
// another type than a string.
func isWrongType(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "WRONGTYPE")
}

// typeOf returns the type of key, for an error's text: "a hash", "a list",
// ...; "another type" when the server does not say.
func (s *Store) typeOf(ctx context.Context, key string) string {
	cmd := redis.NewStatusCmd(ctx, "type", key)
	if err := coalesce.Detached(ctx, func() error { return s.client.Process(ctx, cmd) }); err != nil || cmd.Val() == "" {
		return "another type"
	}
	return "a " + cmd.Val()
}

// pipeline sets cmds[i] to cmd(i), a command on one key, for every i, and
// sends them in one pipeline, which a Cluster client or a Ring splits by
// server, and returns the first error. On a Ring, the commands the Ring
// routed to a shard that left it before they were sent (shardLeft) did
// not run: they go again, made anew, to the shard that holds their key
// now, after a pause, as often as the client's MaxRetries allow, as a
// call of the function does (run).
func (s *Store) pipeline(ctx context.Context, cmds []redis.Cmder, cmd func(i int) redis.Cmder) error {
	todo := indexes(len(cmds))
	for i := range cmds {
		cmds[i] = cmd(i)
	}
	for tries := 0; ; tries++ {
		_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range todo {
				_ = p.Process(ctx, cmds[i])
			}
			return nil
		})
		for _, i := range todo {
			s.rerouteAfter(cmds[i].Err())
		}
		var again []int
		if s.ring != nil && tries < s.retries {
			for _, i := range todo {
				if s.shardLeft(cmds[i].Err()) {
					again = append(again, i)
				}
			}
		}
		if len(again) == 0 {
			for _, c := range cmds {
				if c.Err() != nil {
					return c.Err()
				}
			}
			return err
		}
		if !sleep(ctx, backoff(tries, s.minBackoff, s.maxBackoff)) {
			return fmt.Errorf("%w: the commands were not sent again after: %w", ctx.Err(), cmds[again[0]].Err())
		}
		for _, i := range again {
			cmds[i] = cmd(i)
		}
		todo = again
	}
}

// ErrBadRecord is matched by the error of a call (Apply, ApplyBatch, Load)
// that met, where a record of the store belongs, a string that is none, or
// a key of another type (a hash, a list, ...): a value written there by
// something else, or cut short. The error names the key. The call changed
// nothing; every call on that record fails until the key is deleted.
//
// It is matched too by the error of a settlement (a refund with a
// driver.Settlement: a Limiter's Use, Refund, Settle or
// Reservation.Cancel) whose mark's key holds what is no mark of a cancel
// or a use: the token may have been settled already, so the store
// settles it no more, and writes nothing for the op.
//
// It is driver.ErrBadRecord, the error every store gives for what no
// release of it writes.
var ErrBadRecord = driver.ErrBadRecord

// badRecord returns the error, matching ErrBadRecord, for what (the key
// and the string it holds) and what to do.
func badRecord(what string) error {
	return fmt.Errorf("%w: %s: delete the key (its limit starts full again); if keys under the store's prefix are written by something else, give the store a prefix of its own (WithPrefix)", ErrBadRecord, what)
}

// badMark returns the error, matching ErrBadRecord, for what (the key of
// a settlement's mark and what it holds, which is no mark) and what to do.
func badMark(what string) error {
	return fmt.Errorf("%w: %s, which is no settlement's mark of this store: the token may have been settled already: "+
		"treat it as settled (do not run its job, nor hand its tokens back); once the token has expired (Token.Expires), delete the key; "+
		"if keys under the store's prefix are written by something else, give the store a prefix of its own (WithPrefix)", ErrBadRecord, what)
}

// asBadRecord returns err, a call's error, as badRecord's or badMark's
// when it is the function failing on a string it cannot read or a key of
// another type (BADRECORD at a record's key, BADMARK at a mark's, from
// fail in ratelimit.lua, which names the key and what it holds). Redis
// appends the function and line, which are left out.
func asBadRecord(err error) error {
	if err == nil {
		return err
	}
	as := badRecord
	if !redis.HasErrorPrefix(err, "BADRECORD") {
		if !redis.HasErrorPrefix(err, "BADMARK") {
			return err
		}
		as = badMark
	}
	_, what, _ := strings.Cut(err.Error(), " ")
	if i := strings.LastIndex(what, " script: "); i >= 0 {
		what = what[:i]
	}
	return as(what)
}

// shown returns at most the first n bytes of s, for an error's text, as
// ratelimit.lua's shown does.
func shown(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// parseState reads a record: "\x01" and three little-endian doubles,
// value, ts and the key's expiry; or, as earlier versions wrote it, the
// text "<value> <ts>". ratelimit.lua's parse accepts the same strings:
// its gonum reads a number as ParseFloat does, and fails where it fails
// ("0x10", "-nan", "1e400"), which Lua's tonumber alone would not; and
// both refuse a state that no release writes (driver.CheckState).
func parseState(raw string) (driver.State, error) {
	if len(raw) > 0 && raw[0] == 1 {
		if len(raw) != recordSize {
			return driver.State{}, fmt.Errorf("a record is %d bytes, not %d", recordSize, len(raw))
		}
		return checkState(f64(raw[1:]), f64(raw[9:]))
	}
	v, ts, ok := strings.Cut(raw, " ")
	if !ok {
		return driver.State{}, errors.New(`not "<value> <ts>"`)
	}
	value, err1 := strconv.ParseFloat(v, 64)
	t, err2 := strconv.ParseFloat(ts, 64)
	if err := errors.Join(err1, err2); err != nil {
		return driver.State{}, err
	}
	return checkState(value, t)
}

// checkState returns the state of a record that holds v tokens at ts, as
// read, or an error if it is one that no release writes
// (driver.CheckState): ts is checked before it is made an int64, which
// for NaN or a double beyond the int64s would be any number. The function
// makes the same comparisons (ratelimit.lua's parse and decode).
func checkState(v, ts float64) (driver.State, error) {
	if ts >= float64(driver.MinRecordTime) && ts <= float64(driver.MaxTime) {
		st := driver.State{Remaining: v, TS: int64(ts)}
		return st, driver.CheckState(st)
	}
	return driver.State{}, fmt.Errorf("its time is %v ms from 1970, and a record's is from %d to %d ms", ts, driver.MinRecordTime, driver.MaxTime)
}

// recordSize is the bytes of a record: a version byte and three doubles.
const recordSize = 1 + 3*8

// Delete implements ratelimit.Store: one pipeline of DELs. It returns
// when ctx ends, whatever the server.
func (s *Store) Delete(ctx context.Context, ids []driver.RecordID) error {
	if err := s.usable(ctx, "Delete"); err != nil {
		return err
	}
	cmds := make([]redis.Cmder, len(ids))
	if err := coalesce.Detached(ctx, func() error {
		return s.pipeline(ctx, cmds, func(i int) redis.Cmder { return redis.NewIntCmd(ctx, "del", s.Key(ids[i])) })
	}); err != nil {
		return fmt.Errorf("redisstore: delete: %w", s.callerError(ctx, err))
	}
	return nil
}
