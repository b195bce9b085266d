package pgstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// passingDeadline is a context that never ends, whose deadline is a
// minute away until pass is set, and then behind the wall clock: a
// deadline just reached, its context's timer not run yet (Unmet).
type passingDeadline struct {
	context.Context
	dl   time.Time
	pass atomic.Bool
}

func (c *passingDeadline) Deadline() (time.Time, bool) {
	if c.pass.Load() {
		return c.dl.Add(-2 * time.Minute), true
	}
	return c.dl, true
}

// passTracer, once armed, passes ctx's deadline as a lone call's fresh
// upsert starts, and keeps the arguments of the lone upserts that follow.
type passTracer struct {
	ctx   *passingDeadline
	armed atomic.Bool
	mu    sync.Mutex
	sqls  []string
	args  [][]any
}

func (tr *passTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	switch {
	case !tr.armed.Load():
	case strings.HasPrefix(d.SQL, "INSERT") && strings.Contains(d.SQL, "excluded.expires WHERE c.value IS NULL OR ("):
		tr.ctx.pass.Store(true)
	case strings.HasPrefix(d.SQL, "WITH s AS") && !strings.Contains(d.SQL, "unnest"):
		tr.mu.Lock()
		tr.sqls = append(tr.sqls, d.SQL)
		tr.args = append(tr.args, d.Args)
		tr.mu.Unlock()
	}
	return ctx
}

func (tr *passTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A lone call's upsert sent after its fresh upsert wrote nothing bounds
// its lock wait if the fresh upsert did, by at least 1 ms. It read the
// time left afresh, and a deadline that the wall clock passed meanwhile,
// its context's timer not run yet, read as none: the upsert went without
// a lock_timeout, free to wait on a row lock for as long as its holder
// held it, past the deadline. Directly and through pgx.
func TestLoneUpsertAfterFreshKeepsItsBound(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			callCtx := &passingDeadline{Context: ctx, dl: time.Now().Add(time.Minute)}
			tr := &passTracer{ctx: callCtx}
			cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			cfg.ConnConfig.Tracer = tr
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			s, err := pgstore.New(ctx, pool, pgstore.WithTable(uniqueTable(t, pool)), pgstore.WithMaxBatch(1))
			require.NoError(t, err)
			require.Equal(t, mode == pgx.QueryExecModeCacheStatement, pgstore.Direct(s))

			out := make([]driver.Decision, 1)
			require.NoError(t, s.Apply(ctx, limitOp("k", 1), out)) // the record, not full
			pgstore.ClearHints(s)                                  // the fresh upsert goes first, and writes nothing
			tr.armed.Store(true)
			require.NoError(t, s.Apply(callCtx, limitOp("k", 1), out))
			require.True(t, callCtx.pass.Load(), "the fresh upsert went first")
			require.Equal(t, 8.0, out[0].Remaining)

			tr.mu.Lock()
			defer tr.mu.Unlock()
			require.Len(t, tr.sqls, 1, "the lone upsert")
			require.True(t, strings.Contains(tr.sqls[0], "set_config('lock_timeout'"), "the lone upsert bounds its lock wait")
			args := tr.args[0]
			require.Equal(t, "1ms", fmt.Sprint(args[len(args)-1]), "its lock_timeout, of %v", args)
		})
	}
}

// oneTracer keeps the arguments of the calls of the function _one.
type oneTracer struct {
	mu   sync.Mutex
	args [][]any
}

func (tr *oneTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "SELECT ok, retry") && strings.Contains(d.SQL, `_one"(`) {
		tr.mu.Lock()
		tr.args = append(tr.args, d.Args)
		tr.mu.Unlock()
	}
	return ctx
}

func (tr *oneTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A lone call whose upsert found its record changed decides again with
// the function _one, and bounds its lock wait if the upsert did, by at
// least 1 ms. It read the time left afresh, and a deadline that the wall
// clock passed while the upsert waited for the row, its context's timer
// not run yet, read as none: _one went without a bound on its lock wait.
func TestDecidedAgainKeepsTheBound(t *testing.T) {
	ctx := context.Background()
	tr := &oneTracer{}
	pool := newPool(t, testserver.PostgresURL(t), tr)
	table := uniqueTable(t, pool)
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithMaxBatch(1))
	require.NoError(t, err)
	require.NoError(t, s.Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1)))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "UPDATE "+pgx.Identifier{table}.Sanitize()+" SET value = 0 WHERE id = $1", rowID("k"))
	require.NoError(t, err)
	callCtx := &passingDeadline{Context: ctx, dl: time.Now().Add(time.Minute)}
	call := applyAsync(callCtx, s, limitOp("k", 5))
	waitForLockWaiters(t, pool, table, 1) // the upsert waits for the row
	callCtx.pass.Store(true)
	require.NoError(t, tx.Commit(ctx))
	a := receive(t, call)
	require.NoError(t, a.err)
	require.False(t, a.out[0].OK, "granted 5 tokens of a record left with 0")

	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.Len(t, tr.args, 1, "decided again with _one")
	args := tr.args[0]
	require.Equal(t, int32(1), args[len(args)-1], "_one's lock wait, of %v", args)
}
