package httplimit_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
	lim, err := ratelimit.New(memstore.New(), ratelimit.Limits{
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
