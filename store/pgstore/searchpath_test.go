package pgstore_test

import (
	"context"
	"errors"
	"fmt"
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

// pathPool returns a pool on the test database whose connections have
// search_path path, closed when the test ends; afterConnect, if not nil,
// runs on each new connection.
func pathPool(t *testing.T, path string, afterConnect func(context.Context, *pgx.Conn) error) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = path
	cfg.AfterConnect = afterConnect
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// testSchema creates a schema of the test's own, dropped with what it
// holds at cleanup, and returns its name.
func testSchema(t *testing.T, pool *pgxpool.Pool) string {
	name := fmt.Sprintf("ratelimit_test_app_%d", time.Now().UnixNano())
	_, err := pool.Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	})
	return name
}

// remaining returns the tokens left of key's record of limitOp in s, and
// whether there is one.
func remaining(t *testing.T, s *pgstore.Store, key string) (float64, bool) {
	t.Helper()
	out := make([]driver.Record, 1)
	require.NoError(t, s.Load(context.Background(), []driver.RecordID{{Name: "l", Key: key}}, out))
	return out[0].State.Remaining, out[0].Found
}

// relations counts the relations and functions named after table in
// schema.
func relations(t *testing.T, pool *pgxpool.Pool, schema, table string) (rels, fns int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT (SELECT count(*) FROM pg_class WHERE relname = $2 AND relnamespace = $1::regnamespace), "+
		"(SELECT count(*) FROM pg_proc WHERE starts_with(proname, $2 || '_') AND pronamespace = $1::regnamespace)",
		pgx.Identifier{schema}.Sanitize(), table).Scan(&rels, &fns))
	return rels, fns
}

// A table name without a schema names, on a connection whose search_path
// is set, the relation that a query there finds, or, if none, the table
// that CREATE TABLE makes, in current_schema(); New resolves it once and
// names the table and its functions with that schema from then on. Before,
// New checked the relation that to_regclass found along search_path, the
// script made the table in current_schema(), and the statements followed
// search_path at each call: an upgrade made a new, empty table in the
// first schema of the path, beside the records of the one it had checked,
// and a table of that name made later in an earlier schema of the path
// took a running store's calls.
func TestSearchPath(t *testing.T) {
	ctx := context.Background()
	def := newPool(t, testserver.PostgresURL(t), nil) // search_path "$user", public
	app := testSchema(t, def)
	path := pgx.Identifier{app}.Sanitize() + ", public"

	t.Run("upgrade of the table the name finds", func(t *testing.T) {
		name := uniqueTable(t, def)
		s, err := pgstore.New(ctx, def, pgstore.WithTable(name))
		require.NoError(t, err)
		require.NoError(t, s.Apply(ctx, limitOp("k", 3), make([]driver.Decision, 1)))
		// Another build's mark: a New must install the schema.
		_, err = def.Exec(ctx, "COMMENT ON TABLE "+pgx.Identifier{name}.Sanitize()+" IS 'ratelimit pgstore schema 2 000000000000'")
		require.NoError(t, err)

		s, err = pgstore.New(ctx, pathPool(t, path, nil), pgstore.WithTable(name))
		require.NoError(t, err)
		got, found := remaining(t, s, "k")
		require.True(t, found, "the record written before the upgrade")
		require.Equal(t, 7.0, got)
		rels, fns := relations(t, def, app, name)
		require.Zero(t, rels+fns, "nothing made in %s, the first schema of search_path", app)
		_, err = pgstore.New(ctx, def, pgstore.WithTable(name), pgstore.WithoutDDL())
		require.NoError(t, err, "the table in public upgraded")
	})

	t.Run("a table made later earlier in search_path", func(t *testing.T) {
		name := uniqueTable(t, def)
		_, err := pgstore.New(ctx, def, pgstore.WithTable(name))
		require.NoError(t, err)
		pool := pathPool(t, path, nil)
		s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.NoError(t, err)
		require.NoError(t, s.Apply(ctx, limitOp("k", 3), make([]driver.Decision, 1)))
		require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{limitOp("k", 1), limitOp("j", 1)}, [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}))

		// Another store's table, of the same name, in the first schema of
		// the path; the pool's connections new.
		_, err = pgstore.New(ctx, def, pgstore.WithTable(app+"."+name))
		require.NoError(t, err)
		pool.Reset()
		out := make([]driver.Decision, 1)
		require.NoError(t, s.Apply(ctx, limitOp("k", 1), out))
		require.Equal(t, 5.0, out[0].Remaining, "the record in public")
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{limitOp("k", 1), limitOp("j", 1)}, outs))
		require.Equal(t, []float64{4, 8}, []float64{outs[0][0].Remaining, outs[1][0].Remaining})
		got, _ := remaining(t, s, "k")
		require.Equal(t, 4.0, got)
		var n int
		require.NoError(t, def.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{app, name}.Sanitize()).Scan(&n))
		require.Zero(t, n, "nothing written in %s", app)
	})

	t.Run("a new table in current_schema()", func(t *testing.T) {
		name := uniqueTable(t, def) // dropped in public if made there
		s, err := pgstore.New(ctx, pathPool(t, path, nil), pgstore.WithTable(name))
		require.NoError(t, err)
		require.NoError(t, s.Apply(ctx, limitOp("k", 3), make([]driver.Decision, 1)))
		rels, fns := relations(t, def, app, name)
		require.Equal(t, [2]int{1, 7}, [2]int{rels, fns}, "the table and its functions made in %s", app)
		_, err = pgstore.New(ctx, def, pgstore.WithTable(app+"."+name), pgstore.WithoutDDL())
		require.NoError(t, err)
	})

	t.Run("no schema of search_path exists", func(t *testing.T) {
		name := uniqueTable(t, def)
		pool := pathPool(t, "ratelimit_test_no_such_schema", nil)
		for _, opts := range [][]pgstore.Option{nil, {pgstore.WithoutDDL()}} {
			_, err := pgstore.New(ctx, pool, append(opts, pgstore.WithTable(name))...)
			require.ErrorIs(t, err, pgstore.ErrSchema)
			require.ErrorContains(t, err, "no schema of search_path (ratelimit_test_no_such_schema) exists")
		}
	})

	t.Run("a temporary table", func(t *testing.T) {
		name := uniqueTable(t, def)
		pool := pathPool(t, "public", func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "CREATE TEMPORARY TABLE "+pgx.Identifier{name}.Sanitize()+
				" (id bytea PRIMARY KEY, name bytea NOT NULL, key bytea NOT NULL, shard integer NOT NULL, value double precision, ts bigint, expires bigint NOT NULL)")
			return err
		})
		_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.ErrorIs(t, err, pgstore.ErrNotStoreTable)
		require.ErrorContains(t, err, "temporary table")
		rels, fns := relations(t, def, "public", name)
		require.Zero(t, rels+fns, "nothing made")
	})

	// The SQL of Schema for a name without a schema makes the table in
	// current_schema(), and refuses a name that finds a relation in
	// another schema: it would check one and make another.
	t.Run("the script refuses a name that finds another schema's", func(t *testing.T) {
		name := uniqueTable(t, def)
		_, err := pgstore.New(ctx, def, pgstore.WithTable(name))
		require.NoError(t, err)
		sql, err := pgstore.Schema(name)
		require.NoError(t, err)
		_, err = pathPool(t, path, nil).Exec(ctx, sql)
		var pe *pgconn.PgError
		require.True(t, errors.As(err, &pe), "%v", err)
		require.Equal(t, "RLSCH", pe.Code)
		require.Contains(t, pe.Message, "public."+name)
		rels, fns := relations(t, def, app, name)
		require.Zero(t, rels+fns, "nothing made in %s", app)
	})
}

