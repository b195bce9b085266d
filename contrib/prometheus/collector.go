// Package ratelimitprom exports the decisions of a ratelimit.Limiter, and
// the ends of the jobs of its reservations' AfterFunc, as Prometheus
// metrics.
//
//	c, err := ratelimitprom.NewCollector()
//	if err != nil { ... }
//	prometheus.MustRegister(c)
//	lim, err := ratelimit.New(store, limits, ratelimit.WithObserver(c))
//
// A Collector is both a prometheus.Collector and a ratelimit.Observer. It
// exports two metrics of decisions, both labelled by limit (the limit's
// name), outcome (allowed, reserved, denied or degraded), check ("true"
// for Check, which spends nothing), local ("true" when the deny cache
// answered without asking the store) and allowed ("true" when the call was
// let through: for outcome="degraded", a limit that fails open, where
// "false" is one that fails closed and refused the call):
//
//	ratelimit_decisions_total             counter of decisions
//	ratelimit_decision_duration_seconds   histogram of the time a decision took
//
// It is a ratelimit.JobObserver too, and counts the jobs of
// ratelimit.Reservation.AfterFunc by how they ended, labelled by limit and
// outcome (ran, dropped or stopped), apart from the decisions (a job is
// not one):
//
//	ratelimit_afterfunc_jobs_total        counter of jobs ended
//
// The key a call was limited by is never a label: keys are unbounded (one
// per user or address), and a metric labelled by them grows without limit.
// Nor is the name of a limit given inline (ratelimit.WithConfig on a name
// not declared, ratelimit.Event.Inline), which may be made up per call:
// such calls are all labelled limit="_OTHER" (OtherLimit). Declare a limit
// (New, SetLimits, SetLimit) for its calls to have series of their own.
// A call of LimitAll counts one decision per limit; a job, its reservation's
// decision when it is reserved, and its end once. WithNamespace and
// WithSubsystem change the prefix, WithConstLabels adds labels of the
// process, WithBuckets changes the histogram's buckets.
//
// Two Collectors on one registry, of two Limiters in one process, need
// const labels that tell them apart (WithConstLabels), or a namespace or
// subsystem each: the registry refuses the second with
// prometheus.AlreadyRegisteredError, as it does one Collector registered
// twice.
package ratelimitprom

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ratelimit-go/ratelimit"
)

// bucketLabel is the label of a histogram's buckets, which Prometheus
// gives every histogram series.
const bucketLabel = "le"

// DefaultNamespace is the metrics' prefix unless WithNamespace changes it.
const DefaultNamespace = "ratelimit"

// The labels of the metrics: all five for decisions, LabelLimit and
// LabelOutcome for jobs.
const (
	LabelLimit   = "limit"
	LabelOutcome = "outcome"
	LabelCheck   = "check"
	LabelLocal   = "local"
	// LabelAllowed is "true" when the call was let through (the
	// Result's OK), "false" when it was refused. It follows from the
	// outcome but for "degraded", where it tells a limit that failed
	// open, and let the call through, from one that failed closed.
	LabelAllowed = "allowed"
)

// OtherLimit is the limit label of the calls of limits given inline
// (ratelimit.WithConfig on a name not declared): their names may be made
// up per call, one per tenant say, and a series for each would grow
// without limit. It is spelt as OpenTelemetry spells a value folded for
// the same reason (an HTTP method it does not know); a declared limit of
// that very name would share its series.
const OtherLimit = "_OTHER"

// DefaultBuckets returns the histogram's default buckets, in seconds: from
// 10 µs (an in-memory store) to 2.5 s (a store timing out).
func DefaultBuckets() []float64 {
	return []float64{
		0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
		0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
	}
}

type options struct {
	namespace, subsystem string
	constLabels          prometheus.Labels
	buckets              []float64
}

// Option configures NewCollector.
type Option func(*options)

// WithNamespace sets the metrics' namespace, the first part of their
// names (default DefaultNamespace, "ratelimit"). An empty namespace leaves
// the names decisions_total and decision_duration_seconds, after the
// subsystem if any.
func WithNamespace(ns string) Option { return func(o *options) { o.namespace = ns } }

