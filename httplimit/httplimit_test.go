package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func limiter(t testing.TB, limits ratelimit.Limits, store ratelimit.Store) (*ratelimit.Limiter, *clock.Mock) {
	mock := clock.NewMock()
	mock.Set(t0)
	if store == nil {
		store = must(memstore.New())
	}
	lim, err := ratelimit.New(store, limits, ratelimit.WithClock(mock), ratelimit.WithBreaker(0, 0))
	require.NoError(t, err)
	return lim, mock
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })

func serve(h http.Handler, remote string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestAllowThenRefuse(t *testing.T) {
	lim, mock := limiter(t, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute, Start: t0},
	}, nil)
	mw, err := httplimit.New(lim, []string{"api"})
	require.NoError(t, err)
	h := mw.Wrap(ok)
	mock.Add(20*time.Second + 500*time.Millisecond)

	w := serve(h, "192.0.2.1:5555")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, `"api";q=2;w=60`, w.Header().Get("RateLimit-Policy"))
	require.Equal(t, `"api";r=1;t=40`, w.Header().Get("RateLimit"), "39.5 s to the next window, rounded up")
	w = serve(h, "192.0.2.1:5556")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, `"api";r=0;t=40`, w.Header().Get("RateLimit"))

	w = serve(h, "192.0.2.1:5557")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "40", w.Header().Get("Retry-After"), "whole seconds, rounded up")
	require.Equal(t, `"api";r=0;t=40`, w.Header().Get("RateLimit"))
	require.Equal(t, `"api";q=2;w=60`, w.Header().Get("RateLimit-Policy"))

	// Another client has its own key.
	require.Equal(t, http.StatusOK, serve(h, "192.0.2.2:5555").Code)
	// The next window grants again.
	mock.Add(40 * time.Second)
	require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:5555").Code)
}

func TestRetryAfterRoundsUp(t *testing.T) {
	lim, mock := limiter(t, ratelimit.Limits{
		"tb": {Kind: ratelimit.TokenBucket, Rate: 1, Period: 1500 * time.Millisecond},
	}, nil)
	mw, err := httplimit.New(lim, []string{"tb"})
	require.NoError(t, err)
	h := mw.Wrap(ok)
	require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:1").Code)
	mock.Add(1400 * time.Millisecond)
	w := serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "1", w.Header().Get("Retry-After"), "100 ms left: never 0")
}

func TestHeaderAndPathKeysAndCost(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour}}, nil)
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.Header("X-API-Key")),
		httplimit.WithCost(func(r *http.Request) (float64, error) {
			if c := r.URL.Query().Get("cost"); c != "" {
				return strconv.ParseFloat(c, 64)
			}
			return 1, nil
		}))
	require.NoError(t, err)
	h := mw.Wrap(ok)
	do := func(target, apiKey string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", target, nil)
		if apiKey != "" {
			r.Header.Set("X-API-Key", apiKey)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	require.Equal(t, http.StatusBadRequest, do("/", "").Code, "no key")
	w := do("/?cost=7", "k1")
	require.Equal(t, http.StatusOK, w.Code)
	require.Contains(t, w.Header().Get("RateLimit"), "r=3")
	require.Equal(t, http.StatusTooManyRequests, do("/?cost=4", "k1").Code)
	require.Equal(t, http.StatusOK, do("/?cost=4", "k2").Code)
	require.Equal(t, http.StatusBadRequest, do("/?cost=-1", "k2").Code, "a negative cost is bad input")
	require.Equal(t, http.StatusBadRequest, do("/?cost=11", "k2").Code, "a cost above capacity can never be granted")
	require.Equal(t, http.StatusInternalServerError, do("/?cost=x", "k2").Code, "a failing cost function")

	// Path values: through a ServeMux pattern.
	pm, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.PathValue("tenant")))
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/t/{tenant}/", pm.Wrap(ok))
	for i := range 11 {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", "/t/acme/x", nil))
		want := http.StatusOK
		if i == 10 {
			want = http.StatusTooManyRequests
		}
		require.Equal(t, want, w.Code, "request %d", i)
	}
}

// A header sent twice names no key: a proxy that adds its line to the
// client's, rather than replace it, puts the client's first, and keyed by
// it a client chose a fresh budget with every request, while the proxy's
// value was never read.
func TestHeaderKeyRepeatedIsNoKey(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Hour}}, nil)
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.Header("X-Tenant")))
	require.NoError(t, err)
	h := mw.Wrap(ok)
	passed := 0
	for i := range 10 {
		w := serve(h, "192.0.2.1:1", "X-Tenant", fmt.Sprintf("forged-%d", i), "X-Tenant", "acme")
		if w.Code == http.StatusOK {
			passed++
		}
		require.Contains(t, []int{http.StatusOK, http.StatusBadRequest}, w.Code)
	}
	require.Zero(t, passed, "requests keyed by a value the client chose")

	key := httplimit.Header("X-Tenant")
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Add("X-Tenant", "acme")
	r.Header.Add("X-Tenant", "acme")
	_, err = key(r)
	require.ErrorIs(t, err, httplimit.ErrNoKey, "two lines, even alike")
	r.Header.Set("X-Tenant", "acme")
	got, err := key(r)
	require.NoError(t, err)
	require.Equal(t, "acme", got)
}

func TestSeveralLimitsAllOrNothing(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"perHour":   {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Hour, Start: t0},
		"perMinute": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute, Start: t0},
	}, nil)
	mw, err := httplimit.New(lim, []string{"perHour", "perMinute"})
	require.NoError(t, err)
	h := mw.Wrap(ok)
	require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:1").Code)
	w := serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, `"perHour";q=5;w=3600, "perMinute";q=2;w=60`, w.Header().Get("RateLimit-Policy"))
	require.Equal(t, `"perHour";r=3;t=3600, "perMinute";r=0;t=60`, w.Header().Get("RateLimit"))
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "60", w.Header().Get("Retry-After"))
	// The hour was not charged by the refused request.
	require.Equal(t, `"perHour";r=3;t=3600, "perMinute";r=0;t=60`, w.Header().Get("RateLimit"))
}

// downStore fails every call, as an unreachable server would.
type downStore struct{}

var errDown = errors.New("connection refused")

func (downStore) Apply(context.Context, *driver.Op, []driver.Decision) error { return errDown }
func (downStore) Load(context.Context, []driver.RecordID, []driver.Record) error {
	return errDown
}
func (downStore) Delete(context.Context, []driver.RecordID) error { return errDown }

func TestStoreFailureFollowsPolicy(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"open":   {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute, FailOpen: true},
		"closed": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute},
	}, downStore{})
	var seen []error
	for _, name := range []string{"open", "closed"} {
		mw, err := httplimit.New(lim, []string{name}, httplimit.OnStoreFailure(func(_ *http.Request, err error) { seen = append(seen, err) }))
		require.NoError(t, err)
		w := serve(mw.Wrap(ok), "192.0.2.1:1")
		if name == "open" {
			require.Equal(t, http.StatusOK, w.Code)
		} else {
			require.Equal(t, http.StatusServiceUnavailable, w.Code)
		}
	}
	require.Len(t, seen, 2)
	for _, err := range seen {
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		require.ErrorIs(t, err, errDown)
	}
}

// A store failure that the limits' policy refuses is a request the
// middleware could not decide: the error handler answers it, as it does
// the others, with Retry-After already set; it was a fixed 503 no option
// could change.
func TestErrorHandlerAnswersStoreFailures(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"open":   {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute, FailOpen: true},
		"closed": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute},
	}, downStore{})
	var handled []error
	custom := httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
		handled = append(handled, err)
		w.Header().Set("Cache-Control", "no-store")
		http.Error(w, "try again shortly", http.StatusServiceUnavailable)
	})
	mw, err := httplimit.New(lim, []string{"closed"}, custom)
	require.NoError(t, err)
	w := serve(mw.Wrap(ok), "192.0.2.1:1")
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Equal(t, "try again shortly\n", w.Body.String())
	require.Equal(t, "no-store", w.Header().Get("Cache-Control"))
	require.Equal(t, "1", w.Header().Get("Retry-After"), "no breaker: the next request asks the store again")
	require.Len(t, handled, 1)
	require.ErrorIs(t, handled[0], ratelimit.ErrStoreUnavailable)
	require.ErrorIs(t, handled[0], errDown)

	// A limit that fails open lets the request through: nothing to answer.
	mw, err = httplimit.New(lim, []string{"open"}, custom)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, serve(mw.Wrap(ok), "192.0.2.1:1").Code)
	require.Len(t, handled, 1)

	// The default answers 503, Retry-After set, in problem details too.
	for _, opts := range [][]httplimit.Option{nil, {httplimit.WithProblemDetails()}} {
		mw, err = httplimit.New(lim, []string{"closed"}, opts...)
		require.NoError(t, err)
		w = serve(mw.Wrap(ok), "192.0.2.1:1")
		require.Equal(t, http.StatusServiceUnavailable, w.Code)
		require.NotEmpty(t, w.Header().Get("Retry-After"))
		require.Contains(t, w.Body.String(), "Service Unavailable")
	}
}

