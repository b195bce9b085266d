package ratelimitgrpc_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// tenantError is a KeyFunc's error type whose Error reads its fields.
type tenantError struct{ tenant string }

func (e *tenantError) Error() string { return "no such tenant " + e.tenant }

// A KeyFunc that returns a nil *tenantError as its error (a typed nil,
// not nil: a common bug) is answered Internal, as one that panics, and
// logged: the error's Error panics, and it did so outside the recovery
// of the KeyFunc's call, as the error was logged, which gRPC does not
// recover: one call ended the server's process.
func TestKeyFuncTypedNilErrorIsInternal(t *testing.T) {
	var logs bytes.Buffer
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": twoPerMinute})
	ic, err := ratelimitgrpc.New(lim, []string{"api"},
		ratelimitgrpc.WithKey(func(ctx context.Context) (string, error) {
			var e *tenantError // a bug of the KeyFunc: a typed nil
			return "", e
		}),
		ratelimitgrpc.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	ctx := context.Background()
	ok := func(context.Context, any) (any, error) { return "ok", nil }
	var got error
	require.NotPanics(t, func() { _, got = ic.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod}, ok) })
	assert.Equal(t, codes.Internal, status.Code(got))
	assert.Equal(t, "rate limit: internal error", status.Convert(got).Message())
	assert.Contains(t, logs.String(), "panicked")

	require.NotPanics(t, func() { got = ic.Limit(ctx) })
	assert.Equal(t, codes.Internal, status.Code(got))
	require.NotPanics(t, func() {
		got = ic.Stream()(nil, &fakeStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: watchMethod, IsServerStream: true},
			func(any, grpc.ServerStream) error { return nil })
	})
	assert.Equal(t, codes.Internal, status.Code(got))
}

// lookupError is a KeyFunc's error type whose Error needs no fields but
// whose Unwrap reads one: a nil *lookupError prints, and panics when its
// chain is examined.
type lookupError struct{ err error }

func (e *lookupError) Error() string { return "tenant lookup failed" }

func (e *lookupError) Unwrap() error { return e.err }

// statusError is a KeyFunc's error type whose Is method reads a field:
// a nil *statusError prints, and panics when matched against any target.
type statusError struct{ code int }

func (e *statusError) Error() string { return "tenant service refused the call" }

func (e *statusError) Is(target error) bool { return e.code == 404 && target == ratelimitgrpc.ErrNoKey }

// A KeyFunc's typed-nil error whose Error works but whose Unwrap or Is
// panics is answered Internal, as one that panics, and logged: the
// interceptor examined its chain (errors.Is, for the call's status)
// outside the recovery of the KeyFunc's call, which gRPC does not
// recover, so that one call ended the server's process. The call's
// context is live or canceled: a canceled one is matched against
// context.Canceled and DeadlineExceeded, which a live one is not.
func TestKeyFuncTypedNilErrorChainIsInternal(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  func() error
	}{
		{"Unwrap panics", func() error { var e *lookupError; return e }},
		{"Is panics", func() error { var e *statusError; return e }},
	} {
		for _, canceled := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/canceled=%v", tc.name, canceled), func(t *testing.T) {
				var logs bytes.Buffer
				lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": twoPerMinute})
				ic, err := ratelimitgrpc.New(lim, []string{"api"},
					ratelimitgrpc.WithKey(func(context.Context) (string, error) { return "", tc.err() }),
					ratelimitgrpc.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
				require.NoError(t, err)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if canceled {
					cancel()
				}
				ok := func(context.Context, any) (any, error) { return "ok", nil }
				var got error
				assert.NotPanics(t, func() { _, got = ic.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod}, ok) })
				assert.Equal(t, codes.Internal, status.Code(got))
				assert.Equal(t, "rate limit: internal error", status.Convert(got).Message())
				assert.Contains(t, logs.String(), "a method of the error it returned panicked")

				assert.NotPanics(t, func() { got = ic.Limit(ctx) })
				assert.Equal(t, codes.Internal, status.Code(got))
				assert.NotPanics(t, func() { got = ic.ServerLimiter().Limit(ctx) })
				assert.Equal(t, codes.Internal, status.Code(got))
				assert.NotPanics(t, func() {
					got = ic.Stream()(nil, &fakeStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: watchMethod, IsServerStream: true},
						func(any, grpc.ServerStream) error { return nil })
				})
				assert.Equal(t, codes.Internal, status.Code(got))
			})
		}
	}
}

// A stream handler that ends, after a refused message, with a typed-nil
// error whose Is panics has its error returned to gRPC as it is, with no
// pushback: the interceptor matched it against the refusal (errors.Is)
// unrecovered, and one stream ended the server's process. The handler's
// error is gRPC's to answer.
func TestStreamHandlerTypedNilErrorIsReturned(t *testing.T) {
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"chat": twoPerMinute})
	ic, err := ratelimitgrpc.New(lim, []string{"chat"}, ratelimitgrpc.WithStreamMessages(),
		ratelimitgrpc.WithKey(func(context.Context) (string, error) { return "tenant", nil }))
	require.NoError(t, err)
	var handlerErr *statusError // a bug of the handler: a typed nil
	ss := &fakeStream{ctx: context.Background(), msgs: []string{"1", "2", "3"}}
	require.NotPanics(t, func() {
		err = ic.Stream()(nil, ss, &grpc.StreamServerInfo{FullMethod: talkMethod, IsClientStream: true, IsServerStream: true},
			func(_ any, ss grpc.ServerStream) error {
				m := new(wrapperspb.StringValue)
				for {
					if err := ss.RecvMsg(m); err != nil {
						require.Equal(t, codes.ResourceExhausted, status.Code(err), "the third message is refused")
						return handlerErr
					}
				}
			})
	})
	assert.Same(t, handlerErr, err)
	assert.Empty(t, ss.trailer.Get(ratelimitgrpc.PushbackTrailer), "no pushback with the handler's own error")
}
