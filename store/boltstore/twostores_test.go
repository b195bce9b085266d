package boltstore_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
)

func newLimiter(t *testing.T, s *boltstore.Store, limits ratelimit.Limits, mock *clock.Mock) *ratelimit.Limiter {
	t.Helper()
	lim, err := ratelimit.New(s, limits, ratelimit.WithClock(mock))
	require.NoError(t, err)
	return lim
}

// One token settled at once by many goroutines of two Limiters, each on
// its own Store of one bbolt database (the second made by New on the
// first's DB, as another user of the file): one settlement takes effect, and
// the tokens come back at most once.
func TestTokenSettledAtOnceThroughTwoBoltStores(t *testing.T) {
	ctx := context.Background()
	owner := open(t, filepath.Join(t.TempDir(), "limits.db"))
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Shards: 2, MaxReserved: 100}}
	mock := newMock(t0)
	second, err := boltstore.New(owner.DB())
	require.NoError(t, err)
	lims := [2]*ratelimit.Limiter{
		newLimiter(t, owner, limits, mock),
		newLimiter(t, second, limits, mock),
	}
	for round := range 10 {
		r, err := lims[0].Reserve(ctx, "jobs", "k", ratelimit.Count(4))
		require.NoError(t, err)
		require.True(t, r.OK())
		tok, err := ratelimit.ParseToken(r.Token().String())
		require.NoError(t, err)
		before, err := lims[0].Value(ctx, "jobs", "k")
		require.NoError(t, err)
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			wins int
		)
		for g := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lim := lims[g%2]
				var err error
				switch g % 3 {
				case 0:
					err = lim.Use(ctx, tok)
				case 1:
					err = lim.Refund(ctx, tok)
				default:
					err = lim.Settle(ctx, tok, 1)
				}
				if err == nil {
					mu.Lock()
					wins++
					mu.Unlock()
				} else if !errors.Is(err, ratelimit.ErrAlreadySettled) {
					t.Errorf("round %d: %v", round, err)
				}
			}()
		}
		wg.Wait()
		require.Equal(t, 1, wins, "round %d", round)
		after, err := lims[1].Value(ctx, "jobs", "k")
		require.NoError(t, err)
		require.LessOrEqual(t, after.Remaining-before.Remaining, 4.0, "round %d", round)
		require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrAlreadySettled, "round %d", round)
	}
}