func TestCustomResponsesAndNoHeaders(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}}, nil)
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithoutHeaders(),
		httplimit.WithDeniedHandler(func(w http.ResponseWriter, _ *http.Request, res ratelimit.Result) {
			w.WriteHeader(http.StatusTeapot)
			io.WriteString(w, res.Name)
		}))
	require.NoError(t, err)
	h := mw.Wrap(ok)
	w := serve(h, "192.0.2.1:1")
	require.Empty(t, w.Header().Get("RateLimit"))
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusTeapot, w.Code)
	require.Equal(t, "api", w.Body.String())

	_, err = httplimit.New(nil, []string{"api"})
	require.ErrorIs(t, err, httplimit.ErrInvalidOption)
	_, err = httplimit.New(lim, nil)
	require.ErrorIs(t, err, httplimit.ErrInvalidOption)
	_, err = httplimit.New(lim, []string{"nope"})
	require.ErrorIs(t, err, ratelimit.ErrUnknownLimit)
	_, err = httplimit.New(lim, []string{"api"}, httplimit.WithKey(nil))
	require.ErrorIs(t, err, httplimit.ErrInvalidOption)
	_, err = httplimit.New(lim, []string{"api"}, httplimit.WithoutHeaders(), nil)
	require.ErrorIs(t, err, httplimit.ErrInvalidOption)
	require.ErrorContains(t, err, "nil Option (option 2)", "the place of the nil option, as ratelimit.New names it")
}

// TestRealServer runs the middleware in a real http.Server on loopback.
func TestRealServer(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Minute, Start: t0}}, nil)
	mw, err := httplimit.New(lim, []string{"api"})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: mw.Wrap(ok), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String() + "/"
	var codes []int
	for range 5 {
		req, err := http.NewRequest("GET", url, nil)
		require.NoError(t, err)
		req.Header.Set("X-Forwarded-For", "198.51.100.1") // ignored: no trusted proxy
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests {
			require.Equal(t, "60", resp.Header.Get("Retry-After"))
		}
		require.NotEmpty(t, resp.Header.Get("RateLimit"))
	}
	require.Equal(t, []int{200, 200, 200, 429, 429}, codes)
}

// Issue 16: a fractional rate was announced as q=0;w=1.
func TestPolicyStatesFractionalRates(t *testing.T) {
	tests := []struct {
		cfg  ratelimit.Config
		want string
	}{
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 0.5, Period: time.Second, Capacity: 1}, `"l";q=1;w=2`},
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 0.5, Period: time.Second, Capacity: 1}, `"l";q=1;w=2`},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: 100 * time.Millisecond}, `"l";q=10;w=1`},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1500 * time.Millisecond}, `"l";q=2;w=3`},
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 2.5, Period: time.Minute}, `"l";q=5;w=120`},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1.0 / 3, Period: time.Second, Capacity: 1}, `"l";q=1;w=3`},
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour}, `"l";q=100;w=3600`},
	}
	for _, tt := range tests {
		lim, _ := limiter(t, ratelimit.Limits{"l": tt.cfg}, nil)
		mw, err := httplimit.New(lim, []string{"l"})
		require.NoError(t, err)
		require.Equal(t, tt.want, mw.Policy(), "%+v", tt.cfg)
	}
}

// A limit no request of cost 1 can pass is refused at New, instead of
// answering every request with an error. (ratelimit.New already refuses
// such a limit when its Capacity is left to a Rate below 1; set
// explicitly, a capacity below 1 serves fractional counts.)
func TestNewRefusesALimitNoRequestCanPass(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"half":    {Kind: ratelimit.TokenBucket, Rate: 0.5, Capacity: 0.5, Period: time.Second},
		"sharded": {Kind: ratelimit.FixedWindow, Rate: 3, Capacity: 3, Period: time.Second, Shards: 8},
	}, nil)
	for _, name := range []string{"half", "sharded"} {
		_, err := httplimit.New(lim, []string{name})
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
		require.ErrorContains(t, err, "set its Capacity to 1 or more, or give WithCost")
	}
	_, err := httplimit.New(lim, []string{"half"}, httplimit.WithCost(func(*http.Request) (float64, error) { return 0.5, nil }))
	require.NoError(t, err, "a cost function says what a request costs")
}

// Issue 16: the t of a token bucket was the time until full; the draft's
// t is the time until additional quota is made available.
func TestTokenBucketResetIsTheNextToken(t *testing.T) {
	lim, mock := limiter(t, ratelimit.Limits{
		"tb":   {Kind: ratelimit.TokenBucket, Rate: 10, Period: 10 * time.Second},
		"slow": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute, Capacity: 5},
	}, nil)
	cost := 1.0
	tb, err := httplimit.New(lim, []string{"tb"}, httplimit.WithCost(func(*http.Request) (float64, error) { return cost, nil }))
	require.NoError(t, err)
	h := tb.Wrap(ok)
	var w *httptest.ResponseRecorder
	for range 5 {
		w = serve(h, "192.0.2.1:1")
	}
	require.Equal(t, `"tb";r=5;t=1`, w.Header().Get("RateLimit"), "one token a second; full in 5")
	mock.Add(1500 * time.Millisecond) // 6.5 tokens
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, `"tb";r=5;t=1`, w.Header().Get("RateLimit"), "5.5 left: the 6th in 0.5 s, rounded up")
	cost = 0
	mock.Add(time.Minute)
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, `"tb";r=10`, w.Header().Get("RateLimit"), "a full bucket makes no more quota: no t")

	slow, err := httplimit.New(lim, []string{"slow"})
	require.NoError(t, err)
	h = slow.Wrap(ok)
	serve(h, "192.0.2.1:1")
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, `"slow";r=3;t=60`, w.Header().Get("RateLimit"), "the next token in a minute, not full in two")
	require.Equal(t, `"slow";q=1;w=60`, w.Header().Get("RateLimit-Policy"))
	for range 3 {
		serve(h, "192.0.2.1:1")
	}
	mock.Add(15 * time.Second)
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, `"slow";r=0;t=45`, w.Header().Get("RateLimit"))
	require.Equal(t, "45", w.Header().Get("Retry-After"))
}

// logged collects the records of a slog.Logger.
type logged struct {
	buf bytes.Buffer
}

func (l *logged) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(&l.buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *logged) records(t *testing.T) []map[string]any {
	var out []map[string]any
	for line := range strings.Lines(l.buf.String()) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		out = append(out, rec)
	}
	return out
}

// Issue 16: a bad count answered 400 with the library's own message (the
// limit's name, capacity and advice) in the body.
func TestErrorsSayOnlyTheStatus(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"secret-limit": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour}}, nil)
	var log logged
	mw, err := httplimit.New(lim, []string{"secret-limit"}, httplimit.WithKey(httplimit.Header("X-API-Key")), httplimit.WithLogger(log.logger()),
		httplimit.WithCost(func(r *http.Request) (float64, error) {
			if c := r.URL.Query().Get("cost"); c != "" {
				return strconv.ParseFloat(c, 64)
			}
			return 1, nil
		}))
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/items/{id}", mw.Wrap(ok))
	do := func(target string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", target, nil)
		r.Header.Set("X-API-Key", "key-of-a-customer")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	for _, tt := range []struct {
		target, body string
		code         int
		level        string
	}{
		{"/items/1?cost=11", "Bad Request\n", 400, "INFO"},
		{"/items/1?cost=-1", "Bad Request\n", 400, "INFO"},
		{"/items/1?cost=x", "Internal Server Error\n", 500, "ERROR"},
	} {
		log.buf.Reset()
		w := do(tt.target)
		require.Equal(t, tt.code, w.Code, tt.target)
		require.Equal(t, tt.body, w.Body.String(), tt.target)
		recs := log.records(t)
		require.Len(t, recs, 1)
		rec := recs[0]
		require.Equal(t, tt.level, rec["level"])
		require.Equal(t, "httplimit: request not decided", rec["msg"])
		require.EqualValues(t, tt.code, rec["status"])
		require.Equal(t, "/items/{id}", rec["pattern"])
		require.Len(t, rec["key_id"], 16)
		require.NotContains(t, log.buf.String(), "key-of-a-customer", "the key in clear")
		require.NotEmpty(t, rec["error"])
	}
	require.Contains(t, log.buf.String(), "strconv.ParseFloat", "the detail is in the log")

	// A request without its key: 400, logged at debug.
	log.buf.Reset()
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("GET", "/items/1", nil))
	require.Equal(t, http.StatusBadRequest, w.Code)
	require.Equal(t, "Bad Request\n", w.Body.String())
	require.Equal(t, "DEBUG", log.records(t)[0]["level"])

	// The same key has the same key_id; another has another.
	id := func() any { log.buf.Reset(); do("/items/1?cost=x"); return log.records(t)[0]["key_id"] }
	first := id()
	require.Equal(t, first, id())
	r := httptest.NewRequest("GET", "/items/1?cost=x", nil)
	r.Header.Set("X-API-Key", "another")
	log.buf.Reset()
	mux.ServeHTTP(httptest.NewRecorder(), r)
	require.NotEqual(t, first, log.records(t)[0]["key_id"])
}

