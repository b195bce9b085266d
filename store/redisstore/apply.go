package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/coalesce"
	"github.com/redis/go-redis/v9"
)

//go:embed ratelimit.lua
var luaSource string

// library is ratelimit.lua as a Redis Function library and as a script.
type library struct {
	// name names the library and its decision function: "ratelimit_"
	// and a digest of the code, so that processes running different
	// versions of the store against one server each find their own.
	name string
	// timeFunc names its other function, which answers TIME (RecordNow):
	// name and "_time". Redis keeps one namespace of functions for all
	// libraries: each version's carry its digest, so that they load side
	// by side.
	timeFunc string
	code     string // FUNCTION LOAD's argument
	// For servers without Functions: the script and its SHA-1 (EVALSHA).
	script, sha string
}

var lib = newLibrary(luaConstants.Replace(luaSource))

// luaConstants writes the constants of package driver into ratelimit.lua,
// in the forms that read back as the same values in Lua.
var luaConstants = strings.NewReplacer(
	"{{NOISE}}", strconv.FormatFloat(driver.Noise, 'g', -1, 64),
	"{{MAX_RETRY}}", strconv.FormatInt(driver.MaxRetryAfter, 10),
	"{{GRACE}}", strconv.FormatInt(driver.ExpiryGrace, 10),
	"{{FIXED}}", strconv.Itoa(int(driver.FixedWindow)),
	"{{MODE_LIMIT}}", strconv.Itoa(int(driver.ModeLimit)),
	"{{MODE_REFUND}}", strconv.Itoa(int(driver.ModeRefund)),
	"{{PAIR_TRIES}}", strconv.Itoa(driver.PairTries),
	"{{WAIT_TRIES}}", strconv.Itoa(driver.WaitTries),
	"{{MIN_TS}}", strconv.FormatInt(driver.MinRecordTime, 10),
	"{{MAX_TS}}", strconv.FormatInt(driver.MaxTime, 10),
)

// registrations registers the library's functions, named after the
// library ({{NAME}}): apply, which decides a batch, and one that answers
// the TIME of the server it runs on, as TIME does, for RecordNow: called
// on a record's key, it goes where the key's calls go. It writes nothing
// (no-writes), so that Redis runs it wherever it would run TIME.
const registrations = "\nredis.register_function{function_name='{{NAME}}', callback=apply, flags={'allow-cross-slot-keys'}}\n" +
	"redis.register_function{function_name='{{NAME}}_time', callback=function() return redis.call('TIME') end, flags={'no-writes'}}\n"

func newLibrary(src string) library {
	// The digest covers the registrations as well as src: a library that
	// registers other functions, or with other flags, is another, loaded
	// under a name of its own beside one of an earlier version, which its
	// stores keep calling. Under the same name, the store's load would
	// find the earlier library ("already exists"), and call functions
	// that it does not have.
	sum := sha1.Sum([]byte(src + registrations))
	name := "ratelimit_" + hex.EncodeToString(sum[:8])
	// No shebang (#!lua): Redis runs a script without flags as before 7,
	// letting it reach keys of several slots of its node that it does not
	// declare, as the function's allow-cross-slot-keys does, so that a
	// call over several slots may go by script too (a load refused).
	script := src + "\nreturn apply(KEYS, ARGV)\n"
	sha := sha1.Sum([]byte(script))
	return library{
		name:     name,
		timeFunc: name + "_time",
		code:     "#!lua name=" + name + "\n" + src + strings.ReplaceAll(registrations, "{{NAME}}", name),
		script:   script,
		sha:      hex.EncodeToString(sha[:]),
	}
}

// FunctionLibrary returns the name of the Redis Function library the store
// loads (FUNCTION LOAD) on first use, and calls (FCALL). The name carries a
// digest of the code: a store of another version loads a library of its
// own beside it. Its functions are named after it: the name, which
// decides the calls, and the name followed by "_time", which answers the
// server's TIME (RecordNow). Remove the libraries of versions no longer
// deployed with FUNCTION DELETE.
func FunctionLibrary() string { return lib.name }

// limit is the part of driver.Params that the records of one limit
// share: it travels once per batch, whatever the number of records.
type limit struct {
	kind                        ratelimit.Kind
	rate, capacity, maxReserved float64
	period                      int64
}

// same reports whether l and m are the same bits.
func (l limit) same(m limit) bool {
	return l.kind == m.kind && l.period == m.period && math.Float64bits(l.rate) == math.Float64bits(m.rate) &&
		math.Float64bits(l.capacity) == math.Float64bits(m.capacity) && math.Float64bits(l.maxReserved) == math.Float64bits(m.maxReserved)
}

func limitOf(p driver.Params) limit {
	return limit{kind: p.Kind, rate: p.Rate, period: p.Period, capacity: p.Capacity, maxReserved: p.MaxReserved}
}

// request is one op, copied out of the caller's memory into the store's
// in the caller's goroutine (the Limiter reuses its ops once Apply
// returns, and a caller may leave while its op is in flight), with the
// decisions the batch that carries it writes back.
type request struct {
	mode    driver.Mode
	reserve bool
	now     int64
	items   []item
	keys    []string // the Redis keys of its records, item by item, shard by shard; then its mark's
	out     []driver.Decision
	// settle is the op's settlement, if any (kind 0: none).
	settle driver.Settlement
	// lost: the op's call failed and may have run (unrun says), its
	// answer lost: the op may have been decided and charged.
	lost bool
}

type item struct {
	count  float64
	at     int64 // a refund: when the tokens were charged
	run    int64 // a refund: when the job of the charge may run
	n      int   // shards: 1 or 2
	shards [2]shard
}

type shard struct {
	lim   limit
	phase int64
}

var requests = sync.Pool{New: func() any { return new(request) }}

