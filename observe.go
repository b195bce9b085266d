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
type Observer interface {
	Observe(ctx context.Context, e Event)
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
	// (Degraded) or the deny cache (Local) decided it.
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
	// Latency is the time the decision took, on the Limiter's clock.
	Latency time.Duration
	// Err is the store's error when the Outcome is Degraded.
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