// blockingStore waits for the caller's context, as a stalled server would.
type blockingStore struct{ started chan struct{} }

func (s blockingStore) Apply(ctx context.Context, _ *driver.Op, _ []driver.Decision) error {
	close(s.started)
	<-ctx.Done()
	return ctx.Err()
}
func (blockingStore) Load(context.Context, []driver.RecordID, []driver.Record) error {
	return nil
}
func (blockingStore) Delete(context.Context, []driver.RecordID) error { return nil }

// Issue 16: a client that hung up got 500, counted as a server error.
func TestClientGoneAway(t *testing.T) {
	store := blockingStore{started: make(chan struct{})}
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}}, store)
	var log logged
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithLogger(log.logger()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	r := httptest.NewRequestWithContext(ctx, "GET", "/", nil)
	go func() { <-store.started; cancel() }()
	w := httptest.NewRecorder()
	mw.Wrap(ok).ServeHTTP(w, r)
	require.Equal(t, httplimit.StatusClientClosedRequest, w.Code)
	require.Empty(t, w.Body.String())
	recs := log.records(t)
	require.Len(t, recs, 1)
	require.Equal(t, "DEBUG", recs[0]["level"])
	require.Contains(t, recs[0]["error"], "context canceled")

	// A request whose deadline passed: the service could not decide in time.
	log.buf.Reset()
	dctx, dcancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer dcancel()
	w = httptest.NewRecorder()
	mw.Wrap(ok).ServeHTTP(w, httptest.NewRequestWithContext(dctx, "GET", "/", nil))
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Equal(t, "WARN", log.records(t)[0]["level"])
}

func TestProblemDetails(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"perHour":   {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Hour, Start: t0},
		"perMinute": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute, Start: t0},
	}, nil)
	mw, err := httplimit.New(lim, []string{"perHour", "perMinute"}, httplimit.WithProblemDetails(),
		httplimit.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	h := mw.Wrap(ok)
	require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:1").Code)
	w := serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	require.Equal(t, "60", w.Header().Get("Retry-After"))
	require.JSONEq(t, `{
		"type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
		"title": "Quota Exceeded",
		"status": 429,
		"detail": "Retry after 60 seconds.",
		"violated-policies": ["perMinute"]
	}`, w.Body.String())
	require.Equal(t, `"perHour";r=4;t=3600, "perMinute";r=0;t=60`, w.Header().Get("RateLimit"))

	// Errors: about:blank with the status.
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "@" // not an IP address: no key
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusBadRequest, w.Code)
	require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	require.JSONEq(t, `{"type": "about:blank", "title": "Bad Request", "status": 400}`, w.Body.String())

	// Fail closed: 503.
	down, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}}, downStore{})
	dm, err := httplimit.New(down, []string{"api"}, httplimit.WithProblemDetails())
	require.NoError(t, err)
	w = serve(dm.Wrap(ok), "192.0.2.1:1")
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.JSONEq(t, `{"type": "about:blank", "title": "Service Unavailable", "status": 503}`, w.Body.String())

	// A name a structured-field string cannot hold reads the same in both.
	odd, _ := limiter(t, ratelimit.Limits{"per\tmin\"ute": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute, Start: t0}}, nil)
	om, err := httplimit.New(odd, []string{"per\tmin\"ute"}, httplimit.WithProblemDetails())
	require.NoError(t, err)
	serve(om.Wrap(ok), "192.0.2.1:1")
	w = serve(om.Wrap(ok), "192.0.2.1:1")
	require.Equal(t, `"per_min\"ute";q=1;w=60`, w.Header().Get("RateLimit-Policy"))
	var p struct {
		Violated []string `json:"violated-policies"`
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	require.Equal(t, []string{`per_min"ute`}, p.Violated)
}

// The header fields stay within what they may carry at the edges of the
// limits New accepts: a Retry-After near driver.MaxRetryAfter was
// negative (its rounding up overflowed), a token bucket's t past int64
// or above a structured field's largest Integer, and r above it too.
func TestHeadersAtTheEdges(t *testing.T) {
	field := func(t *testing.T, rl, name string) int64 {
		t.Helper()
		i := strings.Index(rl, ";"+name+"=")
		require.GreaterOrEqual(t, i, 0, "RateLimit: %s", rl)
		v := rl[i+len(name)+2:]
		if j := strings.IndexByte(v, ';'); j >= 0 {
			v = v[:j]
		}
		n, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err, "RateLimit: %s", rl)
		return n
	}
	sfMax := int64(999_999_999_999_999)

	t.Run("Retry-After of a wait of centuries", func(t *testing.T) {
		cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 0.1, Period: ratelimit.MaxPeriod, Capacity: 1}
		lim, _ := limiter(t, ratelimit.Limits{"slow": cfg}, nil)
		h := must(httplimit.New(lim, []string{"slow"})).Wrap(ok)
		require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:1").Code)
		w := serve(h, "192.0.2.1:1")
		require.Equal(t, http.StatusTooManyRequests, w.Code)
		// The wait (driver.MaxRetryAfter ms, about 292 years) is sent as
		// MaxRetryAfter, which a 32-bit integer holds: a client reading
		// the larger number as an error might retry at once.
		n, err := strconv.ParseInt(w.Header().Get("Retry-After"), 10, 32)
		require.NoError(t, err, "Retry-After: %s", w.Header().Get("Retry-After"))
		require.Equal(t, int64(math.MaxInt32), n, "capped, never negative")
		require.Equal(t, httplimit.MaxRetryAfter, time.Duration(n)*time.Second)
		pd := must(httplimit.New(lim, []string{"slow"}, httplimit.WithProblemDetails())).Wrap(ok)
		require.Contains(t, serve(pd, "192.0.2.1:1").Body.String(), `"detail":"Retry after 2147483647 seconds."`)
		// One token in 1,000 years, less the 31.6 s in which the bucket
		// refills the last driver.Noise (10⁻⁹) of it, which the Limiter
		// does not wait for.
		require.Equal(t, 10*int64(ratelimit.MaxPeriod/time.Second)-31, field(t, w.Header().Get("RateLimit"), "t"), "one token in 1,000 years")
	})
	t.Run("t of a bucket that refills once in millions of years", func(t *testing.T) {
		for _, shards := range []int{0, 8} {
			cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1e-9, Period: ratelimit.MaxPeriod, Capacity: 8, Shards: shards}
			lim, _ := limiter(t, ratelimit.Limits{"slow": cfg}, nil)
			w := serve(must(httplimit.New(lim, []string{"slow"})).Wrap(ok), "192.0.2.1:1")
			require.Equal(t, http.StatusOK, w.Code)
			require.Equal(t, sfMax, field(t, w.Header().Get("RateLimit"), "t"), "shards %d", shards)
		}
	})
	t.Run("r of the largest capacity", func(t *testing.T) {
		cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: ratelimit.MaxTokens, Period: time.Second}
		lim, _ := limiter(t, ratelimit.Limits{"api": cfg}, nil)
		mw := must(httplimit.New(lim, []string{"api"}, httplimit.WithCost(func(*http.Request) (float64, error) { return 0, nil })))
		w := serve(mw.Wrap(ok), "192.0.2.1:1")
		require.Equal(t, http.StatusOK, w.Code)
		require.Equal(t, sfMax, field(t, w.Header().Get("RateLimit"), "r"))
	})
}

// A rate a whole quota misses by half a token is not stated exactly:
// 999,999,999.5 per second was announced as q=1000000000;w=1, more than
// the limit grants.
func TestPolicyNeverRoundsUp(t *testing.T) {
	for _, rate := range []float64{999_999_999.5, 5e8 + 0.25, 123_456_789_012.4} {
		lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: rate, Period: time.Second}}, nil)
		p := must(httplimit.New(lim, []string{"api"})).Policy()
		var q, w float64
		for _, f := range strings.Split(p, ";")[1:] {
			v, err := strconv.ParseFloat(f[2:], 64)
			require.NoError(t, err, p)
			if f[0] == 'q' {
				q = v
			} else {
				w = v
			}
		}
		require.LessOrEqual(t, q/w, rate, "%s promises more than %v a second", p, rate)
		require.Greater(t, q/w, rate*(1-1e-9), "%s: the closest from below", p)
	}
}

