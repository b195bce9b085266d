package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/require"
)

// tenantError is a KeyFunc's or CostFunc's error type whose Error reads
// its fields.
type tenantError struct{ tenant string }

func (e *tenantError) Error() string { return "no such tenant " + e.tenant }

// wrapError is an error type that wraps another, whose Unwrap reads its
// field.
type wrapError struct{ err error }

func (e *wrapError) Error() string { return "wrapped" }
func (e *wrapError) Unwrap() error { return e.err }

// A KeyFunc or CostFunc that returns a nil pointer as its error (a typed
// nil, not nil: a common bug) is answered 500 and logged as one that
// panicked (ErrFuncPanicked). Its error's Error (or Unwrap) panicked
// outside the recovery of the function's call, as the request was logged
// or its status chosen: net/http dropped the connection, with no answer
// and no record of the middleware's.
func TestTypedNilErrorIsAServerError(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}}, nil)
	var log logged
	var te *tenantError
	var we *wrapError
	mw := must(httplimit.New(lim, []string{"api"}, httplimit.WithLogger(log.logger()),
		httplimit.WithKey(func(r *http.Request) (string, error) {
			switch r.Header.Get("X-Key-Nil") {
			case "text":
				return "", te
			case "unwrap":
				return "k", we
			}
			return "k", nil
		}),
		httplimit.WithCost(func(r *http.Request) (float64, error) {
			switch r.Header.Get("X-Cost-Nil") {
			case "text":
				return 0, te
			case "unwrap":
				return 0, we
			}
			return 1, nil
		})))
	h := mw.Wrap(ok)
	for _, hdr := range [][2]string{{"X-Key-Nil", "text"}, {"X-Key-Nil", "unwrap"}, {"X-Cost-Nil", "text"}, {"X-Cost-Nil", "unwrap"}} {
		log.buf.Reset()
		var w *httptest.ResponseRecorder
		require.NotPanics(t, func() { w = serve(h, "192.0.2.1:1", hdr[0], hdr[1]) }, hdr)
		require.Equal(t, http.StatusInternalServerError, w.Code, hdr)
		require.Equal(t, "Internal Server Error\n", w.Body.String(), hdr)
		recs := log.records(t)
		require.Len(t, recs, 1, hdr)
		require.Equal(t, "ERROR", recs[0]["level"], hdr)
		require.Contains(t, recs[0]["error"], "panicked", hdr)
		require.Contains(t, recs[0]["error"], "a nil pointer returned as an error", hdr)
	}

	// The error handler gets an error matching ErrFuncPanicked, which it
	// can read.
	var handled error
	mw = must(httplimit.New(lim, []string{"api"}, httplimit.WithLogger(log.logger()),
		httplimit.WithKey(func(*http.Request) (string, error) { return "", te }),
		httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
			handled = err
			w.WriteHeader(http.StatusInternalServerError)
		})))
	require.NotPanics(t, func() { serve(mw.Wrap(ok), "192.0.2.1:1") })
	require.ErrorIs(t, handled, httplimit.ErrFuncPanicked)
	require.False(t, errors.Is(handled, httplimit.ErrNoKey))
}
