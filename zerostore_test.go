package ratelimit_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// unwrapStore is a wrapper with an Unwrap method, as
// ratelimitotel.WrapStore's, and no driver.ZeroChecker of its own.
type unwrapStore struct{ ratelimit.Store }

func (s unwrapStore) Unwrap() ratelimit.Store { return s.Store }

// New refuses a store that its constructor did not make, itself or
// behind a wrapper, with an error matching ErrInvalidOption and
// driver.ErrZeroStore that says which constructor to call. It took it,
// and a Limiter whose limits fail open then granted every call, for as
// long as the process ran, logging a store failure. (Each store's
// TestZeroStore checks its own, storetest.ZeroStore.)
func TestNewRefusesAZeroStore(t *testing.T) {
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true}}
	for _, tt := range []struct {
		store ratelimit.Store
		says  string
	}{
		{&memstore.Store{}, "memstore.New"},
		{unwrapStore{&memstore.Store{}}, "memstore.New"},
		{unwrapStore{unwrapStore{&memstore.Store{}}}, "memstore.New"},
		{unwrapStore{(*memstore.Store)(nil)}, "memstore.New"},
		// A nil pointer is refused as no store: its error matches
		// driver.ErrZeroStore too.
		{(*memstore.Store)(nil), "*memstore.Store(nil)"},
	} {
		lim, err := ratelimit.New(tt.store, limits)
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "%#v", tt.store)
		require.ErrorIs(t, err, driver.ErrZeroStore, "%#v", tt.store)
		require.ErrorContains(t, err, tt.says)
		require.Nil(t, lim)
	}
	// A wrapper of a store that was made, or of nil, or a nil wrapper
	// of its type, are not taken for a zero store.
	_, err := ratelimit.New(unwrapStore{must(memstore.New())}, limits)
	require.NoError(t, err)
	_, err = ratelimit.New(unwrapStore{}, limits)
	require.NoError(t, err, "a wrapper of nil is the wrapper's business")
	_, err = ratelimit.New((*unwrapPtr)(nil), limits)
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	require.NotErrorIs(t, err, driver.ErrZeroStore)
}

// unwrapPtr is a wrapper whose Unwrap panics on a nil pointer.
type unwrapPtr struct{ ratelimit.Store }

func (s *unwrapPtr) Unwrap() ratelimit.Store { return s.Store }

// A store its constructor did not make that does not say so (no
// driver.ZeroChecker: a store of another module, or one behind a wrapper
// with no Unwrap) fails each call with driver.ErrZeroStore. That is no
// outage: the failure policy does not decide the call, which fails, as
// for bad input, and the breaker does not count it. A limit that fails
// open granted every call over such a store, for ever.
func TestZeroStoreErrorIsNoStoreFailure(t *testing.T) {
	ctx := context.Background()
	zero := fmt.Errorf("teststore: Apply: the store is the zero teststore.Store: build it with teststore.New: %w", driver.ErrZeroStore)
	for _, bound := range []bool{false, true} {
		for _, observed := range []bool{false, true} {
			t.Run(fmt.Sprintf("bound=%v/observed=%v", bound, observed), func(t *testing.T) {
				hook, store := hooked(bound)
				var logs bytes.Buffer
				opts := []ratelimit.Option{ratelimit.WithClock(newMock()), ratelimit.WithBreaker(2, time.Hour),
					ratelimit.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))}
				if observed {
					opts = append(opts, ratelimit.WithObserver(ratelimit.ObserverFunc(func(context.Context, ratelimit.Event) {})))
				}
				lim, err := ratelimit.New(store, ratelimit.Limits{
					"open":  {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
					"open2": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
				}, opts...)
				require.NoError(t, err)
				hook.apply = func(context.Context, string) error { return zero }
				hook.load = func(context.Context, string) error { return zero }
				for i := range 5 {
					res, err := lim.Limit(ctx, "open", "k")
					require.ErrorIs(t, err, driver.ErrZeroStore, "call %d", i)
					require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable, "call %d", i)
					require.False(t, res.OK, "call %d: granted by the failure policy", i)
					require.False(t, res.Degraded, "call %d", i)
					res, err = lim.Limit(ctx, "open", "k", ratelimit.Count(2))
					require.ErrorIs(t, err, driver.ErrZeroStore, "call %d", i)
					require.False(t, res.OK, "call %d: granted by the failure policy", i)
					res, err = lim.LimitAll(ctx, "k", []string{"open", "open2"})
					require.ErrorIs(t, err, driver.ErrZeroStore, "call %d", i)
					require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable, "call %d", i)
					require.False(t, res.OK, "call %d: granted by the failure policy", i)
					r, err := lim.Reserve(ctx, "open", "k")
					require.ErrorIs(t, err, driver.ErrZeroStore, "call %d", i)
					require.False(t, r.OK(), "call %d: granted by the failure policy", i)
					_, err = lim.Value(ctx, "open", "k")
					require.ErrorIs(t, err, driver.ErrZeroStore, "call %d", i)
					require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable, "call %d", i)
				}
				require.NotContains(t, logs.String(), "store failed", "counted as a store failure")
				hook.apply, hook.load = nil, nil
				calls := hook.calls.Load()
				res, err := lim.Limit(ctx, "open", "other")
				require.NoError(t, err, "the breaker opened on a zero store's errors")
				require.True(t, res.OK)
				require.False(t, res.Degraded)
				require.Equal(t, calls+1, hook.calls.Load(), "the store was asked")
			})
		}
	}
}

