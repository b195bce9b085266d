package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

// testShardedReservationOfZero checks that a reservation of 0 on a
// sharded limit waits for the debt before it, as on one record: 4 a
// second over 2 shards, each left owing 2 by four reservations of 2, pay
// their debts at 1 s, when a plain call of 0 is granted again and the job
// of 0 may run; while a shard is clear, it runs at once.
func testShardedReservationOfZero(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	for _, cfg := range []ratelimit.Config{
		{Kind: ratelimit.FixedWindow, Rate: 4, Period: time.Second, Shards: 2, Start: epoch},
		{Kind: ratelimit.TokenBucket, Rate: 4, Period: time.Second, Shards: 2},
	} {
		t.Run(cfg.Kind.String(), func(t *testing.T) {
			lim, err := ratelimit.New(newStore(t), ratelimit.Limits{"z": cfg}, ratelimit.WithClock(newMock(epoch)))
			require.NoError(t, err)
			for i := range 4 {
				r, err := lim.Reserve(ctx, "z", "k", ratelimit.Count(2))
				require.NoError(t, err)
				require.True(t, r.OK())
				zero, err := lim.Reserve(ctx, "z", "k", ratelimit.Count(0))
				require.NoError(t, err)
				require.True(t, zero.OK())
				res, err := lim.Check(ctx, "z", "k", ratelimit.Count(0))
				require.NoError(t, err)
				if i < 3 {
					// A shard is clear: the job of 0 runs now.
					require.Equal(t, epoch, zero.Time(), "after %d reservations of 2", i+1)
					require.True(t, res.OK)
					continue
				}
				require.Equal(t, epoch.Add(time.Second), zero.Time(), "the job of 0 waits for the debt of both shards, paid at 1 s")
				require.False(t, res.OK)
				require.Equal(t, time.Second, res.RetryAfter)
			}
		})
	}
}
