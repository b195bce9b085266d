package pgstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// uniqueSchema makes a schema of its own for one test, dropped with all it
// holds at cleanup, and returns its name, short enough to leave room in a
// table name of 57 bytes.
func uniqueSchema(t *testing.T, pool *pgxpool.Pool) string {
	ctx := context.Background()
	schema := "rltest_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() { pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE") })
	return schema
}

// A table name that holds a line break ended a comment of the schema's
// SQL, which named the functions after the table, and the rest of the
// line ran as SQL, as the role that installed the store (or applied the
// script `ratelimit schema --table NAME` printed). New and Schema refuse
// a name that holds any control or other unprintable character, with
// ErrTableName, and run nothing.
func TestTableNameCannotInject(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	schema := uniqueSchema(t, pool)
	code := "CREATE TABLE IF NOT EXISTS " + schema + ".i();--"
	for _, name := range []string{
		schema + ".t\n" + code,
		schema + ".t\r" + code,
		"t\r\n" + code,
		schema + ".t\u2028x", schema + ".t\tx", schema + ".t\u200bx", schema + ".t\u202ex", schema + ".t\x7fx",
	} {
		t.Cleanup(func() { dropTable(pool, name) })
		_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		var made *string
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1)::text", schema+".i").Scan(&made))
		require.Nil(t, made, "%q: the name's SQL ran", name)
		require.ErrorIs(t, err, pgstore.ErrTableName, "%q", name)
		require.ErrorContains(t, err, "unprintable character")
		_, err = pgstore.Schema(name)
		require.ErrorIs(t, err, pgstore.ErrTableName, "%q", name)
	}
	var tables int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace", schema).Scan(&tables))
	require.Zero(t, tables, "tables made in %s", schema)
}

// The schema's SQL writes a table's name, and its functions', as quoted
// identifiers and string literals only: no comment of it holds one.
func TestSchemaCommentsHoldNoName(t *testing.T) {
	const marker = "zqmarkerzq"
	for _, name := range []string{marker, marker + "_s." + marker} {
		sql, err := pgstore.Schema(name)
		require.NoError(t, err)
		require.Contains(t, sql, marker)
		for i, line := range strings.Split(sql, "\n") {
			if c := strings.Index(line, "--"); c >= 0 {
				require.NotContains(t, line[c:], marker, "line %d of the SQL of %q holds the name in a comment: %s", i+1, name, line)
			}
		}
	}
}

// Any printable character is safe in a table name, those that end a
// comment (*/), a string literal (', \' where standard_conforming_strings
// is off), an identifier (") or a dollar-quoted body ($fn$) included: New
// makes the table of that very name, and its calls work, in a session
// whose standard_conforming_strings is on or off. A name holding a
// backslash and a quote ended a string literal of the schema's SQL in a
// session where it was off, and New failed with a syntax error.
func TestTableNamePrintableCharacters(t *testing.T) {
	ctx := context.Background()
	lim := ratelimit.Limits{"signup": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}}
	for _, scs := range []string{"on", "off"} {
		cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
		require.NoError(t, err)
		cfg.ConnConfig.RuntimeParams["standard_conforming_strings"] = scs
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		schema := uniqueSchema(t, pool)
		for _, table := range []string{
			`a*/b/*c`, `a'b`, `a\'b`, `a\\'');SELECT 1/0;--`, `a\`, `"a""b"`, `a$fn$b$fn0$`, `a -- b`, `a;b`, "a é b",
		} {
			name := schema + "." + table
			s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
			require.NoError(t, err, "standard_conforming_strings %s: %q", scs, name)
			l, err := ratelimit.New(s, lim)
			require.NoError(t, err)
			res, err := l.Limit(ctx, "signup", "user")
			require.NoError(t, err)
			require.True(t, res.OK)
			want := strings.ReplaceAll(strings.Trim(table, `"`), `""`, `"`)
			if !strings.HasPrefix(table, `"`) {
				want = table
			}
			var rows int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, want}.Sanitize()).Scan(&rows),
				"standard_conforming_strings %s: %q", scs, name)
			require.Equal(t, 1, rows)
		}
	}
}
