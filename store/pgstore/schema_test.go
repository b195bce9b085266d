package pgstore_test

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// PostgreSQL keeps 63 bytes of a name. Two WithTable names that differ only
// beyond must not share one table (one tenant's spending would refuse the
// other's calls): New refuses every name that would be cut, its own or its
// function's.
func TestTableNamesPostgresWouldCut(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	base := fmt.Sprintf("ratelimit_test_%d_", time.Now().UnixNano())
	long := base + strings.Repeat("x", 63-len(base)) // 63 bytes: kept, but not "_apply" after it
	lim := ratelimit.Limits{"signup": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}}
	tenant := func(name string) (*ratelimit.Limiter, error) {
		t.Cleanup(func() { dropTable(pool, name) })
		s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		if err != nil {
			return nil, err
		}
		return ratelimit.New(s, lim)
	}
	a, errA := tenant(long + "_tenant_a")
	b, errB := tenant(long + "_tenant_b")
	if errA == nil && errB == nil {
		res, err := a.Limit(ctx, "signup", "user")
		require.NoError(t, err)
		require.True(t, res.OK)
		res, err = b.Limit(ctx, "signup", "user")
		require.NoError(t, err)
		require.True(t, res.OK, "tenant b's first call refused by tenant a's: they share one table")
	}
	require.ErrorIs(t, errA, pgstore.ErrTableName)
	require.ErrorIs(t, errB, pgstore.ErrTableName)
	require.ErrorContains(t, errA, "use at most 57 bytes")

	for _, name := range []string{
		long, // the table fits, its function would not
		base + strings.Repeat("x", 58-len(base)),
		strings.Repeat("s", 64) + ".limits", // the schema
		"rate\x00limit",
		"", ".limits", "limits.",
	} {
		_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.ErrorIs(t, err, pgstore.ErrTableName, "%q", name)
		_, err = pgstore.Schema(name)
		require.ErrorIs(t, err, pgstore.ErrTableName, "%q", name)
	}

	// The longest name accepted works, and so does a multibyte one.
	for _, name := range []string{base + strings.Repeat("y", 57-len(base)), base + strings.Repeat("é", (57-len(base))/2)} {
		l, err := tenant(name)
		require.NoError(t, err, "%q (%d bytes)", name, len(name))
		res, err := l.Limit(ctx, "signup", "user")
		require.NoError(t, err)
		require.True(t, res.OK)
	}
}

// A table name that is not valid UTF-8 cannot be a PostgreSQL name: New
// and Schema refuse it with ErrTableName, before the server sees it (it
// would answer SQLSTATE 22021).
func TestTableNameInvalidUTF8(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	for _, name := range []string{"ratelimit_test_\xff", "\xc3.limits", "limits.caf\xc3"} {
		_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.ErrorIs(t, err, pgstore.ErrTableName, "%q", name)
		require.ErrorContains(t, err, "not valid UTF-8")
		_, err = pgstore.Schema(name)
		require.ErrorIs(t, err, pgstore.ErrTableName, "%q", name)
	}
}

// A table in a temporary schema (pg_temp, or a session's pg_temp_N) is one
// session's: the other connections of a pool do not see it. New and Schema
// refuse such a name with ErrTableName and make nothing. New made the
// table and its functions in the temporary schema of the connection that
// installed them, and succeeded; calls on the pool's other connections
// then failed (schema "pg_temp" does not exist), and the records went
// with the connection.
func TestTableNameInATemporarySchema(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	var own string
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TEMPORARY TABLE ratelimit_test_tmp (a integer)")
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_my_temp_schema()::regnamespace::text").Scan(&own))
	conn.Release()
	table := fmt.Sprintf("ratelimit_test_%d", time.Now().UnixNano())
	for _, schema := range []string{"pg_temp", own, "pg_toast_temp_1"} {
		name := schema + "." + table
		for _, opts := range [][]pgstore.Option{nil, {pgstore.WithoutDDL()}} {
			_, err := pgstore.New(ctx, pool, append(opts, pgstore.WithTable(name))...)
			require.ErrorIs(t, err, pgstore.ErrTableName, "%q", name)
			require.ErrorContains(t, err, "temporary schema")
		}
		_, err = pgstore.Schema(name)
		require.ErrorIs(t, err, pgstore.ErrTableName, "%q", name)
	}
	var made int
	require.NoError(t, pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM pg_class WHERE relname = $1) + "+
		"(SELECT count(*) FROM pg_proc WHERE starts_with(proname, $1))", table).Scan(&made))
	require.Zero(t, made, "nothing made")
}

// The SQL of Schema, applied by hand as a migration tool would, makes a
// table that New WithoutDDL accepts; WithoutDDL creates nothing and says
// what is missing.
func TestSchemaAndWithoutDDL(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	name := uniqueTable(t, pool)

	_, err := pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorContains(t, err, "does not exist")
	require.ErrorContains(t, err, "ratelimit schema --table public."+name, "the schema New resolved the name to")
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists))
	require.False(t, exists, "WithoutDDL must create nothing")

	sql, err := pgstore.Schema("public." + name) // named with its schema, as the error says
	require.NoError(t, err)
	require.Contains(t, sql, "CREATE TABLE IF NOT EXISTS "+pgx.Identifier{"public", name}.Sanitize())
	require.NotContains(t, sql, "{{", "every placeholder, constants of package driver included, is written in")
	_, err = pool.Exec(ctx, sql)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, sql)
	require.NoError(t, err, "the schema's SQL is idempotent")

	s, err := pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.NoError(t, err)
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute}},
		ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	for _, want := range []bool{true, true, false} {
		res, err := lim.Limit(ctx, "l", "k")
		require.NoError(t, err)
		require.Equal(t, want, res.OK)
	}

	// A function dropped by hand is missing, and said so.
	_, err = pool.Exec(ctx, "DROP FUNCTION "+pgx.Identifier{name + "_one"}.Sanitize()+oneArgs)
	require.NoError(t, err)
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorContains(t, err, name+"_one")
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err, "without WithoutDDL, New installs it again")
}

