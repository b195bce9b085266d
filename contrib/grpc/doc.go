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
// ones wrote it into x-forwarded-for, and with TrustUnixSocket behind a
// proxy that connects through a Unix socket; Metadata by an API key,
// WithKey by any function of the call's context), costs one token, and is
// decided by the limits of its method, all or nothing: the default limits
// given to New, or those WithMethod names for a full method name. A
// stream is decided once, when it opens, unless WithStreamMessages
// decides each of its messages too.
//
// # Streams
//
// A stream decided at its open alone carries as many messages as its
// client sends: a limit of five calls a minute lets one bidirectional
// stream through with ten thousand messages. Where each message is the
// unit of work (a chat message, a record uploaded, a prompt), give
// WithStreamMessages, for every stream or for the named methods: the open
// is still decided as a call, and pays for the first message; each
// message after it costs one token of the same limits, by the same key,
// found once when the stream opens. A stream of n messages so costs what
// n unary calls do, and a stream opened and left idle still costs one.
// Server-streaming calls carry one message, and are unchanged.
//
// A refused message is dropped, and the handler's RecvMsg returns the
// status a unary call would get instead: ResourceExhausted with a
// RetryInfo detail, or, when the store is down and the limits fail
// closed, Unavailable (logged as the calls' refusals are, at most once a
// second); fail-open limits let it through. The handler decides: one that
// returns the error, as most do, ends the stream with that status, and
// the pushback trailer goes with it (trailers are sent only at a stream's
// end); one that goes on reading gets the next message the limits grant.
// A message is decided with the stream's context: once the client is gone
// or its deadline has passed, RecvMsg returns Canceled or
// DeadlineExceeded, and nothing is spent.
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
// The lines that come in floods (refusals for an unavailable store, calls
// whose deadline passed, internal errors) are logged at most once a second
// each, with the count of those not logged; see WithLogger.
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
// for chains built with that module. Those answer every refusal with
// ResourceExhausted and a message of their own, without RetryInfo; on a
// server, give them ic.ServerLimiter(), which adds the pushback trailer
// (ratelimit.UnaryServerInterceptor(ic.ServerLimiter())), and to the
// client interceptors the Interceptor itself. The interceptors of this
// package are richer.
package ratelimitgrpc
