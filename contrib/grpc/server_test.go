package ratelimitgrpc_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const (
	checkMethod = "/grpc.health.v1.Health/Check"
	watchMethod = "/grpc.health.v1.Health/Watch"
)

// counter counts the calls that reach the service, behind the limits.
type counter struct{ calls atomic.Int64 }

func (c *counter) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	c.calls.Add(1)
	return h(ctx, req)
}

func (c *counter) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	c.calls.Add(1)
	return h(srv, ss)
}

// serve starts a gRPC server with the health service on a loopback port,
// the given interceptors first and a counter last, and returns a client.
func serve(t *testing.T, unary []grpc.UnaryServerInterceptor, stream []grpc.StreamServerInterceptor, dial ...grpc.DialOption) (healthpb.HealthClient, *counter) {
	t.Helper()
	var c counter
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append(unary, c.unary)...),
		grpc.ChainStreamInterceptor(append(stream, c.stream)...))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn), &c
}

func newLimiter(t *testing.T, store ratelimit.Store, mock *clock.Mock, limits ratelimit.Limits) *ratelimit.Limiter {
	t.Helper()
	if store == nil {
		store = must(memstore.New())
	}
	lim, err := ratelimit.New(store, limits, ratelimit.WithClock(mock))
	require.NoError(t, err)
	return lim
}

// retryInfo returns the RetryInfo delay of err's status, and whether it
// has one.
func retryInfo(t *testing.T, err error) (time.Duration, bool) {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "a status error: %v", err)
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

var twoPerMinute = ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute}

func TestUnaryRefusal(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": twoPerMinute})
	ic, err := ratelimitgrpc.New(lim, []string{"api"})
	require.NoError(t, err)
	client, served := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil)

	for range 2 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
	}
	var trailer metadata.MD
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	require.Error(t, err)
	st := status.Convert(err)
	assert.Equal(t, codes.ResourceExhausted, st.Code())
	assert.Equal(t, "rate limit exceeded: retry after 30s", st.Message())
	assert.NotContains(t, st.Message(), "127.0.0.1", "the key is not in the message")
	wait, ok := retryInfo(t, err)
	require.True(t, ok, "a RetryInfo detail")
	assert.Equal(t, 30*time.Second, wait, "a token every 30 s")
	assert.Equal(t, []string{"30000"}, trailer.Get(ratelimitgrpc.PushbackTrailer))
	assert.Equal(t, int64(2), served.calls.Load(), "the refused call never reached the service")

	// The key is the peer's IP: the bucket drained is 127.0.0.1's.
	st2, err := lim.Value(ctx, "api", "127.0.0.1")
	require.NoError(t, err)
	assert.Zero(t, st2.Remaining)
}

// The longest wait a Result reports, about 292 years (a token of a
// limit whose rate is a quarter token a century, past what a Duration
// holds), is in RetryInfo whole, and the pushback is MaxPushback: rounding
// it up overflowed to a negative pushback, which tells gRPC's retry policy
// never to retry, not to wait; sent whole, it was past what grpc-java
// reads (a 32-bit integer), which it takes for the same.
func TestPushbackOfLongestWait(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{
		"api": {Kind: ratelimit.TokenBucket, Rate: 0.25, Period: ratelimit.MaxPeriod, Capacity: 1},
	})
	ic, err := ratelimitgrpc.New(lim, []string{"api"})
	require.NoError(t, err)
	client, _ := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil)
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	var trailer metadata.MD
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	wait, ok := retryInfo(t, err)
	require.True(t, ok)
	assert.Equal(t, time.Duration(driver.MaxRetryAfter)*time.Millisecond, wait)
	// The pushback is at most MaxPushback, which a 32-bit integer holds:
	// grpc-java takes a larger one for "do not retry".
	pushback := trailer.Get(ratelimitgrpc.PushbackTrailer)
	require.Len(t, pushback, 1)
	ms, err := strconv.ParseInt(pushback[0], 10, 32)
	require.NoError(t, err, "pushback %s", pushback[0])
	assert.Equal(t, ratelimitgrpc.MaxPushback, time.Duration(ms)*time.Millisecond)
}

