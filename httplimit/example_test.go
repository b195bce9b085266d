package httplimit_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
)

// An API limited to 2 requests a minute per client IP: the third request
// is refused with 429, Retry-After and the RateLimit header fields.
func Example() {
	mock := clock.NewMock() // a real service leaves the clock out
	mock.Set(time.Date(2024, 1, 1, 12, 0, 15, 0, time.UTC))
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute, Start: time.Unix(0, 0)},
	}, ratelimit.WithClock(mock))
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(lim, []string{"api"})
	if err != nil {
		panic(err)
	}
	handler := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello\n")
	}))

	for i := range 3 {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "203.0.113.7:50000"
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Printf("%d: %d RateLimit: %s Retry-After: %q\n", i+1, rec.Code, rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
	}
	fmt.Println("RateLimit-Policy:", mw.Policy())
	// Output:
	// 1: 200 RateLimit: "api";r=1;t=45 Retry-After: ""
	// 2: 200 RateLimit: "api";r=0;t=45 Retry-After: ""
	// 3: 429 RateLimit: "api";r=0;t=45 Retry-After: "45"
	// RateLimit-Policy: "api";q=2;w=60
}

// Behind load balancers at 10.0.0.0/16 that append to X-Forwarded-For, a
// client that writes its own X-Forwarded-For (or Forwarded) is still keyed
// by the address the load balancer saw.
func ExampleTrustProxies() {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute},
	})
	if err != nil {
		panic(err)
	}
	key, err := httplimit.ClientIP(httplimit.TrustProxies(httplimit.XForwardedFor, netip.MustParsePrefix("10.0.0.0/16")))
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(key))
	if err != nil {
		panic(err)
	}
	handler := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))

	for i := range 3 {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "10.0.3.4:41000" // the load balancer
		forged := fmt.Sprintf("198.51.100.%d", i)
		req.Header.Set("Forwarded", "for="+forged)
		req.Header.Set("X-Forwarded-For", forged+", 203.0.113.7") // the load balancer appended 203.0.113.7
		k, _ := key(req)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Printf("forged %s: key %s, %d\n", forged, k, rec.Code)
	}
	// Output:
	// forged 198.51.100.0: key 203.0.113.7, 200
	// forged 198.51.100.1: key 203.0.113.7, 200
	// forged 198.51.100.2: key 203.0.113.7, 429
}

// A limit's policy is a whole quota over whole seconds, even when its rate
// is a fraction; a token bucket's t is the time until its next token.
func ExampleMiddleware_Policy() {
	mock := clock.NewMock()
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"half":   {Kind: ratelimit.TokenBucket, Rate: 0.5, Period: time.Second, Capacity: 1},
		"burst":  {Kind: ratelimit.TokenBucket, Rate: 1, Period: 100 * time.Millisecond, Capacity: 20},
		"minute": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute, Capacity: 5},
	}, ratelimit.WithClock(mock))
	if err != nil {
		panic(err)
	}
	for _, name := range []string{"half", "burst", "minute"} {
		mw, err := httplimit.New(lim, []string{name})
		if err != nil {
			panic(err)
		}
		req := httptest.NewRequest("GET", "/", nil)
		rec := httptest.NewRecorder()
		mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, req)
		fmt.Printf("%-30s %s\n", mw.Policy(), rec.Header().Get("RateLimit"))
	}
	// Output:
	// "half";q=1;w=2                 "half";r=0;t=2
	// "burst";q=10;w=1               "burst";r=19;t=1
	// "minute";q=1;w=60              "minute";r=4;t=60
}

// WithProblemDetails answers a refused request in application/problem+json.
func ExampleWithProblemDetails() {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"perMinute": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute, Start: time.Unix(0, 0)},
	}, ratelimit.WithClock(clock.NewMock()))
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(lim, []string{"perMinute"}, httplimit.WithProblemDetails())
	if err != nil {
		panic(err)
	}
	handler := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var rec *httptest.ResponseRecorder
	for range 2 {
		rec = httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	}
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"), "Retry-After:", rec.Header().Get("Retry-After"))
	fmt.Print(rec.Body.String())
	// Output:
	// 429 application/problem+json Retry-After: 60
	// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":429,"detail":"Retry after 60 seconds.","violated-policies":["perMinute"]}
}

