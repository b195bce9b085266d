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
// fails so; a call after Close still fails so. A Limiter over zero (New
// refuses a nil pointer) must return that error from its calls. A store
// calls it in a few lines, without a server:
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
	if isnil.Is(zero) {
		return // New refuses it with ratelimit.ErrInvalidOption
	}
	lim, err := ratelimit.New(zero, ratelimit.Limits{"z": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 10}},
		ratelimit.WithClock(newMock(epoch)))
	require.NoError(t, err, "New over %T %s: its calls fail, not New", zero, zeroText(zero))
	ctx := context.Background()
	limiter := []call{
		{"Limiter.Limit", func(ctx context.Context, _ ratelimit.Store) error {
			_, err := lim.Limit(ctx, "z", "k")
			return err
		}},
		{"Limiter.Value", func(ctx context.Context, _ ratelimit.Store) error {
			_, err := lim.Value(ctx, "z", "k")
			return err
		}},
		{"Limiter.Reset", func(ctx context.Context, _ ratelimit.Store) error {
			return lim.Reset(ctx, "z", "k")
		}},
	}
	for _, c := range limiter {
		err := callSafely(t, c, ctx, zero)
		require.ErrorIs(t, err, driver.ErrZeroStore, "%s over %T %s", c.name, zero, zeroText(zero))
	}
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