//go:embed testdata/schema_v1.sql
var schemaV1 string

// upgradeKeepsRecord makes a store of the table name, which an earlier
// build (what) made and left a record of 7 tokens of limit l for key user
// in: New upgrades it, the record reads as it was, and it goes on
// deciding.
func upgradeKeepsRecord(t *testing.T, pool *pgxpool.Pool, name string, limits ratelimit.Limits, what string) {
	t.Helper()
	ctx := context.Background()
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	lim, err := ratelimit.New(s, limits, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	st, err := lim.Value(ctx, "l", "user")
	require.NoError(t, err)
	require.Equal(t, 7.0, st.Remaining, "the record of %s is read as it was", what)
	res, err := lim.Limit(ctx, "l", "user", ratelimit.Count(7))
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = lim.Limit(ctx, "l", "user")
	require.NoError(t, err)
	require.False(t, res.OK)
}

// installV1 makes table as the previous release did.
func installV1(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	sql := strings.NewReplacer(
		"{{table}}", pgx.Identifier{name}.Sanitize(),
		"{{index}}", pgx.Identifier{name + "_expires_idx"}.Sanitize(),
		"{{apply}}", pgx.Identifier{name + "_apply"}.Sanitize(),
	).Replace(schemaV1)
	_, err := pool.Exec(context.Background(), sql)
	require.NoError(t, err)
}

// A table of the previous release keeps its records through New, which
// upgrades it; WithoutDDL refuses it and says what to do.
func TestUpgradeFromVersion1(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	name := uniqueTable(t, pool)
	installV1(t, pool, name)

	// A record written by version 1's function: 3 of 10 tokens spent.
	limits := ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour, Start: time.UnixMilli(0)}}
	id := driver.RecordID{Name: "l", Key: "user", Shard: 0}
	_, err := pool.Exec(ctx, "SELECT * FROM "+pgx.Identifier{name + "_apply"}.Sanitize()+
		"(0, $1, false, '{3}', '{1}', ARRAY[sha256($2)], ARRAY[$3::bytea], ARRAY[$4::bytea], '{0}', '{1}', '{10}', '{3600000}', '{10}', '{0}', '{0}')",
		t0.UnixMilli(), id.AppendKey(nil), []byte("l"), []byte("user"))
	require.NoError(t, err)

	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorContains(t, err, "earlier release")

	upgradeKeepsRecord(t, pool, name, limits, "version 1")

	var indexes int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_index WHERE indrelid = to_regclass($1) AND NOT indisprimary",
		pgx.Identifier{name}.Sanitize()).Scan(&indexes))
	require.Zero(t, indexes, "version 1's index on expires, which rules out HOT updates, is gone")
	var v1 bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regprocedure($1) IS NOT NULL", pgx.Identifier{name + "_apply"}.Sanitize()+
		"(integer, bigint, boolean, float8[], integer[], bytea[], bytea[], bytea[], integer[], integer[], float8[], bigint[], float8[], float8[], bigint[])").Scan(&v1))
	require.True(t, v1, "version 1's function, unmarked, is the store's, and left for its processes still running")
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.NoError(t, err)
}

// A process of version 1 that starts after the upgrade makes version 1's
// index on expires again (its script's CREATE INDEX IF NOT EXISTS), which
// rules out HOT updates: the next New drops it again, as the docs say,
// keeping the records. It did not: a New that found this release's mark
// ran nothing, and the index stayed. New WithoutDDL, which changes
// nothing, accepts the schema all the same: the index is the next
// migration's to drop.
func TestVersion1IndexMadeAgain(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	name := uniqueTable(t, pool)
	installV1(t, pool, name)
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	require.NoError(t, s.Apply(ctx, limitOp("k", 3), make([]driver.Decision, 1)))
	indexes := func() int { return oldIndexes(t, pool, name) }
	require.Zero(t, indexes())

	installV1(t, pool, name) // a process of version 1 starts
	require.Equal(t, 1, indexes())
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.NoError(t, err)
	require.Equal(t, 1, indexes(), "WithoutDDL changes nothing")
	newDropsIndex(t, pool, name) // version 1's index dropped again
	s, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	got, found := remaining(t, s, "k")
	require.True(t, found)
	require.Equal(t, 7.0, got)
}

// Every update of a hot record is a HOT update: no index entry to add.
func TestHotUpdates(t *testing.T) {
	ctx := context.Background()
	pool, name, s := newTableStore(t)
	mock := newMock(t0)
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1e9, Period: time.Second}},
		ratelimit.WithClock(mock))
	require.NoError(t, err)
	for range 200 {
		_, err := lim.Limit(ctx, "l", "hot")
		require.NoError(t, err)
		mock.Add(time.Millisecond) // expires changes with every write
	}
	// The statistics collector reports with a delay; wait for the counts.
	var upd, hot int64
	require.Eventually(t, func() bool {
		_, err := pool.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = to_regclass($1)",
			pgx.Identifier{name}.Sanitize()).Scan(&upd, &hot))
		return upd >= 199
	}, 10*time.Second, 50*time.Millisecond)
	require.GreaterOrEqual(t, hot, upd*9/10, "HOT updates: %d of %d", hot, upd)
}