func TestStreamRefusal(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{
		"api":     twoPerMinute,
		"streams": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute},
	})
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithMethod(watchMethod, "streams"))
	require.NoError(t, err)
	client, served := serve(t, nil, []grpc.StreamServerInterceptor{ic.Stream()})

	// The first stream opens and gets the service's first message.
	first, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = first.Recv()
	require.NoError(t, err)
	// The second is refused when it opens: its first Recv says why.
	second, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = second.Recv()
	require.Error(t, err)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	wait, ok := retryInfo(t, err)
	require.True(t, ok)
	assert.Equal(t, time.Minute, wait)
	assert.Equal(t, []string{"60000"}, second.Trailer().Get(ratelimitgrpc.PushbackTrailer))
	assert.Equal(t, int64(1), served.calls.Load())
}

func TestPerMethodLimits(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{
		"api":   twoPerMinute,
		"check": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour},
		"burst": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute},
	})
	call := func(client healthpb.HealthClient) error {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}

	t.Run("exempt", func(t *testing.T) {
		ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithMethod(checkMethod))
		require.NoError(t, err)
		client, _ := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil)
		for range 5 {
			require.NoError(t, call(client), "a method with no limits is not limited")
		}
	})
	t.Run("all or nothing", func(t *testing.T) {
		ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithMethod(checkMethod, "check", "burst"))
		require.NoError(t, err)
		client, _ := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil)
		require.NoError(t, call(client))
		err = call(client)
		assert.Equal(t, codes.ResourceExhausted, status.Code(err))
		wait, _ := retryInfo(t, err)
		assert.Equal(t, time.Minute, wait, "burst decides")
		// check was charged once only: the refused call spent nothing.
		st, err := lim.Value(ctx, "check", "127.0.0.1")
		require.NoError(t, err)
		assert.Equal(t, 99.0, st.Remaining)
	})
	t.Run("only named methods", func(t *testing.T) {
		ic, err := ratelimitgrpc.New(lim, nil, ratelimitgrpc.WithMethod(watchMethod, "burst"))
		require.NoError(t, err)
		client, _ := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil)
		for range 5 {
			require.NoError(t, call(client), "no default limits: Check is not limited")
		}
	})
}

func TestMetadataKey(t *testing.T) {
	ctx := context.Background()
	var logs bytes.Buffer
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute}})
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(ratelimitgrpc.Metadata("X-API-Key")),
		ratelimitgrpc.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	require.NoError(t, err)
	client, _ := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil)
	call := func(md ...string) error {
		_, err := client.Check(metadata.AppendToOutgoingContext(ctx, md...), &healthpb.HealthCheckRequest{})
		return err
	}

	require.NoError(t, call("x-api-key", "alpha-secret"))
	assert.Equal(t, codes.ResourceExhausted, status.Code(call("x-api-key", "alpha-secret")))
	require.NoError(t, call("x-api-key", "beta-secret"), "another key, another bucket")

	for name, md := range map[string][]string{
		"missing": nil,
		"empty":   {"x-api-key", ""},
		"twice":   {"x-api-key", "alpha-secret", "x-api-key", "beta-secret"},
	} {
		err := call(md...)
		st := status.Convert(err)
		assert.Equal(t, codes.InvalidArgument, st.Code(), name)
		assert.Equal(t, "rate limit: the call carries no key", st.Message(), name)
	}
	assert.Contains(t, logs.String(), "metadata x-api-key is missing")
	assert.NotContains(t, logs.String(), "secret", "keys are never logged")
}

// flakyStore fails every Apply while down is set.
type flakyStore struct {
	ratelimit.Store
	down atomic.Bool
}

func (s *flakyStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if s.down.Load() {
		return errors.New("dial tcp 10.0.0.7:6379: connection refused")
	}
	return s.Store.Apply(ctx, op, out)
}

