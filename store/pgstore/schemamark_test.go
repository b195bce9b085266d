package pgstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// The schema's mark is a digest of what the script does, not of how its
// comments read: an edit of the comments or of the layout alone leaves it,
// so that a release that only rewords them does not make every process
// install the schema again (and processes of two such releases take
// turns installing theirs). Before, it was a digest of the script as
// written, comments and all. An edit of a statement, or of a string's
// text, an '--' in it too, changes it.
func TestSchemaMarkIgnoresComments(t *testing.T) {
	sql := pgstore.SchemaSQL
	require.Equal(t, pgstore.SchemaVersion, pgstore.MarkOf(sql))
	const hint = "ratelimit schema --table), or drop or rename that relation"
	require.Contains(t, sql, hint)
	const code = "ALTER TABLE {{table}} SET (fillfactor = 70);"
	require.Contains(t, sql, code)
	for _, tc := range []struct {
		what, sql string
		same      bool
	}{
		{"a comment reworded", strings.Replace(sql, "-- The schema of pgstore", "-- The schema of the store pgstore", 1), true},
		{"a comment added", strings.Replace(sql, code, "-- a comment\n\t-- of two lines\n"+code, 1), true},
		{"a comment after a statement", strings.Replace(sql, code, code+" -- the fillfactor", 1), true},
		{"a comment dropped", strings.Replace(sql, "-- Only the primary key is indexed, so that an update, which changes\n", "", 1), true},
		{"a comment in a function's body", strings.Replace(sql, "EXIT WHEN FOUND;", "EXIT WHEN FOUND; -- written", 1), true},
		{"indentation", strings.ReplaceAll(sql, "\n\t", "\n    "), true},
		{"spaces", strings.Replace(sql, code, "ALTER TABLE  {{table}}\t SET (fillfactor  =  70);", 1), true},
		{"trailing space", strings.ReplaceAll(sql, ";\n", "; \n"), true},
		{"a line broken", strings.Replace(sql, code, strings.Replace(code, " SET", "\n\tSET", 1), 1), true},
		{"a statement changed", strings.Replace(sql, code, "ALTER TABLE {{table}} SET (fillfactor = 80);", 1), false},
		{"a string's text", strings.Replace(sql, hint, "ratelimit schema --table), or drop that relation", 1), false},
		{"a string's spaces", strings.Replace(sql, hint, "ratelimit schema  --table), or drop or rename that relation", 1), false},
	} {
		require.NotEqual(t, sql, tc.sql, tc.what)
		if tc.same {
			require.Equal(t, pgstore.SchemaVersion, pgstore.MarkOf(tc.sql), tc.what)
		} else {
			require.NotEqual(t, pgstore.SchemaVersion, pgstore.MarkOf(tc.sql), tc.what)
		}
	}
}

// The mark covers the SQL that pgstore writes into the script as well as
// the script's own: the checks of the install lock (lockHeld, lockTaken),
// of the search_path (pathCheck), of the table and the functions, the
// steps, the functions' search_path and marks, and driver's constants. A
// change of any of them changes the mark, so that New installs the schema
// again. Before, the mark was a digest of schema.sql alone, placeholders
// and all, and a table installed with the earlier SQL read as current.
func TestSchemaMarkCoversWrittenSQL(t *testing.T) {
	all := pgstore.SchemaPlaceholders()
	for _, p := range []string{"{{lock_held}}", "{{lock_taken}}", "{{path_check}}", "{{table_check}}", "{{function_check}}",
		"{{mark_functions}}", "{{pin}}", "{{pin_script}}", "{{bare_functions}}", "{{noise}}", "{{step_zero}}", "{{step 1}}"} {
		require.Contains(t, all, p)
	}
	require.Equal(t, pgstore.SchemaVersion, pgstore.MarkWith(func(_, text string) string { return text }))
	for _, p := range all {
		changed := pgstore.MarkWith(func(placeholder, text string) string {
			if placeholder == p {
				return "X" + text
			}
			return text
		})
		require.NotEqual(t, pgstore.SchemaVersion, changed, "the mark of a script whose %s changed", p)
	}
}

