package storetest

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// call is one method of a store, called with ctx on the records of
// errCall's limit, for the error tests.
type call struct {
	name string
	do   func(ctx context.Context, s ratelimit.Store) error
}

// errCalls returns every method of s that takes a context: those of
// Store, and those of the optional interfaces s implements, each on the
// record (e, k) of params p at now, but Load and Delete of missing ones
// and ApplyBatch of two ops; Now and RecordNow only when they answer.
func errCalls(s ratelimit.Store, now int64, p driver.Params) []call {
	calls := storeCalls(s, now, p)
	id := driver.RecordID{Name: "e", Key: "k"}
	if ts, ok := s.(driver.TimeSource); ok {
		if _, err := ts.Now(context.Background()); err == nil {
			calls = append(calls, nowCall)
		}
	}
	if rc, ok := s.(driver.RecordClock); ok {
		if _, err := rc.RecordNow(context.Background(), id); err == nil {
			calls = append(calls, recordNowCall)
		}
	}
	return calls
}

// storeCalls returns the calls of errCalls but Now and RecordNow, which
// it makes none of.
func storeCalls(s ratelimit.Store, now int64, p driver.Params) []call {
	op := func() *driver.Op { return &driver.Op{Now: now, Items: []driver.Item{itemOf("e", "k", 1, p)}} }
	id := driver.RecordID{Name: "e", Key: "k"}
	calls := []call{
		{"Apply", func(ctx context.Context, s ratelimit.Store) error {
			return s.Apply(ctx, op(), make([]driver.Decision, 1))
		}},
		{"Load", func(ctx context.Context, s ratelimit.Store) error {
			return s.Load(ctx, []driver.RecordID{id}, make([]driver.Record, 1))
		}},
		{"Delete", func(ctx context.Context, s ratelimit.Store) error {
			return s.Delete(ctx, []driver.RecordID{{Name: "e", Key: "other"}})
		}},
	}
	if _, ok := s.(driver.BatchApplier); ok {
		calls = append(calls, call{"ApplyBatch", func(ctx context.Context, s ratelimit.Store) error {
			return s.(driver.BatchApplier).ApplyBatch(ctx, []*driver.Op{op(), op()},
				[][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)})
		}})
	}
	if _, ok := s.(driver.Expirer); ok {
		calls = append(calls, call{"DeleteExpired", func(ctx context.Context, s ratelimit.Store) error {
			_, err := s.(driver.Expirer).DeleteExpired(ctx, time.UnixMilli(now).Add(time.Hour))
			return err
		}})
	}
	if _, ok := s.(driver.Binder); ok {
		calls = append(calls, call{"Decide", func(ctx context.Context, s ratelimit.Store) error {
			_, err := s.(driver.Binder).Bind("e", p, func(string) int64 { return 0 }).Decide(ctx, "k", driver.ModeLimit, now, 1, false)
			return err
		}})
	}
	return calls
}

// nowCall and recordNowCall read the time of a driver.TimeSource and of
// a driver.RecordClock, that of the record (e, k).
var (
	nowCall = call{"Now", func(ctx context.Context, s ratelimit.Store) error {
		_, err := s.(driver.TimeSource).Now(ctx)
		return err
	}}
	recordNowCall = call{"RecordNow", func(ctx context.Context, s ratelimit.Store) error {
		_, err := s.(driver.RecordClock).RecordNow(ctx, driver.RecordID{Name: "e", Key: "k"})
		return err
	}}
)

// requireWrapped requires err to match target and to say more than
// target alone: the store and the call it failed, wrapped around it.
func requireWrapped(t *testing.T, err, target error, what string) {
	t.Helper()
	require.ErrorIs(t, err, target, what)
	require.NotEqual(t, target.Error(), err.Error(), "%s: the error %q is bare: wrap it, naming the store and the call", what, err)
}

