package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A caller whose clock lags the record's (the clock stepped back, or
// another process, its clock ahead, wrote the record) is told, for a token
// bucket as for a fixed window, when the record will be full again: its
// refill starts at the record's time, not at the caller's now. A token
// bucket of 1 a second, capacity 1 (2 and 2 over two shards), drained at
// t0+10s; the clock steps back to t0: the call is refused for 11 s, and
// the bucket is full 11 s on, not 1 s on (ResetAfter was 1 s, shorter
// than the RetryAfter of the same answer).
func TestTokenBucketResetAfterOnALaggingClock(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  ratelimit.Config
		opts []ratelimit.CallOption
	}{
		{"bound", ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}, nil},
		{"inline", ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}, []ratelimit.CallOption{
			ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second})}},
		{"sharded", ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Second, Shards: 2}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock := newMock()
			lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{"x": tc.cfg}, ratelimit.WithClock(mock)))
			mock.Set(t0.Add(10 * time.Second))
			res, err := lim.Limit(ctx, "x", "k", append(tc.opts, ratelimit.Count(tc.cfg.Rate))...)
			require.NoError(t, err)
			require.True(t, res.OK)
			assert.Equal(t, time.Second, res.ResetAfter)

			mock.Set(t0)
			res, err = lim.Limit(ctx, "x", "k", tc.opts...)
			require.NoError(t, err)
			require.False(t, res.OK)
			if tc.cfg.Shards == 0 {
				assert.Equal(t, 11*time.Second, res.RetryAfter)
			} else {
				assert.Equal(t, 10500*time.Millisecond, res.RetryAfter, "half a token from each shard")
			}
			assert.Equal(t, 11*time.Second, res.ResetAfter, "full at the record's time plus its refill")

			mock.Set(t0.Add(11*time.Second - time.Millisecond))
			st, err := lim.Value(ctx, "x", "k")
			require.NoError(t, err)
			assert.Less(t, st.Remaining, st.Capacity, "not full a millisecond before")
		})
	}
}
