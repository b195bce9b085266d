package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/isnil"
)

// When the store fails, a call cannot know the state of its limit. Each
// limit then follows its failure policy (Config.FailOpen): fail closed (the
// default) refuses the call, fail open allows it. Either way the Result is
// marked Degraded and the store's error is returned beside it, wrapped in a
// *StoreError, so that the caller sees the failure and may still act on
// the policy's decision.
//
// A store that keeps failing would add its timeout to every call. The
// Limiter's breaker counts consecutive failures; past a threshold it stops
// asking the store for a cool-down, deciding every call by its policy at
// once, then lets one call probe the store, and closes again on success.
// A probe still in the store a cool-down after it went counts as failed.

// Defaults of the breaker; WithBreaker changes them.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = 2 * time.Second
)

// noAnswer is lastAnswer when no answer of the store is known: before
// every time a call may start.
const noAnswer = math.MinInt64

// breakerSlowCall is how long a call cut short by its caller's deadline
// must have waited for the store, with no other call answered meanwhile,
// to count as a store failure; and how long a canceled call must have
// waited so to send the Limiter's own check of the store (gaveUp).
const breakerSlowCall = 250 * time.Millisecond

type breaker struct {
	threshold int
	cooldown  time.Duration
	// clock reads the Limiter's clock: allow reads it again to tell a
	// clock set back from a call that read it early.
	clock func() time.Time

	// fails is read without mu on every call, so that a healthy store
	// costs no lock; it is written under mu.
	fails   atomic.Int64
	mu      sync.Mutex
	until   time.Time // open until then
	probing bool      // a probe is under way
	probeAt time.Time // when the probe under way went
	// probe numbers the probes, so that only the one under way frees its
	// place: an answer to another call may close the breaker while a
	// probe is in the store, and the breaker open again and let a new
	// probe through before the old one fails.
	probe uint64

	// lastAnswer is the time, in Unix ms on the Limiter's clock, of the
	// latest answer of the store: callerGaveUp compares it with the start
	// of a call that timed out. A call through Apply, which may wait on a
	// network, reads the clock when the answer comes; a call through a
	// BoundLimit, which answers in process (driver.Binder), passes the
	// time it read before asking, so that the hot path reads the clock
	// once. It is written only when it moves forward: once a millisecond
	// at most, not once a call; and set back to noAnswer by callerGaveUp
	// once the clock went back behind it.
	lastAnswer atomic.Int64
	// checking is whether a check of the store is under way (checkStore).
	checking atomic.Bool
}

// closed reports whether calls may ask the store without more ado: no
// breaker, or fewer consecutive failures than open it.
func (b *breaker) closed() bool {
	return b.threshold <= 0 || b.fails.Load() < int64(b.threshold)
}