func TestStoreFailure(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	store.down.Store(true)
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"closed": twoPerMinute,
		"open":   {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute, FailOpen: true},
	}, ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	var logs bytes.Buffer
	ic, err := ratelimitgrpc.New(lim, []string{"closed"}, ratelimitgrpc.WithMethod(watchMethod, "open"),
		ratelimitgrpc.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	client, served := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, []grpc.StreamServerInterceptor{ic.Stream()})

	// Check fails closed: Unavailable, with the breaker's cool-down to wait.
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	assert.Equal(t, codes.Unavailable, st.Code())
	assert.Equal(t, "rate limit unavailable: retry after 2s", st.Message())
	wait, ok := retryInfo(t, err)
	require.True(t, ok)
	assert.Equal(t, ratelimit.DefaultBreakerCooldown, wait)
	assert.Contains(t, logs.String(), "connection refused", "the store's error is logged")
	assert.NotContains(t, logs.String(), "127.0.0.1", "the key is not")

	// Watch fails open: the stream goes on.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Watch(wctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)
	assert.Equal(t, int64(1), served.calls.Load())
}

// Nothing of an error reaches the client: not a KeyFunc's words, not a
// bad count's.
func TestInternalErrorsHidden(t *testing.T) {
	ctx := context.Background()
	var logs bytes.Buffer
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": twoPerMinute})
	ic, err := ratelimitgrpc.New(lim, []string{"api"},
		ratelimitgrpc.WithKey(func(context.Context) (string, error) {
			return "", errors.New("tenant lookup: dial 10.1.2.3:5432: password authentication failed")
		}),
		ratelimitgrpc.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	client, _ := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil)
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	assert.Equal(t, codes.Internal, st.Code())
	assert.Equal(t, "rate limit: internal error", st.Message())
	assert.Empty(t, st.Details())
	assert.Contains(t, logs.String(), "password authentication failed")
	assert.Contains(t, logs.String(), "method="+checkMethod)
}

// A call whose client went away while it was decided is Canceled, not an
// internal error; the store is the one that notices.
func TestCanceledWhileDeciding(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": twoPerMinute})
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithLogger(slog.New(slog.DiscardHandler)),
		ratelimitgrpc.WithKey(func(context.Context) (string, error) { return "svc", nil }))
	require.NoError(t, err)
	unary := ic.Unary()
	called := false
	cancel()
	_, err = unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod},
		func(context.Context, any) (any, error) { called = true; return nil, nil })
	assert.Equal(t, codes.Canceled, status.Code(err))
	assert.False(t, called)
}

// Limit is the Limiter of go-grpc-middleware; used directly, its error
// carries the interceptor's status.
func TestLimitStatus(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute}})
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(func(context.Context) (string, error) { return "svc", nil }))
	require.NoError(t, err)
	require.NoError(t, ic.Limit(ctx))
	err = ic.Limit(ctx)
	require.Error(t, err)
	assert.Equal(t, "rate limit exceeded: retry after 1m0s", err.Error())
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	wait, ok := retryInfo(t, err)
	require.True(t, ok)
	assert.Equal(t, time.Minute, wait)
}

