// Package ratelimitgrpc puts named limits of a ratelimit.Limiter in front
// of a gRPC server, and lets a client wait out a refusal.
//
//	ic, err := ratelimitgrpc.New(lim, []string{"api"},
//		ratelimitgrpc.WithMethod("/grpc.health.v1.Health/Check")) // not limited
//	if err != nil { ... }
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
//
// Each call is keyed (by default by its peer's IP address; ClientIP with
// TrustProxies by the client's address behind proxies, as the trusted
// ones wrote it into x-forwarded-for; Metadata by an API key, WithKey by
// any function of the call's context), costs one token, and is decided by
// the limits of its method, all or nothing: the default limits given to
// New, or those WithMethod names for a full method name. A stream is
// decided once, when it opens.
//
// # Refusals
//
// A refused call gets codes.ResourceExhausted with a google.rpc.RetryInfo
// detail carrying the delay after which the same call would succeed, and
// the delay in the trailer grpc-retry-pushback-ms, which gRPC's own retry
// policy follows. When the store fails, each limit's failure policy
// (Config.FailOpen) decides: a call whose limits fail open goes on, one
// whose limits fail closed gets codes.Unavailable with a RetryInfo of the
// breaker's cool-down. A call with no key gets codes.InvalidArgument; a
// call whose caller gave up while it was decided codes.Canceled or
// codes.DeadlineExceeded; any other error codes.Internal. No status
// message ever carries the key or
// an error's text (which may name limits, their configuration and
// internal addresses): the error is logged (WithLogger), the key never.
// Refusals for an unavailable store are logged at most once a second,
// with the count of those not logged.
//
// # Clients
//
// UnaryClientInterceptor waits out a refusal's RetryInfo and retries the
// call once, when the call asks with WaitRetry (or every call, with
// RetryAll), the delay is at most MaxWait, and the call's deadline leaves
// the time.
//
// # go-grpc-middleware
//
// An *Interceptor is also the Limiter of the rate-limit interceptors of
// github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit,
// for chains built with that module: ratelimit.UnaryServerInterceptor(ic).
// Those answer every refusal with ResourceExhausted and a message of their
// own, without RetryInfo; the interceptors of this package are richer.
package ratelimitgrpc
