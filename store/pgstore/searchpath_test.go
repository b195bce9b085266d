package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
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
// tableBesideASchema installs a table of a new name (name) in a new schema
// (home), beside another new schema (first) for the caller to put shadows
// of PostgreSQL's or the store's objects in, through admin.
func tableBesideASchema(t *testing.T) (admin *pgxpool.Pool, first, home, name string) {
	admin = newPool(t, testserver.PostgresURL(t), nil)
	first, home = testSchema(t, admin), testSchema(t, admin)
	name = fmt.Sprintf("ratelimit_test_%d", time.Now().UnixNano())
	_, err := pgstore.New(context.Background(), admin, pgstore.WithTable(home+"."+name))
	require.NoError(t, err)
	return admin, first, home, name
}

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

// shadowsOf returns the SQL that makes, in schema (quoted; "pg_temp" for
// the session's temporary schema), a function of the name and arguments of
// each of the store's functions of table in its schema home, whose body
// fails with "shadowed".
func shadowsOf(t *testing.T, pool *pgxpool.Pool, home, table, schema string) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT p.proname::text, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid), p.prorettype = 'record'::regtype "+
		"FROM pg_proc p WHERE p.pronamespace = $1::regnamespace AND starts_with(p.proname, $2 || '_')", pgx.Identifier{home}.Sanitize(), table)
	require.NoError(t, err)
	var b strings.Builder
	for rows.Next() {
		var (
			name, args, result string
			record             bool
		)
		require.NoError(t, rows.Scan(&name, &args, &result, &record))
		returns := " RETURNS " + result
		if record && !strings.HasPrefix(result, "TABLE") { // OUT parameters, among args
			returns = ""
		}
		fmt.Fprintf(&b, "CREATE FUNCTION %s.%s(%s)%s LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'shadowed: %%', %s; END$$;\n",
			schema, pgx.Identifier{name}.Sanitize(), args, returns, quoteLiteral(schema+"."+name))
	}
	require.NoError(t, rows.Err())
	require.NotZero(t, b.Len())
	return b.String()
}

// Every statement of the store names the store's functions, and its table,
// with their schema: functions of the same names and arguments in a schema
// that comes first along search_path, and a temporary table of the
// table's name, are not what it calls. (Functions of the session's
// temporary schema are never found without their schema; its tables and
// types come first along search_path unless it is listed.) Each kind of
// statement goes: a lone limit, a lone call at the server's clock
// (_one), a batch on one token bucket (the batch upsert and _read), a batch
// of sharded calls refused on both shards (_apply, _split and _pwait),
// Load, Delete and DeleteExpired.
func TestFunctionsOfTheSameNameElsewhere(t *testing.T) {
	ctx := context.Background()
	admin, first, home, name := tableBesideASchema(t)
	table := home + "." + name
	_, err := admin.Exec(ctx, shadowsOf(t, admin, home, name, pgx.Identifier{first}.Sanitize()))
	require.NoError(t, err)
	temp := shadowsOf(t, admin, home, name, "pg_temp") +
		"CREATE TEMPORARY TABLE " + pgx.Identifier{name}.Sanitize() + " (LIKE " + pgx.Identifier{home, name}.Sanitize() + ");"
	pool := pathPool(t, pgx.Identifier{first}.Sanitize()+", "+pgx.Identifier{home}.Sanitize(), func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, temp)
		return err
	})
	// The shadows are there: a call without the schema finds them.
	_, err = pool.Exec(ctx, "SELECT "+pgx.Identifier{name + "_del"}.Sanitize()+"('{}')")
	require.ErrorContains(t, err, "shadowed: "+pgx.Identifier{first}.Sanitize()+"."+name+"_del")

	bucket := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 3_600_000, Capacity: 10}
	op := func(key string, count float64, shards ...int) *driver.Op {
		it := driver.Item{Name: "l", Key: key, Count: count}
		for _, sh := range shards {
			it.Shards = append(it.Shards, driver.Shard{Index: sh, Params: bucket})
		}
		return &driver.Op{Now: t0.UnixMilli(), Items: []driver.Item{it}}
	}
	for _, serverTime := range []bool{false, true} {
		opts := []pgstore.Option{pgstore.WithTable(table), pgstore.WithoutDDL(), pgstore.WithMaxBatch(1)}
		if serverTime {
			opts = append(opts, pgstore.WithServerTime())
		}
		s, err := pgstore.New(ctx, pool, opts...)
		require.NoError(t, err)
		out := make([]driver.Decision, 1)
		require.NoError(t, s.Apply(ctx, op("lone", 3, 0), out), "server time %v", serverTime)
		require.True(t, out[0].OK)
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{op("a", 2, 0), op("b", 2, 0)}, outs), "server time %v", serverTime)
		require.True(t, outs[0][0].OK && outs[1][0].OK)
		require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{op("pair", 25, 0, 1), op("pair", 1, 0, 1)}, outs), "server time %v", serverTime)
		require.False(t, outs[0][0].OK)
		require.True(t, outs[1][0].OK)
	}
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithoutDDL())
	require.NoError(t, err)
	recs := make([]driver.Record, 2)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: "lone"}, {Name: "l", Key: "a"}}, recs))
	require.True(t, recs[0].Found && recs[1].Found)
	require.Equal(t, 7.0, recs[0].State.Remaining) // 3 tokens at the server's clock, years after t0
	require.NoError(t, s.Delete(ctx, []driver.RecordID{{Name: "l", Key: "lone"}}))
	_, err = s.DeleteExpired(ctx, time.Now().Add(1000*time.Hour)) // past every record's, at either clock
	require.NoError(t, err)
	var left int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{home, name}.Sanitize()).Scan(&left))
	require.Zero(t, left)
}
