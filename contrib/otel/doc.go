// Package ratelimitotel records the decisions of a ratelimit.Limiter, and
// the ends of the jobs of its reservations' AfterFunc, as OpenTelemetry
// metrics, and traces the calls a Limiter makes to its Store.
//
//	obs, err := ratelimitotel.NewObserver() // the global MeterProvider
//	if err != nil { ... }
//	lim, err := ratelimit.New(ratelimitotel.WrapStore(store), limits, ratelimit.WithObserver(obs))
//
// # Metrics
//
// The Observer records two instruments, both with the attributes
// ratelimit.limit (the limit's name), ratelimit.outcome (allowed, reserved,
// denied or degraded), ratelimit.check (true for Check, which spends
// nothing), ratelimit.local (true when the deny cache answered without
// asking the store) and ratelimit.allowed (true when the call was let
// through: for a degraded one, a limit that fails open, where false is
// one that fails closed and refused it):
//
//   - ratelimit.decisions, a counter of decisions ({decision});
//   - ratelimit.decision.duration, a histogram of the time a decision took,
//     in seconds, on the Limiter's clock.
//
// The key a call was limited by is never an attribute: keys are unbounded
// (one per user or address), and a metric labelled by them grows without
// limit. Nor is the name of a limit given inline (ratelimit.WithConfig on
// a name not declared, ratelimit.Event.Inline), which may be made up per
// call: such decisions all have ratelimit.limit "_OTHER" (OtherLimit).
// Declare a limit (New, SetLimits, SetLimit) for its decisions to have
// attribute sets of their own. A call of LimitAll records one decision
// per limit.
//
// The Observer is a ratelimit.JobObserver too. A job of
// ratelimit.Reservation.AfterFunc is not a decision (its reservation was
// one, recorded when it was made): its end is counted apart, with the
// attributes ratelimit.limit (as for decisions) and ratelimit.outcome,
// ran, dropped or stopped (ratelimit.JobOutcome):
//
//   - ratelimit.afterfunc.jobs, a counter of jobs ended ({job}).
//
// # Traces
//
// WrapStore returns a Store that starts a span around every call to the
// store it wraps (ratelimit.store.apply, ratelimit.store.load, ...),
// with the names of the limits the call touches but never their keys, and
// the error recorded on the span when the store fails. A store that
// panics ends its span too, as an error, and the panic goes on as it is.
//
// Unlike the metrics, the spans name a limit given inline as the call
// named it, not "_OTHER": a store is not told which limits are declared,
// and a span is not aggregated, so a name per call adds no series. They
// are exported with the traces, though: a name made up of what must not
// leave the service (a user's e-mail address) belongs in the key, which
// no span carries, under a name shared by the calls. The error recorded
// is the store's own: one for a record the store cannot read names the
// record's key, unless the Limiter hashes keys (ratelimit.WithKeyHash).
//
// The span of an apply has the attributes ModeKey (limit, check or
// refund), ReserveKey, LimitsKey and, after the answer, OKKey. A
// settlement (a token's Use, Refund or Settle, a Reservation's Wait,
// AfterFunc or Cancel) is a refund that the store applies once: its span
// has SettleKey too, use or cancel, and, when the store found the token
// settled before and did nothing, SettledKey (how it was settled) and
// SettledOwnKey (whether by the same settler: a retry finding its first
// attempt).
//
// A span's status is Error when the store failed. A call that failed
// because its caller gave up is not the store's failure: when the call's
// context was canceled or its deadline passed, and the error matches
// that (context.Canceled or context.DeadlineExceeded, as the stores
// return it), the error is recorded as an event and the status is left
// Unset. A store's own timeout, with the caller's context live, is an
// Error; so is an error of another cause that came as the context ended.
// A deadline is read off the wall clock by the library's one rule, as
// the Redis and PostgreSQL stores read it: for an error matching
// context.DeadlineExceeded with the wall clock past the deadline and the
// context not yet ended (its timer is due, or the deadline is a mock
// clock's), the wrapper waits a moment (at most 20 ms) for the context to
// end; if it does not, the deadline is another clock's, and the timeout
// the store's own.
//
// The wrapper keeps the optional capabilities of the store visible, so
// that a Limiter treats it exactly as the store: driver.BatchApplier and
// DeleteExpired are implemented when the wrapped store implements them,
// and driver.TimeSource and driver.RecordClock always, its OwnClock
// reporting the wrapped store's answer (false for a store that keeps no
// clock of its own), and its RecordNow the wrapped store's (its Now, for
// a store with one clock for every record). The
// shortcut of driver.Binder is left out, so that every decision has its
// span.
//
// # Providers
//
// Both use the global MeterProvider and TracerProvider of package otel
// unless WithMeterProvider or WithTracerProvider names another. The
// instrumentation scope is ScopeName, the module's path.
//
// A nil Option (an option variable never set) is a mistake, as it is to
// ratelimit.New, and so is a provider that is a nil pointer (a
// *sdktrace.TracerProvider left unset; nil itself asks for the global
// one): NewObserver returns an error matching ErrInvalidOption, and
// WrapStore, which returns no error, panics with one.
package ratelimitotel
