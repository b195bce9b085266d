package ratelimitotel

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/ratelimit-go/ratelimit"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Observer records the decisions of a Limiter as metrics, and the ends of
// the jobs of Reservation.AfterFunc (it is a ratelimit.JobObserver): give
// it to ratelimit.WithObserver. Build it with NewObserver; it is safe for
// concurrent use. The zero Observer is ready to use, as NewObserver with no
// option makes it: it records on the global MeterProvider, its
// instruments made when it is first told of a decision or a job.
type Observer struct {
	once sync.Once // builds the instruments of a zero Observer (ready)

	decisions metric.Int64Counter
	duration  metric.Float64Histogram
	jobs      metric.Int64Counter
	attrs     []attribute.KeyValue

	mu   sync.RWMutex
	sets map[setKey]*measure
}

var (
	_ ratelimit.Observer    = (*Observer)(nil)
	_ ratelimit.JobObserver = (*Observer)(nil)
)

// setKey is what tells the attribute sets of two decisions apart.
type setKey struct {
	name                  string
	outcome               ratelimit.Outcome
	check, local, allowed bool
}

// measure holds the options of one attribute set, built once, so that
// recording a decision allocates nothing.
type measure struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

// maxSets bounds the attribute sets the Observer keeps built. Declared
// limits are few, and the calls of limits given inline share one name
// (OtherLimit); past the bound (thousands of declared limits) each
// decision builds its own.
const maxSets = 1024

// NewObserver returns an Observer that records on a meter of the
// MeterProvider (WithMeterProvider; the global one by default) named
// ScopeName. The error matches ErrInvalidOption for a nil Option, as
// ratelimit.New's does, and for a provider that is a nil pointer;
// otherwise it is the meter's, when it cannot create an instrument.
func NewObserver(opts ...Option) (*Observer, error) {
	c, err := newConfig("NewObserver", opts)
	if err != nil {
		return nil, err
	}
	o := &Observer{}
	o.once.Do(func() { err = o.build(c) })
	if err != nil {
		return nil, err
	}
	return o, nil
}

// build makes the instruments of o on the meter of c's MeterProvider,
// once (o.once).
func (o *Observer) build(c config) error {
	meter := c.mp.Meter(ScopeName)
	decisions, err := meter.Int64Counter("ratelimit.decisions",
		metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions of rate limits, by limit and outcome."))
	if err != nil {
		return fmt.Errorf("ratelimitotel: create the ratelimit.decisions counter: %w", err)
	}
	duration, err := meter.Float64Histogram("ratelimit.decision.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time a rate limit decision took, on the Limiter's clock."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return fmt.Errorf("ratelimitotel: create the ratelimit.decision.duration histogram: %w", err)
	}
	jobs, err := meter.Int64Counter("ratelimit.afterfunc.jobs",
		metric.WithUnit("{job}"),
		metric.WithDescription("Jobs of Reservation.AfterFunc, by limit and how they ended: ran, dropped or stopped."))
	if err != nil {
		return fmt.Errorf("ratelimitotel: create the ratelimit.afterfunc.jobs counter: %w", err)
	}
	o.decisions, o.duration, o.jobs, o.attrs, o.sets = decisions, duration, jobs, c.attrs, make(map[setKey]*measure)
	return nil
}

// ready builds the instruments of a zero Observer, as NewObserver with no
// option does, the first time it is used. Should the global
// MeterProvider fail to create them, its error goes to OpenTelemetry's
// error handler (otel.Handle), and the Observer records nothing.
func (o *Observer) ready() {
	o.once.Do(func() {
		c, _ := newConfig("NewObserver", nil) // no option: no error
		if err := o.build(c); err != nil {
			otel.Handle(err)
			_ = o.build(config{mp: noop.NewMeterProvider()}) // a no-op meter never fails
		}
	})
}

// Observe records one decision: it adds one to ratelimit.decisions and
// records its latency in ratelimit.decision.duration (0 for a negative
// Latency: the Limiter's clock stepped back), with the limit's
// name and the outcome, never the key; with OtherLimit for a limit given
// inline (e.Inline).
func (o *Observer) Observe(ctx context.Context, e ratelimit.Event) {
	o.ready()
	name := e.Result.Name
	if e.Inline {
		name = OtherLimit
	}
	m := o.measure(setKey{name: name, outcome: e.Outcome, check: e.Check, local: e.Result.Local, allowed: e.LetThrough()})
	o.decisions.Add(ctx, 1, m.add...)
	// A clock that stepped back during the call reads a negative time,
	// which would take from the histogram's sum.
	o.duration.Record(ctx, max(e.Latency, 0).Seconds(), m.record...)
}

// ObserveJob records one job of Reservation.AfterFunc: it adds one to
// ratelimit.afterfunc.jobs, with the limit's name (OtherLimit for a limit
// given inline) and how the job ended (ran, dropped or stopped) as
// ratelimit.outcome, never the key.
func (o *Observer) ObserveJob(ctx context.Context, e ratelimit.JobEvent) {
	o.ready()
	name := e.Result.Name
	if e.Inline {
		name = OtherLimit
	}
	// As in measure: the extra attributes first, so that the job's own win.
	attrs := make([]attribute.KeyValue, 0, len(o.attrs)+2)
	attrs = append(attrs, o.attrs...)
	attrs = append(attrs, LimitKey.String(strings.ToValidUTF8(name, "\uFFFD")), OutcomeKey.String(e.Outcome.String()))
	o.jobs.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attrs...)))
}

func (o *Observer) measure(k setKey) *measure {
	o.mu.RLock()
	m, ok := o.sets[k]
	o.mu.RUnlock()
	if ok {
		return m
	}
	// The extra attributes first: of two with the same key, NewSet keeps
	// the last, and the decision's own must win.
	attrs := make([]attribute.KeyValue, 0, len(o.attrs)+5)
	attrs = append(attrs, o.attrs...)
	// A limit's name may be any string; exporters (OTLP's protobuf) need
	// UTF-8.
	set := attribute.NewSet(append(attrs, LimitKey.String(strings.ToValidUTF8(k.name, "\uFFFD")), OutcomeKey.String(k.outcome.String()),
		CheckKey.Bool(k.check), LocalKey.Bool(k.local), AllowedKey.Bool(k.allowed))...)
	m = &measure{add: []metric.AddOption{metric.WithAttributeSet(set)},
		record: []metric.RecordOption{metric.WithAttributeSet(set)}}
	o.mu.Lock()
	if len(o.sets) < maxSets {
		o.sets[k] = m
	}
	o.mu.Unlock()
	return m
}
