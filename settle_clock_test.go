package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
)

// A token's times are the store's when the store keeps its own clock
// (Decision.Now), and so is the life of its settlement's mark: a token is
// judged expired, or not, by that clock, whatever the Limiter's says.
func TestTokenExpiryOnTheStoresClock(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{"tb": {Kind: ratelimit.TokenBucket, Rate: 60, Period: time.Minute}}
	for _, tc := range []struct {
		name string
		skew time.Duration // the Limiter's clock less the store's
	}{
		{"behind", -time.Hour},
		{"ahead", time.Hour},
		{"agreeing", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock := newMock()
			mock.Add(tc.skew)
			store := &clockStore{Store: must(memstore.New()), own: true, now: t0}
			lim, err := ratelimit.New(store, limits, ratelimit.WithClock(mock))
			require.NoError(t, err)

			// A fresh token settles, however far the Limiter's clock is
			// from the store's.
			r, err := lim.Reserve(ctx, "tb", "k", ratelimit.WithReceipt())
			require.NoError(t, err)
			require.True(t, r.OK())
			require.NoError(t, lim.Use(ctx, r.Token()), "a token settled at once, on the store's clock")

			// A canceled job's token, used once the store's clock has passed
			// its mark's life, must not reach the store: a store that had
			// dropped the mark (a Redis TTL) would take it as a first
			// settlement, and the job would run though it was canceled.
			r, err = lim.Reserve(ctx, "tb", "k2", ratelimit.WithReceipt())
			require.NoError(t, err)
			tok := r.Token()
			require.NoError(t, lim.Refund(ctx, tok))
			store.now = tok.Expires().Add(time.Duration(driver.ExpiryGrace)*time.Millisecond + time.Second)
			err = lim.Use(ctx, tok)
			require.ErrorIs(t, err, ratelimit.ErrTokenExpired, "the token expired on the store's clock")

			// The Limiter's clock past the token's expiry does not expire
			// it while the store's is not.
			store.now = t0
			r, err = lim.Reserve(ctx, "tb", "k3", ratelimit.WithReceipt())
			require.NoError(t, err)
			mock.Set(r.Token().Expires().Add(time.Hour))
			require.NoError(t, lim.Refund(ctx, r.Token()))
		})
	}
}

// A store whose clock cannot be read leaves the token unsettled, with the
// store's error.
func TestTokenSettledWhenTheStoresClockFails(t *testing.T) {
	ctx := context.Background()
	store := &failingClockStore{clockStore: clockStore{Store: must(memstore.New()), own: true, now: t0}}
	lim, err := ratelimit.New(store, ratelimit.Limits{"tb": {Kind: ratelimit.TokenBucket, Rate: 60, Period: time.Minute}},
		ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "tb", "k", ratelimit.WithReceipt())
	require.NoError(t, err)
	store.fail = true
	err = lim.Use(ctx, r.Token())
	require.ErrorIs(t, err, errClock)
	store.fail = false
	require.NoError(t, lim.Use(ctx, r.Token()), "nothing was settled")
}

var errClock = errors.New("the clock cannot be read")

type failingClockStore struct {
	clockStore
	fail bool
}

func (s *failingClockStore) Now(ctx context.Context) (int64, error) {
	if s.fail {
		return 0, errClock
	}
	return s.clockStore.Now(ctx)
}

// On a store that takes the Limiter's time, the Limiter's clock expires a
// token.
func TestTokenExpiryOnTheLimitersClock(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"tb": {Kind: ratelimit.TokenBucket, Rate: 60, Period: time.Minute}},
		ratelimit.WithClock(mock))
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "tb", "k", ratelimit.WithReceipt())
	require.NoError(t, err)
	tok := r.Token()
	mock.Set(tok.Expires())
	require.NoError(t, lim.Refund(ctx, tok), "a token may be settled until its Expires")
	r, err = lim.Reserve(ctx, "tb", "k2", ratelimit.WithReceipt())
	require.NoError(t, err)
	mock.Set(r.Token().Expires().Add(time.Millisecond))
	require.ErrorIs(t, lim.Use(ctx, r.Token()), ratelimit.ErrTokenExpired)
}