// A settlement through a Limiter whose store its constructor did not
// make, and does not say so, fails with driver.ErrZeroStore, and does not
// say it may have been taken, to be retried: nothing was settled, and
// nothing will be, over that store. It was a *StoreError
// (ErrStoreUnavailable) that said to retry.
func TestZeroStoreSettlementIsNoStoreFailure(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, FailOpen: true}}
	hook := &hookStore{Store: must(memstore.New())}
	lim := must(ratelimit.New(hook, limits, ratelimit.WithClock(newMock())))
	r, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	tok := r.Token()
	require.NotNil(t, tok)
	hook.apply = func(context.Context, string) error {
		return fmt.Errorf("teststore: Apply: the store is the zero teststore.Store: build it with teststore.New: %w", driver.ErrZeroStore)
	}
	for name, settle := range map[string]func() error{
		"Use":    func() error { return lim.Use(ctx, tok) },
		"Refund": func() error { return lim.Refund(ctx, tok) },
		"Settle": func() error { return lim.Settle(ctx, tok, 0.5) },
		"Cancel": func() error { return r.Cancel(ctx) },
	} {
		err := settle()
		require.ErrorIs(t, err, driver.ErrZeroStore, name)
		require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable, name)
		require.NotContains(t, err.Error(), "may have taken", name)
		require.ErrorContains(t, err, "settled nothing", name)
	}
}

// valueCheckStore implements driver.ZeroChecker by a value method, which
// Go cannot call through a nil *valueCheckStore.
type valueCheckStore struct{ ratelimit.Store }

func (valueCheckStore) CheckZero() error { return nil }

// New refuses a nil pointer of a store type whose CheckZero is a value
// method, as it refuses any nil store, with ErrInvalidOption; it panicked
// asking CheckZero of it (driver.CheckZero), as it did behind a wrapper.
func TestNewRefusesANilStoreWithAValueCheckZero(t *testing.T) {
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}}
	for _, store := range []ratelimit.Store{(*valueCheckStore)(nil), unwrapStore{(*valueCheckStore)(nil)}} {
		var err error
		require.NotPanics(t, func() { _, err = ratelimit.New(store, limits) }, "%#v", store)
		if _, wrapped := store.(unwrapStore); !wrapped {
			require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "%#v", store)
		}
		require.NotErrorIs(t, err, driver.ErrZeroStore, "%#v", store)
	}
}

// The error of a Value or a Reset over a store its constructor did not
// make shows the limit's name as a *StoreError does, cut at 256 bytes: a
// name given inline (WithConfig) may be a client's. It showed it whole.
func TestZeroStoreValueErrorCutsTheName(t *testing.T) {
	ctx := context.Background()
	hook := &hookStore{Store: must(memstore.New())}
	lim := must(ratelimit.New(hook, nil, ratelimit.WithClock(newMock())))
	zero := fmt.Errorf("teststore: the store is the zero teststore.Store: build it with teststore.New: %w", driver.ErrZeroStore)
	hook.load = func(context.Context, string) error { return zero }
	name := strings.Repeat("n", 1000)
	cfg := ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second})
	_, err := lim.Value(ctx, name, "k", cfg)
	require.ErrorIs(t, err, driver.ErrZeroStore)
	require.NotContains(t, err.Error(), name)
	require.Contains(t, err.Error(), "(1000 bytes)")
	require.Contains(t, err.Error(), zero.Error())
}
