// Package deadline is the one rule by which the library reads a context's
// deadline off the wall clock.
//
// # The rule
//
// A context's deadline is a time.Time, and nothing says of which clock.
// Most are the wall clock's: context.WithTimeout sets one, and the context
// ends when the wall clock reaches it. But a test's mock.WithTimeout
// (github.com/benbjohnson/clock), or the Limiter's own check of the store
// on its WithClock, sets a deadline of a mock's time, and that context
// ends when the mock reaches it; a mock starts in 1970, so the wall clock
// is past such a deadline long before its context ends. So, by the wall
// clock, a deadline is
//
//   - ahead (Ahead): the wall clock has not reached it. It may be read
//     off the wall clock, and the time left is time.Until of it, whether
//     or not the context has ended (by a cancel) meanwhile.
//   - met (Met): the wall clock is past it and the context has ended.
//     No time is left.
//   - unmet (Unmet): the wall clock is past it and the context has not
//     ended. It is another clock's, or its context's timer is due and has
//     not run yet (it runs a moment later, on a goroutine of its own).
//     Either way it bounds nothing the wall clock can measure, and must
//     not be read as the context's end: the context's own Err says when
//     that comes. A caller that must tell the two apart waits a moment
//     for the context to end, with Await (the Redis store does, for a
//     read that its client ended at the deadline by the wall clock).
//
// The stores ask this of the context of each call they send: the Redis
// store, whether a network timeout was the caller's deadline; the
// PostgreSQL store, how long its statement may wait for a lock. So does
// the tracing store wrapper of contrib/otel, whether a store's error
// matching context.DeadlineExceeded was the caller's deadline, for the
// status of its span; it waits a moment for an Unmet context to end, by
// Await, as the Redis store does.
//
// A batch's context (internal/coalesce) asks something else: it must
// report the latest of its callers' deadlines without ending at it, since
// it cannot tell of which clock they are either, and ends only once every
// caller has left, each by its own context. It reads no time off the wall
// clock, and keeps a context type of its own; a send given that context
// reads it by this rule, as any other.
package deadline

import (
	"context"
	"strconv"
	"time"
)

// State is what the wall clock tells of a context's deadline.
type State int

// The states of a context's deadline, by the wall clock (see the package
// doc).
const (
	// None: the context has no deadline.
	None State = iota
	// Ahead: the wall clock has not reached the deadline.
	Ahead
	// Met: the wall clock is past the deadline, and the context has ended.
	Met
	// Unmet: the wall clock is past the deadline, and the context has not
	// ended: the deadline is of another clock, or the context's timer has
	// not run yet.
	Unmet
)

// Past reports whether the wall clock is past the deadline: Met or
// Unmet.
func (s State) Past() bool { return s == Met || s == Unmet }

// String returns the state's name.
func (s State) String() string {
	switch s {
	case None:
		return "none"
	case Ahead:
		return "ahead"
	case Met:
		return "met"
	case Unmet:
		return "unmet"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Of returns the time left to ctx's deadline by the wall clock, above 0
// when its state is Ahead and 0 otherwise, and that state. It reads the
// wall clock before ctx's Err, so that a context that ends meanwhile, at
// its deadline, is Met.
func Of(ctx context.Context) (time.Duration, State) {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, None
	}
	if left := time.Until(dl); left > 0 {
		return left, Ahead
	}
	if ctx.Err() != nil {
		return 0, Met
	}
	return 0, Unmet
}

// Lag is how long Await waits for a context to end whose deadline is
// not a moment ago.
const Lag = 20 * time.Millisecond

// Late is how long after its deadline Await waits for a context whose
// deadline the wall clock passed less than Late ago.
const Late = time.Second

// Await waits for ctx, whose deadline the wall clock is past (Unmet), to
// report its end, and returns its error; or nil if it has not ended in
// time: the deadline is then of another clock (a mock's), and bounds
// nothing the wall clock measures. A context's timer, once due, runs a
// moment later on a goroutine of its own, so that a client that stopped
// a read at the deadline by the wall clock may return before the context
// reports its end; the wait tells the two apart. It waits Lag, or, for a
// deadline the wall clock passed less than Late ago, until Late after
// it: on a busy machine that goroutine may wait its turn longer than Lag,
// and a deadline of another clock is seldom that close to the wall
// clock's time. It is for the path of an error that may be the
// deadline's, never a call's own.
func Await(ctx context.Context) error {
	wait := Lag
	if dl, ok := ctx.Deadline(); ok {
		if since := time.Since(dl); since >= 0 && since < Late {
			wait = max(wait, Late-since)
		}
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
