package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// nilPtrError is an error whose methods read its fields: a nil
// *nilPtrError returned as an error panics in each of them.
type nilPtrError struct {
	msg   string
	cause error
}

func (e *nilPtrError) Error() string { return e.msg }

func (e *nilPtrError) Unwrap() error { return e.cause }

func (e *nilPtrError) Is(target error) bool { return e.msg == fmt.Sprint(target) }

func (e *nilPtrError) As(target any) bool { return e.cause != nil && errors.As(e.cause, target) }

// typedNilStore is a memstore whose method named by fail (Apply, Load,
// Delete, Decide, Now) returns a nil *nilPtrError as its error: a store
// that declared `var err *nilPtrError` and returned it. With own set it
// keeps its own clock (driver.TimeSource), and binds no limit then.
type typedNilStore struct {
	*memstore.Store
	fail atomic.Value // string
	own  bool
}

func (s *typedNilStore) failing(method string) error {
	if m, _ := s.fail.Load().(string); m == method {
		var err *nilPtrError
		return err
	}
	return nil
}

func (s *typedNilStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if err := s.failing("Apply"); err != nil {
		return err
	}
	return s.Store.Apply(ctx, op, out)
}

func (s *typedNilStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	if err := s.failing("Load"); err != nil {
		return err
	}
	return s.Store.Load(ctx, ids, out)
}

func (s *typedNilStore) Delete(ctx context.Context, ids []driver.RecordID) error {
	if err := s.failing("Delete"); err != nil {
		return err
	}
	return s.Store.Delete(ctx, ids)
}

func (s *typedNilStore) OwnClock() bool { return s.own }

func (s *typedNilStore) Now(ctx context.Context) (int64, error) {
	if err := s.failing("Now"); err != nil {
		return 0, err
	}
	return t0.UnixMilli(), nil
}

func (s *typedNilStore) Bind(name string, p driver.Params, phase func(key string) int64) driver.BoundLimit {
	return &typedNilBound{BoundLimit: s.Store.Bind(name, p, phase), s: s}
}

type typedNilBound struct {
	driver.BoundLimit
	s *typedNilStore
}

func (b *typedNilBound) Decide(ctx context.Context, key string, mode driver.Mode, now int64, count float64, reserve bool) (driver.Verdict, error) {
	if err := b.s.failing("Decide"); err != nil {
		return driver.Verdict{}, err
	}
	return b.BoundLimit.Decide(ctx, key, mode, now, count, reserve)
}

func (b *typedNilBound) Store() driver.Store { return b.s }

// requireReadableStoreError checks err, that of a call whose store
// returned a nil *nilPtrError: every method of it and of its chain can
// be called, it is a store failure (ErrStoreUnavailable) and says what
// the store did.
func requireReadableStoreError(t *testing.T, err error, what string) {
	t.Helper()
	require.Error(t, err, what)
	require.NotPanics(t, func() {
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, what)
		require.NotErrorIs(t, err, ratelimit.ErrLimited, what)
		var ne *nilPtrError
		require.False(t, errors.As(err, &ne), what)
		var serr *ratelimit.StoreError
		require.ErrorAs(t, err, &serr, what)
		require.Contains(t, err.Error(), "*ratelimit_test.nilPtrError", what)
		require.Contains(t, err.Error(), "nil pointer returned as an error", what)
		_ = fmt.Sprintf("%v %+v %#v", err, err, err)
	}, what)
}