// A name given twice was accepted, then every request failed with 500
// (LimitAll refuses a name named twice).
func TestNewRefusesANameTwice(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute},
		"day": {Kind: ratelimit.FixedWindow, Rate: 100, Period: 24 * time.Hour},
	}, nil)
	_, err := httplimit.New(lim, []string{"api", "day", "api"})
	require.ErrorIs(t, err, httplimit.ErrInvalidOption)
	require.ErrorContains(t, err, `the limit "api" twice`)
}

// An empty name, which ratelimit.New takes, was accepted: the header
// fields and problem details then named the limit "", which tells a
// client nothing, and the name was most likely a variable never set.
func TestNewRefusesAnEmptyName(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"":    {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute},
		"day": {Kind: ratelimit.FixedWindow, Rate: 100, Period: 24 * time.Hour},
	}, nil)
	for _, names := range [][]string{{""}, {"day", ""}} {
		for _, opts := range [][]httplimit.Option{nil, {httplimit.WithoutHeaders()}} {
			_, err := httplimit.New(lim, names, opts...)
			require.ErrorIs(t, err, httplimit.ErrInvalidOption, "%q", names)
			require.ErrorContains(t, err, "empty limit name")
		}
	}
}

// The headers describe the limits as the Limiter declares them at the
// request: after SetLimits they said the old policy and computed t from
// the old rate.
func TestHeadersFollowSetLimits(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"api": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute},
		"day": {Kind: ratelimit.FixedWindow, Rate: 100, Period: 24 * time.Hour, Start: t0},
	}, nil)
	mw := must(httplimit.New(lim, []string{"api", "day"}))
	h := mw.Wrap(ok)
	w := serve(h, "192.0.2.1:1")
	require.Equal(t, `"api";q=2;w=60, "day";q=100;w=86400`, w.Header().Get("RateLimit-Policy"))
	require.Equal(t, `"api";r=1;t=30, "day";r=99;t=86400`, w.Header().Get("RateLimit"))

	require.NoError(t, lim.SetLimit("api", ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 600, Period: time.Minute}))
	require.Equal(t, `"api";q=600;w=60, "day";q=100;w=86400`, mw.Policy())
	w = serve(h, "192.0.2.2:1")
	require.Equal(t, `"api";q=600;w=60, "day";q=100;w=86400`, w.Header().Get("RateLimit-Policy"))
	require.Equal(t, `"api";r=599;t=1, "day";r=99;t=86400`, w.Header().Get("RateLimit"), "t of 600 a minute: the next token in 0.1 s")

	// A limit removed: its requests fail before any header is set, and
	// the policy keeps its last config.
	require.NoError(t, lim.SetLimits(ratelimit.Limits{"day": {Kind: ratelimit.FixedWindow, Rate: 100, Period: 24 * time.Hour, Start: t0}}))
	require.Equal(t, `"api";q=600;w=60, "day";q=100;w=86400`, mw.Policy())
	w = serve(h, "192.0.2.3:1")
	require.Equal(t, http.StatusInternalServerError, w.Code)
	require.Empty(t, w.Header().Get("RateLimit"))
}

// A limit changed at run time (SetLimit) so that it can never grant a
// request's default cost of 1 made every request 400 Bad Request, logged
// at info level: the client's fault, for the server's configuration, which
// New refuses.
func TestLimitChangedToGrantNoRequestIsAServerError(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.TokenBucket, Rate: 0.5, Capacity: 1, Period: time.Second}}, nil)
	var log logged
	mw := must(httplimit.New(lim, []string{"api"}, httplimit.WithLogger(log.logger())))
	h := mw.Wrap(ok)
	require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:1").Code)

	require.NoError(t, lim.SetLimit("api", ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 0.5, Capacity: 0.5, Period: time.Second}))
	w := serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusInternalServerError, w.Code)
	require.Equal(t, "Internal Server Error\n", w.Body.String())
	recs := log.records(t)
	require.Len(t, recs, 1)
	require.Equal(t, "ERROR", recs[0]["level"])
	require.Contains(t, recs[0]["error"], "Capacity")

	// A cost of the request's own (WithCost) that no limit can grant is
	// still the request's fault.
	cm := must(httplimit.New(lim, []string{"api"}, httplimit.WithLogger(slog.New(slog.DiscardHandler)),
		httplimit.WithCost(func(*http.Request) (float64, error) { return 1, nil })))
	require.Equal(t, http.StatusBadRequest, serve(cm.Wrap(ok), "192.0.2.1:1").Code)
}

// Both header fields are well-formed, and the policy never promises more
// than the limit grants, for every config Validate accepts, out to its
// edges: the longest Period, the smallest Rate, fractional rates and
// periods. A limit slower than one token in 999,999,999,999,999 seconds
// (31.7 million years) was announced as q=1 over that many seconds, a
// rate thousands of times its own.
func TestPolicyWellFormedAtTheEdges(t *testing.T) {
	item := regexp.MustCompile(`^"edge";q=(\d{1,15});w=(\d{1,15})$`)
	state := regexp.MustCompile(`^"edge";r=\d{1,15}(;t=\d{1,15})?$`)
	rates := []float64{1e-9, 1.5e-9, 3.17e-9, 1e-7, 0.3, math.Pi, 1, 1e9 + 0.5, 999_999_999_999_999.9, ratelimit.MaxTokens}
	periods := []time.Duration{time.Millisecond, 999 * time.Millisecond, time.Second, 1001 * time.Millisecond, 7 * 24 * time.Hour,
		ratelimit.MaxPeriod / 4 * 3, ratelimit.MaxPeriod/4*3 + time.Millisecond, ratelimit.MaxPeriod - time.Millisecond, ratelimit.MaxPeriod}
	checked := 0
	for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
		for _, rate := range rates {
			for _, period := range periods {
				cfg := ratelimit.Config{Kind: kind, Rate: rate, Period: period, Capacity: max(rate, 1)}
				require.NoError(t, cfg.Validate())
				lim, _ := limiter(t, ratelimit.Limits{"edge": cfg}, nil)
				mw := must(httplimit.New(lim, []string{"edge"}))
				p := mw.Policy()
				m := item.FindStringSubmatch(p)
				require.NotNil(t, m, "%v per %v: RateLimit-Policy: %s", rate, period, p)
				q, w := must(strconv.ParseInt(m[1], 10, 64)), must(strconv.ParseInt(m[2], 10, 64))
				require.GreaterOrEqual(t, w, int64(1), "%v per %v: RateLimit-Policy: %s", rate, period, p)
				perSecond := rate / period.Seconds()
				require.LessOrEqual(t, float64(q)/float64(w), perSecond*(1+1e-9), "%v per %v: RateLimit-Policy: %s promises more", rate, period, p)
				rec := serve(mw.Wrap(ok), "192.0.2.1:1")
				require.Equal(t, http.StatusOK, rec.Code)
				require.Regexp(t, state, rec.Header().Get("RateLimit"), "%v per %v", rate, period)
				checked++
			}
		}
	}
	require.Equal(t, 2*len(rates)*len(periods), checked)

	// Less than one token in the longest window a field holds: no whole
	// quota, over the shortest window of whole periods and whole seconds.
	for _, tt := range []struct {
		cfg  ratelimit.Config
		want string
	}{
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1e-9, Period: ratelimit.MaxPeriod, Capacity: 1}, `"edge";q=0;w=3155673600`},
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1.5e-9, Period: ratelimit.MaxPeriod - time.Millisecond, Capacity: 1}, `"edge";q=0;w=3155673599999`},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 3e-9, Period: 1e7 * time.Second, Capacity: 1}, `"edge";q=0;w=10000000`},
		// One token in 10¹⁵ seconds, one more than a field holds.
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1e-8, Period: 1e7 * time.Second, Capacity: 1}, `"edge";q=0;w=10000000`},
		// One token in fewer seconds is stated.
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 2e-8, Period: 1e7 * time.Second, Capacity: 1}, `"edge";q=1;w=500000000000000`},
	} {
		lim, _ := limiter(t, ratelimit.Limits{"edge": tt.cfg}, nil)
		require.Equal(t, tt.want, must(httplimit.New(lim, []string{"edge"})).Policy(), "%v per %v", tt.cfg.Rate, tt.cfg.Period)
	}
}

