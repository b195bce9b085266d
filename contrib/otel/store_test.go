package ratelimitotel_test

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func newTracer(t *testing.T) (*tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return spans, tp
}

// attrs reads a span's attributes as strings.
func attrs(s tracetest.SpanStub) map[attribute.Key]string {
	m := make(map[attribute.Key]string)
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value.Emit()
	}
	return m
}

func TestWrapStoreSpans(t *testing.T) {
	ctx := context.Background()
	spans, tp := newTracer(t)
	store := ratelimitotel.WrapStore(must(memstore.New()), ratelimitotel.WithTracerProvider(tp),
		ratelimitotel.WithAttributes(attribute.String("ratelimit.store", "memory")))
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api":   {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute},
		"burst": {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Second, Shards: 4},
	}, ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)

	// A parent span: the store's spans are its children.
	ctx, parent := tp.Tracer("test").Start(ctx, "request")
	_, err = lim.Limit(ctx, "api", secretKey)
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "api", secretKey, ratelimit.WithReserve())
	require.NoError(t, err)
	_, err = lim.Check(ctx, "api", secretKey)
	require.NoError(t, err)
	_, err = lim.LimitAll(ctx, secretKey, []string{"api", "burst"})
	require.NoError(t, err)
	_, err = lim.Value(ctx, "burst", secretKey)
	require.NoError(t, err)
	require.NoError(t, lim.Reset(ctx, "burst", secretKey))
	parent.End()

	got := spans.GetSpans()
	require.Len(t, got, 7)
	want := []struct {
		name  string
		attrs map[attribute.Key]string
	}{
		{ratelimitotel.SpanApply, map[attribute.Key]string{"ratelimit.mode": "limit", "ratelimit.reserve": "false", "ratelimit.limits": `["api"]`, "ratelimit.ok": "true"}},
		{ratelimitotel.SpanApply, map[attribute.Key]string{"ratelimit.mode": "limit", "ratelimit.reserve": "true", "ratelimit.limits": `["api"]`, "ratelimit.ok": "true"}},
		{ratelimitotel.SpanApply, map[attribute.Key]string{"ratelimit.mode": "check", "ratelimit.reserve": "false", "ratelimit.limits": `["api"]`, "ratelimit.ok": "false"}},
		{ratelimitotel.SpanApply, map[attribute.Key]string{"ratelimit.mode": "limit", "ratelimit.reserve": "false", "ratelimit.limits": `["api","burst"]`, "ratelimit.ok": "false"}},
		{ratelimitotel.SpanLoad, map[attribute.Key]string{"ratelimit.limits": `["burst"]`, "ratelimit.records": "4"}},
		{ratelimitotel.SpanDelete, map[attribute.Key]string{"ratelimit.limits": `["burst"]`, "ratelimit.records": "4"}},
	}
	for i, w := range want {
		s := got[i]
		assert.Equal(t, w.name, s.Name, "span %d", i)
		assert.Equal(t, ratelimitotel.ScopeName, s.InstrumentationScope.Name, "span %d", i)
		assert.Equal(t, trace.SpanKindInternal, s.SpanKind, "span %d", i)
		assert.Equal(t, parent.SpanContext().SpanID(), s.Parent.SpanID(), "span %d: a child of the caller's span", i)
		assert.Equal(t, codes.Unset, s.Status.Code, "span %d", i)
		w.attrs["ratelimit.store"] = "memory"
		assert.Equal(t, w.attrs, attrs(s), "span %d", i)
	}
	for _, s := range got {
		for _, kv := range s.Attributes {
			assert.NotContains(t, kv.Value.Emit(), secretKey, "span %s attribute %s", s.Name, kv.Key)
		}
	}
}

// ratelimit.ok is of the op's items only: an out may be longer than the
// op (driver.Store's Apply fills one decision per item), and the decisions
// past its items are not the op's.
func TestWrapStoreOKOfItemsOnly(t *testing.T) {
	ctx := context.Background()
	spans, tp := newTracer(t)
	w := ratelimitotel.WrapStore(must(memstore.New()), ratelimitotel.WithTracerProvider(tp))
	op := &driver.Op{Now: 1000, Items: []driver.Item{{Name: "api", Key: secretKey, Count: 1,
		Shards: []driver.Shard{{Params: driver.Params{Kind: ratelimit.FixedWindow, Rate: 1, Period: 1000, Capacity: 1}}}}}}
	out := make([]driver.Decision, 3) // a buffer of a larger op, say
	require.NoError(t, w.Apply(ctx, op, out))
	require.True(t, out[0].OK)
	require.Len(t, spans.GetSpans(), 1)
	assert.Equal(t, "true", attrs(spans.GetSpans()[0])[ratelimitotel.OKKey])
}

