// Package httplimit puts named limits of a ratelimit.Limiter in front of a
// net/http handler.
//
//	mw, err := httplimit.New(lim, []string{"api"})
//	if err != nil { ... }
//	http.Handle("/api/", mw.Wrap(apiHandler))
//
// Each request is keyed by a function of the request (the client's IP by
// default), costs a number of tokens (1 by default), and is decided by the
// named limits all or nothing. A refused request gets 429 Too Many Requests
// with Retry-After; every response carries the RateLimit-Policy and
// RateLimit header fields of the IETF draft
// draft-ietf-httpapi-ratelimit-headers-10 (September 2025): a policy is a
// whole quota over whole seconds stating a limit's rate, and "t" the
// seconds until additional quota is made available (for a token bucket,
// its next token). See docs/http.md.
package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// KeyFunc returns the key a request is limited by. An error refuses the
// request through the error handler (400 for ErrNoKey by default).
type KeyFunc func(r *http.Request) (string, error)

// CostFunc returns the tokens a request costs.
type CostFunc func(r *http.Request) (float64, error)

// ErrNoKey is returned by a KeyFunc that finds no key in the request, such
// as a missing header.
var ErrNoKey = errors.New("httplimit: the request carries no key")

// Middleware limits the requests of the handlers it wraps. Build it with
// New; it is safe for concurrent use.
type Middleware struct {
	lim          *ratelimit.Limiter
	names        []string
	cfgs         []ratelimit.Config // the limits' configs, in the order of names
	quoted       []string           // the names as structured-field strings
	policy       string             // the RateLimit-Policy value
	key          KeyFunc
	cost         CostFunc
	denied       func(w http.ResponseWriter, r *http.Request, res ratelimit.Result)
	failed       func(w http.ResponseWriter, r *http.Request, err error)
	storeFailure func(r *http.Request, err error)
	headers      bool
}

// Option configures a Middleware in New.
type Option func(*Middleware)

// WithKey sets how a request's key is found (default: ClientIP with no
// options, the connection's peer address).
func WithKey(f KeyFunc) Option { return func(m *Middleware) { m.key = f } }

// WithCost sets how many tokens a request costs (default 1).
func WithCost(f CostFunc) Option { return func(m *Middleware) { m.cost = f } }

// WithDeniedHandler replaces the response to a refused request (by
// default 429 with Retry-After and a short text body). The RateLimit
// headers are already set when it runs.
func WithDeniedHandler(f func(w http.ResponseWriter, r *http.Request, res ratelimit.Result)) Option {
	return func(m *Middleware) { m.denied = f }
}

// WithErrorHandler replaces the response to a request that could not be
// decided: a KeyFunc or CostFunc error, or a bad count (by default 400 for
// ErrNoKey and ratelimit.ErrInvalidCount, 500 otherwise).
func WithErrorHandler(f func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(m *Middleware) { m.failed = f }
}

// OnStoreFailure sets a function told of every store failure (an error
// matching ratelimit.ErrStoreUnavailable), e.g. to log it. The request is
// still decided by the limits' failure policy.
func OnStoreFailure(f func(r *http.Request, err error)) Option {
	return func(m *Middleware) { m.storeFailure = f }
}

// WithoutHeaders stops the middleware from sending the RateLimit-Policy
// and RateLimit header fields (Retry-After is still sent on refusals).
func WithoutHeaders() Option { return func(m *Middleware) { m.headers = false } }

// New returns a middleware that decides every request by the named limits
// of lim, which must all be declared in ratelimit.New.
//
// Without WithCost a request costs one token, so New refuses a limit that
// can never grant one (a Capacity, or a Rate standing for it, below 1).
func New(lim *ratelimit.Limiter, names []string, opts ...Option) (*Middleware, error) {
	if lim == nil {
		return nil, fmt.Errorf("httplimit: New needs a *ratelimit.Limiter: %w", ErrInvalidOption)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("httplimit: New needs at least one limit name: %w", ErrInvalidOption)
	}
	m := &Middleware{lim: lim, names: append([]string(nil), names...), key: (&clientIP{v6bits: DefaultIPv6Prefix}).key, headers: true,
		denied: tooManyRequests, failed: badRequest}
	policy := make([]string, len(names))
	for i, n := range names {
		cfg, ok := lim.Config(n)
		if !ok {
			return nil, fmt.Errorf("httplimit: limit %q is not declared in the Limiter: declare it in ratelimit.New: %w", n, ratelimit.ErrUnknownLimit)
		}
		m.cfgs = append(m.cfgs, cfg)
		m.quoted = append(m.quoted, quote(n))
		policy[i] = policyItem(m.quoted[i], cfg)
	}
	m.policy = strings.Join(policy, ", ")
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("httplimit: New was given a nil option: %w", ErrInvalidOption)
		}
		o(m)
	}
	if m.key == nil || m.denied == nil || m.failed == nil {
		return nil, fmt.Errorf("httplimit: an option was given a nil function: %w", ErrInvalidOption)
	}
	if m.cost == nil {
		for i, cfg := range m.cfgs {
			if most := mostAtOnce(cfg); most < 1 {
				return nil, fmt.Errorf("httplimit: limit %q can never grant a request: a request costs 1 token and the limit grants at most %v at once: "+
					"set its Capacity to 1 or more, or give WithCost: %w", names[i], most, ratelimit.ErrInvalidConfig)
			}
		}
	}
	return m, nil
}

// mostAtOnce is the largest count one call of a limit may ask for: its
// capacity, or for a sharded limit the share of the two shards a call
// draws on.
func mostAtOnce(cfg ratelimit.Config) float64 {
	c := cfg.Capacity
	if c == 0 {
		c = cfg.Rate
	}
	if n := cfg.Shards; n > 1 {
		return 2 * c / float64(n)
	}
	return c
}

// Policy returns the RateLimit-Policy header value the middleware sends.
func (m *Middleware) Policy() string { return m.policy }

// Wrap returns next behind the limits.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := m.key(r)
		if err != nil {
			m.failed(w, r, err)
			return
		}
		cost := 1.0
		if m.cost != nil {
			if cost, err = m.cost(r); err != nil {
				m.failed(w, r, err)
				return
			}
		}
		var res ratelimit.Result
		if len(m.names) == 1 {
			res, err = m.lim.Limit(r.Context(), m.names[0], key, ratelimit.Count(cost))
		} else {
			res, err = m.lim.LimitAll(r.Context(), key, m.names, ratelimit.Count(cost))
		}
		switch {
		case errors.Is(err, ratelimit.ErrStoreUnavailable):
			if m.storeFailure != nil {
				m.storeFailure(r, err)
			}
			if !res.OK {
				// The limits fail closed: the service cannot decide, which
				// is its failure, not the client's excess.
				retryAfter(w, res.RetryAfter)
				http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
				return
			}
			next.ServeHTTP(w, r)
			return
		case err != nil:
			m.failed(w, r, err)
			return
		}
		if m.headers {
			m.setHeaders(w.Header(), res)
		}
		if !res.OK {
			m.denied(w, r, res)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func retryAfter(w http.ResponseWriter, d time.Duration) {
	if d > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(seconds(d), 10))
	}
}

func tooManyRequests(w http.ResponseWriter, _ *http.Request, res ratelimit.Result) {
	retryAfter(w, res.RetryAfter)
	http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
}

func badRequest(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.Is(err, ErrNoKey) || errors.Is(err, ratelimit.ErrInvalidCount) {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	http.Error(w, "rate limiter error", http.StatusInternalServerError)
}