// A fixed window grants Rate at each window, but its bucket holds at most
// Capacity: below the rate, Capacity is all a window ever grants. Such a
// limit was announced at its Rate, ten times what it grants. A token
// bucket still refills at its Rate, whatever it holds.
func TestPolicyOfAFixedWindowIsWhatItsBucketHolds(t *testing.T) {
	lim, mock := limiter(t, ratelimit.Limits{
		"fw":      {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour, Capacity: 10, Start: t0},
		"sharded": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour, Capacity: 16, Shards: 8},
		"half":    {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Second, Capacity: 0.5},
		"tb":      {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 3},
	}, nil)
	for name, want := range map[string]string{
		"fw":      `"fw";q=10;w=3600`,
		"sharded": `"sharded";q=16;w=3600`,
		"half":    `"half";q=1;w=2`,
		"tb":      `"tb";q=10;w=60`,
	} {
		mw := must(httplimit.New(lim, []string{name}, httplimit.WithCost(func(*http.Request) (float64, error) { return 0.5, nil })))
		require.Equal(t, want, mw.Policy(), name)
	}
	// What "fw" grants, three hours long: 10 an hour.
	h := must(httplimit.New(lim, []string{"fw"})).Wrap(ok)
	for hour := range 3 {
		granted := 0
		for range 100 {
			if serve(h, "192.0.2.1:1").Code == http.StatusOK {
				granted++
			}
		}
		require.Equal(t, 10, granted, "hour %d", hour)
		mock.Add(time.Hour)
	}
}

// A fixed window's t is, as a token bucket's, the time until r grows: a
// window that grants less than a whole token does not make one available,
// and a full bucket gains nothing at all from the next window. t was the
// next window in both cases.
func TestFixedWindowResetIsWhenRGrows(t *testing.T) {
	lim, mock := limiter(t, ratelimit.Limits{
		"half":     {Kind: ratelimit.FixedWindow, Rate: 0.5, Period: time.Second, Capacity: 1, Start: t0},
		"rollover": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour, Capacity: 150, Start: t0},
		"tenth":    {Kind: ratelimit.FixedWindow, Rate: 0.1, Period: time.Minute, Capacity: 1, Shards: 2},
	}, nil)
	h := must(httplimit.New(lim, []string{"half"})).Wrap(ok)
	w := serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, `"half";r=0;t=2`, w.Header().Get("RateLimit"), "half a token in 1 s, the whole one in 2")
	mock.Add(time.Second)
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, `"half";r=0;t=1`, w.Header().Get("RateLimit"))
	require.Equal(t, "1", w.Header().Get("Retry-After"))
	mock.Add(time.Second)
	require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:1").Code, "when t said")

	cost := 0.0
	h = must(httplimit.New(lim, []string{"rollover"}, httplimit.WithCost(func(*http.Request) (float64, error) { return cost, nil }))).Wrap(ok)
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, `"rollover";r=150`, w.Header().Get("RateLimit"), "a full bucket makes no more quota: no t")
	cost = 1
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, `"rollover";r=149;t=3598`, w.Header().Get("RateLimit"), "the next window, 2 s into this one")

	// Sharded: the two shards a call draws on grant 0.1 a minute together.
	w = serve(must(httplimit.New(lim, []string{"tenth"})).Wrap(ok), "192.0.2.1:1")
	require.Equal(t, http.StatusOK, w.Code)
	rl := w.Header().Get("RateLimit")
	require.Regexp(t, `^"tenth";r=0;t=\d+$`, rl)
	sec := must(strconv.Atoi(rl[strings.LastIndexByte(rl, '=')+1:]))
	require.Greater(t, sec, 9*60, "%s: ten windows at least, not the next", rl)
}

// A cost function that finds the request malformed answers 400 by wrapping
// ratelimit.ErrInvalidCount, and 500 with any other error, as docs/http.md
// says.
func TestCostFunctionErrors(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour}}, nil)
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithCost(func(r *http.Request) (float64, error) {
		switch r.Header.Get("X-Batch") {
		case "bad":
			return 0, fmt.Errorf("X-Batch is not a number: %w", ratelimit.ErrInvalidCount)
		case "broken":
			return 0, errors.New("the pricing table is unavailable")
		}
		return 1, nil
	}))
	require.NoError(t, err)
	h := mw.Wrap(ok)
	require.Equal(t, http.StatusBadRequest, serve(h, "192.0.2.1:1", "X-Batch", "bad").Code)
	require.Equal(t, http.StatusInternalServerError, serve(h, "192.0.2.1:1", "X-Batch", "broken").Code)
	require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:1").Code)
}

// Wrap(nil) returned a handler that panicked at the first request, with a
// nil pointer dereference that named nothing: it panics at once, as
// http.ServeMux.Handle does, with an error matching ErrInvalidOption.
func TestWrapRefusesANilHandler(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}}, nil)
	mw := must(httplimit.New(lim, []string{"api"}))
	for name, next := range map[string]http.Handler{"nil": nil, "nil HandlerFunc": http.HandlerFunc(nil)} {
		var got any
		func() {
			defer func() { got = recover() }()
			mw.Wrap(next)
		}()
		err, isErr := got.(error)
		require.True(t, isErr, "%s: Wrap panics with an error, got %v", name, got)
		require.ErrorIs(t, err, httplimit.ErrInvalidOption, name)
		require.ErrorContains(t, err, "nil handler", name)
	}
}

// Header("") made every request answer 400, as if each client had left
// out its key: a name no request carries is refused by New, with advice.
func TestNewRefusesAHeaderNoRequestCarries(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}}, nil)
	for _, name := range []string{"", "  ", "X API Key", "X-API-Key:"} {
		_, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.Header(name)))
		require.ErrorIs(t, err, httplimit.ErrInvalidOption, "Header(%q)", name)
		require.ErrorContains(t, err, `name the header that holds the key, such as Header("X-API-Key")`, "Header(%q)", name)
	}

	// Spaces around a name are ignored.
	mw := must(httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.Header(" X-API-Key "))))
	require.Equal(t, http.StatusOK, serve(mw.Wrap(ok), "192.0.2.1:1", "X-API-Key", "k1").Code)

	// Inside a KeyFunc of the caller's, New cannot see it: every request
	// is the configuration's fault, 500, not the client's.
	inner := httplimit.Header("")
	wrapped := func(r *http.Request) (string, error) { k, err := inner(r); return "key:" + k, err }
	mw = must(httplimit.New(lim, []string{"api"}, httplimit.WithKey(wrapped), httplimit.WithLogger(slog.New(slog.DiscardHandler))))
	require.Equal(t, http.StatusInternalServerError, serve(mw.Wrap(ok), "192.0.2.1:1", "X-API-Key", "k1").Code)
}

// PathValue("") made every request answer 400: no wildcard has an empty
// name. New refuses it, as it does Header("").
func TestNewRefusesAnEmptyPathValue(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}}, nil)
	_, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.PathValue("")))
	require.ErrorIs(t, err, httplimit.ErrInvalidOption)
	require.ErrorContains(t, err, `name the wildcard that holds the key, such as PathValue("tenant")`)
}

