package frameworks_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	"github.com/labstack/echo/v5"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// downStore fails every call, as an unreachable server would.
type downStore struct{}

var errDown = errors.New("connection refused")

func (downStore) Apply(context.Context, *driver.Op, []driver.Decision) error { return errDown }
func (downStore) Load(context.Context, []driver.RecordID, []driver.Record) error {
	return errDown
}
func (downStore) Delete(context.Context, []driver.RecordID) error { return errDown }

// A store that cannot answer is decided by the limit's failure policy
// behind every framework as behind net/http: a limit that fails closed
// answers 503 with Retry-After, and no handler after it runs; one that
// fails open lets the request through, without a RateLimit field it
// cannot know. Neither is a pass of a closed limit, a 500, or a 429.
func TestStoreFailureBehindFrameworks(t *testing.T) {
	gin.SetMode(gin.TestMode)
	lim, err := ratelimit.New(downStore{}, ratelimit.Limits{
		"closed": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute},
		"open":   {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute, FailOpen: true},
	}, ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	routers := map[string]func(mw *httplimit.Middleware, h http.HandlerFunc) http.Handler{
		"chi": func(mw *httplimit.Middleware, h http.HandlerFunc) http.Handler {
			r := chi.NewRouter()
			r.Use(mw.Wrap)
			r.Get("/t/{tenant}/items", h)
			return r
		},
		"echo": func(mw *httplimit.Middleware, h http.HandlerFunc) http.Handler {
			e := echo.New()
			e.Use(echo.WrapMiddleware(mw.Wrap))
			e.GET("/t/:tenant/items", echo.WrapHandler(h))
			return e
		},
		"gin": func(mw *httplimit.Middleware, h http.HandlerFunc) http.Handler {
			r := gin.New()
			r.Use(ginLimit(mw))
			r.GET("/t/:tenant/items", gin.WrapF(h))
			return r
		},
	}
	for name, router := range routers {
		t.Run(name, func(t *testing.T) {
			for _, limit := range []string{"closed", "open"} {
				mw, err := httplimit.New(lim, []string{limit})
				require.NoError(t, err)
				var reached int
				got := get(router(mw, hello(&reached)), "/t/acme/items")
				if limit == "closed" {
					assert.Equal(t, http.StatusServiceUnavailable, got.status, limit)
					assert.NotEmpty(t, got.retryAfter, limit)
					assert.Empty(t, got.rateLimit, limit)
					assert.Equal(t, 0, reached, limit)
				} else {
					assert.Equal(t, response{200, "hello", "", ""}, got, limit)
					assert.Equal(t, 1, reached, limit)
				}
			}
		})
	}
}