// failStore fails every call.
type failStore struct{ ratelimit.Store }

func (failStore) Apply(context.Context, *driver.Op, []driver.Decision) error {
	return errStoreDown
}
func (failStore) Load(context.Context, []driver.RecordID, []driver.Record) error {
	return errStoreDown
}
func (failStore) Delete(context.Context, []driver.RecordID) error { return errStoreDown }

func TestWrapStoreRecordsErrors(t *testing.T) {
	ctx := context.Background()
	spans, tp := newTracer(t)
	store := ratelimitotel.WrapStore(failStore{}, ratelimitotel.WithTracerProvider(tp))
	lim, err := ratelimit.New(store, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}},
		ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)

	_, err = lim.Limit(ctx, "api", secretKey)
	require.ErrorIs(t, err, errStoreDown, "the wrapper returns the store's error as it is")
	_, err = lim.Value(ctx, "api", secretKey)
	require.ErrorIs(t, err, errStoreDown)
	require.ErrorIs(t, lim.Reset(ctx, "api", secretKey), errStoreDown)

	got := spans.GetSpans()
	require.Len(t, got, 3)
	for _, s := range got {
		assert.Equal(t, codes.Error, s.Status.Code, s.Name)
		assert.Equal(t, "store down", s.Status.Description, s.Name)
		require.Len(t, s.Events, 1, s.Name)
		assert.Equal(t, "exception", s.Events[0].Name, s.Name)
		assert.NotContains(t, attrs(s), ratelimitotel.OKKey, "no answer, no ok")
	}
}

// panicStore panics in every call, as a store with a bug may.
type panicStore struct{ ratelimit.Store }

func (panicStore) Apply(context.Context, *driver.Op, []driver.Decision) error { panic("store bug") }
func (panicStore) Load(context.Context, []driver.RecordID, []driver.Record) error {
	panic("store bug")
}
func (panicStore) Delete(context.Context, []driver.RecordID) error { panic("store bug") }
func (panicStore) ApplyBatch(context.Context, []*driver.Op, [][]driver.Decision) error {
	panic("store bug")
}
func (panicStore) DeleteExpired(context.Context, time.Time) (int, error) { panic("store bug") }
func (panicStore) OwnClock() bool                                        { return true }
func (panicStore) Now(context.Context) (int64, error)                    { panic("store bug") }

// A store call that panics still ends its span, marked as an error, and
// the panic goes on to the caller as it is: a caller that recovers it (an
// HTTP server does) has the failed call in its trace.
func TestWrapStoreEndsSpanOnPanic(t *testing.T) {
	ctx := context.Background()
	spans, tp := newTracer(t)
	w := ratelimitotel.WrapStore(panicStore{}, ratelimitotel.WithTracerProvider(tp))
	ids := []driver.RecordID{{Name: "api", Key: secretKey}}
	for name, call := range map[string]func(){
		ratelimitotel.SpanApply: func() { _ = w.Apply(ctx, &driver.Op{}, nil) },
		ratelimitotel.SpanApplyBatch: func() {
			_ = w.(driver.BatchApplier).ApplyBatch(ctx, []*driver.Op{{}}, [][]driver.Decision{nil})
		},
		ratelimitotel.SpanLoad:   func() { _ = w.Load(ctx, ids, make([]driver.Record, 1)) },
		ratelimitotel.SpanDelete: func() { _ = w.Delete(ctx, ids) },
		ratelimitotel.SpanDeleteExpired: func() {
			_, _ = w.(driver.Expirer).DeleteExpired(ctx, time.Now())
		},
		ratelimitotel.SpanNow: func() { _, _ = w.(driver.TimeSource).Now(ctx) },
	} {
		t.Run(name, func(t *testing.T) {
			spans.Reset()
			assert.PanicsWithValue(t, "store bug", call)
			got := spans.GetSpans()
			require.Len(t, got, 1, "the span is ended")
			assert.Equal(t, name, got[0].Name)
			assert.Equal(t, codes.Error, got[0].Status.Code)
			assert.Equal(t, "the store panicked", got[0].Status.Description)
		})
	}
}

// The stores' optional methods, in every combination the wrapper must
// mirror: each capability apart, then stores made of them.
type (
	batchCap struct{ s ratelimit.Store }
	clockCap struct{ own bool }
	expCap   struct{}
)

