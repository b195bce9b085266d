package ratelimitgrpc_test

import (
	"bytes"
	"context"
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
