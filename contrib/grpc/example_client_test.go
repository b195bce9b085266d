package ratelimitgrpc_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// skipClock is a mock clock on which a wait passes at once: a timer moves
// the clock to its end, so that a Limiter on the same clock sees the time
// waited. It adds up the time waited. Production leaves WithClock out and
// waits on the real clock.
type skipClock struct {
	*clock.Mock
	waited time.Duration
}

// Timer returns a timer of the mock, which has fired: the clock has moved
// d ahead.
func (c *skipClock) Timer(d time.Duration) *clock.Timer {
	t := c.Mock.Timer(d)
	c.waited += d
	c.Add(d)
	return t
}

// A client that waits out a refusal and retries once, when a call asks,
// against a server that grants one call a minute per client address.
func ExampleUnaryClientInterceptor() {
	// The server's Limiter and the client's waits share the clock, set to
	// the time the calls' deadlines are counted from.
	clk := &skipClock{Mock: clock.NewMock()}
	clk.Set(time.Now())
	store, err := memstore.New()
	if err != nil {
		panic(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute},
	}, ratelimit.WithClock(clk))
	if err != nil {
		panic(err)
	}
	ic, err := ratelimitgrpc.New(lim, []string{"api"})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(ratelimitgrpc.UnaryClientInterceptor(
			ratelimitgrpc.MaxWait(2*time.Minute), ratelimitgrpc.WithClock(clk))))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	fmt.Printf("call 1: %v\n", status.Code(err))
	// Not asked to wait: the refusal comes back at once.
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	fmt.Printf("call 2: %v, waited %v\n", status.Code(err), clk.waited)
	// Asked: the client waits the minute the refusal's RetryInfo names,
	// and the retry is granted.
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{}, ratelimitgrpc.WaitRetry())
	fmt.Printf("call 3: %v, waited %v\n", status.Code(err), clk.waited)
	// A deadline too close for the wait: the refusal comes back at once.
	short, cancelShort := context.WithDeadline(ctx, clk.Now().Add(30*time.Second))
	defer cancelShort()
	_, err = client.Check(short, &healthpb.HealthCheckRequest{}, ratelimitgrpc.WaitRetry())
	fmt.Printf("call 4: %v, waited %v\n", status.Code(err), clk.waited)
	// Output:
	// call 1: OK
	// call 2: ResourceExhausted, waited 0s
	// call 3: OK, waited 1m0s
	// call 4: ResourceExhausted, waited 1m0s
}
