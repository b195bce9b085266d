package ratelimit_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deadlineStore records the deadline of every Apply made while watch is
// set.
type deadlineStore struct {
	ratelimit.Store
	watch     atomic.Bool
	deadlines []time.Time // the zero time: none
}

func (s *deadlineStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if s.watch.Load() {
		dl, _ := ctx.Deadline()
		s.deadlines = append(s.deadlines, dl)
	}
	return s.Store.Apply(ctx, op, out)
}

// The tokens that an Observer's panic during Reserve hands back go back
// within the refund timeout (WithRefundTimeout), as Wait's do: they went
// on a context without any deadline, so that a store that did not answer
// held the panicking goroutine for good, its panic never reaching anyone.
func TestObserverPanicHandBackIsBounded(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := &deadlineStore{Store: must(memstore.New())}
	obs := ratelimit.ObserverFunc(func(context.Context, ratelimit.Event) {
		store.watch.Store(true) // the next Apply is the hand-back
		panic("observer boom")
	})
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour},
	}, ratelimit.WithClock(mock), ratelimit.WithObserver(obs), ratelimit.WithRefundTimeout(3*time.Second))
	require.NoError(t, err)
	require.PanicsWithValue(t, "observer boom", func() { _, _ = lim.Reserve(ctx, "jobs", "k") })
	require.Len(t, store.deadlines, 1, "one hand-back")
	assert.Equal(t, mock.Now().Add(3*time.Second), store.deadlines[0], "the hand-back's deadline")
}

// errorLog is a slog handler that passes every record at error level to
// a channel, its message and its err attribute.
type errorLog chan string

func (e errorLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (e errorLog) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			msg += ": " + a.Value.String()
		}
		return true
	})
	e <- msg
	return nil
}
func (e errorLog) WithAttrs([]slog.Attr) slog.Handler { return e }
func (e errorLog) WithGroup(string) slog.Handler      { return e }

// With WithRefundTimeout(0), the tokens that an Observer's panic during
// Reserve hands back go back within the caller's deadline, if one is
// left, and are not sent without one: 0 gives no time past the moment the
// Reserve gave up, and a context without a deadline leaves none. The
// store is not asked (it would be handed a context already ended), and
// the log says why the tokens stay spent: it said only that the context's
// deadline had passed, of a caller who had given none.
func TestObserverPanicHandBackWithRefundTimeout0(t *testing.T) {
	for _, deadline := range []bool{false, true} {
		t.Run(map[bool]string{false: "no deadline", true: "a deadline left"}[deadline], func(t *testing.T) {
			mock := newMock()
			store := &deadlineStore{Store: must(memstore.New())}
			panics := atomic.Bool{}
			panics.Store(true)
			obs := ratelimit.ObserverFunc(func(context.Context, ratelimit.Event) {
				if panics.Load() {
					store.watch.Store(true) // the next Apply is the hand-back
					panic("observer boom")
				}
			})
			logged := make(errorLog, 4)
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"jobs": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour},
			}, ratelimit.WithClock(mock), ratelimit.WithObserver(obs), ratelimit.WithRefundTimeout(0),
				ratelimit.WithLogger(slog.New(logged)))
			require.NoError(t, err)
			ctx := context.Background()
			if deadline {
				var cancel context.CancelFunc
				ctx, cancel = mock.WithTimeout(ctx, time.Minute)
				defer cancel()
			}
			require.PanicsWithValue(t, "observer boom", func() { _, _ = lim.Reserve(ctx, "jobs", "k") })
			panics.Store(false)
			store.watch.Store(false)
			res, err := lim.Check(context.Background(), "jobs", "k")
			require.NoError(t, err)
			if deadline {
				require.Len(t, store.deadlines, 1, "one hand-back")
				assert.Equal(t, mock.Now().Add(time.Minute), store.deadlines[0], "the hand-back's deadline: the caller's")
				require.True(t, res.OK, "the token is back")
				require.Empty(t, logged)
				return
			}
			require.Empty(t, store.deadlines, "no hand-back sent")
			require.False(t, res.OK, "the token stays spent")
			require.Equal(t, "ratelimit: the Observer panicked as it was told of a reservation, whose tokens could not be handed back: ratelimit: cancel reservation of limit \"jobs\": not sent: the context has no deadline left, and the refund timeout (WithRefundTimeout) is 0", <-logged)
		})
	}
}
