package ratelimitotel_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/observetest"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
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

var errStoreDown = errors.New("store down")

func (s *slowStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	s.mock.Add(s.delay)
	if s.fail {
		return errStoreDown
	}
	return s.Store.Apply(ctx, op, out)
}

func newReader(t *testing.T) (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return reader, mp
}

func collect(t *testing.T, reader *sdkmetric.ManualReader) metricdata.ScopeMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	require.Len(t, rm.ScopeMetrics, 1)
	return rm.ScopeMetrics[0]
}

func find(t *testing.T, sm metricdata.ScopeMetrics, name string) metricdata.Metrics {
	t.Helper()
	for _, m := range sm.Metrics {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("no metric %q among %d", name, len(sm.Metrics))
	return metricdata.Metrics{}
}

// counts reads the decision counter as "limit outcome check local" → value.
func counts(t *testing.T, sm metricdata.ScopeMetrics) map[string]int64 {
	t.Helper()
	sum, ok := find(t, sm, "ratelimit.decisions").Data.(metricdata.Sum[int64])
	require.True(t, ok, "ratelimit.decisions is a Sum[int64]")
	assert.True(t, sum.IsMonotonic)
	assert.Equal(t, metricdata.CumulativeTemporality, sum.Temporality)
	got := make(map[string]int64)
	for _, p := range sum.DataPoints {
		got[describe(p.Attributes)] += p.Value
	}
	return got
}

func describe(set attribute.Set) string {
	var parts []string
	for _, k := range []attribute.Key{ratelimitotel.LimitKey, ratelimitotel.OutcomeKey, ratelimitotel.CheckKey, ratelimitotel.LocalKey} {
		v, _ := set.Value(k)
		parts = append(parts, v.Emit())
	}
	return strings.Join(parts, " ")
}

// noKey fails if any attribute of any data point holds the key.
func noKey(t *testing.T, sm metricdata.ScopeMetrics) {
	t.Helper()
	check := func(set attribute.Set) {
		for _, kv := range set.ToSlice() {
			assert.NotContains(t, kv.Value.Emit(), secretKey, "attribute %s", kv.Key)
		}
	}
	for _, m := range sm.Metrics {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				check(p.Attributes)
			}
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				check(p.Attributes)
			}
		default:
			t.Errorf("metric %s has unexpected data %T", m.Name, m.Data)
		}
	}
}

func TestObserverOutcomes(t *testing.T) {
	ctx := context.Background()
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	require.NoError(t, err)
	mock := clock.NewMock()
	store := &slowStore{Store: must(memstore.New()), mock: mock}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api":    {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute, MaxReserved: 1},
		"login":  {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute},
		"search": {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Minute, FailOpen: true},
	}, ratelimit.WithObserver(obs), ratelimit.WithClock(mock), ratelimit.WithDenyCache(16), ratelimit.WithBreaker(0, 0))
	require.NoError(t, err)

	limit := func(name string, opts ...ratelimit.CallOption) ratelimit.Result {
		t.Helper()
		res, err := lim.Limit(ctx, name, secretKey, opts...)
		if store.fail {
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		} else {
			require.NoError(t, err)
		}
		return res
	}
	// api: two allowed, one reserved, one denied by the store, then one
	// denied by the deny cache; a Check on top.
	assert.True(t, limit("api").OK)
	assert.True(t, limit("api").OK)
	assert.True(t, limit("api", ratelimit.WithReserve()).Reserved())
	assert.False(t, limit("api").OK)
	res := limit("api")
	assert.False(t, res.OK)
	assert.True(t, res.Local, "the deny cache answered")
	_, err = lim.Check(ctx, "login", secretKey)
	require.NoError(t, err)
	// The store fails: login fails closed, search open.
	store.fail = true
	assert.False(t, limit("login").OK)
	assert.True(t, limit("search").OK)

	sm := collect(t, reader)
	assert.Equal(t, ratelimitotel.ScopeName, sm.Scope.Name)
	assert.Equal(t, map[string]int64{
		"api allowed false false":     2,
		"api reserved false false":    1,
		"api denied false false":      1,
		"api denied false true":       1,
		"login allowed true false":    1,
		"login degraded false false":  1,
		"search degraded false false": 1,
	}, counts(t, sm))
	noKey(t, sm)
}

