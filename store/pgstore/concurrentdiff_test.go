package pgstore_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// Many goroutines at once, their calls gathered into shared statements:
// the store decides them as the pure transition does, in the order its
// statements run (storetest.ConcurrentDifferential); and it does gather
// them, so that the coalesced path is the one checked.
func TestCoalescedDifferential(t *testing.T) {
	pool := newPool(t, testserver.PostgresURL(t), nil)
	var batches, ops []*atomic.Int64
	storetest.ConcurrentDifferential(t, func(t *testing.T, decided func(context.Context)) ratelimit.Store {
		s := newStore(t, pool)
		b, n := pgstore.Observe(s, decided)
		batches, ops = append(batches, b), append(ops, n)
		return s
	}, 3)
	var b, n int64
	for i := range batches {
		b, n = b+batches[i].Load(), n+ops[i].Load()
	}
	t.Logf("%d ops in %d statements", n, b)
	require.Less(t, b, n*3/4, "statements shared by several ops")
}
