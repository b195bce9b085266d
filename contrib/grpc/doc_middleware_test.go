package ratelimitgrpc_test

import (
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"google.golang.org/grpc"
)

// The go-grpc-middleware example of docs/integrations.md, whose ratelimit
// is that module's package (see doc_test.go).
func integrationsDocMiddleware(ic *ratelimitgrpc.Interceptor) *grpc.Server {
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(ic.ServerLimiter())),
		grpc.ChainStreamInterceptor(ratelimit.StreamServerInterceptor(ic.ServerLimiter())))
	return srv
}

var _ = integrationsDocMiddleware
