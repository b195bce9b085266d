package httplimit

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
)

// KeyFunc returns the key a request is limited by. An error refuses the
// request through the error handler (400 for ErrNoKey by default).
//
// An empty key, with no error, is no key: the request is refused as for
// ErrNoKey (400 by default). A KeyFunc that reads a key the request may
// lack (a header, a value an authentication middleware put in the
// context) and returned "" for its absence put every request without it
// in one budget, which one client could spend for all of them. For one
// budget shared by every request, return a constant such as "all".
type KeyFunc func(r *http.Request) (string, error)

// CostFunc returns the tokens a request costs. Its error answers the
// request 500, or 400 if it wraps ratelimit.ErrInvalidCount: the request
// was malformed.
type CostFunc func(r *http.Request) (float64, error)

// ErrNoKey is returned by a KeyFunc that finds no key in the request, such
// as a missing header.
var ErrNoKey = errors.New("httplimit: the request carries no key")

// ErrFuncPanicked is matched (errors.Is) by the error of a request whose
// KeyFunc or CostFunc panicked, or returned an error whose Error or Unwrap
// panics (a nil pointer returned as an error, a typed nil). The middleware recovers such a panic, so
// that one request that trips a bug in a KeyFunc does not end the server
// (net/http recovers a handler's panic only for its connection, and an
// HTTP/2 server or another router may not at all): the request is answered
// through the error handler (500 by default) and logged at error level
// with the panic's value and stack. A panic of the wrapped handler is not
// the middleware's to recover, and goes on as it would without it.
var ErrFuncPanicked = errors.New("httplimit: the KeyFunc or CostFunc panicked, which is a bug in it: fix it to return an error")

// errEmptyKey is the error of a request whose KeyFunc returned an empty
// key and no error (see KeyFunc).
var errEmptyKey = fmt.Errorf("httplimit: the KeyFunc returned an empty key, which would put every such request in one budget: "+
	"return ErrNoKey for a request that carries no key, or a constant such as \"all\" for one budget shared by every request: %w", ErrNoKey)

// errNeverGranted marks the error of a request of the default cost that a
// limit can no longer grant: New refuses such a limit, but SetLimits may
// make one.
var errNeverGranted = errors.New("httplimit: a request costs 1 token, which a limit as now configured can never grant: " +
	"set its Capacity to 1 or more, or give WithCost")

// StatusClientClosedRequest is the status the default error handler
// records for a request whose client went away before it was decided
// (nginx's 499): nobody reads the response, and it is not a server error.
const StatusClientClosedRequest = 499

// Middleware limits the requests of the handlers it wraps. Build it with
// New; it is safe for concurrent use.
type Middleware struct {
	lim          *ratelimit.Limiter
	names        []string
	quoted       []string // the names as structured-field strings
	view         atomic.Pointer[view]
	key          KeyFunc
	cost         CostFunc
	denied       func(w http.ResponseWriter, r *http.Request, res ratelimit.Result)
	failed       func(w http.ResponseWriter, r *http.Request, err error)
	storeFailure func(r *http.Request, err error)
	logger       *slog.Logger // nil: slog.Default() at the time of logging
	headers      bool
	problem      bool
	preflights   bool   // ExemptPreflights
	keyMAC       []byte // a random secret: logs name a key by its HMAC, never in clear
	optErr       error  // the first option given nil, which New returns
}

// refuseNil records, for New to return, that the option named opt was
// given nil: a function or logger variable never set, which would
// otherwise be taken for the option left out (a cost of 1, the default
// logger) or panic at the first request.
func (m *Middleware) refuseNil(opt, what string) {
	if m.optErr == nil {
		m.optErr = fmt.Errorf("httplimit: %s was given a nil %s: pass one, or leave %s out: %w", opt, what, opt, ErrInvalidOption)
	}
}

// view is what the headers say of the limits: their configs, in the order
// of the middleware's names, and the RateLimit-Policy value made of them.
// It is rebuilt when the Limiter's configs change (SetLimits, SetLimit).
type view struct {
	cfgs   []ratelimit.Config
	items  []string // the RateLimit-Policy items, one a limit
	policy string
}

// current returns the view of the limits as the Limiter declares them
// now, rebuilding it if a config changed since it was made. A name the
// Limiter no longer declares keeps its last config: its calls fail with
// ErrUnknownLimit before any header is set.
func (m *Middleware) current() *view {
	v := m.view.Load()
	for i, n := range m.names {
		if cfg, ok := m.lim.Config(n); ok && cfg != v.cfgs[i] {
			return m.rebuild(v)
		}
	}
	return v
}

