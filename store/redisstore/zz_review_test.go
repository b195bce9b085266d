package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// docs/stores/redis.md: "A call returns when its context ends, by deadline
// or cancel, whatever the client's settings ... The other calls of the
// store keep the same promise". ApplyBatch and CheckServer are sent on
// their caller's goroutine: from a server that stopped answering, they
// return only when go-redis's read timeout passes (3 s by default; never,
// on this client, which has none), not when their context ends. The
// server is let go after 5 s whatever happens; each call must have
// returned before.
func TestReviewStalledServerApplyBatchAndCheckServer(t *testing.T) {
	p := newStallProxy(t)
	c := redis.NewClient(&redis.Options{Addr: p.addr(), ReadTimeout: -1})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.unstall)
	store := newStore(c, uniquePrefix(t, client(t)))
	ctx := context.Background()
	p0 := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: 60_000, Capacity: 10}
	op := func() *driver.Op {
		return &driver.Op{Mode: driver.ModeLimit, Now: 1_700_000_000_000, Items: []driver.Item{
			{Name: "l", Key: "k", Count: 1, Shards: []driver.Shard{{Index: 0, Params: p0}}}}}
	}
	require.NoError(t, store.ApplyBatch(ctx, []*driver.Op{op()}, [][]driver.Decision{make([]driver.Decision, 1)}))

	for _, name := range []string{"CheckServer", "ApplyBatch"} {
		p.stall()
		release := time.AfterFunc(5*time.Second, p.unstall)
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		var err error
		switch name {
		case "ApplyBatch":
			err = store.ApplyBatch(cctx, []*driver.Op{op()}, [][]driver.Decision{make([]driver.Decision, 1)})
		case "CheckServer":
			_, err = store.CheckServer(cctx)
		}
		stalled := p.stalled.Load()
		cancel()
		release.Stop()
		p.unstall()
		require.True(t, stalled, "%s returned only once the server answered again (err %v)", name, err)
		require.ErrorIs(t, err, context.DeadlineExceeded, "%s on a stalled server", name)
	}
}