// newRequest copies op, valid (driver.CheckOp), into a request of the
// store's.
func (s *Store) newRequest(op *driver.Op) *request {
	r := requests.Get().(*request)
	r.mode, r.reserve, r.now = op.Mode, op.Reserve, op.Now
	r.items, r.keys = r.items[:0], r.keys[:0]
	r.settle, r.lost = driver.Settlement{}, false
	if op.Settle != nil {
		r.settle = *op.Settle
	}
	for i := range op.Items {
		it := &op.Items[i]
		ri := item{count: it.Count, at: it.At, run: it.Run, n: len(it.Shards)}
		for j, sh := range it.Shards {
			ri.shards[j] = shard{lim: limitOf(sh.Params), phase: sh.Params.Phase}
			r.keys = append(r.keys, s.Key(driver.RecordID{Name: it.Name, Key: it.Key, Shard: sh.Index}))
		}
		r.items = append(r.items, ri)
	}
	if r.settle.Kind != 0 {
		r.keys = append(r.keys, markKey(r.keys[0], r.settle.ID))
	}
	r.out = slices.Grow(r.out[:0], len(op.Items))[:len(op.Items)]
	return r
}

// markKey returns the Redis key of the mark of the settlement id, beside
// the record rec of its op: the same prefix and hash tag (so that a
// Cluster keeps it in the slot of the op's records), then "s:" and the ID
// in hex. No record's key has a letter after its tag.
func markKey(rec string, id [16]byte) string {
	j := strings.IndexByte(rec, '}')
	return rec[:j+1] + "s:" + hex.EncodeToString(id[:])
}

// release returns r to the pool. Only a request that no batch in flight
// holds may be released.
func release(r *request) {
	clear(r.keys) // drop the strings
	requests.Put(r)
}

// tag returns the hash tag of the request's records (all share it).
func (r *request) tag() string {
	k := r.keys[0]
	i := strings.IndexByte(k, '{')
	j := strings.IndexByte(k, '}')
	return k[i+1 : j]
}

// Apply implements ratelimit.Store. The op goes at once when no round trip
// to its Redis server is in flight; otherwise it waits for that round trip
// and goes with the other ops that arrived meanwhile, in one call of the
// function. An out shorter than op's items, or an invalid op
// (driver.CheckOp), is refused with an error, and nothing is sent. When
// ctx ends first, Apply returns an error matching ctx's, whether the op
// was still queued (it was not sent, and charged nothing) or in flight
// (it may have been decided and charged): the error does not say which.
func (s *Store) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if err := s.usable(ctx, "Apply"); err != nil {
		return err
	}
	if err := driver.CheckOut(op, out); err != nil {
		return fmt.Errorf("redisstore: Apply: %w", err)
	}
	if len(op.Items) == 0 {
		return nil // nothing to decide or write
	}
	r := s.newRequest(op)
	if s.hooks.apply != nil {
		s.hooks.apply(ctx, r)
	}
	var res, err error
	if s.nodes == nil {
		res, err = s.one.Do(ctx, r)
	} else {
		var node string
		if node, err = s.server(ctx, r); err != nil {
			release(r)
			return fmt.Errorf("redisstore: apply: %w", s.callerError(ctx, err))
		}
		res, err = s.nodes.Do(ctx, node, r)
	}
	if err == nil {
		err = res
	}
	if err != nil {
		// r may still be in a batch in flight: leave it to the collector.
		return fmt.Errorf("redisstore: apply: %w", s.callerError(ctx, err))
	}
	copy(out, r.out)
	release(r)
	s.warnOnce()
	return nil
}

// ApplyBatch implements driver.BatchApplier: the ops in one round trip
// (on a Cluster, one per node), decided in order, each op atomic, in calls
// of the function of at most WithMaxBatch ops each, pipelined. Outs of
// the wrong length, or an invalid op, are refused with an error, and
// nothing is sent. It returns when ctx ends, whatever the client's
// timeouts; the ops may then have been decided. An op that fails on its
// own (a record it cannot read: ErrBadRecord) fails alone: the others are
// decided and their outs filled, and the error joins a *driver.OpError
// for each op that failed, undecided, as does each op whose call surely
// did not run (never sent, or refused by Redis). One whose call failed
// and may have run (its answer lost: a read timeout, a connection dropped
// after the call was written) may have been decided and charged: it is no
// *OpError, and the error is then the batch's, naming the op, under which
// any op of the batch may have been decided.
func (s *Store) ApplyBatch(ctx context.Context, ops []*driver.Op, outs [][]driver.Decision) error {
	if err := s.usable(ctx, "ApplyBatch"); err != nil {
		return err
	}
	if err := driver.CheckOuts(ops, outs); err != nil {
		return fmt.Errorf("redisstore: ApplyBatch: %w", err)
	}
	reqs := make([]*request, 0, len(ops))
	at := make([]int, 0, len(ops)) // the op of each request
	for i, op := range ops {
		if len(op.Items) == 0 {
			continue
		}
		reqs = append(reqs, s.newRequest(op))
		at = append(at, i)
	}
	if len(reqs) == 0 {
		return nil
	}
	errs := make([]error, len(reqs))
	// Detached, as Apply's calls are by the batcher: the caller's context,
	// not go-redis's read timeout, bounds the wait. When ctx ends first,
	// send finishes in the background, writing only reqs and errs, which
	// are not read then.
	if err := coalesce.Detached(ctx, func() error { return s.send(ctx, "", reqs, errs) }); err != nil {
		return fmt.Errorf("redisstore: apply batch: %w", s.callerError(ctx, err))
	}
	var failed []error
	lost := -1
	for j, r := range reqs {
		if errs[j] != nil {
			if r.lost && lost < 0 {
				lost = j
			}
			failed = append(failed, &driver.OpError{Index: at[j], Err: fmt.Errorf("redisstore: %w", errs[j])})
			continue
		}
		copy(outs[at[j]], r.out)
		release(r)
	}
	if lost >= 0 {
		// Not an *OpError, which says that its op was not decided.
		return s.callerError(ctx, fmt.Errorf("redisstore: apply batch: op %d of the batch: the op may have been decided and charged, its answer lost: %w",
			at[lost], errs[lost]))
	}
	if failed != nil {
		return s.callerError(ctx, errors.Join(failed...))
	}
	s.warnOnce()
	return nil
}