// rebuild makes and publishes the view of the limits' current configs,
// taking from old those the Limiter no longer declares.
func (m *Middleware) rebuild(old *view) *view {
	v := &view{cfgs: make([]ratelimit.Config, len(m.names)), items: make([]string, len(m.names))}
	policy := v.items
	for i, n := range m.names {
		cfg, ok := m.lim.Config(n)
		if !ok && old != nil {
			cfg = old.cfgs[i]
		}
		v.cfgs[i] = cfg
		policy[i] = policyItem(m.quoted[i], cfg)
	}
	v.policy = strings.Join(policy, ", ")
	m.view.Store(v)
	return v
}

// Option configures a Middleware in New.
type Option func(*Middleware)

// WithKey sets how a request's key is found (default: ClientIP with no
// options, the connection's peer address).
//
// A limit's records are named by the limit and the key alone: Middlewares
// (or other callers of the Limiter) that decide one limit by different
// KeyFuncs share its budget wherever their keys are equal, so that a
// client sending the header X-API-Key: 203.0.113.7 to one spends the
// budget of the client at 203.0.113.7 in another keyed by ClientIP. Give
// each KeyFunc a limit of its own, or prefix its keys (docs/http.md).
func WithKey(f KeyFunc) Option {
	return func(m *Middleware) {
		if f == nil {
			m.refuseNil("WithKey", "KeyFunc")
		}
		m.key = f
	}
}

// WithCost sets how many tokens a request costs (default 1). A nil f is
// refused by New, rather than taken for a cost of 1: a request meant to
// cost more would pass at the price of one.
func WithCost(f CostFunc) Option {
	return func(m *Middleware) {
		if f == nil {
			m.refuseNil("WithCost", "CostFunc")
		}
		m.cost = f
	}
}

// WithDeniedHandler replaces the response to a refused request (by
// default 429 with Retry-After and a short body). The RateLimit headers
// are already set when it runs.
func WithDeniedHandler(f func(w http.ResponseWriter, r *http.Request, res ratelimit.Result)) Option {
	return func(m *Middleware) {
		if f == nil {
			m.refuseNil("WithDeniedHandler", "function")
		}
		m.denied = f
	}
}

// WithErrorHandler replaces the response to a request that could not be
// decided: a KeyFunc or CostFunc error, a bad count, a request whose
// client went away or whose deadline passed, and a store failure that
// the limits' failure policy refuses (err matches
// ratelimit.ErrStoreUnavailable; Retry-After, the time until the store is
// asked again, is already set when f runs). The middleware has logged the
// error when f runs, but for a store failure, which the Limiter's logger
// and OnStoreFailure report; f writes the response, and must not send
// err's text to the client: it may name limits, their configuration and
// internal addresses.
func WithErrorHandler(f func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(m *Middleware) {
		if f == nil {
			m.refuseNil("WithErrorHandler", "function")
		}
		m.failed = f
	}
}

// WithLogger sets where the middleware logs the requests it could not
// decide (default: slog.Default()). Keys are never logged in clear: a log
// record names a key by key_id, an HMAC under a secret of the Middleware,
// the same for one key for the Middleware's life. To log nothing, give
// slog.New(slog.DiscardHandler). A nil l is refused by New: the
// Limiter's WithLogger(nil) logs nothing, and this one would have logged
// to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(m *Middleware) {
		if l == nil {
			m.refuseNil("WithLogger", "logger (for no logging, give slog.New(slog.DiscardHandler))")
		}
		m.logger = l
	}
}

// WithProblemDetails makes the responses the middleware writes itself
// application/problem+json (RFC 9457): a refused request gets 429 with the
// problem type quota-exceeded of draft-ietf-httpapi-ratelimit-headers-10
// and the names of the limits that refused it in "violated-policies";
// other errors get "about:blank" with their status. Retry-After is sent as
// without it.
func WithProblemDetails() Option { return func(m *Middleware) { m.problem = true } }

// OnStoreFailure sets a function told of every store failure (an error
// matching ratelimit.ErrStoreUnavailable), e.g. to log it. The request is
// still decided by the limits' failure policy: it reaches the handler if
// they fail open, and is answered by the error handler (503 by default,
// see WithErrorHandler) if they fail closed. A nil f is refused by New.
func OnStoreFailure(f func(r *http.Request, err error)) Option {
	return func(m *Middleware) {
		if f == nil {
			m.refuseNil("OnStoreFailure", "function")
		}
		m.storeFailure = f
	}
}

