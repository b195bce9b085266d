package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// requireStoreUnavailable checks the error of a settlement, a Reset or a
// Value whose store call failed with cause: a *StoreError naming limit
// "jobs", matching ErrStoreUnavailable and cause, and no other sentinel.
func requireStoreUnavailable(t *testing.T, err, cause error, what string) {
	t.Helper()
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, what)
	require.ErrorIs(t, err, cause, "%s: the store's own error still matches", what)
	var serr *ratelimit.StoreError
	require.ErrorAs(t, err, &serr, what)
	require.Equal(t, "jobs", serr.Name, what)
	require.True(t, serr.Until.IsZero(), what)
	for _, other := range []error{ratelimit.ErrInvalidToken, ratelimit.ErrAlreadySettled, ratelimit.ErrTokenExpired,
		ratelimit.ErrUnknownLimit, ratelimit.ErrReservationUsed, ratelimit.ErrReservationCanceled} {
		require.NotErrorIs(t, err, other, what)
	}
}

// A settlement whose store call fails says so with ErrStoreUnavailable (a
// *StoreError), wrapping the store's error: a worker tells "retry later"
// from every other failure with one errors.Is. Nothing was settled: the
// retry goes through.
func TestSettlementStoreFailureIsStoreUnavailable(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}}
	store := &flakyStore{Store: must(memstore.New())}
	lim := must(ratelimit.New(store, limits, ratelimit.WithClock(newMock())))
	settles := map[string]func(tok *ratelimit.Token, opts ...ratelimit.SettleOption) error{
		"Use":    func(tok *ratelimit.Token, opts ...ratelimit.SettleOption) error { return lim.Use(ctx, tok, opts...) },
		"Refund": func(tok *ratelimit.Token, opts ...ratelimit.SettleOption) error { return lim.Refund(ctx, tok, opts...) },
		"Settle": func(tok *ratelimit.Token, opts ...ratelimit.SettleOption) error {
			return lim.Settle(ctx, tok, 0.5, opts...)
		},
	}
	for name, settle := range settles {
		for _, opts := range [][]ratelimit.SettleOption{nil, {ratelimit.Settler([16]byte{'w'})}} {
			r, err := lim.Reserve(ctx, "jobs", "k-"+name)
			require.NoError(t, err)
			tok := r.Token()
			store.fail.Store(true)
			requireStoreUnavailable(t, settle(tok, opts...), errDown, name)
			store.fail.Store(false)
			require.NoError(t, settle(tok, opts...), "%s: nothing was settled: the retry goes through", name)
		}
	}

	// A Reservation's Cancel, and the use of its Wait, once a token was
	// taken: both go through the store's record of settlements.
	r, err := lim.Reserve(ctx, "jobs", "k-cancel")
	require.NoError(t, err)
	r.Token()
	store.fail.Store(true)
	requireStoreUnavailable(t, r.Cancel(ctx), errDown, "Cancel")
	requireStoreUnavailable(t, r.Wait(ctx), errDown, "Wait")
	store.fail.Store(false)
	require.NoError(t, r.Wait(ctx))
}

// A settlement whose caller's context ended says so, not that the store
// is unavailable: the caller gave up, as for a call of a limit.
func TestSettlementOfAnEndedContextIsNotStoreUnavailable(t *testing.T) {
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}}
	lim := must(ratelimit.New(must(memstore.New()), limits, ratelimit.WithClock(newMock())))
	r, err := lim.Reserve(context.Background(), "jobs", "k")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = lim.Use(ctx, r.Token())
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.NoError(t, lim.Use(context.Background(), r.Token()))
}

// A store whose clock cannot be read fails a settlement as a store
// failure too (ErrStoreUnavailable, and the store's error).
func TestSettlementStoreClockFailureIsStoreUnavailable(t *testing.T) {
	ctx := context.Background()
	store := &failingClockStore{clockStore: clockStore{Store: must(memstore.New()), own: true, now: t0}}
	lim := must(ratelimit.New(store, ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 60, Period: time.Minute}},
		ratelimit.WithClock(newMock())))
	r, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	store.fail = true
	requireStoreUnavailable(t, lim.Refund(ctx, r.Token()), errClock, "Refund")
	store.fail = false
	require.NoError(t, lim.Refund(ctx, r.Token()))
}