// server returns the address of the server r goes to, whose calls
// coalesce apart from the others': the master of its slot on a Cluster
// (master), its shard on a Ring, which go-redis tells from memory.
func (s *Store) server(ctx context.Context, r *request) (string, error) {
	if s.cluster != nil {
		return s.master(ctx, r)
	}
	c, err := s.ring.GetShardClientForKey(r.keys[0])
	if err != nil {
		return "", err
	}
	return c.Options().Addr, nil
}

// master returns the address of the Cluster master that serves r's slot.
// Until the client knows the Cluster's slots, it asks a node for them
// (CLUSTER SLOTS), a read that go-redis bounds by its ReadTimeout only
// (not at all with -1), not by ctx: that lookup goes from a goroutine of
// its own (coalesce.Detached), so that its caller leaves when ctx ends,
// as from any call of the store. Once the client has told a master, it
// knows the slots, and tells the next from memory (it reloads them in the
// background): the lookup stays on the caller's goroutine.
func (s *Store) master(ctx context.Context, r *request) (string, error) {
	if s.routed.Load() {
		// The common case, kept free of the closure below, which escapes.
		node, err := s.cluster.MasterForKey(ctx, r.keys[0])
		if err != nil {
			return "", err
		}
		return node.Options().Addr, nil
	}
	var node *redis.Client
	key := r.keys[0] // read here: r goes back to its pool while a lookup left behind may go on
	if err := coalesce.Detached(ctx, func() (err error) {
		node, err = s.cluster.MasterForKey(ctx, key)
		return err
	}); err != nil {
		return "", err
	}
	s.routed.Store(true)
	return node.Options().Addr, nil
}

// send decides reqs, in order, filling errs (one per request). On a single
// server, or Sentinel, they go in one call of the function. On a Cluster,
// in one call per master (dest, if known): the function may read and
// write keys of several slots of its node; when a slot has moved (or is
// moving, or the Cluster is down), Redis refuses such a call before it
// writes anything, and its ops go again in one call per hash tag (their
// records share a slot), pipelined, which the client routes and
// redirects by itself. Elsewhere (a Ring, or a server without Functions),
// in one call per hash tag.
func (s *Store) send(ctx context.Context, dest string, reqs []*request, errs []error) error {
	if s.single {
		c := &fcall{reqs: reqs, at: indexes(len(reqs))}
		s.run(ctx, s.bound([]*fcall{c}), errs)
		return nil
	}
	calls := groupByTag(reqs)
	if s.cluster != nil && !s.scripts.Load() && len(calls) > 1 {
		calls = s.byMaster(ctx, dest, calls)
	}
	s.run(ctx, s.bound(calls), errs)
	return nil
}

// bound splits the calls of more than WithMaxBatch requests (an
// ApplyBatch's; the batcher's batches are never larger) into calls of at
// most that many, in order, so that no call of the function holds the
// server longer than the option allows: a call over several slots into
// calls over some of its parts, a part larger than the bound into calls of
// its requests. They go together, pipelined, in one round trip.
func (s *Store) bound(calls []*fcall) []*fcall {
	over := false
	for _, c := range calls {
		over = over || len(c.reqs) > s.maxBatch
	}
	if !over {
		return calls // the common case: nothing to allocate
	}
	var out []*fcall
	for _, c := range calls {
		if len(c.reqs) <= s.maxBatch {
			out = append(out, c)
			continue
		}
		if !c.slots {
			for i := 0; i < len(c.reqs); i += s.maxBatch {
				j := min(i+s.maxBatch, len(c.reqs))
				out = append(out, &fcall{reqs: c.reqs[i:j:j], at: c.at[i:j:j]})
			}
			continue
		}
		var cur *fcall
		for _, p := range c.parts {
			if cur != nil && len(cur.reqs)+len(p.reqs) > s.maxBatch {
				out = append(out, cur.single())
				cur = nil
			}
			if len(p.reqs) > s.maxBatch {
				out = append(out, s.bound([]*fcall{p})...)
				continue
			}
			if cur == nil {
				cur = &fcall{slots: true}
			}
			cur.reqs = append(cur.reqs, p.reqs...)
			cur.at = append(cur.at, p.at...)
			cur.parts = append(cur.parts, p)
		}
		if cur != nil {
			out = append(out, cur.single())
		}
	}
	return out
}

// single returns c, a call over the slots of its parts, or its one part
// when it has only one.
func (c *fcall) single() *fcall {
	if len(c.parts) == 1 {
		return c.parts[0]
	}
	return c
}

// upTo holds 0, 1, 2, …: the indexes of a batch's requests.
var upTo = func() []int {
	is := make([]int, 1024)
	for i := range is {
		is[i] = i
	}
	return is
}()

// indexes returns 0, 1, …, n-1; callers must not change it.
func indexes(n int) []int {
	if n <= len(upTo) {
		return upTo[:n:n]
	}
	is := make([]int, n)
	for i := range is {
		is[i] = i
	}
	return is
}

// groupByTag splits reqs into one call per hash tag, keeping the order of
// arrival within each.
func groupByTag(reqs []*request) []*fcall {
	var calls []*fcall
	byTag := make(map[string]*fcall, len(reqs))
	for i, r := range reqs {
		t := r.tag()
		c := byTag[t]
		if c == nil {
			c = &fcall{}
			byTag[t] = c
			calls = append(calls, c)
		}
		c.reqs = append(c.reqs, r)
		c.at = append(c.at, i)
	}
	return calls
}