// A store that returns a nil pointer as its error, whose methods panic on
// it, fails the call as any store failure does: the failure policy
// decides, the breaker counts it, the observer and the caller get an
// error whose every method can be called. The Limiter panicked, in
// errors.Is, or in the caller's or observer's reading of the error.
func TestStoreTypedNilError(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
		"open": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, FailOpen: true},
	}
	newLim := func(t *testing.T, own bool, opts ...ratelimit.Option) (*ratelimit.Limiter, *typedNilStore, *[]ratelimit.Event) {
		store := &typedNilStore{Store: must(memstore.New()), own: own}
		var events []ratelimit.Event
		if opts == nil {
			opts = []ratelimit.Option{ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) {
				events = append(events, e)
				_ = errors.Is(e.Err, ratelimit.ErrStoreUnavailable)
				if e.Err != nil {
					_ = e.Err.Error()
				}
			}))}
		}
		opts = append(opts, ratelimit.WithClock(newMock()), ratelimit.WithBreaker(0, 0))
		return must(ratelimit.New(store, limits, opts...)), store, &events
	}

	calls := []struct {
		name, method string
		own, plain   bool // plain: no observer (the bound fast path)
		call         func(lim *ratelimit.Limiter) error
	}{
		{"Limit bound", "Decide", false, true, func(lim *ratelimit.Limiter) error {
			_, err := lim.Limit(ctx, "jobs", "k")
			return err
		}},
		{"Limit bound, observed", "Decide", false, false, func(lim *ratelimit.Limiter) error {
			_, err := lim.Limit(ctx, "jobs", "k")
			return err
		}},
		{"Limit fail open", "Decide", false, false, func(lim *ratelimit.Limiter) error {
			res, err := lim.Limit(ctx, "open", "k")
			require.True(t, res.OK && res.Degraded)
			return err
		}},
		{"Reserve", "Decide", false, false, func(lim *ratelimit.Limiter) error {
			_, err := lim.Reserve(ctx, "jobs", "k")
			return err
		}},
		{"LimitAll", "Apply", false, false, func(lim *ratelimit.Limiter) error {
			_, err := lim.LimitAll(ctx, "k", []string{"jobs", "open"})
			return err
		}},
		{"Limit own clock", "Apply", true, false, func(lim *ratelimit.Limiter) error {
			_, err := lim.Limit(ctx, "jobs", "k")
			return err
		}},
		{"Value", "Load", false, false, func(lim *ratelimit.Limiter) error {
			_, err := lim.Value(ctx, "jobs", "k")
			return err
		}},
		{"Value own clock", "Now", true, false, func(lim *ratelimit.Limiter) error {
			_, err := lim.Value(ctx, "jobs", "k")
			return err
		}},
		{"Reset", "Delete", false, false, func(lim *ratelimit.Limiter) error {
			return lim.Reset(ctx, "jobs", "k")
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			var opts []ratelimit.Option
			if c.plain {
				opts = []ratelimit.Option{}
			}
			lim, store, events := newLim(t, c.own, opts...)
			store.fail.Store(c.method)
			var err error
			require.NotPanics(t, func() { err = c.call(lim) })
			requireReadableStoreError(t, err, c.name)
			for _, e := range *events {
				require.Equal(t, ratelimit.Degraded, e.Outcome)
				requireReadableStoreError(t, e.Err, c.name+": the observer's")
			}
		})
	}

	// Settlements: Cancel, Refund, Use, Settle and a Wait's use, through
	// Apply, and through the store's clock.
	for _, own := range []bool{false, true} {
		method := "Apply"
		if own {
			method = "Now"
		}
		t.Run("settle "+method, func(t *testing.T) {
			lim, store, _ := newLim(t, own)
			settles := map[string]func(r *ratelimit.Reservation) error{
				"Cancel": func(r *ratelimit.Reservation) error { return r.Cancel(ctx) },
				"Wait":   func(r *ratelimit.Reservation) error { r.Token(); return r.Wait(ctx) },
				"Use":    func(r *ratelimit.Reservation) error { return lim.Use(ctx, r.Token()) },
				"Refund": func(r *ratelimit.Reservation) error { return lim.Refund(ctx, r.Token()) },
				"Settle": func(r *ratelimit.Reservation) error { return lim.Settle(ctx, r.Token(), 0.5) },
			}
			for name, settle := range settles {
				store.fail.Store("")
				r, err := lim.Reserve(ctx, "jobs", "k-"+name)
				require.NoError(t, err)
				r.Token()
				store.fail.Store(method)
				require.NotPanics(t, func() { err = settle(r) }, name)
				requireReadableStoreError(t, err, name)
			}
		})
	}

	// The breaker counts it as a failure: it opens, and its probe, which
	// fails alike, keeps it open.
	t.Run("breaker", func(t *testing.T) {
		mock := newMock()
		store := &typedNilStore{Store: must(memstore.New())}
		lim := must(ratelimit.New(store, limits, ratelimit.WithClock(mock), ratelimit.WithBreaker(2, time.Second)))
		store.fail.Store("Decide")
		for i := range 2 {
			var err error
			require.NotPanics(t, func() { _, err = lim.Limit(ctx, "jobs", "k") })
			requireReadableStoreError(t, err, fmt.Sprint("failure ", i))
		}
		_, err := lim.Limit(ctx, "jobs", "k")
		var serr *ratelimit.StoreError
		require.ErrorAs(t, err, &serr)
		require.NoError(t, serr.Err, "the breaker is open: the store is not asked")
		mock.Add(time.Second)
		require.NotPanics(t, func() { _, err = lim.Limit(ctx, "jobs", "k") }, "the probe")
		requireReadableStoreError(t, err, "the probe")
		_, err = lim.Limit(ctx, "jobs", "k")
		require.ErrorAs(t, err, &serr)
		require.NoError(t, serr.Err, "the probe failed: the breaker is open again")
	})
}
