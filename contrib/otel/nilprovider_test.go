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

// A nil Option (an option variable never set) is refused, as
// ratelimit.New refuses one: NewObserver with an error, WrapStore, which
// returns none, with a panic, both matching ErrInvalidOption and naming
// the option's place. Each skipped it, and ran without the option meant
// (a provider, the attributes that tell two stores apart) unseen.
func TestNilOption(t *testing.T) {
	_, tp := newTracer(t)
	var unset ratelimitotel.Option
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithAttributes(), unset)
	require.ErrorIs(t, err, ratelimitotel.ErrInvalidOption)
	assert.ErrorContains(t, err, "NewObserver was given a nil Option (option 2)")
	assert.Nil(t, obs)

	var got any
	func() {
		defer func() { got = recover() }()
		ratelimitotel.WrapStore(must(memstore.New()), ratelimitotel.WithTracerProvider(tp), unset)
	}()
	perr, ok := got.(error)
	require.True(t, ok, "WrapStore panics with an error, got %v", got)
	require.ErrorIs(t, perr, ratelimitotel.ErrInvalidOption)
	assert.ErrorContains(t, perr, "WrapStore was given a nil Option (option 2)")
}
