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

func TestEchoPathValue(t *testing.T) {
	var reached int
	e := echo.New()
	e.Use(echo.WrapMiddleware(newMiddleware(t, httplimit.WithKey(httplimit.PathValue("tenant"))).Wrap))
	e.GET("/t/:tenant/items", echo.WrapHandler(hello(&reached)))

	var got []response
	for range 3 {
		got = append(got, get(e, "/t/acme/items"))
	}
	wantLimited(t, got)
	assert.Equal(t, 200, get(e, "/t/globex/items").status, "another tenant, another bucket")
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