// byMaster merges the calls (one per hash tag) that go to one master into
// one call over several slots, which keeps them as its parts.
func (s *Store) byMaster(ctx context.Context, dest string, tags []*fcall) []*fcall {
	var calls []*fcall
	byNode := make(map[string]*fcall)
	for _, t := range tags {
		node := dest
		if node == "" {
			var err error
			if node, err = s.master(ctx, t.reqs[0]); err != nil {
				calls = append(calls, t) // the client will find its way
				continue
			}
		}
		c := byNode[node]
		if c == nil {
			c = &fcall{slots: true}
			byNode[node] = c
			calls = append(calls, c)
		}
		c.reqs = append(c.reqs, t.reqs...)
		c.at = append(c.at, t.at...)
		c.parts = append(c.parts, t)
	}
	for i, c := range calls {
		if len(c.parts) == 1 {
			calls[i] = c.parts[0]
		}
	}
	return calls
}

// fcall is one call of the function over requests that share a slot or,
// with slots, over the slots of one Cluster master.
type fcall struct {
	reqs  []*request
	at    []int // the index of each request in the batch
	slots bool  // its keys lie in several slots: they travel as arguments
	// Sent again once the library was loaded (reloaded), once the store
	// turned to scripts (scripted): each once, whatever else met it.
	reloaded, scripted bool
	// script: sent by script (EVALSHA), not by the function (FCALL).
	// probe: sent by the function though the store goes by script for a
	// load refused (Store.probe); probed: that found the library missing.
	// byScript: the call found the library missing and its load refused
	// (or probed): it goes by script from then on, whatever the store's
	// other calls do meanwhile (leaveScripts), rather than find the
	// library missing once more and fail.
	script, probe, probed, byScript bool
	// piped: it went in a Cluster client's pipeline, whose calls go-redis
	// sends again within the pipeline after a redirection or a missing
	// connection (resent); when that send loses its answer, the call keeps
	// the error of the first, though it may have run.
	piped bool
	parts []*fcall
	enc   *encoder
	cmd   redis.Cmder
	err   error
	tries int // times sent again after an answer that it did not run (unsent)
}

// run makes the calls, one pipeline for several, decodes their replies
// into their requests, and sets errs (one per request of the batch). A
// call over several slots that Redis refused for a slot on the move is
// replaced by its parts, made once more. A server that lost the library
// (a restart without persistence, FUNCTION FLUSH, a new node) is given it
// again, and the calls that failed for it are made once more, or, when
// that load failed for a passing reason, go again after a pause (loadFailed); a server
// without Functions (Redis before 7) is sent the script instead, from then
// on, as is a user refused the load, but for a call now and then that
// tries the function (probe) and, finding the library still missing
// (nothing ran), goes by script. A call that surely did not run (unsent: no connection, or Redis
// refused it for its state; on a Ring, routed to a shard that left it:
// shardLeft) goes again after a pause, as often as the
// client's MaxRetries (MaxRedirects on a Cluster) allow; go-redis itself
// sends none again (command), since it would after an error that leaves
// the call run or not, except within a Cluster's pipeline, after which
// such an answer may be stale (resent). A call of several requests that
// the function failed on what one of them read (isOpError) is replaced by
// one call per request, so that only that request's caller gets the
// error. Once the store is closed, no call goes (again): each fails with
// driver.ErrClosed.
func (s *Store) run(ctx context.Context, calls []*fcall, errs []error) {
	pending := calls
	for len(pending) > 0 {
		if s.closed.Load() {
			// Closed since these calls were queued, or refused: none of
			// them ran, nor goes now (as none made after Close does).
			for _, c := range pending {
				err := fmt.Errorf("%w: the call was not sent", driver.ErrClosed)
				if c.err != nil {
					err = fmt.Errorf("%w: the call was not sent again after: %w", driver.ErrClosed, c.err)
				}
				for _, i := range c.at {
					errs[i] = err
				}
			}
			break
		}
		for _, c := range pending {
			if c.enc == nil {
				c.enc = encoders.Get().(*encoder)
				c.enc.encode(c.reqs, s.serverTime, s.margin, c.slots)
			}
			// Only a call's first send may try the function.
			c.probe = c.cmd == nil && !c.probed && s.probe()
			c.script = !c.probe && (c.byScript || s.scripts.Load())
		}
		s.issue(ctx, pending)
		var again []*fcall
		reload := false
		var pause time.Duration
		for _, c := range pending {
			c.err = c.cmd.Err()
			s.rerouteAfter(c.err)
			lost := false // the call may have run, though it failed
			switch {
			case c.err == nil || errors.Is(c.err, redis.Nil):
				if c.probe {
					// The function ran: the library is loaded again.
					s.leaveScripts()
				}
				// A nil reply is no answer of this function's (which
				// answers a string, or fails): decode says so.
				c.err = decode(c.cmd, c.reqs)
			case c.piped && resent(c.err):
				// Not sent again: the error may be of a send before
				// go-redis's last, which may have run.
				lost = true
				c.err = fmt.Errorf("%w; the Cluster client may have sent the call again, and lost its answer: it may have run", c.err)
			case c.slots && isRouting(c.err):
				// Its parts, each of one slot, go once; however many
				// times the call was sent before (refused for the
				// server's state, or without the library).
				again = append(again, c.parts...)
				calls = append(calls, c.parts...)
				continue
			case c.probe && isFunctionMissing(c.err):
				// Tried by the function, the library still missing: the
				// call did not run, and goes by script, as the store's
				// other calls, without a load, which its user may not.
				c.probed, c.byScript = true, true
				again = append(again, c)
				continue
			case !c.reloaded && isFunctionMissing(c.err):
				reload, c.reloaded = true, true
				again = append(again, c)
				continue
			case isFunctionMissing(c.err):
				// Missing once more, the load having found the library
				// there ("already exists") or loaded it.
				c.err = fmt.Errorf("the function %s is missing though the store loaded its library: if the library was deleted meanwhile "+
					"(FUNCTION FLUSH or DELETE), call again; otherwise a library of other code is loaded under its name: "+
					"delete it (FUNCTION DELETE %s), and the store loads its own: %w", lib.name, lib.name, c.err)
			case !c.scripted && isUnknownFCall(c.err):
				// Also when another round trip in flight found out
				// first: this one was sent before, as FCALL.
				s.scriptsForGood()
				c.scripted = true
				again = append(again, c)
				continue
			case isScriptRefused(c.err) && (s.leaveScripts() || c.byScript):
				// Sent by script for a load refused: the next call
				// goes by the function again.
				c.err = libraryUnloadable(c.err)
			case isScriptRefused(c.err):
				// Sent by script for FCALL refused: no call can go.
				c.err = functionsRefused(lib.name, c.err)
			case c.tries < s.retries && (unsent(c.err) || s.shardLeft(c.err)):
				pause = max(pause, backoff(c.tries, s.minBackoff, s.maxBackoff))
				c.tries++
				again = append(again, c)
				continue
			case len(c.reqs) > 1 && isOpError(c.err):
				// The function writes nothing before it has decided
				// every op of the call (ratelimit.lua), so a call it
				// failed changed nothing: each op goes again, alone,
				// and so takes effect once, as a call that go-redis
				// never sends twice (command).
				for j := range c.reqs {
					one := &fcall{reqs: c.reqs[j : j+1], at: c.at[j : j+1]}
					again = append(again, one)
					calls = append(calls, one)
				}
				continue
			}
			lost = lost || c.err != nil && !unrun(c.err)
			c.err = asBadRecord(c.err)
			for j, i := range c.at {
				errs[i] = c.err
				c.reqs[j].lost = lost
			}
		}
		if reload {
			refused, err := s.loadLibrary(ctx)
			if s.hooks.loaded != nil {
				s.hooks.loaded()
			}
			for _, c := range again {
				// Those that wait for the library go by script, as the
				// store does for the load refused.
				c.byScript = c.byScript || refused && isFunctionMissing(c.err)
			}
			if err != nil {
				again = s.loadFailed(ctx, err, again, errs, &pause)
			}
		}
		if len(again) > 0 && pause > 0 && !sleep(ctx, pause) {
			for _, c := range again {
				for _, i := range c.at {
					errs[i] = fmt.Errorf("%w: the call was not sent again after: %w", ctx.Err(), c.err)
				}
			}
			break
		}
		pending = again
	}
	for _, c := range calls {
		if c.enc != nil {
			encoders.Put(c.enc)
		}
		c.enc, c.cmd = nil, nil
	}
}

