package frameworks_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/labstack/echo/v5"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
)

// exampleMiddleware keys requests by their tenant, two a minute each. (The
// mock clock makes the output repeatable; production leaves WithClock
// out.)
func exampleMiddleware() *httplimit.Middleware {
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
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.PathValue("tenant")))
	if err != nil {
		panic(err)
	}
	return mw
}

// exampleRequests sends three requests of one tenant and one of another.
func exampleRequests(h http.Handler) {
	for _, path := range []string{"/t/acme/items", "/t/acme/items", "/t/acme/items", "/t/globex/items"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Printf("%s: %d RateLimit: %s Retry-After: %q\n", path, w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
}

var items = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("items")) })

// chi: the middleware on the route, which has the tenant.
func Example_chi() {
	r := chi.NewRouter()
	r.With(exampleMiddleware().Wrap).Get("/t/{tenant}/items", items)
	exampleRequests(r)
	// Output:
	// /t/acme/items: 200 RateLimit: "api";r=1;t=30 Retry-After: ""
	// /t/acme/items: 200 RateLimit: "api";r=0;t=30 Retry-After: ""
	// /t/acme/items: 429 RateLimit: "api";r=0;t=30 Retry-After: "30"
	// /t/globex/items: 200 RateLimit: "api";r=1;t=30 Retry-After: ""
}

// echo: echo.WrapMiddleware, on the group of the routes that have the
// tenant.
func Example_echo() {
	e := echo.New()
	g := e.Group("/t/:tenant", echo.WrapMiddleware(exampleMiddleware().Wrap))
	g.GET("/items", echo.WrapHandler(items))
	exampleRequests(e)
	// Output:
	// /t/acme/items: 200 RateLimit: "api";r=1;t=30 Retry-After: ""
	// /t/acme/items: 200 RateLimit: "api";r=0;t=30 Retry-After: ""
	// /t/acme/items: 429 RateLimit: "api";r=0;t=30 Retry-After: "30"
	// /t/globex/items: 200 RateLimit: "api";r=1;t=30 Retry-After: ""
}

// gin: the adapter of docs/http.md (ginLimit, in gin_test.go), on the
// group of the routes that have the tenant.
func Example_gin() {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	g := r.Group("/t/:tenant", ginLimit(exampleMiddleware()))
	g.GET("/items", gin.WrapH(items))
	exampleRequests(r)
	// Output:
	// /t/acme/items: 200 RateLimit: "api";r=1;t=30 Retry-After: ""
	// /t/acme/items: 200 RateLimit: "api";r=0;t=30 Retry-After: ""
	// /t/acme/items: 429 RateLimit: "api";r=0;t=30 Retry-After: "30"
	// /t/globex/items: 200 RateLimit: "api";r=1;t=30 Retry-After: ""
}