// relationState is what a test reads of a relation that New must leave as
// it was: its kind, comment and storage options, its rows, and the
// functions named after it.
type relationState struct {
	Kind             string
	Comment, Options *string
	Rows, Functions  int
}

func readRelation(t *testing.T, pool *pgxpool.Pool, name string) relationState {
	t.Helper()
	ctx := context.Background()
	quoted := pgx.Identifier{name}.Sanitize()
	var st relationState
	require.NoError(t, pool.QueryRow(ctx, "SELECT relkind::text, obj_description(oid, 'pg_class'), array_to_string(reloptions, ',') "+
		"FROM pg_class WHERE oid = to_regclass($1)", quoted).Scan(&st.Kind, &st.Comment, &st.Options))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+quoted).Scan(&st.Rows))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_proc WHERE starts_with(proname, $1)", name+"_").Scan(&st.Functions))
	return st
}

// A relation of the table's name that is not a table of the store's (a
// table of the application's, with other columns, other types, a column
// more, another primary key; a view) is refused by New, with or without
// WithoutDDL, and by the SQL of Schema, with an error that names it and
// says what to do; and it is left as it was: no comment marks it as the
// store's, no option, row or function is changed or added. New marked such
// a table as its own, and every call on it then failed.
func TestNewRefusesARelationNotItsOwn(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	const storeColumns = "id bytea, name bytea, key bytea, shard integer, value double precision, ts bigint, expires bigint"
	for _, tc := range []struct {
		name, create, why string
		mark              bool // with the store's functions, and marked as its table (as New left one it took over)
	}{
		{name: "another table", create: "CREATE TABLE %s (a integer, id text)", why: "has the columns a integer, id text"},
		{name: "a column of another type", create: "CREATE TABLE %s (" + storeColumns + ", PRIMARY KEY (id)); ALTER TABLE %[1]s ALTER value TYPE numeric",
			why: "has the columns expires bigint, id bytea, key bytea, name bytea, shard integer, ts bigint, value numeric"},
		{name: "a column more", create: "CREATE TABLE %s (" + storeColumns + ", owner text, PRIMARY KEY (id))",
			why: "has the columns expires bigint, id bytea, key bytea, name bytea, owner text, shard integer, ts bigint, value double precision"},
		{name: "no primary key", create: "CREATE TABLE %s (" + storeColumns + ")", why: "has no primary key"},
		{name: "another primary key", create: "CREATE TABLE %s (" + storeColumns + ", PRIMARY KEY (name, key))", why: "has the primary key (key, name)"},
		{name: "a view", create: "CREATE VIEW %s AS SELECT 1 AS x", why: "is a view"},
		{name: "another table marked as the store's", create: "CREATE TABLE %s (a integer, id text)", why: "has the columns a integer, id text", mark: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := uniqueTable(t, pool)
			quoted := pgx.Identifier{name}.Sanitize()
			t.Cleanup(func() { _, _ = pool.Exec(ctx, "DROP VIEW IF EXISTS "+quoted) }) // before uniqueTable's
			comment := "the orders of the shop"
			if tc.mark {
				// The store's table and functions, then the table
				// replaced by another with the store's mark on it.
				_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
				require.NoError(t, err)
				require.NoError(t, pool.QueryRow(ctx, "SELECT obj_description(to_regclass($1), 'pg_class')", quoted).Scan(&comment))
				_, err = pool.Exec(ctx, "DROP TABLE "+quoted)
				require.NoError(t, err)
			}
			_, err := pool.Exec(ctx, fmt.Sprintf(tc.create, quoted))
			require.NoError(t, err)
			if !strings.Contains(tc.create, "VIEW") {
				rows := "(a, id) SELECT i, i::text"
				if strings.Contains(tc.create, storeColumns) {
					rows = "(id, name, key, shard, value, ts, expires) SELECT i::text::bytea, 'l', i::text::bytea, 0, 1, 1, 1"
				}
				_, err = pool.Exec(ctx, "INSERT INTO "+quoted+" "+rows+" FROM generate_series(1, 3) i")
				require.NoError(t, err)
				_, err = pool.Exec(ctx, "COMMENT ON TABLE "+quoted+" IS "+quoteLiteral(comment))
				require.NoError(t, err)
			}
			before := readRelation(t, pool, name)

			for _, opts := range [][]pgstore.Option{{pgstore.WithTable(name)}, {pgstore.WithTable(name), pgstore.WithoutDDL()}} {
				_, err := pgstore.New(ctx, pool, opts...)
				require.ErrorIs(t, err, pgstore.ErrNotStoreTable)
				require.NotErrorIs(t, err, pgstore.ErrSchema)
				require.ErrorContains(t, err, quoted+" exists and is not the store's table: it "+tc.why+", where the store's has the columns "+storeColumns)
				require.ErrorContains(t, err, "give it a table of its own with WithTable")
				require.Equal(t, before, readRelation(t, pool, name), "New left the relation as it was")
			}

			// The SQL of Schema, applied by hand, refuses it too.
			sql, err := pgstore.Schema(name)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, sql)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "RLTBL", pgErr.Code)
			require.Equal(t, quoted+" exists and is not the table of a ratelimit store: it "+tc.why, pgErr.Message)
			require.Equal(t, before, readRelation(t, pool, name), "the schema's SQL left the relation as it was")
		})
	}
}

