package ratelimitotel_test

import (
	"context"
	"errors"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
)

// errRawKey is the error of a store of one's own that names, unquoted, a
// key of bytes that are not UTF-8, as a key taken from binary metadata
// or a header may be.
var errRawKey = errors.New("rawstore: the record of key \xff\xfe cannot be read")

// rawKeyStore fails every call with errRawKey.
type rawKeyStore struct{ failStore }

func (rawKeyStore) Apply(context.Context, *driver.Op, []driver.Decision) error { return errRawKey }

// A store's error whose text is not UTF-8 is recorded on the span (the
// status and the exception event) in UTF-8, its bytes that are not
// replaced by U+FFFD, as the names of limits are: OTLP's protobuf
// refuses a string that is not UTF-8, and the exporter dropped the whole
// batch of spans with it, the failed call's and every other. The error
// returned is the store's, as it is, and the event keeps its type.
func TestWrapStoreErrorNotUTF8(t *testing.T) {
	spans, tp := newTracer(t)
	lim, err := ratelimit.New(ratelimitotel.WrapStore(rawKeyStore{}, ratelimitotel.WithTracerProvider(tp)),
		ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}}, ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	_, err = lim.Limit(context.Background(), "api", secretKey)
	require.ErrorIs(t, err, errRawKey)

	got := spans.GetSpans()
	require.Len(t, got, 1)
	s := got[0]
	assert.Equal(t, codes.Error, s.Status.Code)
	assert.True(t, utf8.ValidString(s.Status.Description), "status %q is not UTF-8", s.Status.Description)
	assert.Equal(t, "rawstore: the record of key \uFFFD cannot be read", s.Status.Description)
	require.Len(t, s.Events, 1)
	assert.Equal(t, "exception", s.Events[0].Name)
	ev := map[string]string{}
	for _, kv := range s.Events[0].Attributes {
		ev[string(kv.Key)] = kv.Value.Emit()
		assert.True(t, utf8.ValidString(kv.Value.Emit()), "event attribute %s %q is not UTF-8", kv.Key, kv.Value.Emit())
	}
	assert.Equal(t, "rawstore: the record of key \uFFFD cannot be read", ev["exception.message"])
	assert.Equal(t, "*errors.errorString", ev["exception.type"])
}

// storeErr is a store's error type whose Error reads its fields: a nil
// *storeErr returned as an error (a typed nil, a common bug) panics when
// its text is asked for.
type storeErr struct{ what string }

func (e *storeErr) Error() string { return "badstore: " + e.what }

// typedNilStore fails Apply with a nil *storeErr.
type typedNilStore struct{ failStore }

func (typedNilStore) Apply(context.Context, *driver.Op, []driver.Decision) error {
	var e *storeErr
	return e
}

// A store error whose Error panics (a typed nil) is returned as it is,
// without a panic (the Limiter takes it for a store failure), and the
// call's span ends marked as an error that names the nil pointer. The
// wrapper read its text and panicked, where the Limiter over the store
// alone does not.
func TestWrapStoreEndsSpanOnErrorThatPanics(t *testing.T) {
	spans, tp := newTracer(t)
	w := ratelimitotel.WrapStore(typedNilStore{}, ratelimitotel.WithTracerProvider(tp))
	var err error
	require.NotPanics(t, func() { err = w.Apply(context.Background(), &driver.Op{}, nil) })
	var e *storeErr
	require.ErrorAs(t, err, &e, "the store's error, as it is")
	assert.Nil(t, e)
	got := spans.GetSpans()
	require.Len(t, got, 1, "the span is ended")
	assert.Equal(t, ratelimitotel.SpanApply, got[0].Name)
	assert.Equal(t, codes.Error, got[0].Status.Code)
	assert.Equal(t, "the store returned a nil *ratelimitotel_test.storeErr: a nil pointer returned as an error", got[0].Status.Description)
	require.Len(t, got[0].Events, 1)
	assert.Equal(t, "exception", got[0].Events[0].Name)
}

// wrappedNilErr wraps a nil *storeErr, and its Is reads it: the panic
// comes only from errors.Is.
type wrappedNilErr struct{ err *storeErr }

func (w wrappedNilErr) Error() string { return "wrapped" }
func (w wrappedNilErr) Unwrap() error { return w.err }
func (w wrappedNilErr) Is(error) bool { return w.err.what == "" }

type wrappedNilStore struct{ failStore }

func (wrappedNilStore) Apply(context.Context, *driver.Op, []driver.Decision) error {
	return wrappedNilErr{}
}

// An error that wraps a nil pointer, its own text readable, is told so on
// the span, and the wrapper does not panic matching it to the context's.
func TestWrapStoreErrorWrapsNil(t *testing.T) {
	spans, tp := newTracer(t)
	w := ratelimitotel.WrapStore(wrappedNilStore{}, ratelimitotel.WithTracerProvider(tp))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var err error
	require.NotPanics(t, func() { err = w.Apply(ctx, &driver.Op{}, nil) })
	assert.IsType(t, wrappedNilErr{}, err)
	got := spans.GetSpans()
	require.Len(t, got, 1)
	assert.Equal(t, codes.Error, got[0].Status.Code)
	assert.Equal(t, "the store returned an error of type ratelimitotel_test.wrappedNilErr that wraps a nil *ratelimitotel_test.storeErr: a nil pointer returned as an error",
		got[0].Status.Description)
}

// A Limiter over the wrapper of a store that returns a nil pointer as an
// error answers as it does over the store: a store failure, no panic.
func TestWrapStoreTypedNilError(t *testing.T) {
	limits := ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}}
	bare, err := ratelimit.New(typedNilStore{}, limits, ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	_, want := bare.Limit(context.Background(), "api", secretKey)
	require.Error(t, want)

	spans, tp := newTracer(t)
	lim, err := ratelimit.New(ratelimitotel.WrapStore(typedNilStore{}, ratelimitotel.WithTracerProvider(tp)), limits,
		ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	require.NotPanics(t, func() { _, err = lim.Limit(context.Background(), "api", secretKey) })
	require.Error(t, err)
	assert.Equal(t, want.Error(), err.Error())
	got := spans.GetSpans()
	require.Len(t, got, 1)
	assert.Equal(t, codes.Error, got[0].Status.Code)
}
