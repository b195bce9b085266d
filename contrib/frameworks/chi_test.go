package frameworks_test

import (
	"net/http"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/assert"
)

// chi takes net/http middleware as it is.
func TestChi(t *testing.T) {
	mw := newMiddleware(t)
	var reached int
	r := chi.NewRouter()
	r.Use(mw.Wrap)
	r.Get("/hello", hello(&reached))

	var got []response
	for range 3 {
		got = append(got, get(r, "/hello"))
	}
	wantLimited(t, got)
	assert.Equal(t, 2, reached)
}

// A key from the route ({tenant}) needs the middleware after routing:
// chi sets the request's path values when it has found the route, so the
// middleware goes on the route (With), not on the router (Use), whose
// middleware runs before routing.
func TestChiPathValue(t *testing.T) {
	var reached int
	r := chi.NewRouter()
	r.With(newMiddleware(t, httplimit.WithKey(httplimit.PathValue("tenant"))).Wrap).Get("/t/{tenant}/items", hello(&reached))

	var got []response
	for range 3 {
		got = append(got, get(r, "/t/acme/items"))
	}
	wantLimited(t, got)
	assert.Equal(t, 200, get(r, "/t/globex/items").status, "another tenant, another bucket")

	// On the router, the middleware runs before chi has read the path:
	// every request lacks its key.
	early := chi.NewRouter()
	early.Use(newMiddleware(t, httplimit.WithKey(httplimit.PathValue("tenant"))).Wrap)
	early.Get("/t/{tenant}/items", hello(&reached))
	assert.Equal(t, http.StatusBadRequest, get(early, "/t/acme/items").status)
}

// chi matches the escaped path when it differs from the one Go would
// write, and gives a parameter as written: keyed so, every spelling of a
// tenant (/t/%61cme, /t/%61%63me) had a budget of its own.
func TestChiPathValueEscaped(t *testing.T) {
	var reached int
	r := chi.NewRouter()
	r.With(newMiddleware(t, httplimit.WithKey(httplimit.PathValue("tenant"))).Wrap).Get("/t/{tenant}/items", hello(&reached))

	wantLimited(t, []response{get(r, "/t/acme/items"), get(r, "/t/%61cme/items"), get(r, "/t/%61%63me/items")})
	assert.Equal(t, 200, get(r, "/t/a%2Fb/items").status, "another tenant, another bucket")
}