func TestObserverLimitAllRecordsEachLimit(t *testing.T) {
	ctx := context.Background()
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	require.NoError(t, err)
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"hour":   {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour},
		"minute": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute},
	}, ratelimit.WithObserver(obs), ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	for range 2 {
		_, err := lim.LimitAll(ctx, secretKey, []string{"hour", "minute"})
		require.NoError(t, err)
	}
	// The second call: minute refuses, so hour, which would have granted,
	// is not charged; each limit reports its own answer.
	sm := collect(t, reader)
	assert.Equal(t, map[string]int64{
		"hour allowed false false":   2,
		"minute allowed false false": 1,
		"minute denied false false":  1,
	}, counts(t, sm))
	noKey(t, sm)
}

func TestObserverDuration(t *testing.T) {
	ctx := context.Background()
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	require.NoError(t, err)
	mock := clock.NewMock()
	store := &slowStore{Store: must(memstore.New()), mock: mock, delay: 3 * time.Millisecond}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute},
	}, ratelimit.WithObserver(obs), ratelimit.WithClock(mock))
	require.NoError(t, err)
	for range 2 {
		_, err := lim.Limit(ctx, "api", secretKey)
		require.NoError(t, err)
	}
	store.delay = 300 * time.Millisecond
	_, err = lim.Limit(ctx, "api", secretKey)
	require.NoError(t, err)

	m := find(t, collect(t, reader), "ratelimit.decision.duration")
	assert.Equal(t, "s", m.Unit)
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "a Histogram[float64], not %T", m.Data)
	require.Len(t, h.DataPoints, 1)
	p := h.DataPoints[0]
	assert.Equal(t, "api allowed false false", describe(p.Attributes))
	assert.Equal(t, uint64(3), p.Count)
	assert.InDelta(t, 0.306, p.Sum, 1e-9)
	// 3 ms falls in (2.5 ms, 5 ms], 300 ms in (250 ms, 500 ms].
	got := make(map[float64]uint64)
	for i, n := range p.BucketCounts {
		if n > 0 {
			got[p.Bounds[i]] = n
		}
	}
	assert.Equal(t, map[float64]uint64{0.005: 2, 0.5: 1}, got)
}

func TestObserverAttributes(t *testing.T) {
	ctx := context.Background()
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp),
		ratelimitotel.WithAttributes(attribute.String("service.component", "edge"), ratelimitotel.LimitKey.String("overridden")))
	require.NoError(t, err)
	obs.Observe(ctx, ratelimit.Event{Result: ratelimit.Result{Name: "api", Key: secretKey, OK: true}, Outcome: ratelimit.Allowed})

	sm := collect(t, reader)
	sum := find(t, sm, "ratelimit.decisions").Data.(metricdata.Sum[int64])
	require.Len(t, sum.DataPoints, 1)
	attrs := sum.DataPoints[0].Attributes
	v, ok := attrs.Value("service.component")
	assert.True(t, ok)
	assert.Equal(t, "edge", v.AsString())
	assert.Equal(t, "api allowed false false", describe(attrs), "the decision's own attributes win")
	noKey(t, sm)
}

func TestObserverGlobalMeterProvider(t *testing.T) {
	reader, mp := newReader(t)
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(mp)
	t.Cleanup(func() { otel.SetMeterProvider(prev) })

	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(nil)) // nil keeps the global
	require.NoError(t, err)
	obs.Observe(context.Background(), ratelimit.Event{Result: ratelimit.Result{Name: "api"}, Outcome: ratelimit.Denied, Check: true})
	assert.Equal(t, map[string]int64{"api denied true false": 1}, counts(t, collect(t, reader)))
}

