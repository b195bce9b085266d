package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// codeError is an error as a store may write one: it matches the driver's
// sentinels by its code. Its Error reads nothing, and its Is reads its
// code only for those targets: a nil *codeError can be printed, and
// matched against any other target, and panics given one of them.
type codeError struct{ code int }

func (*codeError) Error() string { return "store failed" }

func (e *codeError) Is(target error) bool {
	switch target {
	case driver.ErrInvalidOp:
		return e.code == 1
	case driver.ErrBadRecord:
		return e.code == 2
	}
	return false
}

// detailError is codeError with its code in a detail it points to: one
// whose detail is nil panics given a driver's sentinel, and is not a nil
// pointer itself.
type detailError struct{ detail *struct{ code int } }

func (*detailError) Error() string { return "store failed" }

func (e *detailError) Is(target error) bool {
	return (target == driver.ErrInvalidOp || target == driver.ErrBadRecord) && e.detail.code != 0
}

// errCallerSentinel is a sentinel of the caller's, which driverError
// matches by reading its field.
var errCallerSentinel = errors.New("caller's sentinel")

// driverError is an error type of the caller's own, as a store may wrap
// one (a driver's error): it reads its field given errCallerSentinel.
type driverError struct{ temporary bool }

func (*driverError) Error() string { return "driver error" }

func (e *driverError) Is(target error) bool { return target == errCallerSentinel && e.temporary }

// errorStore is a memstore whose bound limits' Decide returns the error
// its field holds.
type errorStore struct {
	*memstore.Store
	err error
}

func (s *errorStore) Bind(name string, p driver.Params, phase func(key string) int64) driver.BoundLimit {
	return &errorBound{BoundLimit: s.Store.Bind(name, p, phase), s: s}
}

type errorBound struct {
	driver.BoundLimit
	s *errorStore
}

func (b *errorBound) Decide(context.Context, string, driver.Mode, int64, float64, bool) (driver.Verdict, error) {
	return driver.Verdict{}, b.s.err
}

func (b *errorBound) Store() driver.Store { return b.s }

// A nil pointer returned as an error whose methods panic only for some
// targets, or that the store wrapped, is a store failure too: the
// Limiter's reading of it (errors.Is of driver.ErrInvalidOp in the
// breaker's classification) panicked, as the caller's errors.Is of its
// own sentinel did, since the check read the error with one target that
// nothing matches, and a wrapped nil pointer whose Is reads nothing then.
func TestStoreTypedNilErrorSomeTargets(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}}
	var (
		nilCode   *codeError
		nilDriver *driverError
	)
	cases := []struct {
		name string
		err  error
		typ  string
	}{
		{"Is of driver.ErrInvalidOp", nilCode, "*ratelimit_test.codeError"},
		{"wrapped, Is of driver.ErrInvalidOp", fmt.Errorf("decide: %w", nilCode), "*ratelimit_test.codeError"},
		{"joined, Is of driver.ErrBadRecord", errors.Join(errors.New("one"), fmt.Errorf("two: %w", nilCode)), "*ratelimit_test.codeError"},
		{"not nil, Is of driver.ErrInvalidOp", &detailError{}, "*ratelimit_test.detailError"},
		{"Is of the caller's sentinel", nilDriver, "*ratelimit_test.driverError"},
		{"wrapped, Is of the caller's sentinel", fmt.Errorf("decide: %w", nilDriver), "*ratelimit_test.driverError"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, observed := range []bool{false, true} {
				store := &errorStore{Store: must(memstore.New()), err: c.err}
				opts := []ratelimit.Option{ratelimit.WithClock(newMock()), ratelimit.WithBreaker(0, 0)}
				if observed {
					opts = append(opts, ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) {
						_ = errors.Is(e.Err, errCallerSentinel)
					})))
				}
				lim := must(ratelimit.New(store, limits, opts...))
				var err error
				require.NotPanics(t, func() { _, err = lim.Limit(ctx, "jobs", "k") })
				require.NotPanics(t, func() {
					require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
					require.NotErrorIs(t, err, errCallerSentinel)
					require.NotErrorIs(t, err, driver.ErrInvalidOp)
					require.NotErrorIs(t, err, driver.ErrBadRecord)
				})
				require.Contains(t, err.Error(), c.typ)
				require.Contains(t, err.Error(), "nil pointer returned as an error")
			}
		})
	}

	// An error that is not a nil pointer, whose methods work, goes to the
	// caller as it was: a nil pointer's check does not catch it.
	store := &errorStore{Store: must(memstore.New()), err: fmt.Errorf("decide: %w", &driverError{temporary: true})}
	lim := must(ratelimit.New(store, limits, ratelimit.WithClock(newMock()), ratelimit.WithBreaker(0, 0)))
	_, err := lim.Limit(ctx, "jobs", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.ErrorIs(t, err, errCallerSentinel)
	var ce *driverError
	require.ErrorAs(t, err, &ce)
	require.NotNil(t, ce)
}

// checkNilStore stalls the Apply it is told to stall until its caller's
// context ends, saying so on applied, and returns a nil *nilPtrError from
// every Load: the Limiter's own check of the store reads that.
type checkNilStore struct {
	*memstore.Store
	stall   atomic.Bool
	applied chan struct{}
}

func (s *checkNilStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if s.stall.Load() {
		s.applied <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Apply(ctx, op, out)
}

func (s *checkNilStore) Load(context.Context, []driver.RecordID, []driver.Record) error {
	var err *nilPtrError
	return err
}

// The Limiter's own check of the store, sent when a caller's deadline
// passed, reads a nil pointer returned as an error as a failure, which
// the breaker counts: it opens on it, as on any error of the check. The
// breaker's classification panicked reading it, the check's goroutine
// recovered and logged a panic of the store, and counted nothing.
func TestBreakerCheckTypedNilError(t *testing.T) {
	store := &checkNilStore{Store: must(memstore.New()), applied: make(chan struct{}, 1)}
	store.stall.Store(true)
	mock := newMock()
	lim := must(ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(1, time.Minute)))
	done := make(chan error, 1)
	go func() {
		ctx, cancel := mock.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		_, err := lim.Limit(ctx, "l", "k")
		done <- err
	}()
	awaitOrFail(t, store.applied, "the call in the store")
	mock.Add(time.Millisecond)
	require.ErrorIs(t, awaitOrFail(t, done, "the call in a hurry"), context.DeadlineExceeded)
	for ratelimit.Checking(lim) { // the check's Load answers at once
		runtime.Gosched()
	}
	store.stall.Store(false)
	res, err := lim.Limit(context.Background(), "l", "k")
	var serr *ratelimit.StoreError
	require.ErrorAs(t, err, &serr, "the check failed: the breaker is open")
	require.NoError(t, serr.Err, "the breaker is open: the store is not asked")
	require.True(t, res.Degraded)
}