// allow reports whether a call may ask the store now, and, if it is the
// probe that decides whether the breaker closes, its number, to give
// failure or abandon (0 for any other call); when not ok, until says
// when a probe will be let through (while the probe is under way, the
// earliest the next may go).
func (b *breaker) allow(now time.Time) (ok bool, probe uint64, until time.Time) {
	if b.closed() {
		return true, 0, time.Time{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fails.Load() < int64(b.threshold) {
		return true, 0, time.Time{}
	}
	// A probe due more than a cool-down ahead is a call that read the
	// clock before the failure that set until, or a clock that went back
	// since (a clock given to WithClock: the real one's monotonic reading
	// does not). The clock read again here, after that failure, tells
	// them apart: if until is still more than a cool-down ahead, the clock
	// went back, and the breaker stays open one cool-down from now, not
	// the step's length too. Either way the call is judged by the reading
	// again: one that read the clock early may come after until, and then
	// probes as any call would. Only an open breaker reads it.
	if b.until.Sub(now) > b.cooldown && b.clock != nil {
		now = b.clock()
		if b.until.Sub(now) > b.cooldown {
			b.until = now.Add(b.cooldown)
		}
	}
	if b.probing && now.Before(b.probeAt) && b.clock != nil {
		// A call that read the clock before the probe went, or a clock
		// set back since: then a cool-down from now, not the step's
		// length more, as for until above.
		if now = b.clock(); now.Before(b.probeAt) {
			b.probeAt = now
		}
	}
	if b.probing && now.Sub(b.probeAt) >= b.cooldown {
		// The probe has been in the store a cool-down: it counts as
		// failed then, and the next goes a cool-down after. A probe
		// held without end (a caller without a deadline, on a key whose
		// row a stuck transaction locks) would otherwise keep every call
		// of every key to the failure policy while the store answers
		// them. Its answer, when it comes, is a late call's. A late
		// call's failure meanwhile may have set until later still: the
		// next probe goes a cool-down after that failure then.
		b.probing = false
		if next := b.probeAt.Add(b.cooldown).Add(b.cooldown); next.After(b.until) {
			b.until = next
		}
	}
	switch {
	case now.Before(b.until):
		return false, 0, b.until
	case b.probing:
		// The probe is in the store: if it fails, the next goes a
		// cool-down after, and if it succeeds the breaker closes
		// sooner. Not the cool-down's end, which has passed: a
		// refusal would say to retry at once for as long as the probe
		// takes.
		return false, 0, now.Add(b.cooldown)
	}
	b.probing, b.probeAt = true, now
	b.probe++ // from 1: 0 is no probe's number
	return true, b.probe, time.Time{}
}

// isProbe reports whether probe, a number allow returned, is the probe
// under way's. It is called with mu held.
func (b *breaker) isProbe(probe uint64) bool {
	return probe != 0 && b.probing && probe == b.probe
}

// current reports whether answered(now) would do nothing: an answer at
// now or later is recorded, and no failure counted. It is inlined, where
// answered is not.
func (b *breaker) current(now int64) bool {
	return b.lastAnswer.Load() >= now && b.fails.Load() == 0
}

// answered records that the store answered a call at now, in Unix
// milliseconds: the time the answer came, not the time the call was
// asked (see lastAnswer). It reports whether the answer closed an open
// breaker.
func (b *breaker) answered(now int64) (closed bool) {
	if b.lastAnswer.Load() < now {
		b.lastAnswer.Store(now)
	}
	if b.threshold <= 0 || b.fails.Load() == 0 {
		return false // no failure counted, so no probe either
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	closed = b.fails.Load() >= int64(b.threshold)
	b.fails.Store(0)
	b.probing = false
	return closed
}

// failure records that the store failed at now a call, the probe or not
// (probe is the number allow returned); it reports whether the failure
// opened the breaker: the failure that reached the threshold, or the
// probe's. The calls that started before the breaker opened, failing
// after it, open nothing (though they hold the probe back a cool-down
// from their failure), and only the failure of the probe under way lets
// the next call probe: the probe may still be in the store. An earlier
// probe, overtaken by an answer that closed the breaker, is such a call.
func (b *breaker) failure(now time.Time, probe uint64) (opened bool) {
	if b.threshold <= 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	fails := b.fails.Add(1)
	isProbe := b.isProbe(probe)
	if isProbe {
		b.probing = false
	}
	if fails < int64(b.threshold) {
		return false
	}
	b.until = now.Add(b.cooldown)
	return fails == int64(b.threshold) || isProbe
}

// abandon records that a call left without learning anything of the
// store: if it was the probe under way (probe is the number allow
// returned), the next call may probe instead.
func (b *breaker) abandon(probe uint64) {
	if probe == 0 {
		return
	}
	b.mu.Lock()
	if b.isProbe(probe) {
		b.probing = false
	}
	b.mu.Unlock()
}

// policyWait returns the RetryAfter of a refusal of the failure policy
// whose caller should come back in d: whole milliseconds, rounded up, as
// every RetryAfter, at least one and at most driver.MaxRetryAfter, the
// longest a decision reports. A cool-down near the longest Duration
// (WithBreaker(n, math.MaxInt64)) rounded up by adding would overflow
// to a wait of 1 ms.
func policyWait(d time.Duration) time.Duration {
	ms := d.Milliseconds()
	if d%time.Millisecond > 0 {
		ms++
	}
	return time.Duration(min(max(ms, 1), driver.MaxRetryAfter)) * time.Millisecond
}

// callerGaveUp reports whether a call that failed at now, having started
// at start, failed because its caller's context ended rather than because
// of the store. A canceled caller says nothing of the store by itself
// (though a long wait sends a check, gaveUp). A caller
// whose deadline passed says the store is slow only if it gave the store
// breakerSlowCall at least and the store answered no other call
// meanwhile: otherwise the caller's own deadline was too short, and the
// store is healthy for everyone else.
func (b *breaker) callerGaveUp(ctx context.Context, start, now time.Time) bool {
	switch ctx.Err() {
	case nil:
		return false
	case context.DeadlineExceeded:
		if now.Sub(start) < breakerSlowCall {
			return true
		}
		return b.answeredSince(start, now)
	}
	return true
}

// answeredSince reports whether the store answered a call since start,
// as a call that began then and failed at now sees it.
func (b *breaker) answeredSince(start, now time.Time) bool {
	last := b.lastAnswer.Load()
	if last > now.UnixMilli()+breakerSlowCall.Milliseconds() {
		// An answer timed after this call's end, by more than calls
		// ending together read their clocks apart: the wall clock went
		// back since (a step of NTP, or a clock given to WithClock set
		// back). Its time says nothing of this call's wait, and since
		// answered only moves lastAnswer forward, it would take every
		// deadline (and long wait canceled) for the caller's own, and
		// send no check (gaveUp), until the clock caught up, a stalled
		// store never opening the breaker. Forget it: the next answer is
		// recorded again.
		b.lastAnswer.CompareAndSwap(last, noAnswer)
		return false
	}
	return last >= start.UnixMilli()
}

// gaveUp reports whether a call of limit name for key (the store's),
// asked at start with the probe's number probe (0 for another call),
// whose store call failed, failed because its caller's context ended
// (callerGaveUp). If so, the call leaves the probe's place, and, when
// the store may be stalled (unanswered), sends the Limiter's own check
// to the store (checkStore): callers whose deadlines are all shorter than
// breakerSlowCall, or who set none and are only canceled (an HTTP
// handler's client gone), would otherwise never open the breaker on a
// stalled store, each waiting until its context ended.
func (l *Limiter) gaveUp(ctx context.Context, start time.Time, name, key string, probe uint64) bool {
	now := l.now()
	if !l.breaker.callerGaveUp(ctx, start, now) {
		return false
	}
	l.breaker.abandon(probe)
	if l.breaker.threshold > 0 && l.breaker.unanswered(ctx, start, now) {
		l.checkStore(ctx, driver.RecordID{Name: name, Key: key})
	}
	return true
}

// unanswered reports whether a call asked at start, whose caller gave up
// at now (callerGaveUp), leaves the store's health in doubt: the store
// answered no call since start, and the caller's deadline passed, or its
// cancel came breakerSlowCall or more after start. A cancel sooner says
// nothing of the store (a client that leaves at once), and sends no check.
func (b *breaker) unanswered(ctx context.Context, start, now time.Time) bool {
	if ctx.Err() != context.DeadlineExceeded && now.Sub(start) < breakerSlowCall {
		return false
	}
	return !b.answeredSince(start, now)
}

// checkStore reads the record id from the store, unless a check is under
// way already, giving the store breakerSlowCall on the Limiter's clock, in
// a goroutine of its own that ends with the read: the caller whose
// deadline passed, or who canceled, has gone. The read carries the values
// of that caller's context ctx, not its end (as AfterFunc's use does), so
// that a store's tracing sees it as part of the request that caused it. An
// answer says that the deadline, or the cancel, was the caller's, and
// counts nothing; it is not recorded as an answer of the store
// (breaker.answered) either: a read proves little of the calls' path (a
// store whose writes stall may read at once), and recorded, it would
// excuse every call that the store kept waiting meanwhile (callerGaveUp)
// and clear the failures counted. A
// failure counts as a call's would: an error of the store, or no answer
// within breakerSlowCall while the store answered nobody else
// (callerGaveUp). One check at a time, each one read of one record,
// whatever the callers in a hurry: a store that ignores its context's end
// holds one goroutine here for as long as it does not return, never more.
// The goroutine needs no Close: it ends with the read, breakerSlowCall at
// most on the Limiter's clock for a store that keeps the driver contract.
func (l *Limiter) checkStore(ctx context.Context, id driver.RecordID) {
	if !l.breaker.checking.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer l.breaker.checking.Store(false)
		defer func() {
			// A panic here would end the process, with no caller to
			// recover it: log it, and count nothing.
			if r := recover(); r != nil && l.logger != nil {
				l.logger.Error("ratelimit: the store panicked in a check of its health", "limit", id.Name, "panic", r)
			}
		}()
		start := l.now()
		ctx, cancel := l.clock.WithTimeout(context.WithoutCancel(ctx), breakerSlowCall)
		defer cancel()
		var rec [1]driver.Record
		if err := storeError("Load", l.store.Load(ctx, []driver.RecordID{id}, rec[:])); err != nil {
			if !l.breaker.callerGaveUp(ctx, start, l.now()) {
				l.storeErr(id.Name, 0, err)
			}
		}
	}()
}

// callerError is the error of a call whose caller gave up: the context's
// error, and the store's if it said something else.
func callerError(ctx context.Context, name string, err error) error {
	cerr := ctx.Err()
	if errors.Is(err, cerr) {
		return fmt.Errorf("ratelimit: limit %s: %w", written(name), err)
	}
	return fmt.Errorf("ratelimit: limit %s: %w (store: %v)", written(name), cerr, err)
}

// storeError returns err, the error of the store's method method, or,
// when reading it panics, an error that says so. A store that returns a
// nil pointer of its error type (var err *MyError; return err) returns
// an error that is not nil, whose methods may dereference it: the
// Limiter, the breaker classifying the failure (storeErr), the observer
// and the caller each read the error (Error, errors.Is, errors.As), and
// each would panic. Read once here, where the panic is recovered, such an
// error is a store failure like any other. It is inlined: a call that
// succeeded pays a comparison with nil.
func storeError(method string, err error) error {
	if err == nil {
		return nil
	}
	return readStoreError(method, err)
}

// readStoreError is storeError for an error that is not nil. A nil
// pointer anywhere in the error's tree (returned, wrapped or joined) is
// the store's bug whatever its methods do for the targets tried here: an
// Is or As may read its fields for some targets only (the driver's
// sentinels a store's error matches by a code, the caller's own). Then it
// calls Error, and every Unwrap, Is and As of the error's tree with the
// driver's sentinels and the context's errors, which the Limiter's
// handling of a failure matches it with, and with a target nothing
// matches (errors.Is and errors.As of such a target walk all of it).
func readStoreError(method string, err error) (read error) {
	defer func() {
		if p := recover(); p != nil {
			read = fmt.Errorf("the store's %s returned an error of type %T whose methods panic (%v): "+
				"a nil pointer returned as an error? The store must return nil, or an error whose methods can be called", method, err, p)
		}
	}()
	if n := isnil.InError(err); n != nil {
		what := fmt.Sprintf("a nil %T", n)
		if n != err {
			what = fmt.Sprintf("an error of type %T that wraps a nil %T", err, n)
		}
		return fmt.Errorf("the store's %s returned %s: a nil pointer returned as an error, whose methods may panic; "+
			"the store must return nil, or an error whose methods can be called", method, what)
	}
	_ = err.Error()
	for _, target := range readTargets {
		_ = errors.Is(err, target)
	}
	var target *unmatchedError
	_ = errors.As(err, &target)
	return err
}

// readTargets are the targets of readStoreError's errors.Is: those the
// Limiter's handling of a failure matches a store's error with (storeErr,
// zeroStore, settleFailed, callerError), and one nothing matches.
var readTargets = [...]error{errUnmatched, driver.ErrInvalidOp, driver.ErrBadRecord, driver.ErrZeroStore, context.Canceled, context.DeadlineExceeded}

// errUnmatched is the target of readStoreError's errors.Is, which no
// error of a store is, nor wraps.
var errUnmatched error = &unmatchedError{}

// unmatchedError is the type of errUnmatched, and the target of
// readStoreError's errors.As.
type unmatchedError struct{}

func (*unmatchedError) Error() string { return "ratelimit: no error" }
