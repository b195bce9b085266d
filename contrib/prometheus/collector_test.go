package ratelimitprom_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ratelimit-go/ratelimit"
	ratelimitprom "github.com/ratelimit-go/ratelimit/contrib/prometheus"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/observetest"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The key every test limits: it must never appear in a metric.
const secretKey = "user-7f3a@example.com"

// slowStore advances the mock clock by delay during each Apply, so that a
// decision takes a known time; with fail set, Apply fails instead.
type slowStore struct {
	ratelimit.Store
	mock  *clock.Mock
	delay time.Duration
	fail  bool
}

func (s *slowStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	s.mock.Add(s.delay)
	if s.fail {
		return errors.New("store down")
	}
	return s.Store.Apply(ctx, op, out)
}

func newCollector(t *testing.T, opts ...ratelimitprom.Option) (*ratelimitprom.Collector, *prometheus.Registry) {
	t.Helper()
	c, err := ratelimitprom.NewCollector(opts...)
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	return c, reg
}

// noKey fails if any exported label value holds the key.
func noKey(t *testing.T, reg *prometheus.Registry) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				assert.NotContains(t, l.GetValue(), secretKey, "%s label %s", mf.GetName(), l.GetName())
			}
		}
	}
}

func TestCollectorOutcomes(t *testing.T) {
	ctx := context.Background()
	c, reg := newCollector(t)
	mock := clock.NewMock()
	store := &slowStore{Store: must(memstore.New()), mock: mock}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api":    {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute, MaxReserved: 1},
		"login":  {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute},
		"search": {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Minute, FailOpen: true},
	}, ratelimit.WithObserver(c), ratelimit.WithClock(mock), ratelimit.WithDenyCache(16), ratelimit.WithBreaker(0, 0))
	require.NoError(t, err)

	for _, call := range []struct {
		name string
		opts []ratelimit.CallOption
		ok   bool
	}{
		{"api", nil, true},
		{"api", nil, true},
		{"api", []ratelimit.CallOption{ratelimit.WithReserve()}, true},
		{"api", nil, false}, // the store refuses
		{"api", nil, false}, // the deny cache refuses
	} {
		res, err := lim.Limit(ctx, call.name, secretKey, call.opts...)
		require.NoError(t, err)
		assert.Equal(t, call.ok, res.OK)
	}
	_, err = lim.Check(ctx, "login", secretKey)
	require.NoError(t, err)
	store.fail = true
	for _, name := range []string{"login", "search"} {
		_, err := lim.Limit(ctx, name, secretKey)
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	}

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ratelimit_decisions_total Decisions of rate limits, by limit and outcome.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{allowed="true",check="false",limit="api",local="false",outcome="allowed"} 2
ratelimit_decisions_total{allowed="true",check="false",limit="api",local="false",outcome="reserved"} 1
ratelimit_decisions_total{allowed="false",check="false",limit="api",local="false",outcome="denied"} 1
ratelimit_decisions_total{allowed="false",check="false",limit="api",local="true",outcome="denied"} 1
ratelimit_decisions_total{allowed="true",check="true",limit="login",local="false",outcome="allowed"} 1
ratelimit_decisions_total{allowed="false",check="false",limit="login",local="false",outcome="degraded"} 1
ratelimit_decisions_total{allowed="true",check="false",limit="search",local="false",outcome="degraded"} 1
`), "ratelimit_decisions_total"))
	noKey(t, reg)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names and help follow Prometheus' conventions")
}

func TestCollectorDuration(t *testing.T) {
	ctx := context.Background()
	c, reg := newCollector(t, ratelimitprom.WithBuckets([]float64{0.001, 0.01, 0.1}))
	mock := clock.NewMock()
	store := &slowStore{Store: must(memstore.New()), mock: mock, delay: 3 * time.Millisecond}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute},
	}, ratelimit.WithObserver(c), ratelimit.WithClock(mock))
	require.NoError(t, err)
	for _, d := range []time.Duration{3 * time.Millisecond, 3 * time.Millisecond, 50 * time.Millisecond} {
		store.delay = d
		_, err := lim.Limit(ctx, "api", secretKey)
		require.NoError(t, err)
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ratelimit_decision_duration_seconds Time a rate limit decision took, on the Limiter's clock.
# TYPE ratelimit_decision_duration_seconds histogram
ratelimit_decision_duration_seconds_bucket{allowed="true",check="false",limit="api",local="false",outcome="allowed",le="0.001"} 0
ratelimit_decision_duration_seconds_bucket{allowed="true",check="false",limit="api",local="false",outcome="allowed",le="0.01"} 2
ratelimit_decision_duration_seconds_bucket{allowed="true",check="false",limit="api",local="false",outcome="allowed",le="0.1"} 3
ratelimit_decision_duration_seconds_bucket{allowed="true",check="false",limit="api",local="false",outcome="allowed",le="+Inf"} 3
ratelimit_decision_duration_seconds_sum{allowed="true",check="false",limit="api",local="false",outcome="allowed"} 0.056
ratelimit_decision_duration_seconds_count{allowed="true",check="false",limit="api",local="false",outcome="allowed"} 3
`), "ratelimit_decision_duration_seconds"))
}