// loadFailed settles the calls of again, none of them sent since an
// answer that said it did not run, once loading the library has failed
// with err, and returns those that go again. A call that waits for the
// library (its function was missing) goes again after a pause, as one
// that Redis refused for its state does, when the load may pass if sent
// again (loadMayPass: it surely did not run, as with no connection, a
// dataset loading, a master down, ...; or its answer was lost, a read
// timeout) and the call has tries left: it finds the function missing
// once more, or the library loaded meanwhile; otherwise it fails with
// err. The other calls (sent again for another reason) go again as
// planned. A call goes again only once ctx has not ended.
func (s *Store) loadFailed(ctx context.Context, err error, again []*fcall, errs []error, pause *time.Duration) []*fcall {
	var next []*fcall
	for _, c := range again {
		switch {
		case ctx.Err() != nil:
			err := fmt.Errorf("%w: the call was not sent again after: %w", ctx.Err(), err)
			for _, i := range c.at {
				errs[i] = err
			}
		case !isFunctionMissing(c.err):
			next = append(next, c)
		case c.tries < s.retries && loadMayPass(err):
			*pause = max(*pause, backoff(c.tries, s.minBackoff, s.maxBackoff))
			c.tries++
			c.reloaded = false // it may ask for the library once more
			next = append(next, c)
		default:
			for _, i := range c.at {
				errs[i] = err
			}
		}
	}
	return next
}

// loadMayPass reports whether err, a failed load's, may pass if the load
// goes again: the load surely did not run (unsent), or its answer was lost
// (a read timeout, a connection dropped), when it may have run as well.
// Either way the calls that waited for it did not run (Redis refused them
// for the missing function), and may go again: they find the library
// loaded, or missing, and load it once more (a library of this name is
// this very code). Not an answer of Redis's that refused the load for what
// it is, which would refuse it again, nor a client closed.
func loadMayPass(err error) bool {
	var rerr redis.Error
	return unsent(err) || (!errors.As(err, &rerr) && !errors.Is(err, redis.ErrClosed))
}

// issue sends the calls: one alone, several in a pipeline.
func (s *Store) issue(ctx context.Context, calls []*fcall) {
	s.sendCalls(ctx, calls, false)
	// A server that does not know the script (NOSCRIPT) is sent it whole.
	var retry []*fcall
	for _, c := range calls {
		if c.script && isNoScript(c.cmd.Err()) {
			retry = append(retry, c)
		}
	}
	if len(retry) > 0 {
		s.sendCalls(ctx, retry, true)
	}
}

func (s *Store) sendCalls(ctx context.Context, calls []*fcall, eval bool) {
	piped := len(calls) > 1 && s.cluster != nil
	for _, c := range calls {
		c.cmd = s.command(ctx, c, eval)
		c.piped = piped
	}
	if len(calls) == 1 {
		_ = s.client.Process(ctx, calls[0].cmd)
		return
	}
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range calls {
			_ = p.Process(ctx, c.cmd)
		}
		return nil
	})
}

