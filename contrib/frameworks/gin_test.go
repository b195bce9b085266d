package frameworks_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
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

// ginLimit puts an httplimit middleware in a gin chain: gin has no
// wrapper for net/http middleware. The route's pattern and parameters
// become the request's, as PathValue and the middleware's logs read them;
// a request the middleware refuses is aborted with its response.
func ginLimit(mw *httplimit.Middleware) gin.HandlerFunc {
	// A request's way through the middleware, wrapped once and kept for
	// the next request, so that a request allocates no handler.
	type step struct {
		c      *gin.Context
		passed bool
		h      http.Handler
	}
	steps := sync.Pool{New: func() any {
		s := new(step)
		s.h = mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			s.passed = true
			s.c.Request = r
			s.c.Next()
		}))
		return s
	}}
	return func(c *gin.Context) {
		c.Request.Pattern = c.FullPath()
		for _, p := range c.Params {
			c.Request.SetPathValue(p.Key, p.Value)
		}
		s := steps.Get().(*step)
		s.c, s.passed = c, false
		s.h.ServeHTTP(c.Writer, c.Request)
		passed := s.passed
		s.c = nil // gin reuses its Contexts
		steps.Put(s)
		if !passed {
			c.Abort()
		}
	}
}

func TestGin(t *testing.T) {
	gin.SetMode(gin.TestMode)
	mw := newMiddleware(t)
	var reached int
	r := gin.New()
	r.Use(ginLimit(mw))
	r.GET("/hello", gin.WrapF(hello(&reached)))

	var got []response
	for range 3 {
		got = append(got, get(r, "/hello"))
	}
	wantLimited(t, got)
	assert.Equal(t, 2, reached)
}

func TestGinPathValue(t *testing.T) {
	gin.SetMode(gin.TestMode)
	var reached, after int
	r := gin.New()
	g := r.Group("/t/:tenant", ginLimit(newMiddleware(t, httplimit.WithKey(httplimit.PathValue("tenant")))),
		func(*gin.Context) { after++ })
	g.GET("/items", gin.WrapF(hello(&reached)))

	var got []response
	for range 3 {
		got = append(got, get(r, "/t/acme/items"))
	}
	wantLimited(t, got)
	assert.Equal(t, 200, get(r, "/t/globex/items").status, "another tenant, another bucket")
	assert.Equal(t, 3, reached)
	assert.Equal(t, 3, after, "the handlers after the limit run only for requests it passed")
}

// The adapter allocates nothing of its own for a request the middleware
// passes, beyond the middleware's own allocations: it wrapped a new
// handler, a closure of the request's gin.Context, for each request.
func TestGinAdapterAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops what the adapter keeps in its sync.Pool at random")
	}
	gin.SetMode(gin.TestMode)
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"api": {Kind: ratelimit.TokenBucket, Rate: 1e12, Period: time.Second}, // never refuses
	}, ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	mw, err := httplimit.New(lim, []string{"api"})
	require.NoError(t, err)
	served := func(c *gin.Context) { c.Status(http.StatusOK) }
	bare := gin.New()
	bare.Use(func(c *gin.Context) { c.Next() })
	bare.GET("/hello", served)
	limited := gin.New()
	limited.Use(ginLimit(mw))
	limited.GET("/hello", served)

	req := httptest.NewRequest(http.MethodGet, "/hello", nil)
	req.RemoteAddr = "192.0.2.10:5555"
	w := httptest.NewRecorder()
	allocs := func(h http.Handler) float64 {
		return testing.AllocsPerRun(200, func() {
			r := *req
			clear(w.Header()) // a response of its own: the middleware adds its items to those already set
			h.ServeHTTP(w, &r)
		})
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	middleware := allocs(mw.Wrap(ok)) - allocs(ok)
	assert.Equal(t, allocs(bare)+middleware, allocs(limited), "gin's, and the middleware's")
	assert.Equal(t, http.StatusOK, w.Code)
}

// The adapter in docs/http.md is this file's, word for word.
func TestGinAdapterDocumented(t *testing.T) {
	src, err := os.ReadFile("gin_test.go")
	require.NoError(t, err)
	doc, err := os.ReadFile("../../docs/http.md")
	require.NoError(t, err)
	fn := funcText(t, string(src), "func ginLimit(")
	assert.True(t, strings.Contains(string(doc), fn), "docs/http.md does not hold ginLimit as gin_test.go has it:\n%s", fn)
}

// funcText returns the declaration starting with start, up to its closing
// brace at the start of a line.
func funcText(t *testing.T, src, start string) string {
	t.Helper()
	i := strings.Index(src, start)
	require.GreaterOrEqual(t, i, 0, "%s not found", start)
	end := strings.Index(src[i:], "\n}\n")
	require.GreaterOrEqual(t, end, 0)
	return src[i : i+end+2]
}