func TestNewRefuses(t *testing.T) {
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{
		"api":  twoPerMinute,
		"tiny": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute, Capacity: 0.5},
	})
	for _, c := range []struct {
		name  string
		lim   *ratelimit.Limiter
		names []string
		opts  []ratelimitgrpc.Option
		want  error
	}{
		{"no limiter", nil, []string{"api"}, nil, ratelimitgrpc.ErrInvalidOption},
		{"nothing limited", lim, nil, nil, ratelimitgrpc.ErrInvalidOption},
		{"only exempt methods", lim, nil, []ratelimitgrpc.Option{ratelimitgrpc.WithMethod(checkMethod)}, ratelimitgrpc.ErrInvalidOption},
		{"unknown limit", lim, []string{"apii"}, nil, ratelimit.ErrUnknownLimit},
		{"unknown limit of a method", lim, []string{"api"}, []ratelimitgrpc.Option{ratelimitgrpc.WithMethod(checkMethod, "nope")}, ratelimit.ErrUnknownLimit},
		{"limit named twice", lim, []string{"api", "api"}, nil, ratelimit.ErrInvalidConfig},
		{"capacity below one", lim, []string{"tiny"}, nil, ratelimit.ErrInvalidConfig},
		{"bad method", lim, []string{"api"}, []ratelimitgrpc.Option{ratelimitgrpc.WithMethod("grpc.health.v1.Health/Check", "api")}, ratelimitgrpc.ErrInvalidOption},
		{"method without service", lim, []string{"api"}, []ratelimitgrpc.Option{ratelimitgrpc.WithMethod("/Check", "api")}, ratelimitgrpc.ErrInvalidOption},
		{"method twice", lim, []string{"api"}, []ratelimitgrpc.Option{ratelimitgrpc.WithMethod(checkMethod, "api"), ratelimitgrpc.WithMethod(checkMethod)}, ratelimitgrpc.ErrInvalidOption},
		{"nil key", lim, []string{"api"}, []ratelimitgrpc.Option{ratelimitgrpc.WithKey(nil)}, ratelimitgrpc.ErrInvalidOption},
		{"nil logger", lim, []string{"api"}, []ratelimitgrpc.Option{ratelimitgrpc.WithLogger(nil)}, ratelimitgrpc.ErrInvalidOption},
		{"nil option", lim, []string{"api"}, []ratelimitgrpc.Option{nil}, ratelimitgrpc.ErrInvalidOption},
		{"stream messages of a bad method", lim, []string{"api"}, []ratelimitgrpc.Option{ratelimitgrpc.WithStreamMessages("Chat/Talk")}, ratelimitgrpc.ErrInvalidOption},
		{"stream messages of a method twice", lim, []string{"api"}, []ratelimitgrpc.Option{ratelimitgrpc.WithStreamMessages(watchMethod, watchMethod)}, ratelimitgrpc.ErrInvalidOption},
		{"stream messages twice", lim, []string{"api"}, []ratelimitgrpc.Option{ratelimitgrpc.WithStreamMessages(), ratelimitgrpc.WithStreamMessages(watchMethod)}, ratelimitgrpc.ErrInvalidOption},
		{"stream messages of an exempt method", lim, []string{"api"}, []ratelimitgrpc.Option{ratelimitgrpc.WithMethod(watchMethod), ratelimitgrpc.WithStreamMessages(watchMethod)}, ratelimitgrpc.ErrInvalidOption},
		{"stream messages of a method not limited", lim, nil, []ratelimitgrpc.Option{ratelimitgrpc.WithMethod(checkMethod, "api"), ratelimitgrpc.WithStreamMessages(watchMethod)}, ratelimitgrpc.ErrInvalidOption},
	} {
		t.Run(c.name, func(t *testing.T) {
			ic, err := ratelimitgrpc.New(c.lim, c.names, c.opts...)
			require.ErrorIs(t, err, c.want)
			assert.Nil(t, ic)
		})
	}
}

// Calls of many goroutines never pass more than the limit grants.
func TestConcurrentCalls(t *testing.T) {
	ctx := context.Background()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 25, Period: time.Hour}})
	ic, err := ratelimitgrpc.New(lim, []string{"api"})
	require.NoError(t, err)
	client, served := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil)
	var wg sync.WaitGroup
	var refused atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) == codes.ResourceExhausted {
					refused.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(25), served.calls.Load())
	assert.Equal(t, int64(55), refused.Load())
}