// The tables of the store, of this release and of the previous one, and
// one whose columns the schema's SQL made in another order, are the
// store's: New takes them, and the schema's SQL applies again.
func TestNewTakesItsOwnTables(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)

	current := uniqueTable(t, pool)
	_, err := pgstore.New(ctx, pool, pgstore.WithTable(current))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "COMMENT ON TABLE "+pgx.Identifier{current}.Sanitize()+" IS NULL") // as if from another build
	require.NoError(t, err)
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(current))
	require.NoError(t, err)

	v1 := uniqueTable(t, pool)
	installV1(t, pool, v1)
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(v1))
	require.NoError(t, err)

	reordered := uniqueTable(t, pool)
	_, err = pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{reordered}.Sanitize()+
		" (expires bigint NOT NULL, ts bigint, value double precision, shard integer NOT NULL, key bytea NOT NULL, name bytea NOT NULL, id bytea PRIMARY KEY)")
	require.NoError(t, err)
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(reordered))
	require.NoError(t, err)
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, &driver.Op{Now: t0.UnixMilli(), Items: []driver.Item{{Name: "l", Key: "k", Count: 1,
		Shards: []driver.Shard{{Params: driver.Params{Kind: driver.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}}}}}}, out))
	require.True(t, out[0].OK)
}

// Version 1's index on expires, which New drops, is "<table>_expires_idx":
// an index of that name on another table is the application's, and New
// leaves it.
func TestNewLeavesAnIndexOfItsOldNameOnAnotherTable(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	name := uniqueTable(t, pool)
	other := uniqueTable(t, pool)
	_, err := pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (expires bigint); CREATE INDEX %s ON %[1]s (expires)",
		pgx.Identifier{other}.Sanitize(), pgx.Identifier{name + "_expires_idx"}.Sanitize()))
	require.NoError(t, err)
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	var on *string
	require.NoError(t, pool.QueryRow(ctx, "SELECT (SELECT indrelid::regclass::text FROM pg_index WHERE indexrelid = to_regclass($1))",
		pgx.Identifier{name + "_expires_idx"}.Sanitize()).Scan(&on))
	require.NotNil(t, on, "the index of the other table was dropped")
	require.Equal(t, other, *on)
}

//go:embed testdata/schema_2_unmarked.sql
var schema2Unmarked string

// installUnmarked makes table as the build before the store marked its
// functions did.
func installUnmarked(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), strings.ReplaceAll(schema2Unmarked, "{{name}}", name))
	require.NoError(t, err)
}

// The signatures of the store's functions, as a test creates functions of
// the application's with them.
const (
	applyArgs = "(bigint[], float8[], integer[], bytea[], bytea[], bytea[], integer[], integer, bigint[], float8[], integer, boolean, bigint[])"
	splitArgs = "(bigint, float8, bigint, float8, float8, bigint, float8, bigint, float8, float8, float8, bigint, float8, bigint, bigint, float8, boolean)"
)

// functionState is what a test reads of the functions named after a
// table: each one's signature, language, comment and body.
func functionState(t *testing.T, pool *pgxpool.Pool, name string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT oid::regprocedure::text || ' ' || prolang::text || ' ' || "+
		"coalesce(obj_description(oid, 'pg_proc'), '-') || ' ' || prosrc FROM pg_proc WHERE starts_with(proname, $1) ORDER BY 1", name+"_")
	require.NoError(t, err)
	fns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return fns
}

