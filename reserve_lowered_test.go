package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// A Cancel after the limit's Shards was lowered (and its Rate with it)
// hands back, on a shard the limit still has, what the config in force
// allows, as a Refund of the token by a holder would; only a shard the
// limit no longer has is settled under the reservation's own config.
// Shards 4 of 400 a second (100 each) lowered to 2 of 40 (20 each): a
// reservation of 250 takes one shard's 100 and owes 150 on it; a
// second later, under the config in force, that debt takes eight windows
// to be granted, after the job's time (the second window): nothing comes
// back, as for any refund while reservations may stand behind the job.
// The Cancel judged the shard still in use by the old config whenever the
// other shard drawn was one the limit no longer has, found the debt
// granted by the job's time, and turned the shard from −130 into a full
// one: 150 tokens the limit never granted.
func TestCancelAfterShardsLoweredKeepsTheShardsInForce(t *testing.T) {
	ctx := context.Background()
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 400, Period: time.Second, Start: t0, Shards: 4}
	lowered := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 40, Period: time.Second, Start: t0, Shards: 2}
	found := false
	for i := range 64 {
		mock := newMock()
		lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{"jobs": cfg},
			ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(uint64(i), 5))))
		key := fmt.Sprintf("k%d", i)
		r, err := lim.Reserve(ctx, "jobs", key, ratelimit.Count(250))
		require.NoError(t, err)
		require.True(t, r.OK())
		items := r.Token().Items()
		require.Len(t, items, 2)
		var owing, other ratelimit.TokenItem
		for _, it := range items {
			if it.Amount > 0 {
				owing = it
			} else {
				other = it
			}
		}
		// The case of the defect: the shard that owes is kept, the other
		// drawn is not.
		if owing.Amount != 250 || owing.Shard >= 2 || other.Shard < 2 {
			continue
		}
		found = true
		require.NoError(t, lim.SetLimit("jobs", lowered))
		mock.Add(time.Second)
		before, err := lim.Value(ctx, "jobs", key)
		require.NoError(t, err)
		require.Equal(t, -130.0+20, before.Remaining, "the owing shard at −150 + 20, the other full at 20")
		require.NoError(t, r.Cancel(ctx))
		after, err := lim.Value(ctx, "jobs", key)
		require.NoError(t, err)
		require.Equal(t, before.Remaining, after.Remaining,
			"under the config in force the debt is granted after the job's time: nothing comes back")
	}
	require.True(t, found, "no reservation owed on a kept shard beside a dropped one")
}
