package ratelimitgrpc_test

import (
	"context"
	"testing"

	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// An Interceptor that New did not build, the zero one or a nil pointer
// (kept in place of New's error), has no limits to decide by: it lets no
// call through unlimited, but answers each Internal, and Limit says why.
// The zero Interceptor let every call through, limited by nothing, and a
// nil one panicked on the first call, which gRPC does not recover.
func TestInterceptorNotBuiltByNew(t *testing.T) {
	for _, c := range []struct {
		name string
		ic   *ratelimitgrpc.Interceptor
	}{
		{"zero", &ratelimitgrpc.Interceptor{}},
		{"nil", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.ic.Limit(context.Background())
			require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)
			assert.Equal(t, codes.Internal, status.Code(err))
			err = c.ic.ServerLimiter().Limit(context.Background())
			require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)

			client, served := serve(t, []grpc.UnaryServerInterceptor{c.ic.Unary()}, []grpc.StreamServerInterceptor{c.ic.Stream()})
			_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
			assert.Equal(t, codes.Internal, status.Code(err))
			assert.Equal(t, "rate limit: internal error", status.Convert(err).Message(), "no internal detail reaches the client")
			w, err := client.Watch(context.Background(), &healthpb.HealthCheckRequest{})
			require.NoError(t, err)
			_, err = w.Recv()
			assert.Equal(t, codes.Internal, status.Code(err))
			assert.Equal(t, int64(0), served.calls.Load(), "no call reaches the service")
		})
	}
}
