package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// modePool returns a pool on the test database whose statements go in
// mode, closed when the test ends.
func modePool(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// hammer calls every statement of s and serverTime (a store of the same
// table WithServerTime) from several goroutines until stop is closed, and
// returns the errors met.
func hammer(ctx context.Context, s, serverTime *pgstore.Store, stop <-chan struct{}) (calls *atomic.Int64, wait func() []error) {
	calls = new(atomic.Int64)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	two := func(key string) *driver.Op {
		op := limitOp(key, 1)
		op.Items = append(op.Items, op.Items[0])
		op.Items[1].Name = "m"
		return op
	}
	pair := func(key string) *driver.Op {
		op := limitOp(key, 1)
		op.Items[0].Shards = append(op.Items[0].Shards, driver.Shard{Index: 1, Params: op.Items[0].Shards[0].Params})
		op.Items[0].Count = 20 // more than one shard holds: refused, with a wait over both
		return op
	}
	kinds := []struct {
		name string
		call func(key string) error
	}{
		{"lone", func(key string) error { return s.Apply(ctx, limitOp(key, 1), make([]driver.Decision, 1)) }},
		{"_one", func(key string) error { return serverTime.Apply(ctx, limitOp(key, 1), make([]driver.Decision, 1)) }},
		{"_apply", func(key string) error {
			return s.ApplyBatch(ctx, []*driver.Op{two(key)}, [][]driver.Decision{make([]driver.Decision, 2)})
		}},
		{"_split", func(key string) error {
			return s.ApplyBatch(ctx, []*driver.Op{pair(key)}, [][]driver.Decision{make([]driver.Decision, 1)})
		}},
		{"upsert", func(key string) error {
			return s.ApplyBatch(ctx, []*driver.Op{limitOp(key+"a", 1), limitOp(key+"b", 1)},
				[][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)})
		}},
		{"_read", func(key string) error {
			return s.Load(ctx, []driver.RecordID{{Name: "l", Key: key}}, make([]driver.Record, 1))
		}},
		{"_del", func(key string) error { return s.Delete(ctx, []driver.RecordID{{Name: "l", Key: key + "a"}}) }},
		{"_sweep", func(string) error { _, err := s.DeleteExpired(ctx, t0); return err }},
	}
	for _, k := range kinds {
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					calls.Add(1)
					if err := k.call(fmt.Sprintf("%s-%d-%d", k.name, g, i%16)); err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("%s: %w", k.name, err))
						mu.Unlock()
					}
				}
			}()
		}
	}
	return calls, func() []error { wg.Wait(); return errs }
}

// TestReinstallLeavesLiveSessions installs the schema of a table again and
// again (as the SQL of Schema, which a migration tool may run at every
// deploy, and New of another process) while a store serves calls on it:
// every call succeeds, whatever the pool's QueryExecMode.
func TestReinstallLeavesLiveSessions(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := modePool(t, mode)
			table := uniqueTable(t, pool)
			s, err := pgstore.New(ctx, pool, pgstore.WithTable(table))
			require.NoError(t, err)
			serverTime, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithServerTime())
			require.NoError(t, err)
			sql, err := pgstore.Schema(table)
			require.NoError(t, err)

			other := modePool(t, pgx.QueryExecModeCacheStatement) // another process's
			stop := make(chan struct{})
			calls, wait := hammer(ctx, s, serverTime, stop)
			for i := range 20 {
				_, err := other.Exec(ctx, sql)
				require.NoError(t, err, "install %d", i)
				_, err = pgstore.New(ctx, other, pgstore.WithTable(table))
				require.NoError(t, err, "New %d", i)
			}
			close(stop)
			errs := wait()
			require.Empty(t, errs, "%d of %d calls failed", len(errs), calls.Load())
		})
	}
}

