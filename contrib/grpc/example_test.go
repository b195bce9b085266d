package ratelimitgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/benbjohnson/clock"
	mwratelimit "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// A server whose calls are limited by the caller's IP address, and the
// refusal a client gets. (The mock clock makes the output repeatable;
// production leaves WithClock out.)
func Example() {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute},
	}, ratelimit.WithClock(clock.NewMock()))
	if err != nil {
		panic(err)
	}
	ic, err := ratelimitgrpc.New(lim, []string{"api"})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for i := range 3 {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		st := status.Convert(err)
		fmt.Printf("call %d: %v %q", i+1, st.Code(), st.Message())
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Printf(" RetryInfo %v", ri.GetRetryDelay().AsDuration())
			}
		}
		fmt.Println()
	}
	// Output:
	// call 1: OK ""
	// call 2: OK ""
	// call 3: ResourceExhausted "rate limit exceeded: retry after 30s" RetryInfo 30s
}

// The Interceptor as the Limiter of go-grpc-middleware's rate-limit
// interceptors, in a chain built with that module, keyed by an API key.
// Those interceptors answer a refusal with a message of their own and no
// RetryInfo.
func ExampleInterceptor_Limit() {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute},
	}, ratelimit.WithClock(clock.NewMock()))
	if err != nil {
		panic(err)
	}
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(ratelimitgrpc.Metadata("x-api-key")))
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(mwratelimit.UnaryServerInterceptor(ic)),
		grpc.ChainStreamInterceptor(mwratelimit.StreamServerInterceptor(ic)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "k-42")
	for i := range 3 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		st := status.Convert(err)
		fmt.Printf("call %d: %v %q details %d\n", i+1, st.Code(), st.Message(), len(st.Details()))
	}
	// Output:
	// call 1: OK "" details 0
	// call 2: OK "" details 0
	// call 3: ResourceExhausted "/grpc.health.v1.Health/Check is rejected by grpc_ratelimit middleware, please retry later. rate limit exceeded: retry after 30s" details 0
}