// A function of the application's that bears the name of one of the
// store's (the table's name and a suffix), with the store's arguments or
// others, is refused by New, with or without WithoutDDL, and by the SQL of
// Schema, with an error that names it and says what to do; and it is left
// as it was, and nothing is made beside it. New replaced such a function
// with its own (CREATE OR REPLACE), or dropped it (the DROP FUNCTION IF
// EXISTS of an earlier signature, which _one's is), and made its own
// beside one of other arguments, where the application's calls and the
// store's could then find two candidates.
func TestNewLeavesTheApplicationsFunctions(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	for _, tc := range []struct {
		name   string
		create string // %s: the table's name, unquoted
		call   string // a call of the application's function, and what it returns
		want   string
		table  func(t *testing.T, name string)
		sig    string // as the error names it; %s: the table's name
	}{
		{name: "_del with the store's arguments", create: `CREATE FUNCTION "%s_del"(ids bytea[]) RETURNS text LANGUAGE sql AS $$SELECT 'the application''s'$$`,
			call: `SELECT "%s_del"(ARRAY[]::bytea[])`, want: "the application's", sig: "function %s_del(bytea[])"},
		{name: "_one, whose old signature the script dropped", create: `CREATE FUNCTION "%s_one"(bytea, bytea, bytea, integer, integer, float8, bigint, float8, float8, bigint, bigint, float8, integer, integer)
			RETURNS text LANGUAGE plpgsql AS $$BEGIN RETURN 'the application''s'; END$$`,
			call: `SELECT "%s_one"('', '', '', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)`, want: "the application's",
			sig: "function %s_one(bytea,bytea,bytea,integer,integer,double precision,bigint,double precision,double precision,bigint,bigint,double precision,integer,integer)"},
		{name: "_split, PL/pgSQL with the store's arguments", create: `CREATE FUNCTION "%s_split"` + splitArgs + ` RETURNS text LANGUAGE plpgsql AS $$BEGIN RETURN 'the application''s'; END$$`,
			call: `SELECT "%s_split"(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false)`, want: "the application's",
			sig: "function %s_split(bigint,double precision,bigint,double precision,double precision,bigint,double precision,bigint,double precision,double precision,double precision,bigint,double precision,bigint,bigint,double precision,boolean)"},
		{name: "_read with other arguments", create: `CREATE FUNCTION "%s_read"(id integer) RETURNS integer LANGUAGE sql AS 'SELECT id + 1'`,
			call: `SELECT "%s_read"(41)::text`, want: "42", sig: "function %s_read(integer)"},
		{name: "_sweep beside the store's table", create: `CREATE FUNCTION "%s_sweep"(text) RETURNS text LANGUAGE sql AS 'SELECT $1'`,
			call: `SELECT "%s_sweep"('the application''s')`, want: "the application's", sig: "function %s_sweep(text)",
			table: func(t *testing.T, name string) {
				_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
				require.NoError(t, err)
				_, err = pool.Exec(ctx, "COMMENT ON TABLE "+pgx.Identifier{name}.Sanitize()+" IS NULL") // as if from an earlier build
				require.NoError(t, err)
			}},
		// A build of version 2 before _read existed made the table and
		// its mark beside the application's _read, which does not read
		// the table: it is not the store's.
		{name: "_read with the store's arguments beside a table of version 2", create: `CREATE FUNCTION "%s_read"(p_id bytea[]) RETURNS TABLE (id bytea, value float8, ts bigint)
			LANGUAGE plpgsql AS $$BEGIN RETURN QUERY SELECT 'a'::bytea, 1::float8, 2::bigint; END$$`,
			call: `SELECT count(*)::text FROM "%s_read"(ARRAY[]::bytea[])`, want: "1", sig: "function %s_read(bytea[])",
			table: func(t *testing.T, name string) {
				installUnmarked(t, pool, name)
				_, err := pool.Exec(ctx, "DROP FUNCTION "+pgx.Identifier{name + "_read"}.Sanitize()+"(bytea[])")
				require.NoError(t, err)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := uniqueTable(t, pool)
			if tc.table != nil {
				tc.table(t, name)
			}
			_, err := pool.Exec(ctx, fmt.Sprintf(tc.create, name))
			require.NoError(t, err)
			before := functionState(t, pool, name)
			var table *string
			require.NoError(t, pool.QueryRow(ctx, "SELECT obj_description(to_regclass($1), 'pg_class')", pgx.Identifier{name}.Sanitize()).Scan(&table))
			sig := fmt.Sprintf(tc.sig, name)

			for _, opts := range [][]pgstore.Option{{pgstore.WithTable(name)}, {pgstore.WithTable(name), pgstore.WithoutDDL()}} {
				_, err := pgstore.New(ctx, pool, opts...)
				require.ErrorIs(t, err, pgstore.ErrNotStoreFunction)
				require.NotErrorIs(t, err, pgstore.ErrSchema)
				// New names the table with the schema it resolved the name
				// to, and the function with its schema too: it reads the
				// catalog under the search_path pg_catalog, pg_temp.
				require.ErrorContains(t, err, strings.Replace(sig, "function ", "function public.", 1)+
					": not the store's, yet named as the store of table "+pgx.Identifier{"public", name}.Sanitize()+" names its functions")
				require.ErrorContains(t, err, "give it a table of another name with WithTable")
				require.Equal(t, before, functionState(t, pool, name), "New left the functions as they were")
				var got string
				require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(tc.call, name)).Scan(&got))
				require.Equal(t, tc.want, got)
			}
			var after *string
			require.NoError(t, pool.QueryRow(ctx, "SELECT obj_description(to_regclass($1), 'pg_class')", pgx.Identifier{name}.Sanitize()).Scan(&after))
			require.Equal(t, table, after, "New neither made nor marked the table")

			// The SQL of Schema, applied by hand, refuses it too.
			sql, err := pgstore.Schema(name)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, sql)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "RLFUN", pgErr.Code)
			require.Equal(t, sig+": not a ratelimit store's, yet named as the store of table "+pgx.Identifier{name}.Sanitize()+" names its functions", pgErr.Message)
			require.Equal(t, before, functionState(t, pool, name), "the schema's SQL left the functions as they were")
		})
	}
}

