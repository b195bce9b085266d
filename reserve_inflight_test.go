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

// endingStore ends the caller's context while its next op is in the
// store (cancel, once armed), and then decides the op (apply) or fails it
// with the context's error without deciding it.
type endingStore struct {
	ratelimit.Store
	cancel atomic.Pointer[context.CancelFunc]
	apply  bool
}

func (s *endingStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if c := s.cancel.Swap(nil); c != nil {
		(*c)()
		if !s.apply {
			return ctx.Err()
		}
		return s.Store.Apply(context.WithoutCancel(ctx), op, out)
	}
	return s.Store.Apply(ctx, op, out)
}

// A Reserve whose context ends while the store call is on its way: a
// store that answers the charge returns the Reservation, which holds the
// tokens and hands them back (Cancel, or a Wait on the ended context); a
// store that fails with the context's error returns no Reservation, and
// the Limiter hands nothing back, since it cannot know whether the store
// took the charge: a refund of a charge never taken would grant tokens
// the limit never had (docs/reservations.md).
func TestReserveWhoseContextEndsInTheStore(t *testing.T) {
	for _, apply := range []bool{true, false} {
		store := &endingStore{Store: must(memstore.New()), apply: apply}
		lim := must(ratelimit.New(store, ratelimit.Limits{
			"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
		}, ratelimit.WithClock(newMock())))
		ctx, cancel := context.WithCancel(context.Background())
		store.cancel.Store(&cancel)
		r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
		st, verr := lim.Value(context.Background(), "jobs", "k")
		require.NoError(t, verr)
		if !apply {
			require.ErrorIs(t, err, context.Canceled)
			assert.Nil(t, r)
			assert.Equal(t, 10.0, st.Remaining, "not charged, and nothing handed back that was not")
			continue
		}
		require.NoError(t, err, "the store answered: the Reservation is the caller's")
		require.True(t, r.OK())
		assert.Equal(t, 6.0, st.Remaining)
		err = r.Wait(ctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.ErrorContains(t, err, "handed back")
		st, err = lim.Value(context.Background(), "jobs", "k")
		require.NoError(t, err)
		assert.Equal(t, 10.0, st.Remaining, "handed back by the Wait that gave up")
	}
}
