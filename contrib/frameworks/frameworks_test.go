package frameworks_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newMiddleware returns a middleware of two requests a minute per key.
func newMiddleware(t *testing.T, opts ...httplimit.Option) *httplimit.Middleware {
	t.Helper()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"api": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute},
	}, ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	mw, err := httplimit.New(lim, []string{"api"}, opts...)
	require.NoError(t, err)
	return mw
}

// hello answers 200 "hello"; reached counts the requests it served.
func hello(reached *int) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		*reached++
		_, _ = w.Write([]byte("hello"))
	}
}

type response struct {
	status     int
	body       string
	rateLimit  string
	retryAfter string
}

func get(h http.Handler, target string, header ...string) response {
	r := httptest.NewRequest(http.MethodGet, target, nil)
	r.RemoteAddr = "192.0.2.10:5555"
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return response{status: w.Code, body: w.Body.String(), rateLimit: w.Header().Get("RateLimit"), retryAfter: w.Header().Get("Retry-After")}
}

// wantLimited checks the answers to three requests of one key: two served,
// the third refused by the middleware with its headers.
func wantLimited(t *testing.T, got []response) {
	t.Helper()
	require.Len(t, got, 3)
	assert.Equal(t, response{200, "hello", `"api";r=1;t=30`, ""}, got[0])
	assert.Equal(t, response{200, "hello", `"api";r=0;t=30`, ""}, got[1])
	assert.Equal(t, response{429, "rate limit exceeded\n", `"api";r=0;t=30`, "30"}, got[2])
}