// The functions of the build before the store marked them, which carry no
// mark, are the store's: New upgrades them beside a table of that build
// and marks them, keeping the table's records; so is a PL/pgSQL _apply of
// an earlier argument list, which New leaves. Every function New makes is
// marked.
func TestUpgradeFromUnmarkedFunctions(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	name := uniqueTable(t, pool)
	installUnmarked(t, pool, name)
	// An _apply of the first builds of version 2 (eleven arguments), left
	// by the builds after them as an overload.
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION "%s_apply"(bigint[], float8[], integer[], bytea[], bytea[], bytea[], integer[], integer, bigint[], float8[], integer)
		RETURNS void LANGUAGE plpgsql AS $$BEGIN PERFORM FROM "%[1]s"; END$$`, name))
	require.NoError(t, err)
	var unmarked int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_proc WHERE starts_with(proname, $1) AND obj_description(oid, 'pg_proc') IS NULL",
		name+"_").Scan(&unmarked))
	require.Equal(t, 8, unmarked, "the earlier build's 7 functions and the old _apply, unmarked")

	// A record written by the earlier build's function: 3 of 10 tokens
	// spent.
	limits := ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour, Start: time.UnixMilli(0)}}
	id := driver.RecordID{Name: "l", Key: "user", Shard: 0}
	var ok bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT ok FROM "+pgx.Identifier{name + "_one"}.Sanitize()+
		"(sha256($1), $2, $3, 0, 1, 10, 3600000, 10, 0, 0, $4, 3, 0, 0)",
		id.AppendKey(nil), []byte("l"), []byte("user"), t0.UnixMilli()).Scan(&ok))
	require.True(t, ok)

	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.ErrorIs(t, err, pgstore.ErrSchema, "the table of an earlier build")
	require.ErrorContains(t, err, "another release")

	upgradeKeepsRecord(t, pool, name, limits, "the earlier build")

	fns := functionState(t, pool, name)
	require.Len(t, fns, 8)
	marked := 0
	for _, fn := range fns {
		if strings.Contains(fn, " ratelimit pgstore function ") {
			marked++
		} else {
			require.True(t, strings.HasPrefix(fn, name+"_apply(bigint[],double precision[],integer[],bytea[],bytea[],bytea[],integer[],integer,bigint[],double precision[],integer) "),
				"only the old _apply is left unmarked: %s", fn)
		}
	}
	require.Equal(t, 7, marked, "New marked every function it made")
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.NoError(t, err)
}

// The functions of a table in a schema are made in that schema: a
// function of the application's of one of their names there is refused,
// one in another schema is not in the way, and each is left as it was.
func TestFunctionsInTheTablesSchema(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	schema := fmt.Sprintf("ratelimit_test_%d", time.Now().UnixNano())
	name := uniqueTable(t, pool) // its functions in the default schema go with it
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE") })
	mine := func(s string) string {
		var got string
		require.NoError(t, pool.QueryRow(ctx, "SELECT "+s).Scan(&got))
		return got
	}
	inSchema := pgx.Identifier{schema, name + "_read"}.Sanitize()
	outside := pgx.Identifier{name + "_del"}.Sanitize()
	_, err = pool.Exec(ctx, "CREATE FUNCTION "+inSchema+"(integer) RETURNS text LANGUAGE sql AS $$SELECT 'the application''s'$$; "+
		"CREATE FUNCTION "+outside+"(bytea[]) RETURNS text LANGUAGE sql AS $$SELECT 'the application''s too'$$")
	require.NoError(t, err)

	_, err = pgstore.New(ctx, pool, pgstore.WithTable(schema+"."+name))
	require.ErrorIs(t, err, pgstore.ErrNotStoreFunction)
	require.ErrorContains(t, err, "function "+schema+"."+name+"_read(integer): not the store's")
	require.NotContains(t, err.Error(), name+"_del")
	require.Equal(t, "the application's", mine(inSchema+"(1)"))

	_, err = pool.Exec(ctx, "DROP FUNCTION "+inSchema+"(integer)")
	require.NoError(t, err)
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(schema+"."+name))
	require.NoError(t, err)
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, &driver.Op{Now: t0.UnixMilli(), Items: []driver.Item{{Name: "l", Key: "k", Count: 1,
		Shards: []driver.Shard{{Params: driver.Params{Kind: driver.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}}}}}}, out))
	require.True(t, out[0].OK)
	require.Equal(t, "the application's too", mine(outside+"(ARRAY[]::bytea[])"))
	var marked int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_proc WHERE pronamespace = $1::regnamespace AND obj_description(oid, 'pg_proc') = 'ratelimit pgstore function'",
		pgx.Identifier{schema}.Sanitize()).Scan(&marked))
	require.Equal(t, 7, marked)
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(schema+"."+name), pgstore.WithoutDDL())
	require.NoError(t, err)
}

// oldIndexes counts the indexes of table other than its primary key: version
// 1's on expires, if a process of version 1 made it.
func oldIndexes(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_index WHERE indrelid = to_regclass($1) AND NOT indisprimary",
		pgx.Identifier{table}.Sanitize()).Scan(&n))
	return n
}

// newDropsIndex runs New on table until version 1's index is gone, and
// fails the test if it stays. A New that finds only that drop left does it
// only if the install lock is free, and the lock is the database's: a test
// of another package installing its own table in the same database at that
// moment makes one New leave the index (as a process starting beside
// another does), so one New alone would make the test depend on what else
// runs.
//
// Each New goes once the install lock is free (awaitInstallLock): under
// load, another package's install, or another test binary's, held it for
// longer than 50 News in a row took, and the test failed with the table's
// lock free. A New that leaves the index with the install lock free fails
// the test all the same, once 50 have.
func newDropsIndex(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	for range 50 {
		awaitInstallLock(t, pool)
		_, err := pgstore.New(context.Background(), pool, pgstore.WithTable(table))
		require.NoError(t, err)
		if oldIndexes(t, pool, table) == 0 {
			return
		}
	}
	t.Fatalf("version 1's index of %s is still there after 50 News, with the table's lock free", table)
}

// awaitInstallLock returns once no session holds the install lock
// (pgstore.SchemaLock), taking it and letting it go: a New that finds only
// version 1's index to drop drops it only if the lock is free. A wait of a
// minute fails the test.
func awaitInstallLock(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", pgstore.SchemaLock)
		return err
	})
	require.NoError(t, err, "waiting for the install lock")
}

// holdShared reads table in a transaction of its own, left open until
// release is called (or the test ends), as a long report or pg_dump does:
// it holds the table's ACCESS SHARE lock, which the store's calls do not
// wait for, and which a DROP INDEX of the table waits for.
func holdShared(t *testing.T, pool *pgxpool.Pool, table string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	release = sync.OnceFunc(func() { _ = tx.Rollback(ctx) })
	t.Cleanup(release) // before the table is dropped, which waits for the lock
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS SHARE MODE")
	require.NoError(t, err)
	return release
}

// v1IndexMadeAgain returns a fresh table of this release, whose record
// of key "k" a call of 3 tokens wrote, and on which a process of version 1
// then made its index again; and the store New made of it.
func v1IndexMadeAgain(t *testing.T) (*pgxpool.Pool, string, *pgstore.Store) {
	t.Helper()
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	name := uniqueTable(t, pool)
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	require.NoError(t, s.Apply(ctx, limitOp("k", 3), make([]driver.Decision, 1)))
	installV1(t, pool, name) // a process of version 1 starts
	require.Equal(t, 1, oldIndexes(t, pool, name))
	return pool, name, s
}

// New drops version 1's index, made again by a process of version 1, only
// if it gets the table's lock within a short bound: while a long
// transaction reads the table, it leaves the index, returns, and the next
// New drops it. Before, its DROP INDEX queued behind that transaction for
// as long as it lasted, and every call on the table, from every process,
// queued behind the DROP INDEX.
//
// The New must have tried the drop, and given up: its warning says so. A
// New that finds the install lock held, as another package's install
// holds it under load, tries nothing, and passed whatever its wait; it
// goes again once the lock is free (awaitInstallLock).
func TestVersion1IndexDropWaitsBriefly(t *testing.T) {
	ctx := context.Background()
	pool, name, _ := v1IndexMadeAgain(t)
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	var (
		mu       sync.Mutex
		warnings []string
	)
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if n.Severity == "WARNING" && strings.Contains(n.Message, name+"_expires_idx") {
			mu.Lock()
			warnings = append(warnings, n.Message)
			mu.Unlock()
		}
	}
	noticed, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer noticed.Close()
	tried := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(warnings) > 0
	}

	release := holdShared(t, pool, name)
	var s *pgstore.Store
	for i := 0; i < 50 && !tried(); i++ {
		awaitInstallLock(t, pool)
		// Far longer than the bound: New returns long before, or fails.
		nctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		s, err = pgstore.New(nctx, noticed, pgstore.WithTable(name))
		cancel()
		require.NoError(t, err, "New waited for the table's lock")
	}
	require.True(t, tried(), "a New tried to drop the index while the table was held")
	require.Equal(t, 1, oldIndexes(t, pool, name), "the index is left while the table is held")
	require.NoError(t, s.Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1)))
	release()

	newDropsIndex(t, pool, name)
	got, found := remaining(t, s, "k")
	require.True(t, found)
	require.Equal(t, 6.0, got)
}

// The script of Schema, applied as a migration while a long transaction
// reads the table, leaves version 1's index with a warning rather than
// make every call on the table queue behind its DROP INDEX.
func TestVersion1IndexDropInTheScript(t *testing.T) {
	ctx := context.Background()
	pool, name, _ := v1IndexMadeAgain(t)
	sql, err := pgstore.Schema("public." + name)
	require.NoError(t, err)

	release := holdShared(t, pool, name)
	defer release()
	cfg, err := pgx.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	var warnings []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if n.Severity == "WARNING" {
			warnings = append(warnings, n.Message)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	// Far longer than the bound: the script ends long before, or fails.
	nctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = pgx.BeginFunc(nctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(nctx, sql)
		return err
	})
	require.NoError(t, err, "the script waited for the table's lock")
	require.Len(t, warnings, 1)
	require.Contains(t, warnings[0], name+"_expires_idx")
	require.Equal(t, 1, oldIndexes(t, pool, name))
}

// A New that finds this release's schema, and version 1's index made
// again, does not wait for the install lock to drop it: whoever holds the
// lock is installing. Before, processes that started together each waited
// for the lock in turn, and a migration in a long transaction held them
// all, though none had anything to install but the drop.
func TestVersion1IndexDropSkippedWhileInstalling(t *testing.T) {
	ctx := context.Background()
	pool, name, _ := v1IndexMadeAgain(t)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", pgstore.SchemaLock)
	require.NoError(t, err)
	// Far longer than New takes: it returns long before, or fails.
	nctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	s, err := pgstore.New(nctx, pool, pgstore.WithTable(name))
	cancel()
	require.NoError(t, err, "New waited for the install lock")
	require.Equal(t, 1, oldIndexes(t, pool, name))
	require.NoError(t, s.Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1)))
	require.NoError(t, tx.Rollback(ctx))

	newDropsIndex(t, pool, name)
}

// A name part in double quotes, as SQL writes an identifier, is the name
// between them ("" for a quote), so that a schema whose name holds a dot
// can be named: `"my.schema"."T a.b"` is the table T a.b of schema
// my.schema. Before, the name was cut at its first dot, whatever the
// quotes: New looked for schema `"my` and failed on it with PostgreSQL's
// error. A part without quotes is taken as it is, upper case and spaces
// included; a quoted part left open, or followed by anything but a dot,
// is refused with ErrTableName.
func TestQuotedTableNames(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	id := time.Now().UnixNano()
	schema := fmt.Sprintf(`ratelimit test.%d "sch"`, id)
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE") })
	quoted := `"` + strings.ReplaceAll(schema, `"`, `""`) + `"`
	for _, c := range []struct{ name, table string }{
		{quoted + `."T a.b"`, "T a.b"},
		{quoted + `.Upper Case`, "Upper Case"},
		{quoted + `.x.y`, "x.y"}, // the rest of the name, unquoted, as before
		{quoted + `."q""uote"`, `q"uote`},
	} {
		s, err := pgstore.New(ctx, pool, pgstore.WithTable(c.name))
		require.NoError(t, err, c.name)
		require.NoError(t, s.Apply(ctx, limitOp("k", 3), make([]driver.Decision, 1)), c.name)
		var rows int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, c.table}.Sanitize()).Scan(&rows), c.name)
		require.Equal(t, 1, rows, c.name)
		sql, err := pgstore.Schema(c.name)
		require.NoError(t, err)
		require.Contains(t, sql, "CREATE TABLE IF NOT EXISTS "+pgx.Identifier{schema, c.table}.Sanitize()+" (")
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(c.name), pgstore.WithoutDDL())
		require.NoError(t, err, c.name)
	}
	for _, name := range []string{`"open`, `"a"b.c`, `"a".`, `"".t`, `s.""`, `"a"."b".c`, `"a""`} {
		_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.ErrorIs(t, err, pgstore.ErrTableName, "%s", name)
		_, err = pgstore.Schema(name)
		require.ErrorIs(t, err, pgstore.ErrTableName, "%s", name)
	}
	_, err = pgstore.Schema(`"pg_temp".t`)
	require.ErrorIs(t, err, pgstore.ErrTableName)
	require.ErrorContains(t, err, "temporary schema")
}