// testErrors checks that every store gives the errors of one condition the
// same shape (docs/stores.md, "Errors"): a context done before the call,
// by its deadline or its cancel, is the context's error, whatever else is
// wrong with the call, and the call has no effect; an invalid op and an
// out of the wrong length match their sentinels, wrapped, and no context
// error; and a store that can be closed (closes) refuses every call after
// Close with ErrClosed, wrapped, but a call whose context is done, and
// closes again as it closed the first time.
func testErrors(t *testing.T, newStore NewStore) {
	now := epoch.UnixMilli()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	id := driver.RecordID{Name: "e", Key: "k"}
	past, cancelPast := context.WithDeadline(context.Background(), time.Now().Add(-time.Hour))
	defer cancelPast()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()

	t.Run("DeadlineBefore", func(t *testing.T) {
		s := newStore(t)
		charge(t, s, now, "e", p)
		before := loadOne(t, s, p, id, now)
		for _, c := range errCalls(s, now+1, p) {
			err := c.do(past, s)
			require.ErrorIs(t, err, context.DeadlineExceeded, "%s given a context past its deadline", c.name)
			require.NotErrorIs(t, err, context.Canceled, c.name)
		}
		require.Equal(t, before, loadOne(t, s, p, id, now), "a call past its deadline must not have written")
	})
	t.Run("DoneBeforeRefusal", func(t *testing.T) {
		// The context is asked first: a caller that gave up learns that,
		// not what else was wrong with the call.
		s := newStore(t)
		bad := invalidOps(now, p)[0].op
		err := s.Apply(canceled, bad, make([]driver.Decision, len(bad.Items)))
		require.ErrorIs(t, err, context.Canceled, "an invalid op with a canceled context")
		err = s.Apply(canceled, &driver.Op{Now: now, Items: []driver.Item{itemOf("e", "k", 1, p)}}, nil)
		require.ErrorIs(t, err, context.Canceled, "a short out with a canceled context")
		err = s.Load(past, []driver.RecordID{id}, nil)
		require.ErrorIs(t, err, context.DeadlineExceeded, "a short out with a context past its deadline")
		if b, ok := s.(driver.BatchApplier); ok {
			err = b.ApplyBatch(canceled, []*driver.Op{bad}, nil)
			require.ErrorIs(t, err, context.Canceled, "a batch of wrong outs and an invalid op with a canceled context")
		}
	})
	t.Run("Refusals", func(t *testing.T) {
		s := newStore(t)
		bad := invalidOps(now, p)[0].op
		err := s.Apply(context.Background(), bad, make([]driver.Decision, len(bad.Items)))
		requireWrapped(t, err, driver.ErrInvalidOp, "Apply of an invalid op")
		require.False(t, errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, driver.ErrClosed),
			"an invalid op is no context's end and no closed store: %v", err)
		err = s.Apply(context.Background(), &driver.Op{Now: now, Items: []driver.Item{itemOf("e", "k", 1, p)}}, nil)
		requireWrapped(t, err, driver.ErrOutLength, "Apply of a short out")
		err = s.Load(context.Background(), []driver.RecordID{id}, nil)
		requireWrapped(t, err, driver.ErrOutLength, "Load of a short out")
		if b, ok := s.(driver.BatchApplier); ok {
			err = b.ApplyBatch(context.Background(), []*driver.Op{bad}, [][]driver.Decision{make([]driver.Decision, 1)})
			requireWrapped(t, err, driver.ErrInvalidOp, "ApplyBatch of an invalid op")
			err = b.ApplyBatch(context.Background(), []*driver.Op{bad}, nil)
			requireWrapped(t, err, driver.ErrOutLength, "ApplyBatch of no outs")
		}
		if b, ok := s.(driver.Binder); ok {
			q := p
			q.Period = 0
			_, err = b.Bind("e", q, func(string) int64 { return 0 }).Decide(context.Background(), "k", driver.ModeLimit, now, 1, false)
			requireWrapped(t, err, driver.ErrInvalidOp, "Decide of a limit bound with a period of 0")
		}
	})
	if !closes(newStore(t)) {
		return
	}
	t.Run("Closed", func(t *testing.T) {
		s := newStore(t)
		charge(t, s, now, "e", p)
		calls := errCalls(s, now+1, p)
		require.NoError(t, s.(io.Closer).Close())
		for _, c := range calls {
			requireWrapped(t, c.do(context.Background(), s), driver.ErrClosed, c.name+" after Close")
			err := c.do(canceled, s)
			require.ErrorIs(t, err, context.Canceled, "%s after Close, with a canceled context", c.name)
			require.NotErrorIs(t, err, driver.ErrClosed, "%s after Close, with a canceled context: the context's end, not the store's", c.name)
		}
		bad := invalidOps(now, p)[0].op
		err := s.Apply(context.Background(), bad, make([]driver.Decision, len(bad.Items)))
		require.ErrorIs(t, err, driver.ErrClosed, "an invalid op after Close")
		require.NoError(t, s.(io.Closer).Close(), "a second Close does nothing, and returns what the first did")
		require.ErrorIs(t, s.Apply(context.Background(), bad, nil), driver.ErrClosed, "after a second Close")
	})
}

// closes reports whether Close closes s: s is an io.Closer, and so is
// every store it wraps (a wrapper's Unwrap() ratelimit.Store, as
// contrib/otel's), whose Close closes the store it wraps when that is an
// io.Closer, and does nothing otherwise.
func closes(s ratelimit.Store) bool {
	for {
		if _, ok := s.(io.Closer); !ok {
			return false
		}
		w, ok := s.(interface{ Unwrap() ratelimit.Store })
		if !ok {
			return true
		}
		s = w.Unwrap()
	}
}

// FailedOps returns the indexes of the ops that err, the error of an
// ApplyBatch, reports failed on their own, in its order: err must join a
// *driver.OpError for each, as the driver's contract says.
func FailedOps(t testing.TB, err error) []int {
	t.Helper()
	joined, ok := err.(interface{ Unwrap() []error })
	require.True(t, ok, "%v: the errors of the ops that failed, joined", err)
	var failed []int
	for _, e := range joined.Unwrap() {
		var oe *driver.OpError
		require.ErrorAs(t, e, &oe)
		failed = append(failed, oe.Index)
	}
	return failed
}
