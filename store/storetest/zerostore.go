package storetest

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/isnil"
	"github.com/stretchr/testify/require"
)

// ZeroStore checks a store that its constructor did not make: zero is the
// zero value of the store's type (&mystore.Store{}) or a nil pointer to
// it. Every method of the driver's interfaces that zero implements, and
// Close when it is an io.Closer, must fail with an error matching
// driver.ErrZeroStore, wrapped (naming the store and what to do), rather
// than panic or block, and be given a done context's error before it
// (docs/stores.md, "Errors"); Bind must return a BoundLimit whose Decide
// fails so; a call after Close still fails so. When zero implements
// driver.ZeroChecker, CheckZero must return that error too, and
// ratelimit.New refuse zero with it (and ratelimit.ErrInvalidOption); New
// refuses a nil pointer anyway. A Limiter over zero, where New takes it,
// and over zero behind a wrapper that hides its ZeroChecker, must return
// that error from every call, no failure policy deciding it: a limit
// that fails open grants nothing. A store calls it in a few lines,
// without a server:
//
//	func TestZeroStore(t *testing.T) {
//		storetest.ZeroStore(t, &mystore.Store{})
//		storetest.ZeroStore(t, (*mystore.Store)(nil))
//	}
func ZeroStore(t *testing.T, zero ratelimit.Store) {
	t.Helper()
	now := epoch.UnixMilli()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	calls := zeroCalls(zero, now, p)
	for _, c := range calls {
		err := callSafely(t, c, context.Background(), zero)
		requireWrapped(t, err, driver.ErrZeroStore, fmt.Sprintf("%s of %T %s", c.name, zero, zeroText(zero)))
		err = callSafely(t, c, canceled, zero)
		require.ErrorIs(t, err, context.Canceled, "%s of %T %s, with a canceled context", c.name, zero, zeroText(zero))
	}
	if cl, ok := zero.(io.Closer); ok {
		var err error
		callSafely(t, call{"Close", func(context.Context, ratelimit.Store) error {
			err = cl.Close()
			return err
		}}, context.Background(), zero)
		requireWrapped(t, err, driver.ErrZeroStore, fmt.Sprintf("Close of %T %s", zero, zeroText(zero)))
		for _, c := range calls {
			err := callSafely(t, c, context.Background(), zero)
			requireWrapped(t, err, driver.ErrZeroStore, fmt.Sprintf("%s of %T %s after Close", c.name, zero, zeroText(zero)))
		}
	}
	if _, ok := zero.(driver.ZeroChecker); ok {
		var err error
		callSafely(t, call{"CheckZero", func(context.Context, ratelimit.Store) error {
			err = zero.(driver.ZeroChecker).CheckZero()
			return err
		}}, context.Background(), zero)
		requireWrapped(t, err, driver.ErrZeroStore, fmt.Sprintf("CheckZero of %T %s", zero, zeroText(zero)))
	}
	lim, err := ratelimit.New(zero, zeroLimits, ratelimit.WithClock(newMock(epoch)))
	switch {
	case driver.CheckZero(zero) != nil:
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "New over %T %s, which says it is not made (driver.ZeroChecker)", zero, zeroText(zero))
		require.ErrorIs(t, err, driver.ErrZeroStore, "New over %T %s, which says it is not made (driver.ZeroChecker)", zero, zeroText(zero))
		require.Nil(t, lim)
	case isnil.Is(zero):
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "New over %T %s", zero, zeroText(zero))
	default:
		require.NoError(t, err, "New over %T %s, which does not say it is not made (no driver.ZeroChecker): its calls fail, not New", zero, zeroText(zero))
		zeroLimiter(t, lim, zero)
	}
	// A Limiter over the store with its driver.ZeroChecker hidden, as a
	// store without one, or a wrapper that neither implements it nor has
	// an Unwrap method, is: New takes it, and its calls fail.
	hidden := []ratelimit.Store{hiddenStore{zero}}
	if b, ok := zero.(driver.Binder); ok {
		hidden = append(hidden, hiddenBinder{hiddenStore{zero}, b})
	}
	for _, h := range hidden {
		lim, err := ratelimit.New(h, zeroLimits, ratelimit.WithClock(newMock(epoch)), ratelimit.WithBreaker(1, time.Hour))
		require.NoError(t, err, "New over %T %s in a %T", zero, zeroText(zero), h)
		zeroLimiter(t, lim, zero)
	}
}

// zeroLimits are the limits of the Limiters of ZeroStore: two that fail
// open, which a store its constructor did not make must not let every
// call through (alone, or together in a LimitAll), and one that fails
// closed.
var zeroLimits = ratelimit.Limits{
	"open":   {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 10, FailOpen: true},
	"open2":  {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, FailOpen: true},
	"closed": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 10},
}