// Recording a decision whose attribute set was seen before allocates
// nothing of the Observer's own (the no-op meter records nothing).
func TestObserverAllocs(t *testing.T) {
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(noop.NewMeterProvider()))
	require.NoError(t, err)
	ctx := context.Background()
	e := ratelimit.Event{Result: ratelimit.Result{Name: "api", Key: secretKey, OK: true}, Outcome: ratelimit.Allowed, Latency: time.Millisecond}
	obs.Observe(ctx, e)
	assert.Zero(t, testing.AllocsPerRun(100, func() { obs.Observe(ctx, e) }))
}

func BenchmarkObserve(b *testing.B) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	require.NoError(b, err)
	ctx := context.Background()
	e := ratelimit.Event{Result: ratelimit.Result{Name: "api", Key: secretKey, OK: true}, Outcome: ratelimit.Allowed, Latency: time.Millisecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			obs.Observe(ctx, e)
		}
	})
}

// A limit's name is any string; OTLP needs UTF-8 attribute values. The
// name is recorded with the bad bytes replaced.
func TestObserverNameNotUTF8(t *testing.T) {
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	require.NoError(t, err)
	obs.Observe(context.Background(), ratelimit.Event{Result: ratelimit.Result{Name: "api\xff"}, Outcome: ratelimit.Allowed})
	assert.Equal(t, map[string]int64{"api\ufffd allowed false false": 1}, counts(t, collect(t, reader)))
}

// The calls of limits given inline (WithConfig on a name not declared),
// whose names may be made per call, are recorded under the one limit
// attribute "_OTHER": one attribute set for them all, however many names
// they make up, where a declared limit, WithConfig or not, has its own.
func TestObserverInlineNames(t *testing.T) {
	ctx := context.Background()
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	require.NoError(t, err)
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"api": cfg},
		ratelimit.WithObserver(obs), ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	const tenants = 2000 // past the attribute sets the Observer keeps built
	for i := range tenants {
		_, err := lim.Limit(ctx, fmt.Sprintf("tenant-%d", i), secretKey, ratelimit.WithConfig(cfg))
		require.NoError(t, err)
	}
	_, err = lim.Limit(ctx, "api", secretKey)
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "api", secretKey, ratelimit.WithConfig(cfg))
	require.NoError(t, err)

	sm := collect(t, reader)
	assert.Equal(t, map[string]int64{"_OTHER allowed false false": tenants, "api allowed false false": 2}, counts(t, sm))
	hist, ok := find(t, sm, "ratelimit.decision.duration").Data.(metricdata.Histogram[float64])
	require.True(t, ok)
	assert.Len(t, hist.DataPoints, 2, "the histogram too")
	noKey(t, sm)
}

// jobCounts reads the job counter as "limit outcome" → value.
func jobCounts(t *testing.T, sm metricdata.ScopeMetrics) map[string]int64 {
	t.Helper()
	sum, ok := find(t, sm, "ratelimit.afterfunc.jobs").Data.(metricdata.Sum[int64])
	require.True(t, ok, "ratelimit.afterfunc.jobs is a Sum[int64]")
	assert.True(t, sum.IsMonotonic)
	got := make(map[string]int64)
	for _, p := range sum.DataPoints {
		assert.Equal(t, 2, p.Attributes.Len(), "limit and outcome only: %v", p.Attributes.ToSlice())
		limit, _ := p.Attributes.Value(ratelimitotel.LimitKey)
		outcome, _ := p.Attributes.Value(ratelimitotel.OutcomeKey)
		got[limit.Emit()+" "+outcome.Emit()] += p.Value
	}
	return got
}

// The Observer is a JobObserver: it counts the jobs of
// Reservation.AfterFunc by limit and how they ended, apart from the
// decisions, which count each reservation once. A job used to leave no
// trace in the metrics.
func TestObserverJobs(t *testing.T) {
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	require.NoError(t, err)
	observetest.Jobs(t, obs, secretKey)

	sm := collect(t, reader)
	assert.Equal(t, map[string]int64{
		"_OTHER stopped": 1,
		"jobs dropped":   1,
		"jobs ran":       2,
		"jobs stopped":   1,
	}, jobCounts(t, sm))
	assert.Equal(t, map[string]int64{
		"_OTHER allowed false false": 1,
		"jobs allowed false false":   3,
		"jobs reserved false false":  1,
	}, counts(t, sm), "a decision per reservation, none per job")
	noKey(t, sm)
}