// command is a call of the function (or of the script, on a server
// without Functions; eval: with its source), which go-redis never sends
// twice: it sends a command again after a network error or a read
// timeout, when it may have run already, and an op that runs twice is
// applied twice: a refund hands its tokens back twice, a limit charges
// twice, and a slow server would be sent every call again while it runs
// the first. run sends again only a call that surely did not run.
func (s *Store) command(ctx context.Context, c *fcall, eval bool) redis.Cmder {
	e := c.enc
	n := 4 + len(e.keys) // the command, its function or script, the keys' count, the keys, the batch
	if c.slots {
		n += 2 // the first key and routeKey's
	}
	args := make([]any, 0, n)
	switch {
	case !c.script:
		args = append(args, "fcall", lib.name)
	case eval:
		args = append(args, "eval", lib.script)
	default:
		args = append(args, "evalsha", lib.sha)
	}
	if c.slots {
		// The first key routes the call, with a key of its slot that no
		// one writes (routeKey); all follow the batch.
		args = append(args, 2, e.keys[0], routeKey(e.keys[0]), e.buf)
		for _, k := range e.keys {
			args = append(args, k)
		}
	} else {
		args = append(args, len(e.keys))
		for _, k := range e.keys {
			args = append(args, k)
		}
		args = append(args, e.buf)
	}
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return onceCmd{cmd}
}

// routeKey returns the key that a call over several slots declares
// beside its first, rec, a record's: the prefix and hash tag of rec alone,
// which no record nor mark has (each has more after its tag), so a key no
// one writes. Redis runs a call that names two keys of a slot, one of them
// missing, only while the slot stays on its node: while it migrates, the
// node it leaves, and the node it goes to even when asked (ASK, ASKING),
// refuse the call with TRYAGAIN before it runs, and its ops go again one
// call per hash tag, each naming all of its keys. Without it, a call sent
// on to the slot's new node by ASK ran there with the client's ASKING,
// under which that node reads any key of a slot it is taking in (this
// slot, of a record not yet moved, say) as its own: missing, as a full
// bucket; and the record it wrote there then stopped the key's move.
func routeKey(rec string) string {
	return rec[:strings.IndexByte(rec, '}')+1]
}

// onceCmd is a command go-redis must not send again.
type onceCmd struct{ *redis.Cmd }

// NoRetry tells go-redis not to send the command again.
func (onceCmd) NoRetry() bool { return true }

// loadLibrary loads the library on the server, on every master of a
// Cluster, or on every shard of a Ring. A library of this name already
// there is this very code. It reports whether a server refused the load
// to the store's user (NOPERM): the store goes by script then.
func (s *Store) loadLibrary(ctx context.Context) (refused bool, err error) {
	var no atomic.Bool
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, lib.code).Err()
		switch {
		case err != nil && strings.Contains(err.Error(), "already exists"):
			err = nil
		case err != nil && redis.HasErrorPrefix(err, "NOPERM"):
			// Not allowed to load functions: scripts may be. If
			// not, the store goes back to the function
			// (leaveScripts).
			no.Store(true)
			s.loadRefused.Store(true)
			s.scripts.Store(true)
			err = nil
		}
		if err != nil {
			return fmt.Errorf("loading the function library %s: %w", lib.name, err)
		}
		return nil
	}
	err = s.forEachServer(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	return no.Load(), err
}

// forEachServer calls fn on every server that holds records: the one
// server, every master of a Cluster, every shard of a Ring that is up. A
// Ring that has none (closed, or every shard down) is an error, go-redis's
// for a call on it, as for a server that cannot be reached: its
// ForEachShard skips the shards it took for down, and has none once
// closed, and called fn on no server without an error. On a Ring, a shard
// whose client closes under fn (shardLeft) has left the Ring (SetAddrs):
// fn is not called on it again, but on the shards that joined the Ring
// meanwhile, those of the Ring now that it was not called on, as often as
// the client's MaxRetries allow. That failed as if the store's client had
// been closed (driver.ErrClosed), and fn was not called on the shards that
// joined.
func (s *Store) forEachServer(ctx context.Context, fn func(ctx context.Context, c *redis.Client) error) error {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Ring:
		var (
			mu   sync.Mutex
			seen = make(map[*redis.Client]bool) // by client: a shard that leaves and comes back has a new one
		)
		var err error
		for tries := 0; ; tries++ {
			var left atomic.Bool
			err = c.ForEachShard(ctx, func(ctx context.Context, sc *redis.Client) error {
				mu.Lock()
				done := seen[sc]
				seen[sc] = true
				mu.Unlock()
				if done {
					return nil
				}
				err := fn(ctx, sc)
				if err != nil && tries < s.retries && s.shardLeft(err) {
					left.Store(true)
					return nil
				}
				return err
			})
			if err != nil || !left.Load() {
				break
			}
		}
		if err == nil && len(seen) == 0 {
			// A shard that came up meanwhile answers the PING: fn still
			// called none.
			if err = c.Ping(ctx).Err(); err == nil {
				err = errors.New("no shard of the Ring was up")
			}
		}
		return err
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("a client of type %T", s.client) // New refuses it
}