// The buckets of the histogram: DefaultBuckets unless WithBuckets says
// otherwise, and Prometheus's own default given none.
func TestCollectorBuckets(t *testing.T) {
	for name, c := range map[string]struct {
		opts []ratelimitprom.Option
		want []float64
	}{
		"default":     {nil, ratelimitprom.DefaultBuckets()},
		"given":       {[]ratelimitprom.Option{ratelimitprom.WithBuckets([]float64{0.5, 1})}, []float64{0.5, 1}},
		"given none":  {[]ratelimitprom.Option{ratelimitprom.WithBuckets(nil)}, prometheus.DefBuckets},
		"given empty": {[]ratelimitprom.Option{ratelimitprom.WithBuckets([]float64{})}, prometheus.DefBuckets},
	} {
		t.Run(name, func(t *testing.T) {
			col, reg := newCollector(t, c.opts...)
			col.Observe(context.Background(), ratelimit.Event{Result: ratelimit.Result{Name: "api", OK: true}, Outcome: ratelimit.Allowed})
			mfs, err := reg.Gather()
			require.NoError(t, err)
			var got []float64
			for _, mf := range mfs {
				if mf.GetName() == "ratelimit_decision_duration_seconds" {
					for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
						got = append(got, b.GetUpperBound())
					}
				}
			}
			assert.Equal(t, c.want, got)
		})
	}
}

func TestCollectorNames(t *testing.T) {
	ctx := context.Background()
	c, reg := newCollector(t, ratelimitprom.WithNamespace("shop"), ratelimitprom.WithSubsystem("edge"),
		ratelimitprom.WithConstLabels(prometheus.Labels{"store": "redis"}), ratelimitprom.WithConstLabels(prometheus.Labels{"region": "eu"}))
	c.Observe(ctx, ratelimit.Event{Result: ratelimit.Result{Name: "api", Key: secretKey}, Outcome: ratelimit.Denied})
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP shop_edge_decisions_total Decisions of rate limits, by limit and outcome.
# TYPE shop_edge_decisions_total counter
shop_edge_decisions_total{allowed="false",check="false",limit="api",local="false",outcome="denied",region="eu",store="redis"} 1
`), "shop_edge_decisions_total"))
	assert.Equal(t, 1, testutil.CollectAndCount(c, "shop_edge_decision_duration_seconds"))

	c, _ = newCollector(t, ratelimitprom.WithNamespace(""))
	c.Observe(ctx, ratelimit.Event{Result: ratelimit.Result{Name: "api"}, Outcome: ratelimit.Allowed})
	assert.Equal(t, 1, testutil.CollectAndCount(c, "decisions_total"))
}

func TestCollectorInvalidOptions(t *testing.T) {
	for name, opts := range map[string][]ratelimitprom.Option{
		"bad namespace":        {ratelimitprom.WithNamespace("rate\xfflimit")},
		"reserved const label": {ratelimitprom.WithConstLabels(prometheus.Labels{"__store": "x"})},
		"const label clashes":  {ratelimitprom.WithConstLabels(prometheus.Labels{"limit": "x"})},
		"const label allowed":  {ratelimitprom.WithConstLabels(prometheus.Labels{"allowed": "x"})},
		"buckets not sorted":   {ratelimitprom.WithBuckets([]float64{0.1, 0.01})},
		"buckets repeated":     {ratelimitprom.WithBuckets([]float64{0.1, 0.1})},
		// The histogram's bucket label: Prometheus refuses it only when
		// the histogram's first series is made, with a panic, on the
		// decision path.
		"const label le": {ratelimitprom.WithConstLabels(prometheus.Labels{"le": "x"})},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := ratelimitprom.NewCollector(opts...)
			require.ErrorIs(t, err, ratelimitprom.ErrInvalidOption)
			assert.Nil(t, c)
			assert.NotContains(t, err.Error(), "ratelimitprom: ratelimitprom:", "the package names itself once")
		})
	}
}

// A nil Option (an option variable never set) is refused, as
// ratelimit.New refuses one: it was skipped, and a Collector meant to
// carry const labels that tell it apart from another's was built without
// them, to be refused at registration or, on a registry of its own, to
// mix its series with the other's on a dashboard.
func TestCollectorNilOption(t *testing.T) {
	var unset ratelimitprom.Option
	c, err := ratelimitprom.NewCollector(ratelimitprom.WithNamespace("shop"), unset)
	require.ErrorIs(t, err, ratelimitprom.ErrInvalidOption)
	assert.ErrorContains(t, err, "nil Option (option 2)")
	assert.Nil(t, c)
}

// A limit's name is any string; a label value must be UTF-8. The name is
// exported with the bad bytes replaced, rather than making Observe panic.
func TestCollectorNameNotUTF8(t *testing.T) {
	c, _ := newCollector(t)
	c.Observe(context.Background(), ratelimit.Event{Result: ratelimit.Result{Name: "api\xff"}, Outcome: ratelimit.Allowed})
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP ratelimit_decisions_total Decisions of rate limits, by limit and outcome.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{allowed="true",check="false",limit="api�",local="false",outcome="allowed"} 1
`), "ratelimit_decisions_total"))
}

