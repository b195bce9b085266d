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
	"go.opentelemetry.io/otel/trace"
)

// A nil *sdkmetric.MeterProvider or *sdktrace.TracerProvider (a field
// left unset) is refused, as a nil Option is, naming the option, its type
// and its place: it was taken as nil is, for the global provider, which
// the provider meant may not be. nil itself is still the global one.
func TestNilPointerProviders(t *testing.T) {
	_, err := ratelimitotel.NewObserver(ratelimitotel.WithAttributes(), ratelimitotel.WithMeterProvider((*sdkmetric.MeterProvider)(nil)))
	require.ErrorIs(t, err, ratelimitotel.ErrInvalidOption)
	assert.EqualError(t, err, "ratelimitotel: NewObserver was given WithMeterProvider of a nil *metric.MeterProvider, whose methods would dereference it: "+
		"give a provider, or leave the option out (or give it nil) for the global one (option 2)")
	_, err = ratelimitotel.NewObserver(ratelimitotel.WithTracerProvider((*sdktrace.TracerProvider)(nil)))
	require.ErrorIs(t, err, ratelimitotel.ErrInvalidOption)

	var tp trace.TracerProvider = (*sdktrace.TracerProvider)(nil)
	r := recoverPanic(func() { ratelimitotel.WrapStore(must(memstore.New()), ratelimitotel.WithTracerProvider(tp)) })
	rerr, ok := r.(error)
	require.True(t, ok, "WrapStore panicked with %v", r)
	require.ErrorIs(t, rerr, ratelimitotel.ErrInvalidOption)
	assert.EqualError(t, rerr, "ratelimitotel: WrapStore was given WithTracerProvider of a nil *trace.TracerProvider, whose methods would dereference it: "+
		"give a provider, or leave the option out (or give it nil) for the global one (option 1)")

	// nil: the global providers.
	reader, mp := newReader(t)
	prevMP := otel.GetMeterProvider()
	otel.SetMeterProvider(mp)
	t.Cleanup(func() { otel.SetMeterProvider(prevMP) })
	spans, gtp := newTracer(t)
	prevTP := otel.GetTracerProvider()
	otel.SetTracerProvider(gtp)
	t.Cleanup(func() { otel.SetTracerProvider(prevTP) })
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(nil))
	require.NoError(t, err)
	obs.Observe(context.Background(), ratelimit.Event{Result: ratelimit.Result{Name: "api", Key: secretKey}, Outcome: ratelimit.Denied})
	assert.Equal(t, map[string]int64{"api denied false false": 1}, counts(t, collect(t, reader)))
	w := ratelimitotel.WrapStore(must(memstore.New()), ratelimitotel.WithTracerProvider(nil))
	require.NoError(t, w.Delete(context.Background(), []driver.RecordID{{Name: "api", Key: secretKey}}))
	require.Len(t, spans.GetSpans(), 1)
	assert.Equal(t, ratelimitotel.SpanDelete, spans.GetSpans()[0].Name)
}

// recoverPanic returns what f panics with, nil if it does not.
func recoverPanic(f func()) (r any) {
	defer func() { r = recover() }()
	f()
	return nil
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
