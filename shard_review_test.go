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

// The advice of a sharded limit's ErrInvalidCount admits the count: a
// Limiter configured as it says grants a call of that count from fresh
// records. A count above one shard's worth of the whole Capacity (Capacity
// 10 over 2 shards, count 12) was told to "use one shard", which holds
// Capacity, 10, and refuses it the same way.
func TestShardedCountAdviceAdmitsTheCount(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		cfg   ratelimit.Config
		count float64
	}{
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Shards: 2}, 12},
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Shards: 4}, 6},
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Shards: 4}, 15},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, Shards: 4, MaxReserved: 8}, 25},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, Shards: 4}, ratelimit.MaxTokens},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, Shards: 8}, 6e14},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: ratelimit.MaxTokens, Period: time.Second, Shards: 1024}, 9e14},
	} {
		t.Run(fmt.Sprintf("%d shards, count %v", tc.cfg.Shards, tc.count), func(t *testing.T) {
			lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": tc.cfg}))
			_, err := lim.Limit(ctx, "l", "k", ratelimit.Count(tc.count))
			require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
			msg := err.Error()
			// Every config the message suggests grants the call.
			var suggested []ratelimit.Config
			var shards int
			var capacity float64
			if _, e := fmt.Sscanf(afterLast(msg, "use at most "), "%d shards", &shards); e == nil {
				c := tc.cfg
				c.Shards = shards
				suggested = append(suggested, c)
			}
			if _, e := fmt.Sscanf(afterLast(msg, "raise Capacity to "), "%g", &capacity); e == nil {
				c := tc.cfg
				c.Capacity = capacity
				suggested = append(suggested, c)
			}
			if _, e := fmt.Sscanf(afterLast(msg, "use 2 shards with Capacity "), "%g", &capacity); e == nil {
				c := tc.cfg
				c.Shards, c.Capacity = 2, capacity
				suggested = append(suggested, c)
			}
			require.NotContains(t, msg, "use one shard", "one shard holds no more than Capacity, less than the count: %s", msg)
			require.Contains(t, msg, "split the call", "%s", msg)
			for _, c := range suggested {
				l := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": c}, ratelimit.WithRand(rand.NewPCG(1, 1))))
				res, err := l.Limit(ctx, "l", "k", ratelimit.Count(tc.count))
				require.NoError(t, err, "%s: as suggested, %+v", msg, c)
				require.True(t, res.OK, "%s: as suggested, %+v", msg, c)
			}
		})
	}
}

// afterLast returns what follows the last sub in s, or "" without one.
func afterLast(s, sub string) string {
	for i := len(s) - len(sub); i >= 0; i-- {
		if s[i:i+len(sub)] == sub {
			return s[i+len(sub):]
		}
	}
	return ""
}