// A limit that refused a request of its next whole token can grant it no
// sooner than r grows: its t is at most Retry-After, and equal when the
// request costs that one token. t was computed from the config alone and
// said later than Retry-After: after float noise (0.4 + 0.6 tokens, which
// the Limiter grants as 1), for the second shard of a sharded fixed
// window, whose window came first, and with several limits; and earlier,
// for a sharded token bucket one of whose two shards was full. Retry-After
// below the t of a limit that did not refuse the request, or that refused
// a fractional cost it grants before its next whole token, is right.
func TestResetAgreesWithRetryAfter(t *testing.T) {
	type step struct {
		advance time.Duration
		cost    float64
		code    int
		rl      string // RateLimit, "" for any
		retry   string
	}
	tests := []struct {
		name   string
		limits ratelimit.Limits
		names  []string
		steps  []step
	}{{
		name:   "float noise",
		limits: ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 0.6, Period: time.Second, Capacity: 2, Start: t0}},
		names:  []string{"l"},
		steps: []step{
			{0, 1, 200, `"l";r=1;t=2`, ""},
			{0, 1, 200, `"l";r=0;t=2`, ""},
			{2 * time.Second, 1, 200, "", ""}, // 1.2 granted: 0.2 left
			{2 * time.Second, 1, 200, "", ""}, // 1.4 granted: 0.4 left (0.3999999999999999)
			{100 * time.Millisecond, 1, 429, `"l";r=0;t=1`, "1"},
			{900 * time.Millisecond, 0, 200, `"l";r=1;t=2`, ""}, // 0.9999999999999999: a whole token
			{0, 1, 200, `"l";r=0;t=2`, ""},
		},
	}, {
		name: "several limits",
		limits: ratelimit.Limits{
			"day": {Kind: ratelimit.FixedWindow, Rate: 100, Period: 24 * time.Hour, Start: t0},
			"l":   {Kind: ratelimit.FixedWindow, Rate: 0.6, Period: time.Second, Capacity: 2, Start: t0},
		},
		names: []string{"day", "l"},
		steps: []step{
			{0, 1, 200, "", ""},
			{0, 1, 200, "", ""},
			{2 * time.Second, 1, 200, "", ""},
			{2 * time.Second, 1, 200, "", ""},
			// The day's t is past Retry-After: it holds the request's token
			// (r ≥ 1), and its next one is not needed.
			{100 * time.Millisecond, 1, 429, `"day";r=96;t=86396, "l";r=0;t=1`, "1"},
			{900 * time.Millisecond, 1, 200, "", ""},
		},
	}, {
		// Retry-After below a refusing limit's t, and rightly: t is when
		// a whole token comes, and the request needs less.
		name:   "fractional cost",
		limits: ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: 10 * time.Second, Capacity: 1}},
		names:  []string{"l"},
		steps: []step{
			{0, 0.7, 200, `"l";r=0;t=7`, ""},
			{0, 0.5, 429, `"l";r=0;t=7`, "2"},
			{2 * time.Second, 0.5, 200, `"l";r=0;t=10`, ""},
		},
	}, {
		name: "sharded token bucket, one shard full",
		// Two shards of 2 tokens, each refilling 1 in 10 s.
		limits: ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 2, Period: 10 * time.Second, Capacity: 4, Shards: 2}},
		names:  []string{"l"},
		steps: []step{
			{0, 1.5, 200, `"l";r=2;t=3`, ""}, // one shard alone: 0.5 and 2
			// 0.5 short, which only the shard below full makes up: 5 s,
			// not the 2.5 s of both shards' rate.
			{0, 3, 429, `"l";r=2;t=5`, "5"},
			{5 * time.Second, 3, 200, "", ""},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim, mock := limiter(t, tt.limits, nil)
			var cost float64
			h := must(httplimit.New(lim, tt.names, httplimit.WithCost(func(*http.Request) (float64, error) { return cost, nil }))).Wrap(ok)
			for i, s := range tt.steps {
				mock.Add(s.advance)
				cost = s.cost
				w := serve(h, "192.0.2.1:1")
				require.Equal(t, s.code, w.Code, "step %d", i)
				if s.rl != "" {
					require.Equal(t, s.rl, w.Header().Get("RateLimit"), "step %d", i)
				}
				require.Equal(t, s.retry, w.Header().Get("Retry-After"), "step %d", i)
			}
		})
	}

	// A sharded fixed window: each shard has its own phase, and the
	// Result's ResetAfter is the window of the first shard the call
	// evaluated, which may come after the other's.
	t.Run("sharded fixed window", func(t *testing.T) {
		mock := clock.NewMock()
		mock.Set(t0)
		lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{
			"l": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute, Shards: 2}, // one token a minute each
		}, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(1, 2))))
		h := must(httplimit.New(lim, []string{"l"})).Wrap(ok)
		for c := range 16 {
			client := fmt.Sprintf("192.0.2.%d:1", c+1)
			require.Equal(t, http.StatusOK, serve(h, client).Code)
			require.Equal(t, http.StatusOK, serve(h, client).Code)
			w := serve(h, client)
			require.Equal(t, http.StatusTooManyRequests, w.Code)
			require.Equal(t, `"l";r=0;t=`+w.Header().Get("Retry-After"), w.Header().Get("RateLimit"), "client %d", c)
		}
	})
}

// A rate so fast that the shortest window of whole periods and whole
// seconds holds more tokens than a structured field can say was announced
// as the most a field holds over that window: 10¹³ per 1,001 ms, whose
// shortest such window is 1,000 periods (1,001 s), as q=999999999999999;
// w=1001, a tenth of its rate, and 10¹⁵ per 7 ms as a thousandth of it.
// Such a rate is stated over whole seconds alone, from below, as closely as
// a field can.
func TestPolicyOfAFastRateOverAnAwkwardPeriod(t *testing.T) {
	for _, tt := range []struct {
		rate   float64
		period time.Duration
		want   string // "" for any closest from below
	}{
		{1e13, 1001 * time.Millisecond, ""},
		{3.14159e13, 1234 * time.Millisecond, ""},
		{1e13, 999 * time.Millisecond, ""},
		{3e12, time.Minute + time.Millisecond, ""},
		{1e14, 7 * time.Millisecond, `"l";q=999999999999999;w=1`}, // 1.4·10¹⁶ a second: the most a field holds
		{1e15, 1500 * time.Millisecond, `"l";q=666666666666666;w=1`},
		{1e15, ratelimit.MaxPeriod - time.Millisecond, ""},
	} {
		for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
			lim, _ := limiter(t, ratelimit.Limits{"l": {Kind: kind, Rate: tt.rate, Period: tt.period}}, nil)
			p := must(httplimit.New(lim, []string{"l"})).Policy()
			if tt.want != "" {
				require.Equal(t, tt.want, p, "%v per %v", tt.rate, tt.period)
			}
			m := regexp.MustCompile(`^"l";q=(\d{1,15});w=(\d{1,15})$`).FindStringSubmatch(p)
			require.NotNil(t, m, p)
			q, w := must(strconv.ParseFloat(m[1], 64)), must(strconv.ParseFloat(m[2], 64))
			perSecond := tt.rate / tt.period.Seconds()
			best := min(perSecond, 999_999_999_999_999) // a quota over 1 s at most
			require.LessOrEqual(t, q/w, perSecond*(1+1e-12), "%v per %v: %s promises more", tt.rate, tt.period, p)
			require.Greater(t, q/w, best*(1-1e-9), "%v per %v: %s states %.3g of the most a field can say", tt.rate, tt.period, p, q/w/best)
		}
	}
}

// Middlewares in a chain (a router's limit and a route's, as the chi
// example of docs/http.md stacks them) each add their limits to the
// header fields: the inner one's replaced the outer's, so that a client
// told "tenant";r=98 alone was refused next by "ip", whose r=0 it never
// saw.
func TestStackedMiddlewaresListEveryLimit(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"ip":     {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute, Start: t0},
		"tenant": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour, Start: t0},
		"day":    {Kind: ratelimit.FixedWindow, Rate: 3, Period: 24 * time.Hour, Start: t0},
	}, nil)
	outer := must(httplimit.New(lim, []string{"ip"}))
	inner := must(httplimit.New(lim, []string{"tenant"}))
	h := outer.Wrap(inner.Wrap(ok))

	w := serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, []string{`"ip";q=2;w=60, "tenant";q=100;w=3600`}, w.Header().Values("RateLimit-Policy"))
	require.Equal(t, []string{`"ip";r=1;t=60, "tenant";r=99;t=3600`}, w.Header().Values("RateLimit"))
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, `"ip";r=0;t=60, "tenant";r=98;t=3600`, w.Header().Get("RateLimit"))
	w = serve(h, "192.0.2.1:1")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, `"ip";r=0;t=60`, w.Header().Get("RateLimit"), "the inner middleware never ran")

	// The inner one refuses: the outer's item stays, charged.
	inner = must(httplimit.New(lim, []string{"day"}))
	h = outer.Wrap(inner.Wrap(ok))
	for range 3 {
		require.Equal(t, http.StatusOK, serve(h, "192.0.2.2:1").Code)
		require.NoError(t, lim.Reset(context.Background(), "ip", "192.0.2.2"))
	}
	w = serve(h, "192.0.2.2:1")
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, `"ip";q=2;w=60, "day";q=3;w=86400`, w.Header().Get("RateLimit-Policy"))
	require.Equal(t, `"ip";r=1;t=60, "day";r=0;t=86400`, w.Header().Get("RateLimit"))
	require.Equal(t, "86400", w.Header().Get("Retry-After"))

	// A limit decided again further in (the same middleware twice) has
	// an item of each decision, in order: a middleware cannot tell one
	// budget from two (TestStackedMiddlewaresOfOneLimit). Its policy,
	// stated alike, is listed once; an item of another's stays, even one
	// whose parameters hold a comma in a string, and so does a policy of
	// the same name stated otherwise (another Limiter's).
	h = outer.Wrap(outer.Wrap(ok))
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.3:1"
	w = httptest.NewRecorder()
	w.Header().Set("RateLimit-Policy", `"other";q=5;qu="a, b", "ip";q=7;w=1`)
	w.Header().Set("RateLimit", `"other";r=1`)
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, []string{`"other";q=5;qu="a, b", "ip";q=7;w=1, "ip";q=2;w=60`}, w.Header().Values("RateLimit-Policy"))
	require.Equal(t, []string{`"other";r=1, "ip";r=1;t=60, "ip";r=0;t=60`}, w.Header().Values("RateLimit"))

	// What is no item of the draft (the older "limit=100, remaining=50"
	// of other libraries, a policy named by a Token, a broken string)
	// would make the whole field malformed: it is dropped. Lines of
	// items are one list.
	r = httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.4:1"
	w = httptest.NewRecorder()
	w.Header().Set("RateLimit", `limit=100, remaining=50, "a";r=1;t=2`)
	w.Header().Add("RateLimit", `"b";r=7;x="y;z";f=?1;d=0.5;n=-3;k=tok/en;y=:AQ==:, token;r=1, "broken;r=1`)
	outer.Wrap(ok).ServeHTTP(w, r)
	require.Equal(t, []string{`"a";r=1;t=2, "b";r=7;x="y;z";f=?1;d=0.5;n=-3;k=tok/en;y=:AQ==:, "ip";r=1;t=60`}, w.Header().Values("RateLimit"))
}