// functionOIDs returns the OIDs of table's functions, by name, as made in
// the default schema.
func functionOIDs(t *testing.T, pool *pgxpool.Pool, table string) map[string]uint32 {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT proname::text, oid::int8 FROM pg_proc WHERE starts_with(proname, $1) AND pg_function_is_visible(oid)", table+"_")
	require.NoError(t, err)
	got := map[string]uint32{}
	for rows.Next() {
		var (
			name string
			oid  int64
		)
		require.NoError(t, rows.Scan(&name, &oid))
		got[name] = uint32(oid)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, 7)
	return got
}

// The script of Schema run again on a table of this release's leaves
// every function as it is, same OID: a call in flight, or a plan a
// session holds, finds the function it named.
func TestReinstallKeepsFunctions(t *testing.T) {
	ctx := context.Background()
	pool, table, _ := newTableStore(t)
	before := functionOIDs(t, pool, table)
	sql, err := pgstore.Schema(table)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, sql)
	require.NoError(t, err)
	require.Equal(t, before, functionOIDs(t, pool, table))

	// The _one of a build of version 2 before this release's, which
	// returned fewer columns, is dropped and made anew (one of any other
	// results is another release's, and left: see
	// TestNewLeavesALaterReleasesFunctions).
	one := pgx.Identifier{table + "_one"}.Sanitize()
	_, err = pool.Exec(ctx, "DROP FUNCTION "+one+oneArgs+"; CREATE FUNCTION "+one+"(p_id bytea, p_name bytea, p_key bytea, p_shard integer, "+
		"p_kind integer, p_rate float8, p_period bigint, p_cap float8, p_maxr float8, p_phase bigint, "+
		"p_now bigint, p_count float8, p_flags integer, p_wait integer, OUT ok boolean, OUT retry bigint, OUT remaining float8, OUT charged float8) "+
		"LANGUAGE plpgsql AS $$BEGIN PERFORM FROM "+pgx.Identifier{table}.Sanitize()+"; END$$; "+
		"COMMENT ON FUNCTION "+one+oneArgs+" IS 'ratelimit pgstore function'; "+
		"COMMENT ON TABLE "+pgx.Identifier{table}.Sanitize()+" IS 'ratelimit pgstore schema 2 000000000000'")
	require.NoError(t, err)
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithServerTime())
	require.NoError(t, err)
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, limitOp("k", 1), out))
	require.True(t, out[0].OK)
	after := functionOIDs(t, pool, table)
	require.NotEqual(t, before[table+"_one"], after[table+"_one"], "made anew")
	delete(before, table+"_one")
	delete(after, table+"_one")
	require.Equal(t, before, after, "the others replaced in place")
}

// waitAdvisory waits until n sessions wait for New's schema lock.
func waitAdvisory(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting int
		err := pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "+
			"AND (classid::int8 << 32 | objid::int8) = $1", pgstore.SchemaLock).Scan(&waiting)
		return err == nil && waiting >= n
	}, 10*time.Second, time.Millisecond)
}

// Processes that start together on a fresh table (each New found no
// schema, and waited for another's install) all succeed, and the schema
// is installed once: a New that finds it installed once it holds the lock
// runs nothing, so that it replaces no function that the stores made
// meanwhile already call. So too where the default isolation is
// REPEATABLE READ or SERIALIZABLE: there the install's transaction took
// its snapshot before it waited for the lock, did not see the install of
// the process that held it, and installed again, every New of them.
func TestConcurrentNew(t *testing.T) {
	ctx := context.Background()
	const procs = 4
	for _, iso := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(iso, func(t *testing.T) {
			tr := &tracer{}
			cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
			require.NoError(t, err)
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
			cfg.ConnConfig.Tracer = tr
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			table := uniqueTable(t, pool)
			hold := newPool(t, testserver.PostgresURL(t), nil)
			release := holdTables(t, hold)
			errs := make(chan error, procs)
			for range procs {
				go func() {
					_, err := pgstore.New(ctx, pool, pgstore.WithTable(table))
					errs <- err
				}()
			}
			waitAdvisory(t, hold, procs)
			release()
			for range procs {
				require.NoError(t, <-errs)
			}
			installs := 0
			for _, sql := range tr.sql {
				if strings.Contains(sql, "CREATE TABLE IF NOT EXISTS") {
					installs++
				}
			}
			require.Equal(t, 1, installs, "the schema installed once")
		})
	}
}

