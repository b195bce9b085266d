package frameworks_test

import (
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/assert"
)

// echo wraps net/http middleware with echo.WrapMiddleware; in echo v5 it
// also hands the route's parameters over as path values.
func TestEcho(t *testing.T) {
	mw := newMiddleware(t)
	var reached int
	e := echo.New()
	e.Use(echo.WrapMiddleware(mw.Wrap))
	e.GET("/hello", echo.WrapHandler(hello(&reached)))

	var got []response
	for range 3 {
		got = append(got, get(e, "/hello"))
	}
	wantLimited(t, got)
	assert.Equal(t, 2, reached)
}

// A key from the route ({tenant}) needs the middleware on the routes that
// have it: a group or a route. On the router (Use), it runs for every
// request, after routing: a route without the parameter, or a path that
// matches no route, lacks the key, and gets 400 in place of its answer
// or its 404.
func TestEchoPathValue(t *testing.T) {
	var reached int
	e := echo.New()
	g := e.Group("/t/:tenant", echo.WrapMiddleware(newMiddleware(t, httplimit.WithKey(httplimit.PathValue("tenant"))).Wrap))
	g.GET("/items", echo.WrapHandler(hello(&reached)))
	e.GET("/health", echo.WrapHandler(hello(&reached)))

	var got []response
	for range 3 {
		got = append(got, get(e, "/t/acme/items"))
	}
	wantLimited(t, got)
	assert.Equal(t, 200, get(e, "/t/globex/items").status, "another tenant, another bucket")
	assert.Equal(t, 200, get(e, "/health").status, "a route without the tenant is not limited")
	assert.Equal(t, 404, get(e, "/nope").status)
	assert.Equal(t, 4, reached)

	// On the router, every route needs the parameter.
	early := echo.New()
	early.Use(echo.WrapMiddleware(newMiddleware(t, httplimit.WithKey(httplimit.PathValue("tenant"))).Wrap))
	early.GET("/t/:tenant/items", echo.WrapHandler(hello(&reached)))
	early.GET("/health", echo.WrapHandler(hello(&reached)))
	assert.Equal(t, 200, get(early, "/t/acme/items").status)
	assert.Equal(t, 400, get(early, "/health").status)
	assert.Equal(t, 400, get(early, "/nope").status)
}

func TestEchoHeaderKey(t *testing.T) {
	var reached int
	e := echo.New()
	e.Use(echo.WrapMiddleware(newMiddleware(t, httplimit.WithKey(httplimit.Header("X-API-Key"))).Wrap))
	e.GET("/hello", echo.WrapHandler(hello(&reached)))

	var got []response
	for range 3 {
		got = append(got, get(e, "/hello", "X-API-Key", "k1"))
	}
	wantLimited(t, got)
	assert.Equal(t, 200, get(e, "/hello", "X-API-Key", "k2").status)
	assert.Equal(t, 400, get(e, "/hello").status, "no key")
	assert.Equal(t, 3, reached)
}

// echo, as chi, matches the escaped path when it differs from the one Go
// would write, and gives a parameter as written: keyed so, every spelling
// of a tenant (/t/%61cme, /t/%61%63me) had a budget of its own.
func TestEchoPathValueEscaped(t *testing.T) {
	var reached int
	e := echo.New()
	g := e.Group("/t/:tenant", echo.WrapMiddleware(newMiddleware(t, httplimit.WithKey(httplimit.PathValue("tenant"))).Wrap))
	g.GET("/items", echo.WrapHandler(hello(&reached)))

	wantLimited(t, []response{get(e, "/t/acme/items"), get(e, "/t/%61cme/items"), get(e, "/t/%61%63me/items")})
	assert.Equal(t, 200, get(e, "/t/a%2Fb/items").status, "another tenant, another bucket")
}
