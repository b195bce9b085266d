package ratelimitgrpc_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// jumpClock is a mock clock on which a wait passes at once: a timer moves
// the clock to its end, so the server's limiter, on the same clock, sees
// the time waited.
type jumpClock struct {
	*clock.Mock
	mu     sync.Mutex
	waited []time.Duration
}

func (c *jumpClock) Timer(d time.Duration) *clock.Timer {
	t := c.Mock.Timer(d)
	c.mu.Lock()
	c.waited = append(c.waited, d)
	c.mu.Unlock()
	c.Add(d)
	return t
}

func (c *jumpClock) waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waited...)
}

// limitedServer serves Check behind one token a minute, on clk, to a
// client that waits up to an hour unless opts say otherwise.
func limitedServer(t *testing.T, clk *jumpClock, opts ...ratelimitgrpc.ClientOption) (healthpb.HealthClient, *counter) {
	t.Helper()
	lim := newLimiter(t, nil, clk.Mock, ratelimit.Limits{"api": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute}})
	ic, err := ratelimitgrpc.New(lim, []string{"api"})
	require.NoError(t, err)
	return serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil,
		grpc.WithUnaryInterceptor(ratelimitgrpc.UnaryClientInterceptor(
			append([]ratelimitgrpc.ClientOption{ratelimitgrpc.MaxWait(time.Hour), ratelimitgrpc.WithClock(clk)}, opts...)...)))
}

func TestClientWaitsWhenAsked(t *testing.T) {
	ctx := context.Background()
	clk := &jumpClock{Mock: clock.NewMock()}
	client, served := limitedServer(t, clk)

	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	// Not asked: the refusal comes back at once.
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Empty(t, clk.waits())
	// Asked: it waits the minute the server named, and the retry passes.
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{}, ratelimitgrpc.WaitRetry())
	require.NoError(t, err)
	assert.Equal(t, []time.Duration{time.Minute}, clk.waits())
	assert.Equal(t, int64(2), served.calls.Load())
}

func TestClientRetryAll(t *testing.T) {
	ctx := context.Background()
	clk := &jumpClock{Mock: clock.NewMock()}
	client, served := limitedServer(t, clk, ratelimitgrpc.RetryAll())
	for range 3 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
	}
	assert.Equal(t, []time.Duration{time.Minute, time.Minute}, clk.waits())
	assert.Equal(t, int64(3), served.calls.Load())
}

// farFuture is a time a mock clock is set to so that a deadline on it is
// also far ahead of the real clock: a context's deadline is a time, which
// gRPC turns into a timeout on the real clock.
var farFuture = time.Date(2100, time.January, 1, 0, 0, 0, 0, time.UTC)

// The deadline is measured on the interceptor's clock, as the wait is: a
// deadline 30 s ahead on that clock leaves no time for a minute's wait,
// however far it is on the real clock.
func TestClientDoesNotWaitPastDeadline(t *testing.T) {
	for _, c := range []struct {
		name    string
		left    time.Duration
		retried bool
	}{
		{"too soon", 30 * time.Second, false},
		{"just the wait", time.Minute, false},
		{"time left", 2 * time.Minute, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := &jumpClock{Mock: clock.NewMock()}
			clk.Set(farFuture)
			client, served := limitedServer(t, clk)
			_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
			require.NoError(t, err)

			ctx, cancel := context.WithDeadline(context.Background(), clk.Now().Add(c.left))
			defer cancel()
			_, err = client.Check(ctx, &healthpb.HealthCheckRequest{}, ratelimitgrpc.WaitRetry())
			if !c.retried {
				assert.Equal(t, codes.ResourceExhausted, status.Code(err), "a minute's wait cannot end within %v", c.left)
				assert.Empty(t, clk.waits())
				assert.Equal(t, int64(1), served.calls.Load())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, []time.Duration{time.Minute}, clk.waits())
			assert.Equal(t, int64(2), served.calls.Load())
		})
	}
}

