package ratelimitotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
)

// errOwnTimeout is the error of a store that bounds its calls itself (a
// client's own timeout), with the caller's context still live.
var errOwnTimeout = fmt.Errorf("store: no answer within its own timeout: %w", context.DeadlineExceeded)

// ctxStore answers every call with the error of its context when that has
// ended, as the stores do, and otherwise with err; with deaf, with err
// always.
type ctxStore struct {
	err  error
	deaf bool
}

func (s ctxStore) fail(ctx context.Context) error {
	if err := ctx.Err(); err != nil && !s.deaf {
		return fmt.Errorf("ctxstore: %w", err)
	}
	return s.err
}

func (s ctxStore) Apply(ctx context.Context, _ *driver.Op, _ []driver.Decision) error {
	return s.fail(ctx)
}
func (s ctxStore) Load(ctx context.Context, _ []driver.RecordID, _ []driver.Record) error {
	return s.fail(ctx)
}
func (s ctxStore) Delete(ctx context.Context, _ []driver.RecordID) error { return s.fail(ctx) }
func (s ctxStore) ApplyBatch(ctx context.Context, _ []*driver.Op, _ [][]driver.Decision) error {
	return s.fail(ctx)
}
func (s ctxStore) DeleteExpired(ctx context.Context, _ time.Time) (int, error) {
	return 0, s.fail(ctx)
}
func (ctxStore) OwnClock() bool                           { return true }
func (s ctxStore) Now(ctx context.Context) (int64, error) { return 0, s.fail(ctx) }

// lateContext is a context whose deadline has passed while its Err does
// not say so yet: its timer is due, and runs a moment later, and a
// client that stops a read at the deadline may return its error before
// the context reports its end. It ends as soon as it is waited on (Done),
// so that no test waits for a timer.
type lateContext struct {
	context.Context
	deadline time.Time
	once     sync.Once
	done     chan struct{}
	ended    atomic.Bool
}

func newLateContext() *lateContext {
	return &lateContext{Context: context.Background(), deadline: time.Now().Add(-time.Second), done: make(chan struct{})}
}

func (c *lateContext) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *lateContext) Done() <-chan struct{} {
	c.once.Do(func() { c.ended.Store(true); close(c.done) })
	return c.done
}

func (c *lateContext) Err() error {
	if c.ended.Load() {
		return context.DeadlineExceeded
	}
	return nil
}

// The span of a store call that failed because its caller's context
// ended, canceled or past its deadline, records the error but keeps the
// status Unset: the caller gave up, and the store did not fail. A store
// that fails of itself, its own timeout included, while the caller
// waits, has status Error; so has one whose failure is not the context's,
// though the context ended meanwhile.
func TestWrapStoreCallerEnded(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	// A deadline on a Limiter's mock clock (its AfterFunc and Cancel
	// bound their calls by it), not yet reached there, though long
	// past by this machine's clock.
	onMock, cancel := clock.NewMock().WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The same on a mock set to this machine's time an hour ago: its
	// deadline has a monotonic reading, as a wall clock's, and was taken
	// for one.
	nowMock := clock.NewMock()
	nowMock.Set(time.Now().Add(-time.Hour))
	onNowMock, cancel := nowMock.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		storeErr error // when the context is live
		deaf     bool  // storeErr even when it is not
		want     codes.Code
		is       error
	}{
		{"canceled", canceled, errStoreDown, false, codes.Unset, context.Canceled},
		{"deadline passed", expired, errStoreDown, false, codes.Unset, context.DeadlineExceeded},
		{"deadline passed, not reported yet", newLateContext(), errOwnTimeout, false, codes.Unset, context.DeadlineExceeded},
		{"store's own timeout", context.Background(), errOwnTimeout, false, codes.Error, context.DeadlineExceeded},
		{"store's own timeout, deadline on a mock clock", onMock, errOwnTimeout, false, codes.Error, context.DeadlineExceeded},
		{"store's own timeout, deadline on a mock set to the wall clock", onNowMock, errOwnTimeout, false, codes.Error, context.DeadlineExceeded},
		{"store down", context.Background(), errStoreDown, false, codes.Error, errStoreDown},
		{"store down, caller canceled", canceled, errStoreDown, true, codes.Error, errStoreDown},
		{"store's own timeout, caller canceled", canceled, errOwnTimeout, true, codes.Error, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans, tp := newTracer(t)
			w := ratelimitotel.WrapStore(ctxStore{err: tc.storeErr, deaf: tc.deaf}, ratelimitotel.WithTracerProvider(tp))
			ids := []driver.RecordID{{Name: "api", Key: secretKey}}
			var errs []error
			errs = append(errs,
				w.Apply(tc.ctx, &driver.Op{}, nil),
				w.(driver.BatchApplier).ApplyBatch(tc.ctx, []*driver.Op{{}}, [][]driver.Decision{nil}),
				w.Load(tc.ctx, ids, make([]driver.Record, 1)),
				w.Delete(tc.ctx, ids))
			_, err := w.(driver.Expirer).DeleteExpired(tc.ctx, time.Now())
			errs = append(errs, err)
			_, err = w.(driver.TimeSource).Now(tc.ctx)
			errs = append(errs, err)
			for i, err := range errs {
				require.ErrorIs(t, err, tc.is, "call %d: the store's error goes back as it is", i)
			}
			got := spans.GetSpans()
			require.Len(t, got, len(errs))
			for _, s := range got {
				assert.Equal(t, tc.want, s.Status.Code, s.Name)
				require.Len(t, s.Events, 1, "%s: the error is recorded whatever its cause", s.Name)
				assert.Equal(t, "exception", s.Events[0].Name, s.Name)
			}
		})
	}
}

// The same through a Limiter's Value, whose call a store answers with
// the caller's context ended: memstore checks the context only as the
// call begins, so that a caller canceling while the store runs is
// simulated by a store that cancels it.
func TestWrapStoreCallerCanceledMemstore(t *testing.T) {
	spans, tp := newTracer(t)
	ctx, cancel := context.WithCancel(context.Background())
	w := ratelimitotel.WrapStore(cancelingStore{Store: must(memstore.New()), cancel: cancel}, ratelimitotel.WithTracerProvider(tp))
	lim, err := ratelimit.New(w, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute}})
	require.NoError(t, err)
	_, err = lim.Value(ctx, "api", secretKey)
	require.ErrorIs(t, err, context.Canceled)
	got := spans.GetSpans()
	require.Len(t, got, 1)
	assert.Equal(t, ratelimitotel.SpanLoad, got[0].Name)
	assert.Equal(t, codes.Unset, got[0].Status.Code)
	require.Len(t, got[0].Events, 1)
}

// cancelingStore cancels its caller's context as a Load begins, as the
// caller would while the store works, and then loads.
type cancelingStore struct {
	ratelimit.Store
	cancel context.CancelFunc
}

func (s cancelingStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	s.cancel()
	if err := s.Store.Load(ctx, ids, out); err != nil {
		return err
	}
	return errors.New("cancelingStore: memstore loaded with its context canceled: the test needs another store")
}
