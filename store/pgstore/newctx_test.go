package pgstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// A New whose context ends while one of its statements is written (the
// search for the table's schema, the reads of the schema, the wait for
// the install lock; the BEGIN and COMMIT of its transactions and the
// install's script, which pgx sends by the simple protocol, a Query)
// fails with an error that matches the context's, as every other call of
// the store does: pgx answers the connection's timeout alone, which reads
// as the server's failure.
func TestNewContextEndsWhileWriting(t *testing.T) {
	cleanup := newPool(t, testserver.PostgresURL(t), nil)
	ends := endings(t)
	// 'B', a Bind: a statement of arguments, prepared; 'Q', a Query.
	for _, msg := range []byte{'B', 'Q'} {
		var left atomic.Int32
		var end atomic.Pointer[func()]
		cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
		require.NoError(t, err)
		cfg.MaxConns = 1
		cfg.ConnConfig.DialFunc = endingDial(msg, &left, &end)
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		for how, newCtx := range ends {
			how := string(msg) + ", " + how
			// The k-th statement New executes ends its context, until New
			// executes fewer than k.
			for k := int32(1); ; k++ {
				ctx, endCtx, want := newCtx()
				end.Store(&endCtx)
				left.Store(k)
				_, err := pgstore.New(ctx, pool, pgstore.WithTable(uniqueTable(t, cleanup)))
				if left.Load() > 0 {
					require.NoError(t, err, "%s: New executes %d statements", how, k-1)
					require.Greater(t, k, int32(3), "%s: New executes a few statements", how)
					break
				}
				left.Store(0)
				require.ErrorIs(t, err, want, "%s: statement %d", how, k)
				require.ErrorContains(t, err, "pgstore: ", how+": statement "+strconv.Itoa(int(k)))
			}
		}
	}
}