func (c batchCap) ApplyBatch(ctx context.Context, ops []*driver.Op, outs [][]driver.Decision) error {
	for i, op := range ops {
		if err := c.s.Apply(ctx, op, outs[i]); err != nil {
			return err
		}
	}
	return nil
}
func (c clockCap) OwnClock() bool                                    { return c.own }
func (clockCap) Now(context.Context) (int64, error)                  { return 1_700_000_000_000, nil }
func (expCap) DeleteExpired(context.Context, time.Time) (int, error) { return 3, nil }

type (
	batchStore struct {
		ratelimit.Store
		batchCap
	}
	clockStore struct {
		ratelimit.Store
		clockCap
	}
	expStore struct {
		ratelimit.Store
		expCap
	}
	batchExpStore struct {
		ratelimit.Store
		batchCap
		expCap
	}
)

func TestWrapStoreKeepsCapabilities(t *testing.T) {
	ctx := context.Background()
	base := must(memstore.New())
	batch := batchCap{base}
	for _, s := range []ratelimit.Store{
		base,
		batchStore{base, batch},
		expStore{base, expCap{}},
		batchExpStore{base, batch, expCap{}},
		clockStore{base, clockCap{true}},
		clockStore{base, clockCap{false}},
	} {
		t.Run(typeName(s), func(t *testing.T) {
			spans, tp := newTracer(t)
			w := ratelimitotel.WrapStore(s, ratelimitotel.WithTracerProvider(tp))
			require.Equal(t, s, w.(interface{ Unwrap() ratelimit.Store }).Unwrap())
			var names []string

			// memstore binds limits; its BoundLimits would decide past the
			// wrapper, without a span.
			_, isBinder := w.(driver.Binder)
			assert.False(t, isBinder, "a wrapped store is no Binder")

			_, isBatch := s.(driver.BatchApplier)
			wb, ok := w.(driver.BatchApplier)
			require.Equal(t, isBatch, ok, "BatchApplier")
			if ok {
				out := [][]driver.Decision{make([]driver.Decision, 1)}
				op := &driver.Op{Now: 1000, Items: []driver.Item{{Name: "api", Key: secretKey, Count: 1,
					Shards: []driver.Shard{{Params: driver.Params{Kind: ratelimit.FixedWindow, Rate: 1, Period: 1000, Capacity: 1}}}}}}
				require.NoError(t, wb.ApplyBatch(ctx, []*driver.Op{op}, out))
				names = append(names, ratelimitotel.SpanApplyBatch)
			}

			ts, isClock := s.(driver.TimeSource)
			wts, ok := w.(driver.TimeSource)
			require.True(t, ok, "a wrapped store is always a TimeSource")
			assert.Equal(t, isClock && ts.OwnClock(), wts.OwnClock(), "OwnClock")
			now, err := wts.Now(ctx)
			if isClock {
				require.NoError(t, err)
				assert.Equal(t, int64(1_700_000_000_000), now)
				names = append(names, ratelimitotel.SpanNow)
			} else {
				require.Error(t, err)
				// As every method of package driver's interfaces: given a
				// context already done, the context's error.
				done, cancel := context.WithCancel(ctx)
				cancel()
				_, err = wts.Now(done)
				require.ErrorIs(t, err, context.Canceled)
			}

			se, isExp := s.(driver.Expirer)
			if e, ok := w.(driver.Expirer); assert.Equal(t, isExp, ok, "DeleteExpired (int, error)") && ok {
				want, err := se.DeleteExpired(ctx, time.Now())
				require.NoError(t, err)
				n, err := e.DeleteExpired(ctx, time.Now())
				require.NoError(t, err)
				assert.Equal(t, want, n, "the wrapper answers as the store")
				names = append(names, ratelimitotel.SpanDeleteExpired)
			}
			var got []string
			for _, sp := range spans.GetSpans() {
				got = append(got, sp.Name)
			}
			assert.Equal(t, names, got)
		})
	}
}

func typeName(s ratelimit.Store) string {
	n := fmt.Sprintf("%T", s)
	return n[strings.LastIndex(n, ".")+1:]
}