// Two middlewares of one limit, keyed apart (by address, and by user
// with a prefix, as docs/http.md shows), decide two budgets of it: the
// inner one's item replaced the outer's, so that a client told "api";r=8
// of its user's budget was refused next by its address's, whose r=0 it
// never saw. Both show, in the order decided, the policy once.
func TestStackedMiddlewaresOfOneLimit(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, nil)
	perIP := must(httplimit.New(lim, []string{"api"}))
	perUser := must(httplimit.New(lim, []string{"api"}, httplimit.WithKey(prefixed("user:", httplimit.Header("X-User")))))
	h := perIP.Wrap(perUser.Wrap(ok))
	for range 9 {
		require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:1", "X-User", "bob").Code)
	}
	w := serve(h, "192.0.2.1:1", "X-User", "alice")
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, []string{`"api";q=10;w=60`}, w.Header().Values("RateLimit-Policy"))
	require.Equal(t, []string{`"api";r=0;t=60, "api";r=9;t=60`}, w.Header().Values("RateLimit"))
	w = serve(h, "192.0.2.1:1", "X-User", "alice")
	require.Equal(t, http.StatusTooManyRequests, w.Code, "refused by the address's budget")
	require.Equal(t, `"api";r=0;t=60`, w.Header().Get("RateLimit"))
}

// Two limits whose names the header fields write alike (bytes a
// structured-field string cannot hold become "_") were both listed as
// "caf_", so that a client could not tell which r was whose. New refuses
// them, unless neither the header fields nor problem details name them.
func TestNewRefusesNamesTheHeadersWriteAlike(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"café":  {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute},
		"cafè":  {Kind: ratelimit.FixedWindow, Rate: 1000, Period: time.Hour},
		"caf\t": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Minute},
	}, nil)
	for _, names := range [][]string{{"café", "cafè"}, {"cafè", "caf\t"}} {
		_, err := httplimit.New(lim, names)
		require.ErrorIs(t, err, httplimit.ErrInvalidOption, "%q", names)
		require.ErrorContains(t, err, `"caf_"`)
		_, err = httplimit.New(lim, names, httplimit.WithoutHeaders(), httplimit.WithProblemDetails())
		require.ErrorIs(t, err, httplimit.ErrInvalidOption, "%q", names)
		_, err = httplimit.New(lim, names, httplimit.WithoutHeaders())
		require.NoError(t, err, "%q: no field names them", names)
	}
	mw, err := httplimit.New(lim, []string{"café"})
	require.NoError(t, err)
	require.Equal(t, `"caf_";q=10;w=60`, mw.Policy())
}

// preflight returns a CORS preflight request for a POST from origin (empty:
// none), as a browser sends it: without the request's credentials or API
// key.
func preflight(origin, method string) *http.Request {
	r := httptest.NewRequest(http.MethodOptions, "/items", nil)
	r.RemoteAddr = "192.0.2.1:1"
	if origin != "" {
		r.Header.Set("Origin", origin)
	}
	if method != "" {
		r.Header.Set("Access-Control-Request-Method", method)
	}
	r.Header.Set("Access-Control-Request-Headers", "x-api-key")
	return r
}

// ExemptPreflights lets CORS preflights through uncharged, without a key,
// and nothing else: an OPTIONS request that is no preflight is decided as
// any request, as is every request without the option.
func TestExemptPreflights(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour, Start: t0}}, nil)
	var reached []string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached = append(reached, r.Method)
		w.WriteHeader(http.StatusNoContent)
	})
	do := func(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	// Without the option a preflight is decided: keyed by an API key it
	// carries none (400), keyed by address it spends the budget.
	byKey := must(httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.Header("X-API-Key")))).Wrap(next)
	require.Equal(t, http.StatusBadRequest, do(byKey, preflight("https://app.example", "POST")).Code)
	byIP := must(httplimit.New(lim, []string{"api"})).Wrap(next)
	require.Equal(t, http.StatusNoContent, do(byIP, preflight("https://app.example", "POST")).Code)
	require.Equal(t, http.StatusTooManyRequests, do(byIP, preflight("https://app.example", "POST")).Code)

	mw := must(httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.Header("X-API-Key")), httplimit.ExemptPreflights()))
	h := mw.Wrap(next)
	reached = nil
	for range 3 {
		w := do(h, preflight("https://app.example", "POST"))
		require.Equal(t, http.StatusNoContent, w.Code)
		require.Empty(t, w.Header().Values("RateLimit"), "a preflight is not decided")
		require.Empty(t, w.Header().Values("RateLimit-Policy"))
	}
	require.Equal(t, []string{"OPTIONS", "OPTIONS", "OPTIONS"}, reached)
	r := httptest.NewRequest(http.MethodPost, "/items", nil)
	r.Header.Set("X-API-Key", "k1")
	w := do(h, r)
	require.Equal(t, http.StatusNoContent, w.Code, "the preflights spent nothing")
	require.Equal(t, `"api";r=0;t=3600`, w.Header().Get("RateLimit"))
	require.Equal(t, http.StatusTooManyRequests, do(h, r).Code)

	// Not preflights: decided, and without an API key refused.
	for _, r := range []*http.Request{
		preflight("", "POST"),                    // no Origin
		preflight("https://app.example", ""),     // no Access-Control-Request-Method
		httptest.NewRequest("OPTIONS", "*", nil), // a plain OPTIONS
	} {
		require.Equal(t, http.StatusBadRequest, do(h, r).Code, "%s %v", r.Method, r.Header)
	}
	r = preflight("https://app.example", "POST")
	r.Method = http.MethodGet
	require.Equal(t, http.StatusBadRequest, do(h, r).Code, "a GET with the preflight's headers")
}

// A KeyFunc (or CostFunc) that panicked ended the server: net/http's
// recovery is per connection, and none recovers it elsewhere. The panic
// is an error matching ErrFuncPanicked, answered 500 and logged with its
// value; a panic of the wrapped handler is not the middleware's, and goes
// on.
func TestPanickingKeyFuncIsAServerError(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}}, nil)
	var log logged
	var handled error
	boom := func(r *http.Request) (string, error) {
		if r.Header.Get("X-Boom") != "" {
			panic(errors.New("tenant table not loaded")) // a bug of the KeyFunc
		}
		return "k", nil
	}
	mw := must(httplimit.New(lim, []string{"api"}, httplimit.WithKey(boom), httplimit.WithLogger(log.logger()),
		httplimit.WithCost(func(r *http.Request) (float64, error) {
			if r.Header.Get("X-Cost-Boom") != "" {
				panic("cost boom")
			}
			return 1, nil
		})))
	h := mw.Wrap(ok)
	for _, hdr := range []string{"X-Boom", "X-Cost-Boom"} {
		log.buf.Reset()
		var w *httptest.ResponseRecorder
		require.NotPanics(t, func() { w = serve(h, "192.0.2.1:1", hdr, "1") }, hdr)
		require.Equal(t, http.StatusInternalServerError, w.Code, hdr)
		require.Equal(t, "Internal Server Error\n", w.Body.String(), hdr)
		recs := log.records(t)
		require.Len(t, recs, 1, hdr)
		require.Equal(t, "ERROR", recs[0]["level"], hdr)
		require.Contains(t, recs[0]["error"], "panicked", hdr)
	}
	mw = must(httplimit.New(lim, []string{"api"}, httplimit.WithKey(boom), httplimit.WithLogger(log.logger()),
		httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
			handled = err
			w.WriteHeader(http.StatusInternalServerError)
		})))
	serve(mw.Wrap(ok), "192.0.2.1:1", "X-Boom", "1")
	require.ErrorIs(t, handled, httplimit.ErrFuncPanicked)

	// The handler's own panic is not recovered.
	bad := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler boom") }))
	require.PanicsWithValue(t, "handler boom", func() { serve(bad, "192.0.2.1:1") })
	// Nor is http.ErrAbortHandler, a deliberate abort.
	abort := must(httplimit.New(lim, []string{"api"}, httplimit.WithKey(func(*http.Request) (string, error) { panic(http.ErrAbortHandler) })))
	require.PanicsWithValue(t, http.ErrAbortHandler, func() { serve(abort.Wrap(ok), "192.0.2.1:1") })
}

