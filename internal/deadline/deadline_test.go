package deadline_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit/internal/deadline"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stuck is a context with a deadline that never ends at it: the context
// of a batch whose callers are all still there.
type stuck struct {
	context.Context
	deadline time.Time
}

func (c stuck) Deadline() (time.Time, bool) { return c.deadline, true }

// ended is a context that has ended, with a deadline it reports.
func ended(t *testing.T, dl time.Time) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), dl)
	cancel()
	t.Cleanup(cancel)
	return ctx
}

// Of tells a deadline ahead of the wall clock, and its time left, from
// one the wall clock is past, and of these one whose context has ended
// from one whose context has not: a mock's, or one whose timer is due.
func TestOf(t *testing.T) {
	mock := clock.NewMock() // 1970: years before the wall clock
	mockCtx, cancel := mock.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	ahead := clock.NewMock()
	ahead.Set(time.Now().Add(24 * time.Hour)) // a mock ahead of the wall clock reads as the wall's
	aheadCtx, cancel := ahead.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	wall, cancel := context.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	canceled, cancel := context.WithTimeout(context.Background(), time.Hour)
	cancel()
	noDeadline, cancel := context.WithCancel(context.Background())
	cancel()
	never := time.Unix(1<<62, 0)

	for _, tc := range []struct {
		name     string
		ctx      context.Context
		want     deadline.State
		min, max time.Duration // the time left
	}{
		{"no deadline", context.Background(), deadline.None, 0, 0},
		{"no deadline, canceled", noDeadline, deadline.None, 0, 0},
		{"wall clock's, ahead", wall, deadline.Ahead, 59 * time.Minute, time.Hour},
		{"ahead, canceled", canceled, deadline.Ahead, 59 * time.Minute, time.Hour},
		{"centuries away", stuck{context.Background(), never}, deadline.Ahead, time.Until(never) - time.Minute, time.Until(never)},
		{"ahead of the wall clock, a mock's", aheadCtx, deadline.Ahead, 24 * time.Hour, 25 * time.Hour},
		{"past, ended", ended(t, time.Now().Add(-time.Second)), deadline.Met, 0, 0},
		{"past, ended, a mock's", ended(t, time.Unix(0, 0)), deadline.Met, 0, 0},
		{"past, not ended, a mock's", mockCtx, deadline.Unmet, 0, 0},
		{"past, not ended, due", stuck{context.Background(), time.Now()}, deadline.Unmet, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			left, st := deadline.Of(tc.ctx)
			require.Equal(t, tc.want, st)
			assert.GreaterOrEqual(t, left, tc.min, "time left")
			assert.LessOrEqual(t, left, tc.max, "time left")
			assert.Equal(t, st == deadline.Met || st == deadline.Unmet, st.Past(), "Past")
		})
	}
}

// A mock's deadline is unmet until the mock reaches it, then met: the
// wall clock says nothing of when.
func TestOfMockDeadline(t *testing.T) {
	mock := clock.NewMock()
	ctx, cancel := mock.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, st := deadline.Of(ctx)
	require.Equal(t, deadline.Unmet, st)
	mock.Add(59 * time.Second)
	_, st = deadline.Of(ctx)
	require.Equal(t, deadline.Unmet, st, "the mock has not reached it")
	mock.Add(time.Second)
	_, st = deadline.Of(ctx)
	require.Equal(t, deadline.Met, st, "the mock reached it")
}

func TestStateString(t *testing.T) {
	for st, want := range map[deadline.State]string{
		deadline.None: "none", deadline.Ahead: "ahead", deadline.Met: "met", deadline.Unmet: "unmet", 7: "State(7)",
	} {
		assert.Equal(t, want, st.String())
	}
}

// Await returns the error of a context that ends within Lag, at once for
// one that has ended, and nil, after Lag, for one whose deadline is of
// another clock and does not end.
func TestAwait(t *testing.T) {
	require.ErrorIs(t, deadline.Await(ended(t, time.Now().Add(-time.Second))), context.DeadlineExceeded)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	late := stuck{ctx, time.Unix(0, 0)}
	go cancel() // the timer that is due, running a moment later
	require.ErrorIs(t, deadline.Await(late), context.Canceled)

	mock := clock.NewMock()
	mockCtx, cancel := mock.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	start := time.Now()
	assert.NoError(t, deadline.Await(mockCtx), "a mock's deadline does not end by the wall clock")
	assert.GreaterOrEqual(t, time.Since(start), deadline.Lag)
}

// A context whose deadline passed a moment ago, and whose timer runs late
// (a busy machine's), is waited for longer than Lag: its end is its
// caller's deadline. Await gave up after Lag, and a store's timeout at
// that deadline was counted as the store's failure.
func TestAwaitALateTimer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	late := stuck{ctx, time.Now()}
	timer := time.AfterFunc(5*deadline.Lag, cancel)
	t.Cleanup(func() { timer.Stop() })
	require.ErrorIs(t, deadline.Await(late), context.Canceled)
}