// The script of Schema, applied by several migrations at once, each in a
// transaction (as migration tools apply one), or beside a New: the
// script takes New's lock, so that none fails on another's DDL.
func TestConcurrentSchemaScripts(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	for range 5 {
		table := uniqueTable(t, pool)
		sql, err := pgstore.Schema(table)
		require.NoError(t, err)
		errs := make(chan error, 5)
		for range 4 {
			go func() {
				errs <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, sql); return err })
			}()
		}
		go func() { _, err := pgstore.New(ctx, pool, pgstore.WithTable(table)); errs <- err }()
		for range 5 {
			require.NoError(t, <-errs)
		}
	}
}

// The advisory lock's key is documented, so that an application's own
// advisory locks can keep clear of it, and it is the one the script takes.
func TestSchemaLockDocumented(t *testing.T) {
	call := fmt.Sprintf("pg_advisory_xact_lock(%d)", pgstore.SchemaLock)
	sql, err := pgstore.Schema("public.limits")
	require.NoError(t, err)
	require.Contains(t, sql, "SELECT pg_catalog."+call+",")
	for _, page := range []string{"stores/postgres.md", "cli.md"} {
		doc, err := os.ReadFile(filepath.Join("..", "..", "docs", page))
		require.NoError(t, err)
		require.Contains(t, strings.Join(strings.Fields(string(doc)), " "), call, "docs/%s names the lock's key", page)
	}
}

// installLaterRelease makes the table name's _one a later release's,
// with other results (a column more), and marks the table as that
// release's, "ratelimit pgstore schema 2 later"; it returns the table's
// name, quoted.
func installLaterRelease(t *testing.T, pool *pgxpool.Pool, name string) string {
	t.Helper()
	one := pgx.Identifier{"public", name + "_one"}.Sanitize()
	table := pgx.Identifier{"public", name}.Sanitize()
	_, err := pool.Exec(context.Background(), "DROP FUNCTION "+one+oneArgs+"; CREATE FUNCTION "+one+`(
	p_id bytea, p_name bytea, p_key bytea, p_shard integer,
	p_kind integer, p_rate float8, p_period bigint, p_cap float8, p_maxr float8, p_phase bigint,
	p_now bigint, p_count float8, p_flags integer, p_wait integer,
	OUT ok boolean, OUT retry bigint, OUT remaining float8, OUT charged float8, OUT at bigint, OUT ts bigint, OUT later bigint
) LANGUAGE plpgsql AS $$BEGIN ok := true; END$$;
COMMENT ON FUNCTION `+one+oneArgs+` IS 'ratelimit pgstore function';
COMMENT ON TABLE `+table+` IS 'ratelimit pgstore schema 2 later';`)
	require.NoError(t, err)
	return table
}

// A New of this release that finds the store's functions made by another
// release, with other results (a later release's _one, with a column
// more), neither drops nor changes them: the processes of that release
// call them. It fails with ErrSchema, saying what to do. Before, the
// script dropped any _one whose parameters were not this release's and
// made its own: every call of the later release's WithServerTime stores
// failed ("cache lookup failed for function", then a result of other
// columns) until they were restarted.
func TestNewLeavesALaterReleasesFunctions(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	name := uniqueTable(t, pool)
	_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	installLaterRelease(t, pool, name)
	before := functionOIDs(t, pool, name)

	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorContains(t, err, "other results")
	require.ErrorContains(t, err, "DROP FUNCTION")
	require.Equal(t, before, functionOIDs(t, pool, name), "the later release's functions are left")
	var args string
	one := pgx.Identifier{"public", name + "_one"}.Sanitize()
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_get_function_arguments($1::regprocedure)", one+oneArgs).Scan(&args))
	require.Contains(t, args, "OUT later bigint")
}