// A KeyFunc of the user's that returns an empty key, and no error, for a
// request without the identity it reads put every such request in one
// budget: one client spent it for all. An empty key is no key, answered
// 400 as ErrNoKey and logged at debug; the request whose key is there
// goes on.
func TestEmptyKeyIsNoKey(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}}, nil)
	var logs logged
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithLogger(logs.logger()),
		httplimit.WithKey(func(r *http.Request) (string, error) {
			return r.Header.Get("X-User"), nil // a KeyFunc's mistake: no user is no key
		}))
	require.NoError(t, err)
	h := mw.Wrap(ok)
	for range 3 {
		require.Equal(t, http.StatusBadRequest, serve(h, "192.0.2.1:1").Code)
	}
	recs := logs.records(t)
	require.Len(t, recs, 3)
	require.Equal(t, "DEBUG", recs[0]["level"])
	require.Contains(t, recs[0]["error"], "empty key")
	st, err := lim.Value(context.Background(), "api", "")
	require.NoError(t, err)
	require.Equal(t, 1.0, st.Remaining, "the empty key's budget is untouched")

	require.Equal(t, http.StatusOK, serve(h, "192.0.2.1:1", "X-User", "ann").Code)
	require.Equal(t, http.StatusTooManyRequests, serve(h, "192.0.2.1:1", "X-User", "ann").Code)
}

// WithCost(nil) was taken for no WithCost, so that a request a CostFunc
// variable never set was to price at 100 tokens cost 1, and
// WithLogger(nil) for the default logger, where the Limiter's WithLogger
// of nil logs nothing. OnStoreFailure(nil) was silently no function
// either. Each option given nil is refused by New, as WithKey(nil) is.
func TestNewRefusesOptionsGivenNil(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}}, nil)
	for name, opt := range map[string]httplimit.Option{
		"WithCost":       httplimit.WithCost(nil),
		"WithLogger":     httplimit.WithLogger(nil),
		"OnStoreFailure": httplimit.OnStoreFailure(nil),
		"WithKey":        httplimit.WithKey(nil),
	} {
		mw, err := httplimit.New(lim, []string{"api"}, opt)
		require.ErrorIs(t, err, httplimit.ErrInvalidOption, name)
		require.ErrorContains(t, err, name, name)
		require.Nil(t, mw, name)
	}
}

// A Middleware whose New failed, kept instead of its error (nil), or a
// zero Middleware, was wrapped without a word, and the handler panicked
// at the first request with a nil dereference that named nothing. Wrap
// panics at once, as for a nil handler, with an error matching
// ErrInvalidOption.
func TestWrapOfAMiddlewareNotMadeByNew(t *testing.T) {
	for name, mw := range map[string]*httplimit.Middleware{"nil": nil, "zero": {}} {
		var got any
		func() {
			defer func() { got = recover() }()
			h := mw.Wrap(ok)
			serve(h, "192.0.2.1:1")
		}()
		err, isErr := got.(error)
		require.True(t, isErr, "%s: Wrap panics with an error, got %v", name, got)
		require.ErrorIs(t, err, httplimit.ErrInvalidOption, name)
		require.ErrorContains(t, err, "New", name)
	}
}

// Header("Host") refused every request, through a real server, with 400,
// as if each client had left out its key: net/http moves Host to
// Request.Host, and Transfer-Encoding and Trailer to fields of their own,
// and none of them is ever in Request.Header. New refuses them, with
// advice, as it does a name that is no header's.
func TestNewRefusesAHeaderNetHTTPTakesOut(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}}, nil)
	for _, name := range []string{"Host", "host", " HOST ", "Transfer-Encoding", "trailer"} {
		_, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.Header(name)))
		require.ErrorIs(t, err, httplimit.ErrInvalidOption, "Header(%q)", name)
		require.ErrorContains(t, err, "net/http", "Header(%q)", name)
	}
	_, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.Header("Host")))
	require.ErrorContains(t, err, "r.Host")

	// What a real server hands the handler: no Host among the header
	// fields, though the client sent one.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Empty(t, r.Header.Values("Host"))
		require.Equal(t, "tenant.example", r.Host)
	}))
	defer srv.Close()
	req := must(http.NewRequest(http.MethodGet, srv.URL, nil))
	req.Host = "tenant.example"
	resp := must(srv.Client().Do(req))
	resp.Body.Close()
}

// PathValue unescapes a value a router gave as written in the escaped
// path (chi, echo), but not one of ServeMux's, which is unescaped
// already: a tenant whose name holds an escape of its own (a%41, sent
// as a%2541) keeps it, whatever else the path escapes.
func TestPathValueEscapes(t *testing.T) {
	key := httplimit.PathValue("tenant")
	mux := http.NewServeMux()
	var got []string
	mux.HandleFunc("/t/{tenant}/items", func(_ http.ResponseWriter, r *http.Request) {
		k, err := key(r)
		require.NoError(t, err)
		got = append(got, k)
	})
	for _, p := range []string{"/t/acme/items", "/t/%61cme/items", "/t/a%2541/items", "/t/a%2541/%69tems", "/t/100%25/%69tems", "/t/a%2Fb/items"} {
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, p, nil))
	}
	require.Equal(t, []string{"acme", "acme", "a%41", "a%41", "100%", "a/b"}, got)

	// A router's value as written in the escaped path.
	r := httptest.NewRequest(http.MethodGet, "/t/%61%63me/items", nil)
	r.SetPathValue("tenant", "%61%63me")
	k, err := key(r)
	require.NoError(t, err)
	require.Equal(t, "acme", k)
	r.SetPathValue("tenant", "%61%zz") // not an escape: kept as it is
	k, err = key(r)
	require.NoError(t, err)
	require.Equal(t, "%61%zz", k)
}

// A ServeMux wildcard is unescaped already, wherever else the path writes
// it: under /t/{tenant}/, /t/a%2541/a%41 is tenant a%41, sent escaped,
// whose value is also written, as a later segment, in the escaped path.
// Found there, it was unescaped again, and keyed as tenant aA: one tenant
// had two budgets, one of them another tenant's. A router's value is
// told by the segment its pattern (r.Pattern) gives the parameter.
func TestPathValueUnescapesOnlyTheParametersSegment(t *testing.T) {
	key := httplimit.PathValue("tenant")
	mux := http.NewServeMux()
	var got []string
	mux.HandleFunc("/t/{tenant}/", func(_ http.ResponseWriter, r *http.Request) {
		k, err := key(r)
		require.NoError(t, err)
		got = append(got, k)
	})
	for _, p := range []string{"/t/a%2541/a%41", "/t/a%2541/x/a%41", "/t/%2561cme/%61cme", "/t/aA/a%41"} {
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, p, nil))
	}
	require.Equal(t, []string{"a%41", "a%41", "%61cme", "aA"}, got)

	// Routers that give a parameter as written and name its segment in
	// r.Pattern: chi's {tenant}, echo's and gin's :tenant, a catch-all.
	for _, tt := range []struct{ pattern, name, path, value, want string }{
		{"/t/{tenant}/items", "tenant", "/t/%61cme/items", "%61cme", "acme"},
		{"/t/{tenant:[a-z%0-9]+}/items", "tenant", "/t/%61cme/items", "%61cme", "acme"},
		{"/t/:tenant/items", "tenant", "/t/%61cme/items", "%61cme", "acme"},
		{"/t/:tenant/*rest", "rest", "/t/x/a%2Fb/%63", "a%2Fb/%63", "a/b/c"},
		{"/t/*", "*", "/t/a%2Fb/%63", "a%2Fb/%63", "a/b/c"},
		// gin's catch-all starts with the slash before it.
		{"/t/:tenant/*rest", "rest", "/t/x/a%2Fb/%63", "/a%2Fb/%63", "/a/b/c"},
		{"/*rest", "rest", "/%61", "/%61", "/a"},
		{"/t/:tenant/*rest", "rest", "/t/x/a%2541", "/a%41", "/a%41"},
		{"/t/:tenant/*rest", "rest", "/t/x/a%2541/%2F", "/a%41/%2F", "/a%41/%2F"},
		// The value written at another segment than the parameter's: a
		// value of its own, kept.
		{"/t/:tenant/*", "tenant", "/t/a%2541/a%41", "a%41", "a%41"},
		// A pattern whose literal segments are not the path's says
		// nothing of where the parameter is: the value is kept.
		{"/u/:tenant/items", "tenant", "/t/%61cme/items", "%61cme", "%61cme"},
		// No pattern names the parameter (chi before v5.2.2 sets none): a
		// value found as written in the escaped path is unescaped.
		{"", "tenant", "/t/%61%63me/items", "%61%63me", "acme"},
		{"/t/", "tenant", "/t/%61%63me/items", "%61%63me", "acme"},
	} {
		r := httptest.NewRequest(http.MethodGet, tt.path, nil)
		r.Pattern = tt.pattern
		r.SetPathValue(tt.name, tt.value)
		k, err := httplimit.PathValue(tt.name)(r)
		require.NoError(t, err)
		require.Equal(t, tt.want, k, "%s %s", tt.pattern, tt.path)
	}
}