// A job's own attributes win over the extra ones, and a name that is not
// UTF-8 is recorded with the bad bytes replaced, as a decision's.
func TestObserverJobAttributes(t *testing.T) {
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp),
		ratelimitotel.WithAttributes(attribute.String("service.component", "edge"), ratelimitotel.OutcomeKey.String("overridden")))
	require.NoError(t, err)
	obs.ObserveJob(context.Background(), ratelimit.JobEvent{Result: ratelimit.Result{Name: "api\xff", Key: secretKey}, Outcome: ratelimit.JobDropped})
	sm := collect(t, reader)
	sum := find(t, sm, "ratelimit.afterfunc.jobs").Data.(metricdata.Sum[int64])
	require.Len(t, sum.DataPoints, 1)
	attrs := sum.DataPoints[0].Attributes
	v, _ := attrs.Value("service.component")
	assert.Equal(t, "edge", v.AsString())
	v, _ = attrs.Value(ratelimitotel.LimitKey)
	assert.Equal(t, "api\ufffd", v.AsString())
	v, _ = attrs.Value(ratelimitotel.OutcomeKey)
	assert.Equal(t, "dropped", v.AsString())
	noKey(t, sm)
}

// The zero Observer panicked, with a nil pointer dereference, at its first
// decision: it is ready to use, as NewObserver with no option makes it,
// on the global MeterProvider.
func TestZeroObserver(t *testing.T) {
	reader, mp := newReader(t)
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(mp)
	t.Cleanup(func() { otel.SetMeterProvider(prev) })

	var obs ratelimitotel.Observer
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}},
		ratelimit.WithObserver(&obs), ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	require.NotPanics(t, func() {
		_, _ = lim.Limit(context.Background(), "api", secretKey)
		obs.ObserveJob(context.Background(), ratelimit.JobEvent{Result: ratelimit.Result{Name: "api"}, Outcome: ratelimit.JobRan})
	})
	sm := collect(t, reader)
	assert.Equal(t, map[string]int64{"api allowed false false": 1}, counts(t, sm))
	jobs, ok := find(t, sm, "ratelimit.afterfunc.jobs").Data.(metricdata.Sum[int64])
	require.True(t, ok)
	require.Len(t, jobs.DataPoints, 1)
	assert.Equal(t, int64(1), jobs.DataPoints[0].Value)
}

// ratelimit.outcome=degraded recorded alike a store failure that a
// fail-open limit let through and one that a fail-closed limit refused:
// ratelimit.allowed tells them apart.
func TestObserverDegradedOpenOrClosed(t *testing.T) {
	ctx := context.Background()
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	require.NoError(t, err)
	lim, err := ratelimit.New(&slowStore{Store: must(memstore.New()), mock: clock.NewMock(), fail: true}, ratelimit.Limits{
		"closed": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute},
		"open":   {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute, FailOpen: true},
	}, ratelimit.WithObserver(obs), ratelimit.WithClock(clock.NewMock()), ratelimit.WithBreaker(0, 0))
	require.NoError(t, err)
	for _, name := range []string{"open", "open", "closed"} {
		_, err := lim.Limit(ctx, name, secretKey)
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	}
	sum, ok := find(t, collect(t, reader), "ratelimit.decisions").Data.(metricdata.Sum[int64])
	require.True(t, ok)
	got := make(map[string]int64)
	for _, p := range sum.DataPoints {
		allowed, _ := p.Attributes.Value(ratelimitotel.AllowedKey)
		got[describe(p.Attributes)+" allowed="+allowed.Emit()] += p.Value
	}
	assert.Equal(t, map[string]int64{
		"open degraded false false allowed=true":    2,
		"closed degraded false false allowed=false": 1,
	}, got)
}
