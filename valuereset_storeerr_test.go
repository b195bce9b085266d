package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// loadDeleteDownStore fails every Load and Delete with errDown while fail is set.
type loadDeleteDownStore struct {
	ratelimit.Store
	fail bool
}

func (s *loadDeleteDownStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	if s.fail {
		return errDown
	}
	return s.Store.Load(ctx, ids, out)
}

func (s *loadDeleteDownStore) Delete(ctx context.Context, ids []driver.RecordID) error {
	if s.fail {
		return errDown
	}
	return s.Store.Delete(ctx, ids)
}

// A Reset or a Value whose store call fails says so with
// ErrStoreUnavailable (a *StoreError naming the limit), wrapping the
// store's error, as a settlement does: a caller tells "retry later" from
// a bad name or option with one errors.Is. One whose context ended says
// that instead.
func TestValueAndResetStoreFailureIsStoreUnavailable(t *testing.T) {
	ctx := context.Background()
	store := &loadDeleteDownStore{Store: must(memstore.New())}
	lim := must(ratelimit.New(store, ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}},
		ratelimit.WithClock(newMock())))
	store.fail = true
	_, verr := lim.Value(ctx, "jobs", "k")
	for what, err := range map[string]error{"Reset": lim.Reset(ctx, "jobs", "k"), "Value": verr} {
		requireStoreUnavailable(t, err, errDown, what)
	}
	require.EqualError(t, lim.Reset(ctx, "jobs", "k"), `ratelimit: reset limit "jobs": store: connection refused`)
	require.EqualError(t, verr, `ratelimit: value of limit "jobs": store: connection refused`)

	ended, cancel := context.WithCancel(ctx)
	cancel()
	err := lim.Reset(ended, "jobs", "k")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, errDown)
	require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable, "the caller gave up")

	store.fail = false
	require.NoError(t, lim.Reset(ctx, "jobs", "k"))
	_, err = lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
}