// Middlewares in a chain: one for every route, keyed by the client's
// address, and one for a tenant's routes, keyed by the tenant. Each adds
// its limits to the header fields, so that a response names both, and the
// client sees the one that refuses it next.
func ExampleMiddleware_Wrap() {
	mock := clock.NewMock()
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"perClient": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute, Start: time.Unix(0, 0)},
		"perTenant": {Kind: ratelimit.FixedWindow, Rate: 1000, Period: time.Hour, Start: time.Unix(0, 0)},
	}, ratelimit.WithClock(mock))
	if err != nil {
		panic(err)
	}
	perClient, err := httplimit.New(lim, []string{"perClient"})
	if err != nil {
		panic(err)
	}
	perTenant, err := httplimit.New(lim, []string{"perTenant"}, httplimit.WithKey(httplimit.PathValue("tenant")))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/t/{tenant}/items", perTenant.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	handler := perClient.Wrap(mux)

	for i := range 3 {
		req := httptest.NewRequest("GET", "/t/acme/items", nil)
		req.RemoteAddr = "203.0.113.7:50000"
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Printf("%d: %d RateLimit: %s\n", i+1, rec.Code, rec.Header().Get("RateLimit"))
	}
	// Output:
	// 1: 200 RateLimit: "perClient";r=1;t=60, "perTenant";r=999;t=3600
	// 2: 200 RateLimit: "perClient";r=0;t=60, "perTenant";r=998;t=3600
	// 3: 429 RateLimit: "perClient";r=0;t=60
}

// A browser app at another origin calls an API keyed by X-API-Key, one
// request a minute. Its browser asks first, in a preflight that carries
// no API key: with ExemptPreflights the preflight reaches the CORS
// handler, which answers it, and spends nothing.
func ExampleExemptPreflights() {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute, Start: time.Unix(0, 0)},
	}, ratelimit.WithClock(clock.NewMock()))
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.Header("X-API-Key")), httplimit.ExemptPreflights())
	if err != nil {
		panic(err)
	}
	// cors stands for a CORS handler (github.com/rs/cors and the like): it
	// answers preflights itself, and passes other requests on.
	cors := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Access-Control-Allow-Origin", "https://app.example")
			if r.Method == http.MethodOptions {
				w.Header().Set("Access-Control-Allow-Methods", "POST")
				w.Header().Set("Access-Control-Allow-Headers", "X-API-Key")
				w.WriteHeader(http.StatusNoContent)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	handler := mw.Wrap(cors(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "created\n")
	})))

	for i := range 2 {
		pre := httptest.NewRequest(http.MethodOptions, "/items", nil)
		pre.Header.Set("Origin", "https://app.example")
		pre.Header.Set("Access-Control-Request-Method", "POST")
		pre.Header.Set("Access-Control-Request-Headers", "x-api-key")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, pre)
		fmt.Printf("preflight %d: %d RateLimit: %q\n", i+1, rec.Code, rec.Header().Get("RateLimit"))

		req := httptest.NewRequest(http.MethodPost, "/items", nil)
		req.Header.Set("Origin", "https://app.example")
		req.Header.Set("X-API-Key", "k-42")
		rec = httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Printf("request %d: %d RateLimit: %q\n", i+1, rec.Code, rec.Header().Get("RateLimit"))
	}
	// Output:
	// preflight 1: 204 RateLimit: ""
	// request 1: 200 RateLimit: "\"api\";r=0;t=60"
	// preflight 2: 204 RateLimit: ""
	// request 2: 429 RateLimit: "\"api\";r=0;t=60"
}