// What the mark reads of a script: comments and whitespace go, but within
// literals and quoted identifiers.
func TestSchemaMarkCanonical(t *testing.T) {
	for _, tc := range []struct{ sql, want string }{
		{"  SELECT 1;  -- one\n\n\tSELECT  2; --", "SELECT 1; SELECT 2;"},
		{"SELECT '--  not a comment';", "SELECT '--  not a comment';"},
		{"SELECT 'it''s -- here' -- gone\n;", "SELECT 'it''s -- here' ;"},
		{`SELECT "a -- b""  c" FROM t;`, `SELECT "a -- b""  c" FROM t;`},
		{`SELECT E'\' -- kept', e'\\'  , 'x';`, `SELECT E'\' -- kept', e'\\' , 'x';`},
		{`SELECT TYPE'\' -- c` + "\n'x';", `SELECT TYPE'\' 'x';`},
		{"SELECT /* a /* nested */ still */ 1;", "SELECT 1;"},
		{"SELECT 1/2 - -3;", "SELECT 1/2 - -3;"},
		{"SELECT 'open", "SELECT 'open"},
		// A dollar-quoted string other than a body's tag ({{q}}) is a
		// string, kept as it is: a -- or a quote in it starts nothing.
		{"SELECT $m$a  -- b$m$, 1; -- c", "SELECT $m$a  -- b$m$, 1;"},
		{"SELECT $$it's$$, 'x -- y';", "SELECT $$it's$$, 'x -- y';"},
		{"SELECT $m$ $n$ -- $m$ -- c\n;", "SELECT $m$ $n$ -- $m$ ;"},
		// A $ within a name, or a parameter, quotes nothing.
		{"SELECT a$b, $1 -- c\n, x$y$ -- d", "SELECT a$b, $1 , x$y$"},
		{"SELECT $m$open -- c", "SELECT $m$open -- c"},
		// A carriage return ends a -- comment, as a line feed does.
		{"SELECT 1 -- c\rDROP TABLE t;", "SELECT 1 DROP TABLE t;"},
	} {
		require.Equal(t, tc.want, pgstore.Canonical(tc.sql), tc.sql)
	}
	// Scripts that differ within a dollar-quoted string differ in mark.
	require.NotEqual(t, pgstore.MarkOf("SELECT $m$a -- b$m$;"), pgstore.MarkOf("SELECT $m$a -- c$m$;"))
}

// A table that carries the mark of the previous build, a digest of its
// script comments and all (the schema it installed is this one's), is
// installed again by New, in place, and marked with this release's; New
// WithoutDDL refuses it until then, naming the mark, as it does any other
// release's.
func TestSchemaMarkOfThePreviousBuild(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	name := uniqueTable(t, pool)
	_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	const previous = "ratelimit pgstore schema 2 847eeb9cedd7"
	require.NotEqual(t, previous, pgstore.SchemaVersion)
	table := pgx.Identifier{"public", name}.Sanitize()
	_, err = pool.Exec(ctx, "COMMENT ON TABLE "+table+" IS '"+previous+"'")
	require.NoError(t, err)
	before := functionOIDs(t, pool, name)

	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.ErrorIs(t, err, pgstore.ErrSchema)
	require.ErrorContains(t, err, previous)
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	var mark string
	require.NoError(t, pool.QueryRow(ctx, "SELECT obj_description($1::regclass, 'pg_class')", table).Scan(&mark))
	require.Equal(t, pgstore.SchemaVersion, mark)
	require.Equal(t, before, functionOIDs(t, pool, name), "the functions replaced in place")
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.NoError(t, err)
}

// The mark is the same in every process and for every table: a New after
// one that installed the schema on a fresh table, and a New after the
// script of Schema for the table named with its schema (or one applied
// under another search_path), finds it current and runs nothing, leaving
// the rows of the table and its functions in the catalog as they were (a
// script run again would write them anew, with new xmins).
func TestSchemaMarkNoReinstall(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	catalog := func(t *testing.T, table string) string {
		t.Helper()
		var rows string
		require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT c.xmin::text FROM pg_class c WHERE c.oid = to_regclass($1)) || ' ' ||
			(SELECT string_agg(p.oid::text || ':' || p.xmin::text, ' ' ORDER BY p.oid) FROM pg_proc p
				WHERE p.pronamespace = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass($1)))`, table).Scan(&rows))
		return rows
	}

	t.Run("New twice", func(t *testing.T) {
		schema := uniqueSchema(t, pool)
		name := schema + ".t"
		_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.NoError(t, err)
		before := catalog(t, name)
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.NoError(t, err)
		require.Equal(t, before, catalog(t, name), "the second New installed the schema again")
	})

	t.Run("the script, then New", func(t *testing.T) {
		schema := uniqueSchema(t, pool)
		name := schema + ".t"
		sql, err := pgstore.Schema(name)
		require.NoError(t, err)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SET LOCAL search_path = "+pgx.Identifier{schema}.Sanitize()+", public")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, sql)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		before := catalog(t, name)
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.NoError(t, err)
		require.Equal(t, before, catalog(t, name), "New installed the schema the script had installed again")
	})
}
