// Package httplimit puts named limits of a ratelimit.Limiter in front of a
// net/http handler.
//
//	mw, err := httplimit.New(lim, []string{"api"})
//	if err != nil { ... }
//	http.Handle("/api/", mw.Wrap(apiHandler))
//
// Each request is keyed by a function of the request, costs a number of
// tokens (1 by default), and is decided by the named limits all or
// nothing. A refused request gets 429 Too Many Requests with Retry-After.
// ExemptPreflights lets CORS preflights through undecided, for a
// middleware in front of the CORS handler. See docs/http.md.
//
// # Keys
//
// The default key is the client's IP address, as ClientIP with no options
// finds it: the connection's peer, an IPv6 client by its /64 network
// (IPv6Prefix sets another). No header is read unless TrustProxies names both the header the
// deployment's proxies write and the addresses of those proxies:
//
//	key, err := httplimit.ClientIP(httplimit.TrustProxies(httplimit.XForwardedFor,
//		netip.MustParsePrefix("10.0.0.0/16"))) // the load balancers
//	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(key))
//
// The header is then read from the right, past the trusted proxies, so
// that what a client writes into it can never be taken for what the
// proxies appended. A proxy that connects through a Unix socket has no
// address: TrustUnixSocket trusts it, when asked, never by default.
// SingleIPHeader names a header of one address (X-Real-IP) for
// TrustProxies. Header and PathValue key by an API key or a tenant.
//
// # Headers
//
// Every decided response carries the RateLimit-Policy and RateLimit header
// fields of the IETF draft draft-ietf-httpapi-ratelimit-headers-10
// (September 2025). A limit's policy is a whole quota over a whole number
// of seconds stating its rate ("api";q=100;w=60; a Rate of 0.5 per second
// is q=1;w=2; a fixed window grants at most its Capacity per window). Its
// RateLimit item has r, the tokens left, and t, the seconds until
// additional quota is made available, that is until r grows by one: for a
// token bucket, the next whole token; for a fixed window, the next window,
// or the first whose grants add up to a whole token (no t when the bucket
// holds all the whole tokens it can). Retry-After speaks for the request:
// never before the t of a limit that refused it for want of its next whole
// token, it may come before the t of a limit that did not refuse it, or
// that refused a fractional cost it grants before a whole token.
// Middlewares in a chain (a router's, then a route's) add their items to
// those set further out, so that a response names every limit it passed.
//
// # Errors
//
// A request that cannot be decided (no key, a cost no limit can grant, a
// failing CostFunc, a deadline passed) is logged with the detail
// (WithLogger; keys are never logged in clear) and answered with a bare
// status: 400, 500 or 503 and its status text, never the error's words. A
// request whose client went away is logged at debug level and recorded as
// StatusClientClosedRequest. A store failure is decided by the limits'
// failure policy: a refusal gets 503 with Retry-After. WithErrorHandler
// replaces every one of these responses.
// WithProblemDetails answers in application/problem+json (RFC 9457), a
// refusal with the draft's quota-exceeded problem type.
package httplimit
