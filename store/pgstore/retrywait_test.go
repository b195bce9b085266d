package pgstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// A statement sent again after a serialization failure waits for a lock
// no longer than its context then leaves: each try's lock_timeout is read
// anew. It was read once, before the first try, so that the last of
// SerialRetries retries could wait on a row lock for as long as the first
// might, beyond the caller's deadline. A trigger reports each write's
// lock_timeout in a notice, takes 50 ms (the server's clock, so that the
// time left shrinks between tries) and fails it with SQLSTATE 40001; each
// of the store's statements that bound their lock wait: the lone ones,
// directly and through pgx, _one, _apply and the batch upsert.
func TestRetryLockWaitIsTheTimeLeft(t *testing.T) {
	ctx := context.Background()
	var (
		mu      sync.Mutex
		notices []int64
	)
	onNotice := func(_ *pgconn.PgConn, n *pgconn.Notice) {
		ms, err := strconv.ParseInt(n.Message, 10, 64)
		if err != nil {
			return // not the trigger's
		}
		mu.Lock()
		notices = append(notices, ms)
		mu.Unlock()
	}
	newNoticePool := func(mode pgx.QueryExecMode) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
		require.NoError(t, err)
		cfg.ConnConfig.DefaultQueryExecMode = mode
		cfg.ConnConfig.OnNotice = onNotice
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	direct := newNoticePool(pgx.QueryExecModeCacheStatement)
	viaPgx := newNoticePool(pgx.QueryExecModeExec)

	table := uniqueTable(t, direct)
	s, err := pgstore.New(ctx, direct, pgstore.WithTable(table), pgstore.WithMaxBatch(1))
	require.NoError(t, err)
	require.True(t, pgstore.Direct(s))
	fail := pgx.Identifier{table + "_fail"}.Sanitize()
	_, err = direct.Exec(ctx, "CREATE FUNCTION "+fail+"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"+
		" RAISE NOTICE '%', (extract(epoch FROM current_setting('lock_timeout')::interval) * 1000)::bigint;"+
		" PERFORM pg_sleep(0.05);"+
		" RAISE 'no serialization' USING ERRCODE = '40001'; END $$;"+
		"CREATE TRIGGER fail BEFORE INSERT OR UPDATE OR DELETE ON "+pgx.Identifier{table}.Sanitize()+
		" FOR EACH ROW EXECUTE FUNCTION "+fail+"()")
	require.NoError(t, err)

	pgxStore, err := pgstore.New(ctx, viaPgx, pgstore.WithTable(table), pgstore.WithMaxBatch(1))
	require.NoError(t, err)
	require.False(t, pgstore.Direct(pgxStore))
	serverTime, err := pgstore.New(ctx, direct, pgstore.WithTable(table), pgstore.WithMaxBatch(1), pgstore.WithServerTime())
	require.NoError(t, err)
	two := limitOp("a", 1) // two limits of one key: _apply
	two.Items = append(two.Items, two.Items[0])
	two.Items[1].Name = "m"
	for _, c := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"lone, direct", func(ctx context.Context) error { return s.Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1)) }},
		{"lone, through pgx", func(ctx context.Context) error {
			return pgxStore.Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1))
		}},
		{"_one", func(ctx context.Context) error {
			return serverTime.Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1))
		}},
		{"_apply", func(ctx context.Context) error { return s.Apply(ctx, two, make([]driver.Decision, 2)) }},
		{"batch upsert", func(ctx context.Context) error {
			return s.ApplyBatch(ctx, []*driver.Op{limitOp("a", 1), limitOp("b", 1)}, [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)})
		}},
	} {
		mu.Lock()
		notices = notices[:0]
		mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		first := pgstore.LockWait(cctx)
		err := c.call(cctx)
		cancel()
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe, c.name)
		require.Equal(t, "40001", pe.Code, c.name)
		mu.Lock()
		got := append([]int64(nil), notices...)
		mu.Unlock()
		require.Len(t, got, 1+pgstore.SerialRetries, "%s: the tries' lock_timeouts", c.name)
		require.LessOrEqual(t, got[0], int64(first), "%s: the first try's lock_timeout, of %v", c.name, got)
		for i := 1; i < len(got); i++ {
			// 50 ms or more went by: the wait is 9/8 of the time left.
			require.Less(t, got[i], got[i-1]-50, "%s: try %d waits for a lock no less than the one before, of %v", c.name, i, got)
		}
	}
}