// isRouting reports whether err is Redis refusing a call for where its
// keys are: a slot moved or moving, keys of several slots, a Cluster
// down. Redis refuses such a call before it runs, or, for a call over
// several slots, when it reads a key not on the node, before any write.
func isRouting(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false // not Redis's answer: a call that may have run
	}
	if isBadRecord(err) {
		return false // its text names a key, which may hold any words
	}
	msg := err.Error()
	for _, m := range []string{"non local key", "MOVED", "ASK", "TRYAGAIN", "CROSSSLOT", "CLUSTERDOWN"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// isOpError reports whether err is the function failing on what the ops
// of a call read (a record it cannot read, a key of another type than a
// string): Redis's answer, but not for where the keys are (isRouting), for
// a library or script missing, or for the server's state, which each op
// alone would meet as well. Not a network error or a context's end either,
// after which the call may have run.
func isOpError(err error) bool {
	if isBadRecord(err) {
		return true
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) || errors.Is(err, redis.Nil) || isRouting(err) || isFunctionMissing(err) ||
		isUnknownFCall(err) || isNoScript(err) {
		return false
	}
	for _, state := range []string{"OOM", "READONLY", "MISCONF", "NOREPLICAS", "MASTERDOWN", "LOADING", "BUSY", "NOAUTH", "NOPERM"} {
		if redis.HasErrorPrefix(err, state) {
			return false
		}
	}
	return true
}

// unsent reports whether err, a call's, says that the call did not run:
// it was never written to a connection (none free in the pool, none could
// be dialed), or Redis answered that it runs no write now (a replica, a
// dataset loading, a master down, a Cluster down or a slot migrating, too
// few replicas, too many clients, another's script running past
// busy-reply-threshold: BUSY), before running it. A call that failed
// otherwise (a read timeout, a connection dropped) may have run.
func unsent(err error) bool {
	var op *net.OpError
	if errors.Is(err, redis.ErrPoolTimeout) || (errors.As(err, &op) && op.Op == "dial") {
		return true
	}
	for _, state := range []string{"READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS", "BUSY ", "max number of clients reached"} {
		if redis.HasErrorPrefix(err, state) {
			return true
		}
	}
	return false
}

// rerouteAfter has a Cluster client reload its map of the slots (in the
// background, one load at a time; after one that succeeded, none for
// 200 ms, but after one that failed, the next at once) when err, a
// call's, says that the node the client took for the master of the call's
// slot may be gone: no connection to it could be dialed, the connection
// dropped, or the Cluster answered that it is down (CLUSTERDOWN,
// MASTERDOWN). go-redis itself reloads the map only after an answer that
// the slot is elsewhere (MOVED, READONLY) or once it is older than its
// ClusterStateReloadInterval (10 s by default): a master that died gives
// no such answer, and its slots' calls went on to its address, refused,
// for up to that interval after a replica had taken its place. The call
// itself goes again only when err says that it did not run (unsent);
// the calls after it find the new master.
func (s *Store) rerouteAfter(err error) {
	if s.cluster != nil && err != nil && nodeGone(err) {
		s.cluster.ReloadState(context.Background())
	}
}

// nodeGone reports whether err says that the node a command went to may
// have left the Cluster's service: a dial that failed, a connection that
// dropped, or Redis's answer that the Cluster or the slot's master is
// down. Not a read timeout, which a slow node, or a caller's deadline
// (ContextTimeoutEnabled), gives as well.
func nodeGone(err error) bool {
	var op *net.OpError
	return (errors.As(err, &op) && op.Op == "dial") || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNREFUSED) ||
		redis.HasErrorPrefix(err, "CLUSTERDOWN") || redis.HasErrorPrefix(err, "MASTERDOWN")
}

// unrun reports whether err, the error a call failed with when it went
// no more, says that the call did not run: go-redis did not send it (no
// connection: unsent; its client closed, or on a Ring its shard gone:
// errShardGone), or Redis answered it with an error, refusing it before it
// ran or the function failing it before it wrote anything (it writes once
// it has decided every op of the call). Otherwise (a read timeout, a
// connection dropped, a context ended, an answer that holds no decisions)
// it may have run: its ops may have been decided and charged.
func unrun(err error) bool {
	var rerr redis.Error
	return unsent(err) || errors.Is(err, redis.ErrClosed) || err.Error() == errShardGone ||
		errors.As(err, &rerr) && !errors.Is(err, redis.Nil)
}

// shardLeft reports whether err, a call's on a Ring, says that the
// client of the shard the Ring sent it to was closed while the Ring is
// open: the shard left the Ring (SetAddrs closes its client) after the
// Ring had routed the call to it. go-redis says so (redis.ErrClosed) only
// before it sends: the call did not run, and sent again, it goes to the
// shard the Ring routes its key to now. It failed with the error of a
// client closed under the store (driver.ErrClosed). So, in a Ring's
// pipeline, for a shard that left between the Ring's choice of its name
// for a key and its look-up of the name (errShardGone), before sending:
// that failed with go-redis's error, as a server's failure.
func (s *Store) shardLeft(err error) bool {
	if s.ring == nil || err == nil || !errors.Is(err, redis.ErrClosed) && err.Error() != errShardGone {
		return false
	}
	_, err = s.ring.GetShardClientForKey("")
	return !errors.Is(err, redis.ErrClosed)
}

// errShardGone is the text of the error a Ring's pipeline sets on the
// commands of a shard it chose by name for their keys, and no longer has
// by that name when it sends them: go-redis makes it with errors.New.
const errShardGone = "redis: the shard is not in the ring"

// resent reports whether err, a call's in a Cluster client's pipeline, is
// one after which go-redis sends the call again within the pipeline: a
// redirection (MOVED, ASK), or no connection to the node: none free in the
// pool, none dialed, or Redis's answer to the commands that set a new
// connection up (AUTH, HELLO, CLIENT SETNAME, SELECT, READONLY) that
// unsent takes as well: too many clients, or BUSY, another's script
// running. The call then keeps that error if the later send fails before
// its answer is read (the connection drops, or an answer before it times
// out), when it may have run: the error says nothing of whether it did.
// (A client's Process sets the last send's error, whatever the earlier
// ones.)
func resent(err error) bool {
	var op *net.OpError
	return redis.HasErrorPrefix(err, "MOVED ") || redis.HasErrorPrefix(err, "ASK ") ||
		errors.Is(err, redis.ErrPoolTimeout) || (errors.As(err, &op) && op.Op == "dial") ||
		redis.HasErrorPrefix(err, "max number of clients reached") || redis.HasErrorPrefix(err, "BUSY ")
}

// backoff returns the pause before sending a call again the (tries+1)th
// time, as go-redis's: from lo, doubling, at random, at most hi.
func backoff(tries int, lo, hi time.Duration) time.Duration {
	if lo <= 0 {
		return 0
	}
	d := lo << min(tries, 30)
	if d < lo || d > hi {
		return hi
	}
	return min(lo+rand.N(d), hi)
}