func TestCollectorLimitAll(t *testing.T) {
	ctx := context.Background()
	c, reg := newCollector(t)
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"hour":   {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour},
		"minute": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute},
	}, ratelimit.WithObserver(c), ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	for range 2 {
		_, err := lim.LimitAll(ctx, secretKey, []string{"hour", "minute"})
		require.NoError(t, err)
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ratelimit_decisions_total Decisions of rate limits, by limit and outcome.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{allowed="true",check="false",limit="hour",local="false",outcome="allowed"} 2
ratelimit_decisions_total{allowed="true",check="false",limit="minute",local="false",outcome="allowed"} 1
ratelimit_decisions_total{allowed="false",check="false",limit="minute",local="false",outcome="denied"} 1
`), "ratelimit_decisions_total"))
	noKey(t, reg)
}

// Observing a decision whose series was seen before allocates nothing.
func TestCollectorAllocs(t *testing.T) {
	c, _ := newCollector(t)
	ctx := context.Background()
	e := ratelimit.Event{Result: ratelimit.Result{Name: "api", Key: secretKey, OK: true}, Outcome: ratelimit.Allowed, Latency: time.Millisecond}
	c.Observe(ctx, e)
	assert.Zero(t, testing.AllocsPerRun(100, func() { c.Observe(ctx, e) }))
}

func BenchmarkObserve(b *testing.B) {
	c, err := ratelimitprom.NewCollector()
	require.NoError(b, err)
	ctx := context.Background()
	e := ratelimit.Event{Result: ratelimit.Result{Name: "api", Key: secretKey, OK: true}, Outcome: ratelimit.Allowed, Latency: time.Millisecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Observe(ctx, e)
		}
	})
}

// The calls of limits given inline (WithConfig on a name not declared),
// whose names may be made per call, are counted under the one limit label
// "_OTHER": one series for them all, however many names they make up,
// where a declared limit, WithConfig or not, has its own.
func TestCollectorInlineNames(t *testing.T) {
	ctx := context.Background()
	c, reg := newCollector(t)
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"api": cfg},
		ratelimit.WithObserver(c), ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	const tenants = 2000 // past the series the Collector keeps found
	for i := range tenants {
		_, err := lim.Limit(ctx, fmt.Sprintf("tenant-%d", i), secretKey, ratelimit.WithConfig(cfg))
		require.NoError(t, err)
	}
	_, err = lim.Limit(ctx, "api", secretKey)
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "api", secretKey, ratelimit.WithConfig(cfg))
	require.NoError(t, err)

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(`
# HELP ratelimit_decisions_total Decisions of rate limits, by limit and outcome.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{allowed="true",check="false",limit="_OTHER",local="false",outcome="allowed"} %d
ratelimit_decisions_total{allowed="true",check="false",limit="api",local="false",outcome="allowed"} 2
`, tenants)), "ratelimit_decisions_total"))
	assert.Equal(t, 2, testutil.CollectAndCount(c, "ratelimit_decision_duration_seconds"), "the histogram too")
	noKey(t, reg)
}

// A Collector is a JobObserver: it counts the jobs of Reservation.AfterFunc
// by limit and how they ended, apart from the decisions, which count each
// reservation once. A job used to leave no trace in the metrics.
func TestCollectorJobs(t *testing.T) {
	c, reg := newCollector(t)
	observetest.Jobs(t, c, secretKey)

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ratelimit_afterfunc_jobs_total Jobs of Reservation.AfterFunc, by limit and how they ended: ran, dropped or stopped.
# TYPE ratelimit_afterfunc_jobs_total counter
ratelimit_afterfunc_jobs_total{limit="_OTHER",outcome="stopped"} 1
ratelimit_afterfunc_jobs_total{limit="jobs",outcome="dropped"} 1
ratelimit_afterfunc_jobs_total{limit="jobs",outcome="ran"} 2
ratelimit_afterfunc_jobs_total{limit="jobs",outcome="stopped"} 1
# HELP ratelimit_decisions_total Decisions of rate limits, by limit and outcome.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{allowed="true",check="false",limit="_OTHER",local="false",outcome="allowed"} 1
ratelimit_decisions_total{allowed="true",check="false",limit="jobs",local="false",outcome="allowed"} 3
ratelimit_decisions_total{allowed="true",check="false",limit="jobs",local="false",outcome="reserved"} 1
`), "ratelimit_afterfunc_jobs_total", "ratelimit_decisions_total"))
	noKey(t, reg)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names and help follow Prometheus' conventions")
}