// zeroLimiter requires every call of lim, a Limiter over zero (or over
// zero behind a wrapper), to fail with an error matching
// driver.ErrZeroStore, with no grant: no failure policy decides it, a
// fail-open limit's included, so the error matches no
// ratelimit.ErrStoreUnavailable, and the breaker counts none of them (a
// breaker open would answer without the store, and the store's error
// would not be returned).
func zeroLimiter(t *testing.T, lim *ratelimit.Limiter, zero ratelimit.Store) {
	t.Helper()
	for round := range 3 { // past WithBreaker(1, …)'s threshold
		for _, name := range []string{"open", "closed"} {
			calls := []struct {
				name string
				do   func(ctx context.Context) (ratelimit.Result, error)
			}{
				{"Limit", func(ctx context.Context) (ratelimit.Result, error) { return lim.Limit(ctx, name, "k") }},
				{"Limit with Count", func(ctx context.Context) (ratelimit.Result, error) {
					return lim.Limit(ctx, name, "k", ratelimit.Count(2))
				}},
				{"Check", func(ctx context.Context) (ratelimit.Result, error) { return lim.Check(ctx, name, "k") }},
				{"LimitAll", func(ctx context.Context) (ratelimit.Result, error) {
					return lim.LimitAll(ctx, "k", []string{name, "open2"})
				}},
				{"Reserve", func(ctx context.Context) (ratelimit.Result, error) {
					r, err := lim.Reserve(ctx, name, "k")
					return r.Result(), err
				}},
				{"Value", func(ctx context.Context) (ratelimit.Result, error) {
					_, err := lim.Value(ctx, name, "k")
					return ratelimit.Result{}, err
				}},
				{"Reset", func(ctx context.Context) (ratelimit.Result, error) {
					return ratelimit.Result{}, lim.Reset(ctx, name, "k")
				}},
			}
			for _, c := range calls {
				var res ratelimit.Result
				err := callSafely(t, call{"Limiter." + c.name, func(ctx context.Context, _ ratelimit.Store) error {
					var err error
					res, err = c.do(ctx)
					return err
				}}, context.Background(), zero)
				what := fmt.Sprintf("Limiter.%s of limit %q over %T %s (round %d)", c.name, name, zero, zeroText(zero), round)
				require.ErrorIs(t, err, driver.ErrZeroStore, what)
				require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable, what)
				require.False(t, res.OK, what)
				require.False(t, res.Degraded, what)
			}
		}
	}
}

// hiddenStore hides every method of its store but those of
// ratelimit.Store.
type hiddenStore struct{ s ratelimit.Store }

func (h hiddenStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	return h.s.Apply(ctx, op, out)
}

func (h hiddenStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	return h.s.Load(ctx, ids, out)
}

func (h hiddenStore) Delete(ctx context.Context, ids []driver.RecordID) error {
	return h.s.Delete(ctx, ids)
}

// hiddenBinder is a hiddenStore that keeps its store's driver.Binder.
type hiddenBinder struct {
	hiddenStore
	driver.Binder
}

// zeroCalls returns the calls ZeroStore makes of zero: storeCalls', and
// those of a TimeSource and a RecordClock.
func zeroCalls(zero ratelimit.Store, now int64, p driver.Params) []call {
	calls := storeCalls(zero, now, p)
	if _, ok := zero.(driver.TimeSource); ok {
		calls = append(calls, nowCall)
	}
	if _, ok := zero.(driver.RecordClock); ok {
		calls = append(calls, recordNowCall)
	}
	return calls
}

// callSafely makes c on s with ctx, and fails the test, naming c, if it
// panics or has not returned within ten seconds.
func callSafely(t *testing.T, c call, ctx context.Context, s ratelimit.Store) error {
	t.Helper()
	type answer struct {
		err   error
		panic any
	}
	done := make(chan answer, 1)
	go func() {
		var a answer
		defer func() {
			if r := recover(); r != nil {
				a.panic = r
			}
			done <- a
		}()
		a.err = c.do(ctx, s)
	}()
	select {
	case a := <-done:
		if a.panic != nil {
			t.Fatalf("%s of %T %s panicked: %v", c.name, s, zeroText(s), a.panic)
		}
		return a.err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s of %T %s did not return within 10s", c.name, s, zeroText(s))
		return nil
	}
}

// zeroText says which store ZeroStore was given, for its messages.
func zeroText(s ratelimit.Store) string {
	if isnil.Is(s) {
		return "(nil)"
	}
	return "(the zero value)"
}
