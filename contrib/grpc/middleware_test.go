package ratelimitgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	mwratelimit "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// An *Interceptor is the Limiter of go-grpc-middleware's rate-limit
// interceptors.
var _ mwratelimit.Limiter = (*ratelimitgrpc.Interceptor)(nil)

// So is a ServerLimiter.
var _ mwratelimit.Limiter = ratelimitgrpc.ServerLimiter{}

func TestGoGRPCMiddlewareServer(t *testing.T) {
	ctx := context.Background()
	ic := apiAndStreams(t)
	client, served := serve(t, []grpc.UnaryServerInterceptor{mwratelimit.UnaryServerInterceptor(ic)},
		[]grpc.StreamServerInterceptor{mwratelimit.StreamServerInterceptor(ic)})

	for range 2 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
	}
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	assert.Equal(t, codes.ResourceExhausted, st.Code())
	assert.Contains(t, st.Message(), "rate limit exceeded: retry after 30s")
	assert.NotContains(t, st.Message(), "127.0.0.1")

	// The stream's own limit: the method comes from the call's context.
	_, err = watchTwice(t, ctx, client)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "retry after 1m0s")
	assert.Equal(t, int64(3), served.calls.Load())
}

// On a client the Interceptor throttles the calls it sends: the default
// limits, keyed by a fixed key.
func TestGoGRPCMiddlewareClient(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"outgoing": twoPerMinute})
	ic, err := ratelimitgrpc.New(lim, []string{"outgoing"},
		ratelimitgrpc.WithKey(func(context.Context) (string, error) { return "billing-service", nil }))
	require.NoError(t, err)
	client, served := serve(t, nil, nil, grpc.WithUnaryInterceptor(mwratelimit.UnaryClientInterceptor(ic)))
	for range 2 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
	}
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, int64(2), served.calls.Load(), "the third call was never sent")
}

// ServerLimiter is the Limiter of go-grpc-middleware's server
// interceptors that sends the pushback of a refusal, as Unary and Stream
// do: under those interceptors the Interceptor's own Limit sends none,
// and the status they answer has no RetryInfo, so that a client's retry
// policy found the delay nowhere but in the words of the message.
func TestGoGRPCMiddlewareServerPushback(t *testing.T) {
	ctx := context.Background()
	ic := apiAndStreams(t)
	sl := ic.ServerLimiter()
	client, served := serve(t, []grpc.UnaryServerInterceptor{mwratelimit.UnaryServerInterceptor(sl)},
		[]grpc.StreamServerInterceptor{mwratelimit.StreamServerInterceptor(sl)})

	var trailer metadata.MD
	for range 2 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		require.NoError(t, err)
		assert.Empty(t, trailer.Get(ratelimitgrpc.PushbackTrailer), "no pushback on a call granted")
	}
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "rate limit exceeded: retry after 30s")
	assert.Equal(t, []string{"30000"}, trailer.Get(ratelimitgrpc.PushbackTrailer))

	second, err := watchTwice(t, ctx, client)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, []string{"60000"}, second.Trailer().Get(ratelimitgrpc.PushbackTrailer))
	assert.Equal(t, int64(3), served.calls.Load())
}

// The Interceptor's own Limit sets no trailer: a client interceptor of
// go-grpc-middleware calls it with the context of an outgoing call, which,
// made while serving a call, is that served call's, whose status is its
// handler's to choose. A ServerLimiter's Limit is for the server's
// interceptors alone.
func TestGoGRPCMiddlewareLimitSetsNoTrailer(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"outgoing": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute}})
	ic, err := ratelimitgrpc.New(lim, []string{"outgoing"},
		ratelimitgrpc.WithKey(func(context.Context) (string, error) { return "billing-service", nil }))
	require.NoError(t, err)
	// A handler that throttles the calls it makes, and serves its own call
	// whatever their answer.
	outgoing := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		_ = ic.Limit(ctx)
		return h(ctx, req)
	}
	client, _ := serve(t, []grpc.UnaryServerInterceptor{outgoing}, nil)
	for range 3 {
		var trailer metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		require.NoError(t, err)
		assert.Empty(t, trailer.Get(ratelimitgrpc.PushbackTrailer))
	}
}

// A zero ServerLimiter refuses every call with an error, and never panics.
func TestZeroServerLimiter(t *testing.T) {
	err := ratelimitgrpc.ServerLimiter{}.Limit(context.Background())
	require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)
}

// watchTwice opens two Watch streams of client, the first granted, and
// returns the second with the error of its first Recv.
func watchTwice(t *testing.T, ctx context.Context, client healthpb.HealthClient) (healthpb.Health_WatchClient, error) {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	first, err := client.Watch(wctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = first.Recv()
	require.NoError(t, err)
	second, err := client.Watch(wctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = second.Recv()
	return second, err
}

// apiAndStreams returns an Interceptor that decides every call by "api",
// two a minute, and the Watch streams by "streams" too, one a minute.
func apiAndStreams(t *testing.T) *ratelimitgrpc.Interceptor {
	t.Helper()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{
		"api":     twoPerMinute,
		"streams": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute},
	})
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithMethod(watchMethod, "streams"))
	require.NoError(t, err)
	return ic
}