// A Limiter on a wrapped store that keeps its own clock follows that clock
// as it would the store's: the Limiter asks the wrapper's Now.
func TestWrapStoreOwnClock(t *testing.T) {
	ctx := context.Background()
	spans, tp := newTracer(t)
	lim, err := ratelimit.New(ratelimitotel.WrapStore(clockStore{must(memstore.New()), clockCap{true}}, ratelimitotel.WithTracerProvider(tp)),
		ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}})
	require.NoError(t, err)
	st, err := lim.Value(ctx, "api", secretKey)
	require.NoError(t, err)
	storeNow := time.UnixMilli(1_700_000_000_000)
	assert.False(t, st.WindowStart.After(storeNow), "window start %v after the store's now", st.WindowStart)
	assert.True(t, st.NextGrant.After(storeNow), "next grant %v not after the store's now", st.NextGrant)
	assert.Less(t, st.NextGrant.Sub(storeNow), time.Minute+time.Millisecond, "the window follows the store's clock")
	var names []string
	for _, sp := range spans.GetSpans() {
		names = append(names, sp.Name)
	}
	assert.Equal(t, []string{ratelimitotel.SpanLoad, ratelimitotel.SpanNow}, names)
}

func TestWrapStoreGlobalTracerProvider(t *testing.T) {
	spans, tp := newTracer(t)
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	w := ratelimitotel.WrapStore(must(memstore.New()))
	require.NoError(t, w.Delete(context.Background(), []driver.RecordID{{Name: "api", Key: secretKey}}))
	require.Len(t, spans.GetSpans(), 1)
	assert.Equal(t, ratelimitotel.SpanDelete, spans.GetSpans()[0].Name)
}

func TestWrapStoreNil(t *testing.T) {
	assert.Nil(t, ratelimitotel.WrapStore(nil))
}

// A store whose New failed, kept instead of its error, is a nil pointer:
// wrapped, it is refused by ratelimit.New as it would be unwrapped, rather
// than accepted and panicking on the first decision.
func TestWrapStoreNilPointer(t *testing.T) {
	var mem *memstore.Store
	w := ratelimitotel.WrapStore(mem)
	assert.Nil(t, w)
	lim, err := ratelimit.New(w, ratelimit.Limits{"api": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute}})
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.Nil(t, lim)
}

// The wrapper passes the conformance suite of stores: it changes nothing
// of what the store decides, with spans recorded (and dropped).
func TestConformance(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	t.Run("memstore", func(t *testing.T) {
		storetest.Run(t, func(*testing.T) ratelimit.Store {
			return ratelimitotel.WrapStore(must(memstore.New()), ratelimitotel.WithTracerProvider(tp))
		})
	})
	t.Run("model", func(t *testing.T) { // a BatchApplier
		storetest.Run(t, func(*testing.T) ratelimit.Store {
			return ratelimitotel.WrapStore(storetest.NewModel(), ratelimitotel.WithTracerProvider(tp))
		})
	})
	t.Run("boltstore", func(t *testing.T) { // a BatchApplier, an Expirer and an io.Closer
		storetest.Run(t, func(t *testing.T) ratelimit.Store {
			bs, err := boltstore.Open(filepath.Join(t.TempDir(), "limits.db"))
			require.NoError(t, err)
			w := ratelimitotel.WrapStore(bs, ratelimitotel.WithTracerProvider(tp))
			t.Cleanup(func() { _ = w.(io.Closer).Close() })
			return w
		}, storetest.DifferentialRuns(3, 60))
	})
}

