package httplimit_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/require"
)

// discard is a ResponseWriter that keeps its header and drops the rest,
// so that only the middleware's allocations are counted.
type discard struct{ h http.Header }

func (w *discard) Header() http.Header         { return w.h }
func (w *discard) Write(b []byte) (int, error) { return len(b), nil }
func (w *discard) WriteHeader(int)             {}

// decidedRequest returns a handler behind a middleware whose limit grants
// every request, a request of a client, and a writer for it.
func decidedRequest(t testing.TB, opts ...httplimit.Option) (http.Handler, *http.Request, *discard) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.TokenBucket, Rate: 1e9, Period: time.Second}}, nil)
	mw, err := httplimit.New(lim, []string{"api"}, opts...)
	require.NoError(t, err)
	h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r, err := http.NewRequest(http.MethodGet, "/", nil)
	require.NoError(t, err)
	r.RemoteAddr = "192.0.2.1:1234"
	return h, r, &discard{h: http.Header{}}
}

// A decided request allocates 4 times: its key, the RateLimit item, and
// the two header fields' value slices.
func TestDecidedRequestAllocations(t *testing.T) {
	h, r, w := decidedRequest(t)
	allocs := testing.AllocsPerRun(1000, func() {
		clear(w.h)
		h.ServeHTTP(w, r)
	})
	require.LessOrEqual(t, allocs, 4.0)
}

func BenchmarkWrap(b *testing.B) {
	h, r, w := decidedRequest(b)
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		h.ServeHTTP(w, r)
	}
}