// WithSubsystem sets the part of the metrics' names between the namespace
// and the name (default none).
func WithSubsystem(s string) Option { return func(o *options) { o.subsystem = s } }

// WithConstLabels adds labels with fixed values to both metrics, such as
// the store's or the service's name. NewCollector refuses a label named as
// one of the Collector's own (LabelLimit and the others) or "le", the
// histogram's bucket label.
func WithConstLabels(l prometheus.Labels) Option {
	return func(o *options) {
		if o.constLabels == nil {
			o.constLabels = make(prometheus.Labels, len(l))
		}
		for k, v := range l {
			o.constLabels[k] = v
		}
	}
}

// WithBuckets sets the upper bounds, in seconds and increasing, of the
// duration histogram's buckets (default DefaultBuckets). Given none, the
// histogram has Prometheus's default buckets, prometheus.DefBuckets.
func WithBuckets(b []float64) Option {
	return func(o *options) { o.buckets = append([]float64(nil), b...) }
}

// Collector counts the decisions of a Limiter and times them: it is a
// ratelimit.Observer to give to ratelimit.WithObserver, and a
// prometheus.Collector to register. Build it with NewCollector; it is safe
// for concurrent use. The zero Collector is ready to use, as NewCollector
// with no option makes it: its metrics are built when it is first used
// (registered, or told of a decision).
type Collector struct {
	once sync.Once // builds the metrics of a zero Collector (ready)

	decisions *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	jobs      *prometheus.CounterVec

	mu     sync.RWMutex
	series map[seriesKey]series
}

var (
	_ ratelimit.Observer    = (*Collector)(nil)
	_ ratelimit.JobObserver = (*Collector)(nil)
	_ prometheus.Collector  = (*Collector)(nil)
)

type seriesKey struct {
	name                  string
	outcome               ratelimit.Outcome
	check, local, allowed bool
}

// series holds the counter and histogram of one label set, found once, so
// that observing a decision does not look them up by label values again.
type series struct {
	decisions prometheus.Counter
	duration  prometheus.Observer
}

// maxSeries bounds the series the Collector keeps found. Declared limits
// are few, and the calls of limits given inline share one name
// (OtherLimit); past the bound (thousands of declared limits) each
// decision looks its series up.
const maxSeries = 1024

// ErrInvalidOption is matched by the error of NewCollector given an
// invalid option.
var ErrInvalidOption = errors.New("ratelimitprom: invalid option")

// NewCollector returns a Collector, or an error matching ErrInvalidOption
// for a nil Option (as ratelimit.New refuses one), or an option
// Prometheus would refuse: a namespace, subsystem or const
// label that is not a valid name, a const label named as one of the
// Collector's own labels or as the histogram's bucket label ("le"),
// buckets that do not increase.
func NewCollector(opts ...Option) (*Collector, error) {
	o := options{namespace: DefaultNamespace, buckets: DefaultBuckets()}
	for k, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("ratelimitprom: NewCollector was given a nil Option (option %d): leave it out, or pass the option it was meant to be: %w", k+1, ErrInvalidOption)
		}
		opt(&o)
	}
	for i, b := range o.buckets {
		if math.IsNaN(b) || (i > 0 && b <= o.buckets[i-1]) {
			return nil, fmt.Errorf("ratelimitprom: histogram buckets %v do not increase at %v: give increasing upper bounds: %w",
				o.buckets, b, ErrInvalidOption)
		}
	}
	// Prometheus refuses the histogram's bucket label as a const label
	// only when the histogram's first series is made: on the first
	// decision, with a panic, where registration passed.
	if _, ok := o.constLabels[bucketLabel]; ok {
		return nil, fmt.Errorf("ratelimitprom: const label %q is the duration histogram's bucket label: name it otherwise: %w",
			bucketLabel, ErrInvalidOption)
	}
	c := &Collector{}
	c.once.Do(func() { c.build(o) })
	// The descriptions carry the errors of names and labels; a registry
	// reports them.
	if err := prometheus.NewRegistry().Register(c); err != nil {
		return nil, fmt.Errorf("ratelimitprom: Prometheus refuses the metrics as the options name them: %w: "+
			"give a namespace, subsystem and const label names of ASCII letters, digits and underscores, not starting with a digit "+
			"(nor a label with \"__\"), const labels named apart from the Collector's own, and values in UTF-8: %w", err, ErrInvalidOption)
	}
	return c, nil
}