// A real store with DeleteExpired: boltstore's, traced through the wrapper.
func TestWrapStoreBolt(t *testing.T) {
	ctx := context.Background()
	spans, tp := newTracer(t)
	bs, err := boltstore.Open(filepath.Join(t.TempDir(), "limits.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = bs.Close() })
	w := ratelimitotel.WrapStore(bs, ratelimitotel.WithTracerProvider(tp))
	e, ok := w.(driver.Expirer)
	require.True(t, ok, "boltstore's DeleteExpired is visible through the wrapper")
	n, err := e.DeleteExpired(ctx, time.Now())
	require.NoError(t, err)
	assert.Zero(t, n)
	require.Len(t, spans.GetSpans(), 1)
	assert.Equal(t, map[attribute.Key]string{"ratelimit.records": "0"}, attrs(spans.GetSpans()[0]))
}

// The wrapper stands for the store where it is closed: Close closes a
// store that has Close (boltstore's), and does nothing to one that has
// none. It was no io.Closer, and a caller that closed the store it kept
// as the wrapper failed the assertion.
func TestWrapStoreClose(t *testing.T) {
	ctx := context.Background()
	ids := []driver.RecordID{{Name: "api", Key: secretKey}}
	out := make([]driver.Record, 1)

	bs, err := boltstore.Open(filepath.Join(t.TempDir(), "limits.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = bs.Close() })
	w := ratelimitotel.WrapStore(bs)
	c, ok := w.(io.Closer)
	require.True(t, ok, "the wrapper of a store with Close is an io.Closer")
	require.NoError(t, c.Close())
	require.ErrorIs(t, bs.Load(ctx, ids, out), driver.ErrClosed, "Close closed the store")
	require.NoError(t, c.Close(), "as the store's, idempotent")

	ms := must(memstore.New())
	c, ok = ratelimitotel.WrapStore(ms).(io.Closer)
	require.True(t, ok, "every wrapper is an io.Closer")
	require.NoError(t, c.Close(), "a store without Close has nothing to close")
	require.NoError(t, ms.Load(ctx, ids, out))
}

// A limit given inline is named on its spans as the call named it, not
// "_OTHER" as in the metrics: the store is not told which limits are
// declared, and a span adds no series. Its key is on no span.
func TestWrapStoreInlineNames(t *testing.T) {
	spans, tp := newTracer(t)
	lim, err := ratelimit.New(ratelimitotel.WrapStore(must(memstore.New()), ratelimitotel.WithTracerProvider(tp)), nil,
		ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	_, err = lim.Limit(context.Background(), "tenant-7", secretKey,
		ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}))
	require.NoError(t, err)
	got := spans.GetSpans()
	require.Len(t, got, 1)
	assert.Equal(t, `["tenant-7"]`, attrs(got[0])[ratelimitotel.LimitsKey])
	for _, kv := range got[0].Attributes {
		assert.NotContains(t, kv.Value.Emit(), secretKey)
	}
}

// recordClockStore keeps a clock per record, as a store over several
// servers does (driver.RecordClock): its records' server is an hour ahead
// of the one its Now reads.
type recordClockStore struct {
	ratelimit.Store
	clockCap
}

func (recordClockStore) RecordNow(context.Context, driver.RecordID) (int64, error) {
	return 1_700_000_000_000 + time.Hour.Milliseconds(), nil
}

// A Limiter on a wrapped store that keeps a clock per record
// (driver.RecordClock) follows the clock of the key's record, as it would
// the store's, in a span of SpanNow: the wrapper asks the store's
// RecordNow. It asked the store's Now, the time of another server.
func TestWrapStoreRecordClock(t *testing.T) {
	ctx := context.Background()
	spans, tp := newTracer(t)
	lim, err := ratelimit.New(ratelimitotel.WrapStore(recordClockStore{must(memstore.New()), clockCap{true}}, ratelimitotel.WithTracerProvider(tp)),
		ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}})
	require.NoError(t, err)
	st, err := lim.Value(ctx, "api", secretKey)
	require.NoError(t, err)
	recordNow := time.UnixMilli(1_700_000_000_000).Add(time.Hour)
	assert.False(t, st.WindowStart.After(recordNow), "window start %v after the record's now", st.WindowStart)
	assert.True(t, st.NextGrant.After(recordNow), "next grant %v not after the record's now %v", st.NextGrant, recordNow)
	var names []string
	for _, sp := range spans.GetSpans() {
		names = append(names, sp.Name)
	}
	assert.Equal(t, []string{ratelimitotel.SpanLoad, ratelimitotel.SpanNow}, names)
}

// TestWrapStoreNilOp: a nil op, in Apply or within ApplyBatch, goes to the
// store, which refuses it (driver.ErrInvalidOp), and its span records the
// error. Before, the wrapper read the op for the span's attributes first
// and panicked on it.
func TestWrapStoreNilOp(t *testing.T) {
	ctx := context.Background()
	spans, tp := newTracer(t)
	store := ratelimitotel.WrapStore(storetest.NewModel(), ratelimitotel.WithTracerProvider(tp))
	var err error
	require.NotPanics(t, func() { err = store.Apply(ctx, nil, make([]driver.Decision, 1)) })
	require.ErrorIs(t, err, driver.ErrInvalidOp)
	b, ok := store.(driver.BatchApplier)
	require.True(t, ok, "the model applies batches, and so does its wrapper")
	valid := &driver.Op{Now: 1_700_000_000_000}
	require.NotPanics(t, func() {
		err = b.ApplyBatch(ctx, []*driver.Op{valid, nil, valid}, make([][]driver.Decision, 3))
	})
	require.ErrorIs(t, err, driver.ErrInvalidOp)
	got := spans.GetSpans()
	require.Len(t, got, 2)
	for _, s := range got {
		assert.Equal(t, codes.Error, s.Status.Code, s.Name)
	}
}
