package ratelimit_test

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/doctest"
	"github.com/ratelimit-go/ratelimit/store/janitor"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// The examples of docs/production.md, word for word, so that the compiler
// checks them: each is the body of a productionDoc function, but its final
// return, and TestProductionDocExamples keeps the two the same. Their
// free names (ctx, lim, apiKey, …) are the functions' parameters.

// expiredDeleted stands for the metric of the janitor's example.
var expiredDeleted interface{ Add(float64) }

func productionDocLimitAll(ctx context.Context, lim *ratelimit.Limiter, apiKey string) error {
	res, err := lim.LimitAll(ctx, apiKey, []string{"perHour", "perMinute"})
	if err != nil && !errors.Is(err, ratelimit.ErrStoreUnavailable) {
		return err // bad input, or the caller's context is done
	}
	for _, part := range res.All {
		log.Printf("%s: ok=%v remaining=%v", part.Name, part.OK, part.Remaining) // each limit's own answer
	}
	if !res.OK {
		return res.Err() // a *ratelimit.LimitError: the limit that refused (res.Name) and its RetryAfter
	}
	return nil
}

func productionDocFailure(ctx context.Context, lim *ratelimit.Limiter, userID string) error {
	res, err := lim.Limit(ctx, "search", userID)
	if err != nil && !errors.Is(err, ratelimit.ErrStoreUnavailable) {
		return err // bad input, or the caller's context is done
	}
	if !res.OK {
		return res.Err() // refused, by the limit or, while the store fails, by its policy
	}
	return nil
}

func productionDocJanitor(store *memstore.Store) error {
	j, err := janitor.New(store, 5*time.Minute,
		janitor.WithObserver(func(r janitor.Result) {
			expiredDeleted.Add(float64(r.Deleted)) // your metric
		}))
	if err != nil {
		return err // a nil store or an interval ≤ 0: errors.Is(err, janitor.ErrInvalid)
	}
	defer j.Close() // before the store's Close
	return nil
}

func productionDocKeyHash(store ratelimit.Store, limits ratelimit.Limits) (*ratelimit.Limiter, error) {
	secret := []byte(os.Getenv("RATELIMIT_KEY_SECRET")) // 32 random bytes, e.g. openssl rand -base64 32
	lim, err := ratelimit.New(store, limits, ratelimit.WithKeyHash(secret))
	return lim, err
}

func productionDocReload(lim *ratelimit.Limiter, path string) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			data, err := os.ReadFile(path)
			if err == nil {
				var limits ratelimit.Limits
				if limits, err = ratelimit.ParseLimits(data); err == nil {
					err = lim.SetLimits(limits)
				}
			}
			if err != nil {
				slog.Error("limits not reloaded; the old ones stay", "err", err)
			}
		}
	}()
}

var _ = []any{productionDocLimitAll, productionDocFailure, productionDocJanitor, productionDocKeyHash, productionDocReload}

// Every Go block of docs/production.md is the body of a productionDoc
// function, and every such body is a block of the page. The LimitAll
// example ranged over res.All with a variable its loop did not use, which
// does not compile.
func TestProductionDocExamples(t *testing.T) {
	require.Equal(t, doctest.Bodies(t, "productionDoc", "production_doc_test.go"), doctest.Blocks(t, filepath.Join("docs", "production.md")),
		"docs/production.md's Go blocks are not the productionDoc functions' bodies")
}

// TestProductionDocDecisions runs the examples of docs/production.md that
// decide a call: each returns an error when the call is refused, by a
// limit or by its failure policy while the store fails, and nil when it is
// allowed, by a limit or by a policy that fails open. The LimitAll example
// dropped every error, a bad limit name's included, and the failure
// example returned nil when refused.
func TestProductionDocDecisions(t *testing.T) {
	ctx := context.Background()
	w := log.Writer()
	log.SetOutput(io.Discard) // the LimitAll example logs each limit's answer
	t.Cleanup(func() { log.SetOutput(w) })
	for _, tc := range []struct {
		name   string
		decide func(*ratelimit.Limiter) error
		limits []string
	}{
		{"LimitAll", func(lim *ratelimit.Limiter) error { return productionDocLimitAll(ctx, lim, "key-1") }, []string{"perHour", "perMinute"}},
		{"Limit", func(lim *ratelimit.Limiter) error { return productionDocFailure(ctx, lim, "user-42") }, []string{"search"}},
	} {
		newLimiter := func(store ratelimit.Store, failOpen bool, names ...string) *ratelimit.Limiter {
			limits := ratelimit.Limits{}
			for _, n := range names {
				limits[n] = ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Hour, FailOpen: failOpen}
			}
			return must(ratelimit.New(store, limits, ratelimit.WithLogger(nil)))
		}

		lim := newLimiter(must(memstore.New()), false, tc.limits...)
		require.NoError(t, tc.decide(lim), tc.name)
		require.NoError(t, tc.decide(lim), tc.name)
		err := tc.decide(lim)
		var limited *ratelimit.LimitError
		require.ErrorAs(t, err, &limited, tc.name)
		require.Contains(t, tc.limits, limited.Name, tc.name)

		store := &flakyStore{Store: must(memstore.New())}
		store.fail.Store(true)
		require.NoError(t, tc.decide(newLimiter(store, true, tc.limits...)), "%s: failing open", tc.name)
		require.ErrorIs(t, tc.decide(newLimiter(store, false, tc.limits...)), ratelimit.ErrLimited, "%s: failing closed", tc.name)

		require.ErrorIs(t, tc.decide(newLimiter(must(memstore.New()), false)), ratelimit.ErrUnknownLimit, "%s: no such limit", tc.name)
	}
}
