package pgstore_test

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	require.ErrorContains(t, err, "ratelimit schema --table "+name)
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists))
	require.False(t, exists, "WithoutDDL must create nothing")

	sql, err := pgstore.Schema(name)
	require.NoError(t, err)
	require.Contains(t, sql, "CREATE TABLE IF NOT EXISTS "+pgx.Identifier{name}.Sanitize())
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

	s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	lim, err := ratelimit.New(s, limits, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	st, err := lim.Value(ctx, "l", "user")
	require.NoError(t, err)
	require.Equal(t, 7.0, st.Remaining, "the record of version 1 is read as it was")
	res, err := lim.Limit(ctx, "l", "user", ratelimit.Count(7))
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = lim.Limit(ctx, "l", "user")
	require.NoError(t, err)
	require.False(t, res.OK)

	var indexes int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_index WHERE indrelid = to_regclass($1) AND NOT indisprimary",
		pgx.Identifier{name}.Sanitize()).Scan(&indexes))
	require.Zero(t, indexes, "version 1's index on expires, which rules out HOT updates, is gone")
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.NoError(t, err)
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