// A method named without its leading slash is the method: grpc-go served
// such a path as the method it names (before v1.79.3, and with
// GRPC_GO_EXPERIMENTAL_DISABLE_STRICT_PATH_CHECKING since), and the
// interceptors, which looked the name up as it came, decided the call by
// the default limits, or by none, not by the method's own.
func TestMethodWithoutLeadingSlash(t *testing.T) {
	ctx := withPeer(&net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 1})
	oneAMinute := ratelimit.Limits{"strict": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute}}
	newIC := func(opts ...ratelimitgrpc.Option) *ratelimitgrpc.Interceptor {
		ic, err := ratelimitgrpc.New(newLimiter(t, nil, clock.NewMock(), oneAMinute), nil, opts...)
		require.NoError(t, err)
		return ic
	}
	bare := func(m string) string { return strings.TrimPrefix(m, "/") }

	ic := newIC(ratelimitgrpc.WithMethod(checkMethod, "strict"))
	served := 0
	handler := func(context.Context, any) (any, error) { served++; return nil, nil }
	for range 3 {
		_, _ = ic.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: bare(checkMethod)}, handler)
	}
	assert.Equal(t, 1, served, "Unary: the method's limit decides")

	// Limit and ServerLimiter read the method from the call's context.
	for _, l := range []interface{ Limit(context.Context) error }{newIC(ratelimitgrpc.WithMethod(checkMethod, "strict")),
		newIC(ratelimitgrpc.WithMethod(checkMethod, "strict")).ServerLimiter()} {
		cctx := grpc.NewContextWithServerTransportStream(ctx, transportStream(bare(checkMethod)))
		require.NoError(t, l.Limit(cctx))
		require.Error(t, l.Limit(cctx), "Limit: the method's limit decides")
	}

	ic = newIC(ratelimitgrpc.WithMethod(talkMethod, "strict"), ratelimitgrpc.WithStreamMessages(talkMethod))
	info := &grpc.StreamServerInfo{FullMethod: bare(talkMethod), IsClientStream: true, IsServerStream: true}
	var errs []error
	err := ic.Stream()(nil, &fakeStream{ctx: ctx, msgs: []string{"1", "2"}}, info, func(_ any, ss grpc.ServerStream) error {
		for range 2 {
			errs = append(errs, ss.RecvMsg(new(wrapperspb.StringValue)))
		}
		return nil
	})
	require.NoError(t, err)
	require.Len(t, errs, 2)
	assert.NoError(t, errs[0], "the open pays for the first message")
	assert.Equal(t, codes.ResourceExhausted, status.Code(errs[1]), "Stream: the method's messages are decided")
	err = ic.Stream()(nil, &fakeStream{ctx: ctx}, info, func(any, grpc.ServerStream) error { return nil })
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "Stream: the method's limit decides")
}

// transportStream is a grpc.ServerTransportStream of a method, which
// grpc.Method reads from a call's context.
type transportStream string

func (s transportStream) Method() string             { return string(s) }
func (transportStream) SetHeader(metadata.MD) error  { return nil }
func (transportStream) SendHeader(metadata.MD) error { return nil }
func (transportStream) SetTrailer(metadata.MD) error { return nil }

// A KeyFunc that panicked ended the server: gRPC recovers no panic of an
// interceptor. The call is answered Internal, and the panic logged with
// its value; the handler's own panic is not the Interceptor's, and goes
// on.
func TestPanickingKeyFuncIsInternal(t *testing.T) {
	var logs bytes.Buffer
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": twoPerMinute})
	ic, err := ratelimitgrpc.New(lim, []string{"api"},
		ratelimitgrpc.WithKey(func(ctx context.Context) (string, error) {
			if len(metadata.ValueFromIncomingContext(ctx, "boom")) > 0 {
				panic(errors.New("tenant table not loaded")) // a bug of the KeyFunc
			}
			return "k", nil
		}),
		ratelimitgrpc.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("boom", "1"))
	ok := func(context.Context, any) (any, error) { return "ok", nil }
	var got error
	require.NotPanics(t, func() { _, got = ic.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod}, ok) })
	assert.Equal(t, codes.Internal, status.Code(got))
	assert.Equal(t, "rate limit: internal error", status.Convert(got).Message())
	assert.Contains(t, logs.String(), "panicked")
	assert.Contains(t, logs.String(), "tenant table not loaded")

	require.NotPanics(t, func() { got = ic.Limit(ctx) })
	assert.Equal(t, codes.Internal, status.Code(got))
	require.NotPanics(t, func() { got = ic.ServerLimiter().Limit(ctx) })
	assert.Equal(t, codes.Internal, status.Code(got))
	require.NotPanics(t, func() {
		got = ic.Stream()(nil, &fakeStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: watchMethod, IsServerStream: true},
			func(any, grpc.ServerStream) error { return nil })
	})
	assert.Equal(t, codes.Internal, status.Code(got))

	// The handler's own panic goes on.
	require.PanicsWithValue(t, "handler boom", func() {
		_, _ = ic.Unary()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: checkMethod},
			func(context.Context, any) (any, error) { panic("handler boom") })
	})
}
