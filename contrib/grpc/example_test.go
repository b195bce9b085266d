package ratelimitgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/netip"
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
	"google.golang.org/grpc/peer"
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
// RetryInfo; on a server, ServerLimiter adds the pushback trailer.
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

// ServerLimiter, for go-grpc-middleware's server interceptors: a refused
// call carries its delay in the pushback trailer, which gRPC's retry policy
// waits out, where the Interceptor's Limit sends none.
func ExampleInterceptor_ServerLimiter() {
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
		grpc.ChainUnaryInterceptor(mwratelimit.UnaryServerInterceptor(ic.ServerLimiter())),
		grpc.ChainStreamInterceptor(mwratelimit.StreamServerInterceptor(ic.ServerLimiter())),
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
		var trailer metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		fmt.Printf("call %d: %v pushback %v\n", i+1, status.Code(err), trailer.Get(ratelimitgrpc.PushbackTrailer))
	}
	// Output:
	// call 1: OK pushback []
	// call 2: OK pushback []
	// call 3: ResourceExhausted pushback [30000]
}

// A service behind Envoy, whose address (here 127.0.0.1, where the client
// of the example calls from) is the only one trusted: Envoy appends the
// address it received each call from, 203.0.113.7, to the x-forwarded-for
// the client sent, which the client makes up anew for every call. The
// client is keyed by what Envoy appended, and its third call is refused.
func ExampleClientIP() {
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
	key, err := ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor,
		netip.MustParsePrefix("127.0.0.1/32"))) // Envoy's address
	if err != nil {
		panic(err)
	}
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(key))
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

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for i := range 3 {
		forged := fmt.Sprintf("198.51.100.%d", i+1)
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-forwarded-for", forged+", 203.0.113.7")
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		fmt.Printf("call %d, forged %s: %v\n", i+1, forged, status.Code(err))
	}
	st, err := lim.Value(context.Background(), "api", "203.0.113.7")
	if err != nil {
		panic(err)
	}
	fmt.Println("203.0.113.7 remaining:", st.Remaining)
	// Output:
	// call 1, forged 198.51.100.1: OK
	// call 2, forged 198.51.100.2: OK
	// call 3, forged 198.51.100.3: ResourceExhausted
	// 203.0.113.7 remaining: 0
}

// The key ClientIP finds behind load balancers at 10.0.0.0/16 that append
// to x-forwarded-for: the first address, from the right, that is not a
// load balancer's; what a client wrote left of it is never read, and
// neither is anything a peer that is not a load balancer sends.
func ExampleTrustProxies() {
	key, err := ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor,
		netip.MustParsePrefix("10.0.0.0/16")))
	if err != nil {
		panic(err)
	}
	call := func(from, xff string) context.Context {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(from))})
		return metadata.NewIncomingContext(ctx, metadata.Pairs("x-forwarded-for", xff))
	}
	for _, c := range []struct{ from, xff string }{
		{"10.0.0.2:5000", "203.0.113.7"},
		{"10.0.0.2:5000", "1.1.1.1, 203.0.113.7"},                  // 1.1.1.1 is the client's own
		{"10.0.0.2:5000", "1.1.1.1, 203.0.113.7, 10.0.0.3"},        // two load balancers
		{"10.0.0.2:5000", "2001:db8:1:2::7"},                       // an IPv6 client, by its /64
		{"198.51.100.4:5000", "203.0.113.7"},                       // not a load balancer
		{"10.0.0.2:5000", "203.0.113.7, not-an-address, 10.0.0.3"}, // the walk stops at 10.0.0.3
	} {
		k, err := key(call(c.from, c.xff))
		if err != nil {
			panic(err)
		}
		fmt.Printf("%-17s %-38s -> %s\n", c.from, c.xff, k)
	}
	_, err = ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, netip.MustParsePrefix("0.0.0.0/0")))
	fmt.Println(err)
	// Output:
	// 10.0.0.2:5000     203.0.113.7                            -> 203.0.113.7
	// 10.0.0.2:5000     1.1.1.1, 203.0.113.7                   -> 203.0.113.7
	// 10.0.0.2:5000     1.1.1.1, 203.0.113.7, 10.0.0.3         -> 203.0.113.7
	// 10.0.0.2:5000     2001:db8:1:2::7                        -> 2001:db8:1:2::/64
	// 198.51.100.4:5000 203.0.113.7                            -> 198.51.100.4
	// 10.0.0.2:5000     203.0.113.7, not-an-address, 10.0.0.3  -> 10.0.0.3
	// ratelimitgrpc: TrustProxies: prefix 0.0.0.0/0 trusts every address, which lets any client choose its key: list only your proxies: ratelimitgrpc: invalid option
}