// WithoutHeaders stops the middleware from sending the RateLimit-Policy
// and RateLimit header fields (Retry-After is still sent on refusals).
func WithoutHeaders() Option { return func(m *Middleware) { m.headers = false } }

// ExemptPreflights lets CORS preflight requests through to the wrapped
// handler undecided: no key is looked for, no token spent, no RateLimit
// header field set. A preflight is an OPTIONS request with the header
// fields Origin and Access-Control-Request-Method, which a browser sends
// before a cross-origin request that is not simple (a POST of JSON, a
// request with an X-API-Key), and without the request's credentials.
// Without this option a preflight is decided as any request: keyed by
// Header it has no key and gets 400, keyed by address it spends a token
// of the budget meant for the request it asks about, and either answer,
// without the Access-Control-Allow-* fields, fails that request in the
// browser as a CORS error.
//
// Anyone can send a request shaped as a preflight, as often as they like:
// the wrapped handler must answer preflights at once, doing none of the
// work the limits protect, as a CORS handler (github.com/rs/cors and the
// like) does. Better still, put the CORS handler outside the middleware:
// it answers preflights before they reach it, and adds its
// Access-Control-Allow-Origin to the middleware's refusals, which the
// browser then lets the page read. The option is for where the middleware
// must come first (docs/http.md, "CORS preflights").
func ExemptPreflights() Option { return func(m *Middleware) { m.preflights = true } }

// isPreflight reports whether r is a CORS preflight request: OPTIONS, with
// Origin and Access-Control-Request-Method.
func isPreflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != ""
}

