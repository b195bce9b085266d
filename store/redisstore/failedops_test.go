package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestFailedOpsOfAClosedClient: the ops of an ApplyBatch that go-redis
// did not send, its client closed (redis.ErrClosed) or, on a Ring, their
// shard gone under every try, were not decided: the error joins an
// *driver.OpError for each, as the driver's contract says, and matches
// driver.ErrClosed for a closed client. The store's note on the closed
// client wrapped the join ("...: %w: %w"), whose errors were then
// driver.ErrClosed and the join: a caller that lists the ops that failed
// (the joined error's Unwrap() []error) found none.
func TestFailedOpsOfAClosedClient(t *testing.T) {
	ctx := context.Background()
	ops := []*driver.Op{shardedOp("k1"), shardedOp("k2")}
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}

	t.Run("closed client", func(t *testing.T) {
		c := redis.NewClient(client(t).Options())
		s := newStore(c, uniquePrefix(t, client(t)))
		t.Cleanup(func() { s.Close() })
		require.NoError(t, c.Close())
		err := s.ApplyBatch(ctx, ops, outs)
		require.ErrorIs(t, err, driver.ErrClosed)
		require.ErrorContains(t, err, "close the client after the store's last call")
		require.Equal(t, []int{0, 1}, storetest.FailedOps(t, err), "neither op was sent (err: %v)", err)
	})

	t.Run("context ended", func(t *testing.T) {
		// The caller's context ended after the batch was answered, one
		// op failing on its record, the other unsent.
		s := newStore(client(t), uniquePrefix(t, client(t)))
		t.Cleanup(func() { s.Close() })
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		joined := errors.Join(&driver.OpError{Index: 0, Err: fmt.Errorf("redisstore: %w", driver.ErrBadRecord)},
			&driver.OpError{Index: 3, Err: fmt.Errorf("redisstore: %w", redis.ErrPoolTimeout)})
		err := redisstore.CallerError(s, cctx, joined)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, err, driver.ErrBadRecord)
		require.Equal(t, []int{0, 3}, storetest.FailedOps(t, err), "err: %v", err)
	})

	t.Run("ring shard left every try", func(t *testing.T) {
		addrs := [2]string{client(t).Options().Addr, ownServer(t)}
		ring := newLeavingRingOf(t, &redis.RingOptions{MaxRetries: -1}, addrs, "fcall", map[string]string{"a": addrs[0]})
		s := newStore(ring.Ring, uniquePrefix(t, ring.Ring))
		t.Cleanup(func() { s.Close() })
		kb := keyOn(t, s, ring.Ring, addrs[1])
		ring.armed.Store(true)
		err := s.ApplyBatch(ctx, []*driver.Op{shardedOp(kb)}, outs[:1])
		require.False(t, ring.armed.Load(), "the shard left the Ring under the call")
		require.NotErrorIs(t, err, driver.ErrClosed)
		require.ErrorContains(t, err, "left the Ring")
		require.Equal(t, []int{0}, storetest.FailedOps(t, err), "the op was not sent (err: %v)", err)
	})
}