// The SQL of Schema for a table name without a schema makes functions
// that name the table without it too: they find it along the search_path
// of the connection that calls them, where the store's statements name it
// with the schema New resolved. New took such a schema for this release's:
// with a table of that name made later in an earlier schema of the path,
// a store's lone calls went to one table and its batches, Load, Delete and
// DeleteExpired, which go through the functions, to the other. New now
// installs the functions again, named with the schema, keeping their
// OIDs; WithoutDDL refuses them and says what to apply.
func TestSearchPathFunctionsOfASchemaWithoutOne(t *testing.T) {
	ctx := context.Background()
	def := newPool(t, testserver.PostgresURL(t), nil) // search_path "$user", public
	app := testSchema(t, def)
	name := uniqueTable(t, def)
	sql, err := pgstore.Schema(name)
	require.NoError(t, err)
	_, err = def.Exec(ctx, sql)
	require.NoError(t, err)
	before := functionOIDs(t, def, name)
	pool := pathPool(t, pgx.Identifier{app}.Sanitize()+", public", nil)

	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorContains(t, err, "name it without its schema")
	require.ErrorContains(t, err, "ratelimit schema --table public."+name)

	s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	require.Equal(t, before, functionOIDs(t, def, name), "replaced in place")
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.NoError(t, err)

	// A table of that name, another store's, made later in the first
	// schema of the path; the pool's connections new.
	_, err = pgstore.New(ctx, def, pgstore.WithTable(app+"."+name))
	require.NoError(t, err)
	pool.Reset()
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, limitOp("k", 3), out))
	require.Equal(t, 7.0, out[0].Remaining)
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{limitOp("k", 1), limitOp("k", 1)}, outs), "the function _apply")
	require.Equal(t, []float64{6, 5}, []float64{outs[0][0].Remaining, outs[1][0].Remaining})
	got, found := remaining(t, s, "k")
	require.True(t, found)
	require.Equal(t, 5.0, got)
	var n int
	require.NoError(t, def.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{app, name}.Sanitize()).Scan(&n))
	require.Zero(t, n, "nothing written in %s", app)
}