// sleep waits for d, or for ctx to end: then it returns false.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func isFunctionMissing(err error) bool {
	return err != nil && !isBadRecord(err) && strings.Contains(err.Error(), "Function not found")
}

// isBadRecord reports whether err is the function failing on a string it
// cannot read or a key of another type (BADRECORD, BADMARK: fail in
// ratelimit.lua), before it wrote anything. Its text names the key, which
// may spell any other answer of Redis's ("MOVED", "Function not found"):
// the other tests of an error's text must not look into it.
func isBadRecord(err error) bool {
	return redis.HasErrorPrefix(err, "BADRECORD") || redis.HasErrorPrefix(err, "BADMARK")
}

// isUnknownFCall reports whether err is a server's refusal of FCALL as
// such: a server without Functions or a proxy that does not pass them
// ("unknown command"), or a user not allowed it (NOPERM, by an ACL), for
// whom scripts may be. Redis refuses it before it runs.
func isUnknownFCall(err error) bool {
	if err == nil || isBadRecord(err) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return (strings.Contains(msg, "unknown command") || redis.HasErrorPrefix(err, "NOPERM")) && strings.Contains(msg, "fcall")
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// decode reads the reply of one call into its requests' decisions.
func decode(cmd redis.Cmder, reqs []*request) error {
	var reply string
	var err error
	switch c := cmd.(type) {
	case *redis.Cmd:
		reply, err = c.Text()
	case onceCmd:
		reply, err = c.Text()
	}
	if err != nil {
		// Not %w: a nil reply must not read as a key missing (redis.Nil).
		return fmt.Errorf("the function answered no string of decisions (%v): is another library loaded under the name %s?", err, lib.name)
	}
	n := 0
	for _, r := range reqs {
		n += len(r.out)
	}
	if len(reply) != n*decisionSize {
		return fmt.Errorf("the function answered %d bytes for %d decisions of %d: is another library loaded under the name %s?", len(reply), n, decisionSize, lib.name)
	}
	for _, r := range reqs {
		for i := range r.out {
			d := reply[:decisionSize]
			reply = reply[decisionSize:]
			r.out[i] = driver.Decision{
				OK:         d[0]&1 == 1,
				Settled:    driver.SettleKind(d[0] >> 1 & 3),
				Own:        d[0]&8 != 0,
				RetryAfter: int64(f64(d[1:])),
				Remaining:  f64(d[9:]),
				Charged:    [2]float64{f64(d[17:]), f64(d[25:])},
				Now:        int64(f64(d[33:])),
				TS:         int64(f64(d[41:])),
			}
		}
	}
	return nil
}

// decisionSize is the bytes of one decision in the reply: ok, retry after,
// remaining, charged to each shard, now, the first record's time.
const decisionSize = 1 + 6*8

// f64 reads a little-endian double.
func f64(b string) float64 {
	_ = b[7]
	return math.Float64frombits(uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56)
}

// encoder builds the keys and the argument of one call of the function
// (ratelimit.lua says the layout).
type encoder struct {
	buf    []byte
	keys   []string
	limits []limit
	refs   []uint32 // per shard, in order: its limit, 1-based
}

var encoders = sync.Pool{New: func() any { return new(encoder) }}

func (e *encoder) encode(reqs []*request, serverTime bool, margin int64, slots bool) {
	e.keys, e.limits, e.refs = e.keys[:0], e.limits[:0], e.refs[:0]
	for _, r := range reqs {
		e.keys = append(e.keys, r.keys...)
		for i := range r.items {
			it := &r.items[i]
			for j := range it.n {
				e.refs = append(e.refs, e.ref(it.shards[j].lim))
			}
		}
	}
	var flags float64
	if serverTime {
		flags++
	}
	if slots {
		flags += 2
	}
	b := appendF64(e.buf[:0], flags)
	b = appendF64(b, float64(margin))
	nops := 0
	for _, r := range reqs {
		if len(r.items) > 0 {
			nops++
		}
	}
	b = appendF64(b, float64(len(e.limits)))
	b = appendF64(b, float64(nops))
	for _, l := range e.limits {
		b = appendF64(b, float64(l.kind))
		b = appendF64(b, l.rate)
		b = appendF64(b, float64(l.period))
		b = appendF64(b, l.capacity)
		b = appendF64(b, l.maxReserved)
	}
	refs := e.refs
	for _, r := range reqs {
		if len(r.items) == 0 {
			continue // nothing to decide or write
		}
		var reserve float64
		if r.reserve {
			reserve = 1
		}
		if r.mode == driver.ModeRefund {
			reserve = float64(r.settle.Kind) // a refund's reserve field is its settlement
		}
		b = appendF64(b, float64(r.mode))
		b = appendF64(b, reserve)
		b = appendF64(b, float64(len(r.items)))
		b = appendF64(b, float64(r.now))
		for i := range r.items {
			it := &r.items[i]
			b = appendF64(b, it.count)
			b = appendF64(b, float64(it.at))
			b = appendF64(b, float64(it.n))
			for j := range it.n {
				b = appendF64(b, float64(refs[0]))
				refs = refs[1:]
				b = appendF64(b, float64(it.shards[j].phase))
			}
			if r.mode == driver.ModeRefund {
				b = appendF64(b, float64(it.run))
			}
		}
		if r.settle.Kind != 0 {
			b = appendF64(b, float64(r.settle.Until))
			b = append(b, r.settle.Settler[:]...) // raw bytes, not a double
		}
	}
	e.buf = b
}

// ref returns the 1-based index of l among the batch's limits, adding it.
func (e *encoder) ref(l limit) uint32 {
	for i, have := range e.limits {
		if have.same(l) {
			return uint32(i + 1)
		}
	}
	e.limits = append(e.limits, l)
	return uint32(len(e.limits))
}

func appendF64(b []byte, x float64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
}
