package ratelimitgrpc_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/ratelimit-go/ratelimit/internal/doctest"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The examples of docs/integrations.md that use this module, word for
// word, so that the compiler checks them (package doctest): each is the
// body of an integrationsDoc function, but its final return, here or in
// doc_middleware_test.go, whose ratelimit is go-grpc-middleware's.

func integrationsDocServer(lim *ratelimit.Limiter) (*grpc.Server, error) {
	ic, err := ratelimitgrpc.New(lim, []string{"api"},
		ratelimitgrpc.WithMethod("/grpc.health.v1.Health/Check"),         // not limited
		ratelimitgrpc.WithMethod("/shop.Orders/Create", "api", "orders")) // both, all or nothing
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
	return srv, nil
}

func integrationsDocTrustProxies(lim *ratelimit.Limiter) (*ratelimitgrpc.Interceptor, error) {
	key, err := ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor,
		netip.MustParsePrefix("10.0.0.0/16"),  // the gateways
		netip.MustParsePrefix("127.0.0.0/8"))) // the sidecar, on loopback: the service's peer
	if err != nil {
		return nil, err // errors.Is(err, ratelimitgrpc.ErrInvalidOption)
	}
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(key))
	if err != nil {
		return nil, err
	}
	return ic, nil
}

func integrationsDocUnixSocket() (ratelimitgrpc.KeyFunc, error) {
	key, err := ratelimitgrpc.ClientIP(
		ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor), // and the prefixes of proxies in front of it, if any
		ratelimitgrpc.TrustUnixSocket())
	if err != nil {
		return nil, err // errors.Is(err, ratelimitgrpc.ErrInvalidOption)
	}
	return key, nil
}

func integrationsDocStreamMessages(lim *ratelimit.Limiter) (*ratelimitgrpc.Interceptor, error) {
	ic, err := ratelimitgrpc.New(lim, []string{"api"},
		ratelimitgrpc.WithStreamMessages("/chat.Chat/Talk", "/records.Store/Upload")) // no names: every stream
	if err != nil {
		return nil, err
	}
	return ic, nil
}

func integrationsDocClient(ctx context.Context, target string, creds credentials.TransportCredentials, req *healthpb.HealthCheckRequest) error {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds),
		grpc.WithUnaryInterceptor(ratelimitgrpc.UnaryClientInterceptor()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	if _, err := client.Check(ctx, req, ratelimitgrpc.WaitRetry()); err != nil {
		return err // refused still (no time left to wait, or refused again after the wait), or failed
	}
	return nil
}

var _ = []any{integrationsDocServer, integrationsDocTrustProxies, integrationsDocUnixSocket, integrationsDocStreamMessages, integrationsDocClient}

// The gRPC blocks of docs/integrations.md are the integrationsDoc
// functions' bodies. They assigned err and read it never (New's, whose
// nil Interceptor the server's options then called; NewClient's), and
// the client's called a client they never made.
func TestIntegrationsDocExamples(t *testing.T) {
	require.Equal(t, doctest.Bodies(t, "integrationsDoc", "doc_test.go", "doc_middleware_test.go"),
		doctest.Blocks(t, filepath.Join("..", "..", "docs", "integrations.md"), doctest.IntegrationsSections["grpc"]...))
}