func TestClientMaxWait(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		clk := &jumpClock{Mock: clock.NewMock()}
		var calls atomic.Int64
		client, _ := serve(t, []grpc.UnaryServerInterceptor{refuser(codes.ResourceExhausted, ratelimitgrpc.DefaultMaxWait+time.Millisecond, &calls)}, nil,
			grpc.WithUnaryInterceptor(ratelimitgrpc.UnaryClientInterceptor(ratelimitgrpc.WithClock(clk), ratelimitgrpc.RetryAll())))
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		assert.Equal(t, codes.ResourceExhausted, status.Code(err))
		assert.Equal(t, int64(1), calls.Load())
		assert.Empty(t, clk.waits())
	})
	clk := &jumpClock{Mock: clock.NewMock()}
	client, _ := limitedServer(t, clk, ratelimitgrpc.MaxWait(59*time.Second), ratelimitgrpc.RetryAll())
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Empty(t, clk.waits())
}

// A negative MaxWait would never wait out a refusal: each call through the
// interceptor fails, before it is sent, with an error that says so. It was
// taken as given, and no refusal was ever waited out.
func TestClientNegativeMaxWait(t *testing.T) {
	clk := &jumpClock{Mock: clock.NewMock()}
	client, served := limitedServer(t, clk, ratelimitgrpc.MaxWait(-time.Second), ratelimitgrpc.RetryAll())
	for range 2 {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)
		assert.ErrorContains(t, err, "MaxWait(-1s)")
		// The caller's code is the option's fault, not Unknown.
		st, ok := status.FromError(err)
		require.True(t, ok, "a status error: %v", err)
		assert.Equal(t, codes.InvalidArgument, st.Code())
		assert.Contains(t, st.Message(), "MaxWait(-1s)")
	}
	assert.Equal(t, int64(0), served.calls.Load())
	assert.Empty(t, clk.waits())
}

// A nil clock, untyped or a nil *clock.Mock, is a mistake: each call
// through the interceptor fails, before it is sent, with InvalidArgument
// and an error matching ErrInvalidOption. A nil *clock.Mock was taken as a
// clock, and the first call that measured its deadline, or waited out a
// refusal, panicked on it.
func TestClientNilClock(t *testing.T) {
	for _, c := range []struct {
		name  string
		clk   clock.Clock
		given string // as the error names it
	}{
		{"untyped", nil, "nil"},
		{"nil mock", (*clock.Mock)(nil), "(*clock.Mock)(nil)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int64
			client, _ := serve(t, []grpc.UnaryServerInterceptor{refuser(codes.ResourceExhausted, time.Second, &calls)}, nil,
				grpc.WithUnaryInterceptor(ratelimitgrpc.UnaryClientInterceptor(ratelimitgrpc.WithClock(c.clk), ratelimitgrpc.RetryAll())))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)
			assert.ErrorContains(t, err, "WithClock("+c.given+")")
			assert.Equal(t, codes.InvalidArgument, status.Code(err))
			assert.Equal(t, int64(0), calls.Load(), "no call is sent")
		})
	}
}

// A nil ClientOption (an option variable never set) is a mistake, as a
// nil Option is to New: each call through the interceptor fails, before
// it is sent, with InvalidArgument and an error matching
// ErrInvalidOption that names the option's place. It was skipped, and
// the interceptor ran without the option meant, RetryAll say, unseen.
func TestClientNilOption(t *testing.T) {
	var calls atomic.Int64
	var unset ratelimitgrpc.ClientOption
	client, _ := serve(t, []grpc.UnaryServerInterceptor{refuser(codes.ResourceExhausted, time.Second, &calls)}, nil,
		grpc.WithUnaryInterceptor(ratelimitgrpc.UnaryClientInterceptor(ratelimitgrpc.MaxWait(time.Minute), unset)))
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)
	assert.ErrorContains(t, err, "nil ClientOption (option 2)")
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Equal(t, int64(0), calls.Load(), "no call is sent")
}

// refuser answers every call with code, and a RetryInfo of delay when
// delay ≥ 0.
func refuser(code codes.Code, delay time.Duration, calls *atomic.Int64) grpc.UnaryServerInterceptor {
	return func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		st := status.New(code, "no")
		if delay >= 0 {
			st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
		}
		return nil, st.Err()
	}
}

