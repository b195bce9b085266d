package frameworks_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/gin-gonic/gin"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A handler that panics behind the adapter, recovered by gin.Recovery in
// front of it, leaves the adapter whole: the next requests are limited
// and answered as before, none served with another request's context.
func TestGinHandlerPanics(t *testing.T) {
	gin.SetMode(gin.TestMode)
	var reached int
	r := gin.New()
	r.Use(gin.CustomRecoveryWithWriter(nil, func(c *gin.Context, _ any) { c.AbortWithStatus(http.StatusInternalServerError) }))
	r.Use(ginLimit(newMiddleware(t, httplimit.WithKey(httplimit.Header("X-API-Key")))))
	r.GET("/panic", func(*gin.Context) { panic("handler") })
	r.GET("/hello", gin.WrapF(hello(&reached)))

	assert.Equal(t, http.StatusInternalServerError, get(r, "/panic", "X-API-Key", "k1").status)
	var got []response
	for range 2 {
		got = append(got, get(r, "/hello", "X-API-Key", "k1"))
	}
	assert.Equal(t, http.StatusOK, got[0].status, "the panicking request spent one of k1's two")
	assert.Equal(t, http.StatusTooManyRequests, got[1].status)
	assert.Equal(t, "30", got[1].retryAfter)
	assert.Equal(t, http.StatusOK, get(r, "/hello", "X-API-Key", "k2").status)
	assert.Equal(t, 2, reached)
}

// Requests of many keys at once through the adapter (run with -race):
// each is passed or refused by its own key's budget, and a request the
// limits passed reaches the handler with its own context.
func TestGinConcurrent(t *testing.T) {
	gin.SetMode(gin.TestMode)
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"api": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute},
	}, ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(httplimit.PathValue("tenant")))
	require.NoError(t, err)
	var served atomic.Int64
	r := gin.New()
	r.Group("/t/:tenant", ginLimit(mw)).GET("/items", func(c *gin.Context) {
		if c.Param("tenant") != c.Request.PathValue("tenant") {
			t.Errorf("served %q with the request of %q", c.Param("tenant"), c.Request.PathValue("tenant"))
		}
		served.Add(1)
		c.Status(http.StatusOK)
	})
	const tenants, each = 16, 5
	codes := make([][]int, tenants)
	var wg sync.WaitGroup
	for i := range tenants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				req := httptest.NewRequest(http.MethodGet, fmt.Sprintf("/t/tenant%d/items", i), nil)
				w := httptest.NewRecorder()
				r.ServeHTTP(w, req)
				codes[i] = append(codes[i], w.Code)
			}
		}()
	}
	wg.Wait()
	for i, c := range codes {
		assert.Equal(t, []int{200, 200, 429, 429, 429}, c, "tenant%d", i)
	}
	assert.Equal(t, int64(2*tenants), served.Load())
}