func TestCollectorJobNameNotUTF8(t *testing.T) {
	c, _ := newCollector(t)
	c.ObserveJob(context.Background(), ratelimit.JobEvent{Result: ratelimit.Result{Name: "api\xff"}, Outcome: ratelimit.JobDropped})
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP ratelimit_afterfunc_jobs_total Jobs of Reservation.AfterFunc, by limit and how they ended: ran, dropped or stopped.
# TYPE ratelimit_afterfunc_jobs_total counter
ratelimit_afterfunc_jobs_total{limit="api�",outcome="dropped"} 1
`), "ratelimit_afterfunc_jobs_total"))
}

// The zero Collector panicked, with a nil pointer dereference, at its
// first decision or registration: it is ready to use, as NewCollector
// with no option makes it.
func TestZeroCollector(t *testing.T) {
	ctx := context.Background()
	var c ratelimitprom.Collector
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}},
		ratelimit.WithObserver(&c), ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	require.NotPanics(t, func() {
		_, _ = lim.Limit(ctx, "api", secretKey)
		c.ObserveJob(ctx, ratelimit.JobEvent{Result: ratelimit.Result{Name: "api"}, Outcome: ratelimit.JobRan})
	})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(&c))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ratelimit_decisions_total Decisions of rate limits, by limit and outcome.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{allowed="true",check="false",limit="api",local="false",outcome="allowed"} 1
# HELP ratelimit_afterfunc_jobs_total Jobs of Reservation.AfterFunc, by limit and how they ended: ran, dropped or stopped.
# TYPE ratelimit_afterfunc_jobs_total counter
ratelimit_afterfunc_jobs_total{limit="api",outcome="ran"} 1
`), "ratelimit_decisions_total", "ratelimit_afterfunc_jobs_total"))

	// Registered first, before any decision.
	var fresh ratelimitprom.Collector
	require.NoError(t, prometheus.NewPedanticRegistry().Register(&fresh))
}

// outcome="degraded" counted alike a store failure that a fail-open limit
// let through and one that a fail-closed limit refused: the label allowed
// tells them apart.
func TestCollectorDegradedOpenOrClosed(t *testing.T) {
	ctx := context.Background()
	c, reg := newCollector(t)
	mock := clock.NewMock()
	store := &slowStore{Store: must(memstore.New()), mock: mock, fail: true}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"closed": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute},
		"open":   {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute, FailOpen: true},
	}, ratelimit.WithObserver(c), ratelimit.WithClock(mock), ratelimit.WithBreaker(0, 0))
	require.NoError(t, err)
	for range 2 {
		res, err := lim.Limit(ctx, "open", secretKey)
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		require.True(t, res.OK)
	}
	res, err := lim.Limit(ctx, "closed", secretKey)
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.False(t, res.OK)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ratelimit_decisions_total Decisions of rate limits, by limit and outcome.
# TYPE ratelimit_decisions_total counter
ratelimit_decisions_total{allowed="false",check="false",limit="closed",local="false",outcome="degraded"} 1
ratelimit_decisions_total{allowed="true",check="false",limit="open",local="false",outcome="degraded"} 2
`), "ratelimit_decisions_total"))
}