// holdTable begins a transaction on pool that locks table (public's) in
// mode, as a VACUUM, an ANALYZE or a CREATE INDEX holds it, and returns
// the transaction's backend pid and a function that ends it.
func holdTable(t *testing.T, pool *pgxpool.Pool, table, mode string) (pid uint32, release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	release = sync.OnceFunc(func() { _ = tx.Rollback(ctx) })
	t.Cleanup(release) // before the table is dropped, which waits for the lock
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN "+mode+" MODE")
	require.NoError(t, err)
	return tx.Conn().PgConn().PID(), release
}

// A transaction that holds the table in a mode that conflicts with the
// install's SHARE UPDATE EXCLUSIVE lock (a CREATE INDEX's SHARE, a
// VACUUM's or an ANALYZE's SHARE UPDATE EXCLUSIVE) makes New, and the
// script of Schema, fail within the install's bound, naming that
// transaction's session, rather than wait for as long as it lasts: New
// waited until its context ended (for ever without a deadline), holding
// the install lock, and every New with a schema to install behind it.
// The script leaves the session's lock_timeout as it was.
func TestInstallWaitsForTheTableBriefly(t *testing.T) {
	ctx := context.Background()
	pool, name, s := newTableStore(t)
	def, err := pgstore.Schema("public." + name)
	require.NoError(t, err)
	require.Contains(t, def, "'5000ms'", "the bound")
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "stores", "postgres.md"))
	require.NoError(t, err)
	require.Contains(t, strings.Join(strings.Fields(string(doc)), " "), "waits for it at most 5 s", "docs/stores/postgres.md gives the bound")
	defer pgstore.SetInstallWait(300)()
	sql, err := pgstore.Schema("public." + name)
	require.NoError(t, err)
	for _, mode := range []string{"SHARE", "SHARE UPDATE EXCLUSIVE"} {
		_, err := pool.Exec(ctx, "COMMENT ON TABLE "+pgx.Identifier{name}.Sanitize()+" IS 'ratelimit pgstore schema 2 000000000000'")
		require.NoError(t, err)
		pid, release := holdTable(t, pool, name, mode)

		// Far longer than the bound: New returns long before.
		nctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err = pgstore.New(nctx, pool, pgstore.WithTable(name))
		ended := nctx.Err()
		cancel()
		require.Error(t, err, mode)
		require.NoError(t, ended, "New waited for the table until its context ended (%s): %v", mode, err)
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, "55P03", pe.Code, "%v", err)
		require.ErrorContains(t, err, "another transaction holds the table")
		require.ErrorContains(t, err, fmt.Sprintf("held by pid %d (", pid))

		// The store's calls go on beside a VACUUM's lock (a CREATE
		// INDEX's holds writes up itself). A migration's script fails
		// as New does.
		if mode == "SHARE UPDATE EXCLUSIVE" {
			out := make([]driver.Decision, 1)
			cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			require.NoError(t, s.Apply(cctx, limitOp("k", 1), out))
			cancel()
			require.True(t, out[0].OK)
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sql)
			return err
		})
		require.ErrorAs(t, err, &pe, mode)
		require.Equal(t, "55P03", pe.Code, "%v", err)
		require.Contains(t, pe.Message, "another transaction held it for more than 300ms")
		release()
	}

	// Once the table is free, New installs, and the script, run again in
	// a transaction, leaves its session's lock_timeout as it was.
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return err
		}
		var got string
		require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&got))
		require.Equal(t, "0", got)
		return nil
	}))
}

