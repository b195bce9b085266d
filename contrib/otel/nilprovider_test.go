package ratelimitotel_test

import (
	"context"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// A nil *sdkmetric.MeterProvider or *sdktrace.TracerProvider (a field
// left unset) is taken as nil is: the global provider. NewObserver and
// WrapStore called the nil provider's Meter and Tracer, and panicked.
func TestNilPointerProviders(t *testing.T) {
	reader, mp := newReader(t)
	prevMP := otel.GetMeterProvider()
	otel.SetMeterProvider(mp)
	t.Cleanup(func() { otel.SetMeterProvider(prevMP) })
	spans, tp := newTracer(t)
	prevTP := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prevTP) })

	var obs *ratelimitotel.Observer
	require.NotPanics(t, func() {
		var err error
		obs, err = ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider((*sdkmetric.MeterProvider)(nil)))
		require.NoError(t, err)
	})
	obs.Observe(context.Background(), ratelimit.Event{Result: ratelimit.Result{Name: "api", Key: secretKey}, Outcome: ratelimit.Denied})
	assert.Equal(t, map[string]int64{"api denied false false": 1}, counts(t, collect(t, reader)))

	var w ratelimit.Store
	require.NotPanics(t, func() {
		w = ratelimitotel.WrapStore(must(memstore.New()), ratelimitotel.WithTracerProvider((*sdktrace.TracerProvider)(nil)))
	})
	require.NoError(t, w.Delete(context.Background(), []driver.RecordID{{Name: "api", Key: secretKey}}))
	require.Len(t, spans.GetSpans(), 1)
	assert.Equal(t, ratelimitotel.SpanDelete, spans.GetSpans()[0].Name)
}