// build makes the metrics of c as o names them, once (c.once).
func (c *Collector) build(o options) {
	labels := []string{LabelLimit, LabelOutcome, LabelCheck, LabelLocal, LabelAllowed}
	c.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.namespace, Subsystem: o.subsystem, Name: "decisions_total",
		Help:        "Decisions of rate limits, by limit and outcome.",
		ConstLabels: o.constLabels,
	}, labels)
	c.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: o.namespace, Subsystem: o.subsystem, Name: "decision_duration_seconds",
		Help:        "Time a rate limit decision took, on the Limiter's clock.",
		ConstLabels: o.constLabels,
		Buckets:     o.buckets,
	}, labels)
	c.jobs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: o.namespace, Subsystem: o.subsystem, Name: "afterfunc_jobs_total",
		Help:        "Jobs of Reservation.AfterFunc, by limit and how they ended: ran, dropped or stopped.",
		ConstLabels: o.constLabels,
	}, []string{LabelLimit, LabelOutcome})
	c.series = make(map[seriesKey]series)
}

// ready builds the metrics of a zero Collector, as NewCollector with no
// option does, the first time it is used.
func (c *Collector) ready() {
	c.once.Do(func() { c.build(options{namespace: DefaultNamespace, buckets: DefaultBuckets()}) })
}

// Describe sends the descriptions of the metrics.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.ready()
	c.decisions.Describe(ch)
	c.duration.Describe(ch)
	c.jobs.Describe(ch)
}

// Collect sends the current values of the metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.ready()
	c.decisions.Collect(ch)
	c.duration.Collect(ch)
	c.jobs.Collect(ch)
}

// Observe counts one decision and records how long it took (0 for a
// negative Latency: the Limiter's clock stepped back), labelled by the
// limit's name and the outcome, never the key; by OtherLimit for a limit
// given inline (e.Inline).
func (c *Collector) Observe(_ context.Context, e ratelimit.Event) {
	c.ready()
	name := e.Result.Name
	if e.Inline {
		name = OtherLimit
	}
	s := c.find(seriesKey{name: name, outcome: e.Outcome, check: e.Check, local: e.Result.Local, allowed: e.LetThrough()})
	s.decisions.Inc()
	// A clock that stepped back during the call reads a negative time,
	// which would take from the sum Prometheus reads as a counter.
	s.duration.Observe(max(e.Latency, 0).Seconds())
}

// ObserveJob counts one job of Reservation.AfterFunc in
// afterfunc_jobs_total, labelled by the limit's name (OtherLimit for a
// limit given inline) and how the job ended: ran, dropped or stopped.
func (c *Collector) ObserveJob(_ context.Context, e ratelimit.JobEvent) {
	c.ready()
	name := e.Result.Name
	if e.Inline {
		name = OtherLimit
	}
	c.jobs.WithLabelValues(strings.ToValidUTF8(name, "\uFFFD"), e.Outcome.String()).Inc()
}

func (c *Collector) find(k seriesKey) series {
	c.mu.RLock()
	s, ok := c.series[k]
	c.mu.RUnlock()
	if ok {
		return s
	}
	// A label value must be UTF-8; a limit's name may be any string.
	values := []string{strings.ToValidUTF8(k.name, "\uFFFD"), k.outcome.String(), strconv.FormatBool(k.check), strconv.FormatBool(k.local),
		strconv.FormatBool(k.allowed)}
	s = series{decisions: c.decisions.WithLabelValues(values...), duration: c.duration.WithLabelValues(values...)}
	c.mu.Lock()
	if len(c.series) < maxSeries {
		c.series[k] = s
	}
	c.mu.Unlock()
	return s
}