// A transaction waiting for the table in a mode that conflicts with the
// install's (a migration's ALTER TABLE behind a long report that reads the
// table) queues the install behind it, though no conflicting lock is
// granted: the install fails within its bound all the same, and names
// that waiting session, and the one it waits for, rather than say that
// the holder had ended.
func TestInstallNamesTheSessionItQueuedBehind(t *testing.T) {
	ctx := context.Background()
	pool, name, _ := newTableStore(t)
	defer pgstore.SetInstallWait(300)()
	_, err := pool.Exec(ctx, "COMMENT ON TABLE "+pgx.Identifier{name}.Sanitize()+" IS 'ratelimit pgstore schema 2 000000000000'")
	require.NoError(t, err)
	reader, releaseReader := holdTable(t, pool, name, "ACCESS SHARE")

	// A migration's ALTER TABLE, waiting for the report to end.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	waiter := tx.Conn().PgConn().PID()
	locked := make(chan error, 1)
	go func() {
		_, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{name}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
		locked <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)", waiter).Scan(&waiting)
		return err == nil && waiting
	}, 15*time.Second, 10*time.Millisecond, "the ALTER TABLE does not wait")

	nctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err = pgstore.New(nctx, pool, pgstore.WithTable(name))
	require.NoError(t, nctx.Err(), "New waited for the table until its context ended: %v", err)
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "55P03", pe.Code, "%v", err)
	require.ErrorContains(t, err, fmt.Sprintf("pid %d (AccessExclusiveLock, waiting for pid %d)", waiter, reader))

	releaseReader()
	require.NoError(t, <-locked)
	require.NoError(t, tx.Rollback(ctx))
}
