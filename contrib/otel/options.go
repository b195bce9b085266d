package ratelimitotel

import (
	"errors"
	"fmt"

	"github.com/ratelimit-go/ratelimit/internal/isnil"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meters and tracers this
// package creates: the module's path.
const ScopeName = "github.com/ratelimit-go/ratelimit/contrib/otel"

// The attributes of the metrics and spans.
const (
	// LimitKey is the name of the limit decided (or of a job's
	// reservation); OtherLimit for a limit given inline.
	LimitKey = attribute.Key("ratelimit.limit")
	// OutcomeKey is what became of the call: allowed, reserved, denied or
	// degraded (ratelimit.Outcome.String); of a job of AfterFunc, how it
	// ended: ran, dropped or stopped (ratelimit.JobOutcome.String).
	OutcomeKey = attribute.Key("ratelimit.outcome")
	// CheckKey is true for a call of Check, which spends nothing.
	CheckKey = attribute.Key("ratelimit.check")
	// LocalKey is true when the deny cache refused the call without asking
	// the store.
	LocalKey = attribute.Key("ratelimit.local")
	// AllowedKey is true when the call was let through (the Result's
	// OK), false when it was refused. It follows from the outcome but for
	// degraded, where it tells a limit that failed open, and let the call
	// through, from one that failed closed.
	AllowedKey = attribute.Key("ratelimit.allowed")
	// LimitsKey lists, on a span, the names of the limits a store call
	// touches, once each, as the store is given them: a limit given
	// inline is named as the call named it, not OtherLimit (a store does
	// not know which limits are declared, and a span, which is not
	// aggregated, may carry a name per call).
	LimitsKey = attribute.Key("ratelimit.limits")
	// ModeKey is, on an apply span, what the call asks of the store:
	// limit, check or refund. A settlement is a refund; SettleKey says
	// which.
	ModeKey = attribute.Key("ratelimit.mode")
	// SettleKey is, on the apply span of a settlement (a token's Use,
	// Refund or Settle, a Reservation's Cancel, and its Wait or AfterFunc
	// once its token was taken), how it settles: use (the job ran, or
	// may: Use, Settle of a used above 0, Wait, AfterFunc) or cancel (the
	// tokens go back: Refund, Settle of 0, Cancel). A plain refund has
	// none.
	SettleKey = attribute.Key("ratelimit.settle")
	// SettledKey is, on the apply span of a settlement that the store
	// found settled before, and so did nothing, how it was: use or
	// cancel. A settlement the call made has none.
	SettledKey = attribute.Key("ratelimit.settled")
	// SettledOwnKey is, with SettledKey, true when the settlement found is
	// the sender's own (driver.Decision.Own): a retry finding its first
	// attempt, whose answer was lost, rather than another settler's.
	SettledOwnKey = attribute.Key("ratelimit.settled_own")
	// ReserveKey is, on an apply span, true for a call that may reserve.
	ReserveKey = attribute.Key("ratelimit.reserve")
	// OKKey is, on an apply span, true when the store granted every item.
	OKKey = attribute.Key("ratelimit.ok")
	// RecordsKey is, on a load or delete span, how many records the call
	// reads or removes; on a delete_expired span, how many it removed.
	RecordsKey = attribute.Key("ratelimit.records")
	// OpsKey is, on an apply_batch span, how many ops the batch holds.
	OpsKey = attribute.Key("ratelimit.ops")
)

// OtherLimit is the LimitKey of the decisions of limits given inline
// (ratelimit.WithConfig on a name not declared, ratelimit.Event.Inline):
// their names may be made up per call, one per tenant say, and an
// attribute set for each would grow without limit. It is spelt as the
// semantic conventions spell a value folded for the same reason (an HTTP
// method they do not know); a declared limit of that very name would share
// its attribute sets. It is the metrics' alone: the spans of WrapStore
// name such limits as the calls did (LimitsKey).
const OtherLimit = "_OTHER"

// durationBuckets are the bucket boundaries, in seconds, the decision
// duration histogram advises: from 10 µs (an in-memory store) to 2.5 s (a
// store timing out). A View of the MeterProvider may change them.
var durationBuckets = []float64{
	0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
}

type config struct {
	mp    metric.MeterProvider
	tp    trace.TracerProvider
	attrs []attribute.KeyValue
}

// ErrInvalidOption is matched (errors.Is) by the error of NewObserver
// given a nil Option, or a provider that is a nil pointer, and by the
// value WrapStore panics with given one.
var ErrInvalidOption = errors.New("ratelimitotel: invalid option")

// newConfig applies opts, for the function fn. A nil Option (an option
// variable never set) is refused, as ratelimit.New refuses one: skipped,
// the option meant (a provider, the attributes that tell two stores
// apart) would go missing unseen. So is an option's error, which says
// what was wrong; newConfig names the function and the option's place.
func newConfig(fn string, opts []Option) (config, error) {
	c := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider()}
	for k, o := range opts {
		if isnil.Is(o) {
			return config{}, fmt.Errorf("ratelimitotel: %s was given a nil Option (option %d): leave it out, or pass the option it was meant to be: %w", fn, k+1, ErrInvalidOption)
		}
		if err := o.apply(&c); err != nil {
			return config{}, fmt.Errorf("ratelimitotel: %s was given %w (option %d)", fn, err, k+1)
		}
	}
	return c, nil
}

// Option configures NewObserver and WrapStore.
type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// nilProvider is the error of a provider that is a nil pointer, of type
// t, given to the option named opt.
type nilProvider struct{ opt, t string }

func (e nilProvider) Error() string {
	return fmt.Sprintf("%s of a nil %s, whose methods would dereference it: give a provider, or leave the option out (or give it nil) for the global one", e.opt, e.t)
}

func (e nilProvider) Unwrap() error { return ErrInvalidOption }

// WithMeterProvider sets the MeterProvider the Observer creates its meter
// from. By default, or given nil, it is the global one (otel.GetMeterProvider).
// A nil pointer (a *sdkmetric.MeterProvider left unset), whose methods
// would dereference it, is refused (ErrInvalidOption): it is no provider,
// and not the nil that asks for the global one, which the provider meant
// may not be.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) error {
		switch {
		case mp == nil:
		case isnil.Is(mp):
			return nilProvider{"WithMeterProvider", fmt.Sprintf("%T", mp)}
		default:
			c.mp = mp
		}
		return nil
	})
}

// WithTracerProvider sets the TracerProvider the wrapped store creates its
// tracer from. By default, or given nil, it is the global one
// (otel.GetTracerProvider). A nil pointer (a *sdktrace.TracerProvider left
// unset) is refused, as WithMeterProvider refuses one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) error {
		switch {
		case tp == nil:
		case isnil.Is(tp):
			return nilProvider{"WithTracerProvider", fmt.Sprintf("%T", tp)}
		default:
			c.tp = tp
		}
		return nil
	})
}

// WithAttributes adds attributes to every measurement and span, such as
// the name of the store or of the service. They must not depend on the
// call: a key among them would make every metric unbounded.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) error {
		c.attrs = append(c.attrs, attrs...)
		return nil
	})
}
