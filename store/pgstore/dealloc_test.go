package pgstore_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// pgx forgets a cached statement that failed, and deallocates it on the
// connection before the next statement it sends there: a batch that failed
// on an op's record leaves its statement to be deallocated before its ops
// go again one by one. A context that ends while that deallocation is
// written fails the op before its statement is sent: it was not decided,
// an *driver.OpError like those after it, not an op that "may have been
// decided and charged", its answer lost, which made the batch's error
// say that any op of it may have been.
func TestContextEndsWhileDeallocating(t *testing.T) {
	var left atomic.Int32
	var end atomic.Pointer[func()]
	b := newResendBatch(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		cfg.ConnConfig.DialFunc = endingDial('C', &left, &end)
	}, "a", "bad", "b")
	require.Error(t, b.s.ApplyBatch(context.Background(), b.ops, b.outs), "its statements prepared")
	ends := endings(t)
	for how, newCtx := range ends {
		ctx, endCtx, want := newCtx()
		end.Store(&endCtx)
		pgstore.SetHooks(b.s, pgstore.Hooks{Resend: func() { left.Store(1) }})
		err := b.s.ApplyBatch(ctx, b.ops, b.outs)
		pgstore.SetHooks(b.s, pgstore.Hooks{})
		require.Zero(t, left.Load(), "%s: the context ended as the deallocation before the first op sent again was written", how)
		require.ErrorIs(t, err, want, how)
		require.NotContains(t, err.Error(), "may have been decided", how)
		require.Equal(t, []int{0, 1, 2}, storetest.FailedOps(t, err), "%s: none was decided (err: %v)", how, err)
		for i, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			require.ErrorIs(t, e, want, "%s: op %d, left out as ctx ended", how, i)
		}
	}
}
