package ratelimit

import (
	"context"
	"time"
)

// Observer sees every decision of a Limiter, so that metrics, traces and
// logs can be fed without the library depending on any of them. Observe is
// called synchronously on the caller's goroutine, once per limit decided
// (LimitAll reports each of its limits); keep it fast and non-blocking.
//
// Label metrics by the limit's name (Event.Result.Name) and Event.Outcome,
// never by the key (Event.Result.Key): keys are unbounded (one per user or
// IP), and a metric labelled by them grows without limit. So may be the
// names of limits given inline (Event.Inline): label those calls by one
// value for all.
//
// Only decisions are events, of the store or of the failure policy. A
// call that ends with its caller's context, before the store answered
// (the caller's own error, as callers see it: the context's, not a
// store's failure, docs/production.md), was decided by neither, and is
// not reported: count those at the caller, or time the store's calls
// (ratelimitotel.WrapStore). That includes a Reserve whose store
// call its context cut short, which the store may have charged all the
// same (docs/reservations.md). A call the store answered after its
// caller's context ended is a decision, reported as such.
//
// What later becomes of a Reservation (its
// Wait, Cancel, or the Use, Refund or Settle of its token) is not, and a
// reservation is reported once, when it is made. The one exception is
// the job of Reservation.AfterFunc, which runs, or is dropped, where no
// caller sees it: an Observer that implements JobObserver learns its end.
//
// A panic of Observe is not recovered: it goes on to the caller of the
// call it was told of, whose tokens stay taken, as a panic of the caller's
// own code after the call would leave them. But for Reserve, whose
// Reservation, the one means to hand its tokens back, would never reach
// its caller: they are handed back before the panic goes on, the store
// given no longer than a Wait's refund (WithRefundTimeout).
//
// Limit and LimitAll keep their charge even with WithReserve, whose
// tokens may be owed as a Reservation's are: their Result has no Cancel,
// and a caller who saw it could not hand the tokens back through it
// either, so the panic takes no means from the caller that it had. With
// WithReceipt it does (the Token could Refund them), but a receipt settles
// an outcome only the caller knows, and the charge stays taken, as a
// caller's panic before it settled its receipt would leave it.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// JobObserver is implemented by an Observer that learns, too, how each
// job that Reservation.AfterFunc scheduled ended: the function ran, the
// job was dropped (what OnDropped is told), or stop stopped it and handed
// the tokens back. The Limiter calls ObserveJob once per scheduled job,
// never for an AfterFunc that returned an error (it scheduled nothing),
// and never for a Wait, whose caller has its answer. The calls for a run
// or a drop come on the goroutine that would run the job, before the
// function (or OnDropped's) is called, with a context that carries the
// values of the Reserve call's context (a trace, a span), but not its
// cancellation or deadline (context.WithoutCancel); the call for a stop
// comes on the goroutine of stop, with stop's context. Keep it fast and non-blocking, as Observe.
//
// A panic of ObserveJob is not recovered, as Observe's is not, but it
// cannot keep a job from its end: the store has marked the reservation
// used (or the job was let go) before the call, so the function (or
// OnDropped's) is called all the same, and the panic goes on once it has
// returned: on the job's goroutine, as a panic of the function would,
// which ends the process as one of time.AfterFunc's function does. A
// panic as stop reports true goes on to stop's caller, the tokens handed
// back already.
//
// A job is not a decision: count jobs apart from decisions, labelled by
// limit and outcome as an Event is (a JobEvent's Inline and Result.Key
// are what Event's are).
type JobObserver interface {
	ObserveJob(ctx context.Context, e JobEvent)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// Outcome is what became of a call, as an Event reports it.
type Outcome uint8

const (
	// Allowed: the limit had the tokens, and they were taken (or, for
	// Check, would be). In a LimitAll that another limit refused, the
	// limit's own answer is reported: it had them, but nothing was taken.
	Allowed Outcome = iota + 1
	// Reserved: OK, with tokens owed until RetryAfter (and, as for
	// Allowed, nothing taken if another limit of a LimitAll refused).
	Reserved
	// Denied: refused; nothing was taken.
	Denied
	// Degraded: the store could not decide; the failure policy did (see
	// Event.Result.OK and Event.Err).
	Degraded
)

// String returns "allowed", "reserved", "denied" or "degraded".
func (o Outcome) String() string {
	switch o {
	case Allowed:
		return "allowed"
	case Reserved:
		return "reserved"
	case Denied:
		return "denied"
	case Degraded:
		return "degraded"
	}
	return "unknown"
}

// Event describes one decision of one limit.
type Event struct {
	// Result is the limit's own answer: its Name, Key (never a metric
	// label), Count, OK, RetryAfter, and whether the failure policy
	// (Degraded) or the deny cache (Local) decided it. Its Token is nil:
	// a receipt is the caller's, a bearer capability that an observer
	// logging its events would spread.
	Result Result
	// Outcome sums the answer up.
	Outcome Outcome
	// Check is true for Check, which spends nothing.
	Check bool
	// Inline is true when the call gave the limit's config (WithConfig)
	// for a name not declared (in New, SetLimits or SetLimit). Such names
	// may be made per call, one per tenant say, and a metric labelled by
	// them grows without limit, as by keys: label such calls alike.
	Inline bool
	// Latency is the time the decision took, on the Limiter's clock
	// (WithClock). It is never negative: a decision during which that
	// clock stepped back (a step of NTP, a clock set back) took 0.
	Latency time.Duration
	// Err is the store's error when the Outcome is Degraded.
	Err error
}

// LetThrough reports whether the call of e was let through: Allowed and
// Reserved are, Denied is not, and a Degraded call is as its limit's
// failure policy answered (Result.OK: let through when the limit fails
// open). It is the Outcome's answer for the event's own limit, which
// for Allowed and Reserved is a yes even where another limit of a
// LimitAll refused the call.
func (e Event) LetThrough() bool {
	switch e.Outcome {
	case Allowed, Reserved:
		return true
	case Degraded:
		return e.Result.OK
	}
	return false
}

// JobOutcome is how a job of Reservation.AfterFunc ended, as a JobEvent
// reports it.
type JobOutcome uint8

const (
	// JobRan: the job's time came, and AfterFunc ran its function.
	JobRan JobOutcome = iota + 1
	// JobDropped: the job's time came, and AfterFunc did not run its
	// function; JobEvent.Err says why, as OnDropped's error does.
	JobDropped
	// JobStopped: stop reported true: the function will not run, and the
	// tokens were handed back unless JobEvent.Err (the refund's error,
	// which stop does not return) says otherwise.
	JobStopped
)

// String returns "ran", "dropped" or "stopped".
func (o JobOutcome) String() string {
	switch o {
	case JobRan:
		return "ran"
	case JobDropped:
		return "dropped"
	case JobStopped:
		return "stopped"
	}
	return "unknown"
}

// JobEvent describes how one job of Reservation.AfterFunc ended.
type JobEvent struct {
	// Result is the reservation's decision (Reservation.Result), reported
	// as an Event when the reservation was made: its Name, Key (never a
	// metric label), Count, and whether the failure policy granted it
	// (Degraded); its Token is nil, as an Event's.
	Result Result
	// Outcome says how the job ended.
	Outcome JobOutcome
	// Inline is true for a limit given inline, as Event.Inline.
	Inline bool
	// Err is why a job was dropped (JobDropped), or why a stopped job's
	// tokens were not handed back (JobStopped); nil otherwise.
	Err error
}

func outcomeOf(r Result, failed bool) Outcome {
	switch {
	case failed:
		return Degraded
	case !r.OK:
		return Denied
	case r.RetryAfter > 0:
		return Reserved
	}
	return Allowed
}

// observeJobThen tells the JobObserver, if any, with ctx (the values of
// the Reserve call's context), that the job of r ended as o (a run, or a
// drop with why), on the job's goroutine, then calls
// next: the job's function, or OnDropped's. next is called even if
// ObserveJob panics, whose panic goes on once next has returned: the
// store has settled the use already, and a job it marked used that never
// ran, or a drop that OnDropped never learned of, would be lost.
func (l *Limiter) observeJobThen(ctx context.Context, r *Reservation, o JobOutcome, err error, next func()) {
	// Through a closure, so that next, not the deferred function itself,
	// cannot recover the observer's panic and hide it.
	defer func() { next() }()
	l.observeJob(ctx, r, o, err)
}
