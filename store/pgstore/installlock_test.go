package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// A pool whose sessions set a lock_timeout (a runtime parameter of its
// connection string, or a SET in AfterConnect) bounds New's wait for the
// install lock too: while another install holds it (a New of another
// process, a migration's script), New fails with lock_not_available
// before it has touched the table. The error says so, and names the
// session that holds the lock, rather than blame a transaction on the
// table or its functions, which no one held.
func TestInstallLockHeldUnderALockTimeout(t *testing.T) {
	ctx := context.Background()
	admin := newPool(t, testserver.PostgresURL(t), nil)
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "200"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	name := uniqueTable(t, admin)

	// Another install, holding the lock.
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", pgstore.SchemaLock)
	require.NoError(t, err)
	holder := tx.Conn().PgConn().PID()

	nctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err = pgstore.New(nctx, pool, pgstore.WithTable(name))
	require.NoError(t, nctx.Err(), "New waited for the lock until its context ended: %v", err)
	require.NoError(t, tx.Rollback(ctx))
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "55P03", pe.Code, "%v", err)
	require.NotContains(t, err.Error(), "holds the table", "no one held the table")
	require.ErrorContains(t, err, "install lock")
	require.ErrorContains(t, err, fmt.Sprintf("held by pid %d", holder))
	require.ErrorContains(t, err, "lock_timeout (200ms)")

	// Once the lock is free, New installs under the same lock_timeout. The
	// lock is one for the whole database, so the New of another test (of
	// this package or another, run at the same time) may hold it for a
	// while: New then fails as above, and is called again.
	for start := time.Now(); ; {
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
		if err == nil || !errors.As(err, &pe) || pe.Code != "55P03" || time.Since(start) > time.Minute {
			break
		}
		require.NotContains(t, err.Error(), fmt.Sprintf("held by pid %d", holder), "the lock was released")
	}
	require.NoError(t, err)
}