func TestClientRetriesOnce(t *testing.T) {
	for _, c := range []struct {
		name    string
		code    codes.Code
		delay   time.Duration
		retried bool
	}{
		{"resource exhausted", codes.ResourceExhausted, time.Second, true},
		{"unavailable", codes.Unavailable, time.Second, true},
		{"no delay", codes.ResourceExhausted, 0, true},
		{"no retry info", codes.ResourceExhausted, -1, false},
		{"another code", codes.PermissionDenied, time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := &jumpClock{Mock: clock.NewMock()}
			var calls atomic.Int64
			client, _ := serve(t, []grpc.UnaryServerInterceptor{refuser(c.code, c.delay, &calls)}, nil,
				grpc.WithUnaryInterceptor(ratelimitgrpc.UnaryClientInterceptor(ratelimitgrpc.WithClock(clk), ratelimitgrpc.RetryAll())))
			_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
			assert.Equal(t, c.code, status.Code(err), "the second refusal is returned")
			want := int64(1)
			if c.retried {
				want = 2
			}
			assert.Equal(t, want, calls.Load())
			if c.retried && c.delay > 0 {
				assert.Equal(t, []time.Duration{c.delay}, clk.waits())
			} else {
				assert.Empty(t, clk.waits())
			}
		})
	}
}

// stallClock's timers never fire; it says when one is made.
type stallClock struct {
	*clock.Mock
	made chan struct{}
}

func (c *stallClock) Timer(d time.Duration) *clock.Timer {
	t := c.Mock.Timer(d)
	close(c.made)
	return t
}

func TestClientCanceledWhileWaiting(t *testing.T) {
	clk := &stallClock{Mock: clock.NewMock(), made: make(chan struct{})}
	var calls atomic.Int64
	client, _ := serve(t, []grpc.UnaryServerInterceptor{refuser(codes.ResourceExhausted, time.Second, &calls)}, nil,
		grpc.WithUnaryInterceptor(ratelimitgrpc.UnaryClientInterceptor(ratelimitgrpc.WithClock(clk))))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-clk.made
		cancel()
	}()
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, ratelimitgrpc.WaitRetry())
	assert.Equal(t, codes.Canceled, status.Code(err))
	assert.Equal(t, int64(1), calls.Load(), "no retry after the caller gave up")
}

// A server's RetryInfo is the client's input: a negative delay is retried
// at once, with no wait; none, one out of the range of a protocol buffer
// Duration, or one too long for a time.Duration, is not waited out.
func TestClientHostileRetryInfo(t *testing.T) {
	for _, c := range []struct {
		name    string
		delay   *durationpb.Duration
		retried bool
	}{
		{"negative", durationpb.New(-time.Hour), true},
		{"no delay given", nil, false},
		{"out of range", &durationpb.Duration{Seconds: 1 << 62}, false},
		{"sign mismatch", &durationpb.Duration{Seconds: 1, Nanos: -1}, false},
		{"beyond time.Duration", &durationpb.Duration{Seconds: 300 * 365 * 24 * 3600}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := &jumpClock{Mock: clock.NewMock()}
			var calls atomic.Int64
			refuse := func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
				calls.Add(1)
				st, _ := status.New(codes.ResourceExhausted, "no").WithDetails(&errdetails.RetryInfo{RetryDelay: c.delay})
				return nil, st.Err()
			}
			client, _ := serve(t, []grpc.UnaryServerInterceptor{refuse}, nil,
				grpc.WithUnaryInterceptor(ratelimitgrpc.UnaryClientInterceptor(ratelimitgrpc.WithClock(clk), ratelimitgrpc.RetryAll(),
					ratelimitgrpc.MaxWait(time.Hour))))
			_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
			assert.Equal(t, codes.ResourceExhausted, status.Code(err))
			want := int64(1)
			if c.retried {
				want = 2
			}
			assert.Equal(t, want, calls.Load())
			assert.Empty(t, clk.waits(), "nothing waited")
		})
	}
}