// New returns a middleware that decides every request by the named limits
// of lim, which must all be declared in ratelimit.New, each named once,
// none by the empty name (which ratelimit.New takes, and which tells a
// client nothing).
// The header fields and problem details name a limit as a structured-field
// string can, with "_" for each character outside printable ASCII: New
// refuses names that would read alike there (café and cafè), unless
// WithoutHeaders is given without WithProblemDetails.
//
// Without WithCost a request costs one token, so New refuses a limit that
// can never grant one (a Capacity, or a Rate standing for it, below 1); a
// limit changed so later (SetLimits) answers every request 500.
func New(lim *ratelimit.Limiter, names []string, opts ...Option) (*Middleware, error) {
	if lim == nil {
		return nil, fmt.Errorf("httplimit: New needs a *ratelimit.Limiter: %w", ErrInvalidOption)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("httplimit: New needs at least one limit name: %w", ErrInvalidOption)
	}
	m := &Middleware{lim: lim, names: append([]string(nil), names...), key: bareClientIP(),
		headers: true, keyMAC: make([]byte, 32)}
	m.denied = m.tooManyRequests
	m.failed = m.writeError
	rand.Read(m.keyMAC) // never fails (crypto/rand)
	for i, n := range names {
		if n == "" {
			// ratelimit.New takes it, but it names nothing a client could
			// tell apart, and is most likely a variable never set.
			return nil, fmt.Errorf("httplimit: New was given an empty limit name (name %d): name each limit as it is declared in ratelimit.New, "+
				"by a name the RateLimit header fields and problem details can show a client: %w", i+1, ErrInvalidOption)
		}
		if _, ok := lim.Config(n); !ok {
			return nil, fmt.Errorf("httplimit: limit %q is not declared in the Limiter: declare it in ratelimit.New: %w", n, ratelimit.ErrUnknownLimit)
		}
		if slices.Contains(names[:i], n) {
			return nil, fmt.Errorf("httplimit: New was given the limit %q twice: name each limit once: %w", n, ErrInvalidOption)
		}
		m.quoted = append(m.quoted, quote(n))
	}
	v := m.rebuild(nil)
	for k, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("httplimit: New was given a nil Option (option %d): leave it out, or pass the option it was meant to be: %w", k+1, ErrInvalidOption)
		}
		o(m)
	}
	if m.optErr != nil {
		return nil, m.optErr
	}
	if err := keyError(m.key); err != nil {
		return nil, err
	}
	if m.headers || m.problem {
		// The fields and problem details name the limits as a
		// structured-field string can: names that read alike there leave
		// the client unable to tell whose numbers are whose.
		for i, q := range m.quoted {
			if j := slices.Index(m.quoted[:i], q); j >= 0 {
				return nil, fmt.Errorf("httplimit: limits %q and %q are both named %s in the RateLimit header fields and problem details, "+
					"which carry printable ASCII only: rename one (or, if no client is to see the names, give WithoutHeaders and not WithProblemDetails): %w", names[j], names[i], q, ErrInvalidOption)
			}
		}
	}
	if m.cost == nil {
		for i, cfg := range v.cfgs {
			if most := mostAtOnce(cfg); most < 1 {
				return nil, fmt.Errorf("httplimit: limit %q can never grant a request: a request costs 1 token and the limit grants at most %s at once: "+
					"set its Capacity to 1 or more, or give WithCost: %w", names[i], numtext.Format(most), ratelimit.ErrInvalidConfig)
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

// Policy returns the RateLimit-Policy header value the middleware sends,
// for the limits' configs as the Limiter declares them now.
func (m *Middleware) Policy() string { return m.current().policy }

// Wrap returns next behind the limits.
//
// A nil next (or a nil http.HandlerFunc) is a programming error that no
// request could be served by: Wrap panics at once, with an error matching
// ErrInvalidOption, as http.ServeMux.Handle does for a nil handler,
// rather than return a handler that panics at the first request. So does
// Wrap of a Middleware New did not make: nil (New's, when it failed and
// its error went unchecked) or the zero Middleware.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	if m == nil || m.lim == nil {
		panic(fmt.Errorf("httplimit: Wrap was called on a Middleware that New did not make (nil, or its zero value): build it with New, and check New's error: %w", ErrInvalidOption))
	}
	if f, ok := next.(http.HandlerFunc); next == nil || ok && f == nil {
		panic(fmt.Errorf("httplimit: Wrap was given a nil handler: give it the handler the limits protect: %w", ErrInvalidOption))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.preflights && isPreflight(r) {
			next.ServeHTTP(w, r)
			return
		}
		key, err := m.keyOf(r)
		if err != nil {
			m.fail(w, r, "", err)
			return
		}
		cost := 1.0
		if m.cost != nil {
			if cost, err = m.costOf(r); err != nil {
				m.fail(w, r, key, err)
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
				// is its failure, not the client's excess (503 by default).
				// The Limiter's logger and OnStoreFailure report it: it is
				// not logged again here, once a request while it lasts.
				retryAfter(w, res.RetryAfter)
				m.failed(w, r, err)
				return
			}
			next.ServeHTTP(w, r)
			return
		case err != nil:
			if m.cost == nil && errors.Is(err, ratelimit.ErrInvalidCount) {
				// The cost is the middleware's own 1: a limit changed since
				// New (SetLimits) to grant less, which is not the client's
				// fault.
				err = fmt.Errorf("%w: %w", errNeverGranted, err)
			}
			m.fail(w, r, key, err)
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

// keyOf returns the key of r by the KeyFunc, with a panic of it, or of
// its error's methods (see readError), as an error matching
// ErrFuncPanicked, and an empty key as errEmptyKey.
func (m *Middleware) keyOf(r *http.Request) (key string, err error) {
	fn := "KeyFunc"
	defer func() {
		if p := recover(); p != nil {
			err = panicked(fn, p)
		}
	}()
	if key, err = m.key(r); err == nil && key == "" {
		err = errEmptyKey
	}
	fn = "the KeyFunc's error (a nil pointer returned as an error?)"
	readError(r, err)
	return key, err
}

// costOf returns the cost of r by the CostFunc, with a panic of it, or of
// its error's methods (see readError), as an error matching
// ErrFuncPanicked.
func (m *Middleware) costOf(r *http.Request) (cost float64, err error) {
	fn := "CostFunc"
	defer func() {
		if p := recover(); p != nil {
			err = panicked(fn, p)
		}
	}()
	cost, err = m.cost(r)
	fn = "the CostFunc's error (a nil pointer returned as an error?)"
	readError(r, err)
	return cost, err
}

// readError reads err, if any, as fail does: its text, and its chain
// (Unwrap, Is) for its status. An error whose methods panic (a typed nil:
// a *T that is nil returned as an error) panics here, in the recovery of
// the call of the function that returned it, rather than as the request
// is logged, where net/http dropped the connection with no answer and no
// record.
func readError(r *http.Request, err error) {
	if err != nil {
		_ = err.Error()
		errorStatus(r, err)
	}
}

// panicked is the error of a function of the middleware's options that
// panicked with p: its value and the stack, for the log. The panic
// http.ErrAbortHandler, which aborts the response on purpose, goes on.
func panicked(fn string, p any) error {
	if p == http.ErrAbortHandler {
		panic(p)
	}
	return fmt.Errorf("%w: %s panicked: %v\n%s", ErrFuncPanicked, fn, p, debug.Stack())
}

// fail logs a request that could not be decided, then lets the error
// handler answer it.
func (m *Middleware) fail(w http.ResponseWriter, r *http.Request, key string, err error) {
	status, level := errorStatus(r, err)
	logger := m.logger
	if logger == nil {
		logger = slog.Default()
	}
	ctx := context.WithoutCancel(r.Context())
	if logger.Enabled(ctx, level) {
		attrs := []slog.Attr{slog.Int("status", status), slog.String("error", err.Error()), slog.String("method", r.Method)}
		if r.Pattern != "" {
			attrs = append(attrs, slog.String("pattern", r.Pattern)) // the route, not the path: a path may hold the key
		}
		if key != "" {
			attrs = append(attrs, slog.String("key_id", m.keyID(key)))
		}
		logger.LogAttrs(ctx, level, "httplimit: request not decided", attrs...)
	}
	m.failed(w, r, err)
}

// keyID names a key in logs without revealing it.
func (m *Middleware) keyID(key string) string {
	h := hmac.New(sha256.New, m.keyMAC)
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// errorStatus is the status the default error handler answers err with,
// and the level the middleware logs it at:
//
//   - the request's client went away (its context canceled):
//     StatusClientClosedRequest, debug;
//   - a store failure the limits' failure policy refuses
//     (ratelimit.ErrStoreUnavailable): 503, warn (not logged by the
//     middleware: see Wrap);
//   - the request's deadline passed: 503, warn;
//   - ErrNoKey: 400, debug (routine: a request without its API key), an
//     empty key included;
//   - a request of the default cost that a limit, changed since New, can
//     never grant: 500, error (the configuration's fault);
//   - ratelimit.ErrInvalidCount (a cost of WithCost no limit can grant,
//     or a CostFunc's error that wraps it): 400, info;
//   - anything else (a failing CostFunc or KeyFunc, one that panicked or
//     whose error's methods panic (ErrFuncPanicked), a bug): 500, error.
func errorStatus(r *http.Request, err error) (int, slog.Level) {
	switch ctxErr := r.Context().Err(); {
	case errors.Is(err, ratelimit.ErrStoreUnavailable):
		return http.StatusServiceUnavailable, slog.LevelWarn
	case ctxErr != nil && errors.Is(err, context.Canceled):
		return StatusClientClosedRequest, slog.LevelDebug
	case ctxErr != nil && errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, slog.LevelWarn
	case errors.Is(err, ErrNoKey):
		return http.StatusBadRequest, slog.LevelDebug
	case errors.Is(err, errNeverGranted):
		return http.StatusInternalServerError, slog.LevelError
	case errors.Is(err, ratelimit.ErrInvalidCount):
		return http.StatusBadRequest, slog.LevelInfo
	}
	return http.StatusInternalServerError, slog.LevelError
}

// writeError is the default error handler: a status and its generic text,
// never the error's own words.
func (m *Middleware) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, _ := errorStatus(r, err)
	if status == StatusClientClosedRequest {
		w.WriteHeader(status) // for access logs and metrics; nobody reads it
		return
	}
	m.writeStatus(w, status)
}

// writeStatus answers with status and its text, or its problem details.
func (m *Middleware) writeStatus(w http.ResponseWriter, status int) {
	if m.problem {
		writeProblem(w, problem{Type: "about:blank", Title: http.StatusText(status), Status: status})
		return
	}
	http.Error(w, http.StatusText(status), status)
}

// MaxRetryAfter is the longest Retry-After the middleware sends, in its
// responses and in the problem details' words: 2,147,483,647 seconds, about
// 68 years, the most a parser of 32-bit integers reads (Java's
// Integer.parseInt, and many HTTP clients). A longer wait (a limit that
// refills one token in centuries; up to about 292 years) is sent as
// MaxRetryAfter: a client that read a larger number as an error might
// retry at once.
const MaxRetryAfter = math.MaxInt32 * time.Second

func retryAfter(w http.ResponseWriter, d time.Duration) {
	if d > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(d), 10))
	}
}

// retryAfterSeconds is the Retry-After of a wait of d: its whole seconds,
// rounded up, at most MaxRetryAfter's.
func retryAfterSeconds(d time.Duration) int64 {
	return seconds(min(d, MaxRetryAfter))
}

// tooManyRequests is the default response to a refused request.
func (m *Middleware) tooManyRequests(w http.ResponseWriter, _ *http.Request, res ratelimit.Result) {
	retryAfter(w, res.RetryAfter)
	if !m.problem {
		http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
		return
	}
	writeProblem(w, quotaExceeded(res))
}
