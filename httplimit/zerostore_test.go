package httplimit_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/require"
)

// zeroStore fails every call as a store its constructor did not make
// does, and does not say so (no driver.ZeroChecker), as a store of
// another module, or one behind a wrapper that hides it, may not.
type zeroStore struct{}

var errZero = fmt.Errorf("teststore: the store is the zero teststore.Store: build it with teststore.New: %w", driver.ErrZeroStore)

func (zeroStore) Apply(context.Context, *driver.Op, []driver.Decision) error     { return errZero }
func (zeroStore) Load(context.Context, []driver.RecordID, []driver.Record) error { return errZero }
func (zeroStore) Delete(context.Context, []driver.RecordID) error                { return errZero }

// A request over a store its constructor did not make is the service's
// error, not a store failure for the policy to decide, nor the client's
// excess: 500, logged at error level, and never let through, though its
// limits fail open; OnStoreFailure is not told.
func TestZeroStoreIsAnInternalError(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{
		"open":   {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute, FailOpen: true},
		"open2":  {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute, FailOpen: true},
		"closed": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute},
	}, zeroStore{})
	for _, names := range [][]string{{"open"}, {"closed"}, {"open", "open2"}, {"open", "closed"}} {
		var logs bytes.Buffer
		served := 0
		next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ })
		mw, err := httplimit.New(lim, names,
			httplimit.OnStoreFailure(func(*http.Request, error) { t.Errorf("%v: OnStoreFailure told of a zero store", names) }),
			httplimit.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		require.NoError(t, err)
		for range 3 {
			w := serve(mw.Wrap(next), "192.0.2.1:1")
			require.Equal(t, http.StatusInternalServerError, w.Code, "%v", names)
			require.Empty(t, w.Header().Get("Retry-After"), "%v", names)
		}
		require.Zero(t, served, "%v: let through", names)
		require.Contains(t, logs.String(), "level=ERROR", "%v", names)
		require.Contains(t, logs.String(), "build it with teststore.New", "%v", names)
	}
}
