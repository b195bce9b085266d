package ratelimit_test

import (
	"context"
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
