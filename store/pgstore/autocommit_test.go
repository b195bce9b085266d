package pgstore_test

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// statements splits an SQL script into its statements as psql does: at
// each semicolon outside a comment, a string, a quoted identifier and a
// dollar-quoted body.
func statements(script string) []string {
	tag := regexp.MustCompile(`^\$[A-Za-z_0-9]*\$`)
	var out []string
	start := 0
	for i := 0; i < len(script); i++ {
		switch c := script[i]; {
		case c == '-' && strings.HasPrefix(script[i:], "--"):
			end := strings.IndexByte(script[i:], '\n')
			if end < 0 {
				i = len(script)
				break
			}
			i += end
		case c == '\'' || c == '"':
			for i++; i < len(script); i++ {
				if script[i] == c {
					if i+1 < len(script) && script[i+1] == c {
						i++
						continue
					}
					break
				}
			}
		case c == '$' && tag.MatchString(script[i:]):
			t := tag.FindString(script[i:])
			end := strings.Index(script[i+len(t):], t)
			if end < 0 {
				i = len(script)
				break
			}
			i += len(t) + end + len(t) - 1
		case c == ';':
			out = append(out, script[start:i+1])
			start = i + 1
		}
	}
	if rest := strings.TrimSpace(script[start:]); rest != "" && !strings.HasPrefix(rest, "--") {
		out = append(out, rest)
	}
	return out
}

// runAutocommit runs script on conn statement by statement, each in a
// transaction of its own, going on after a statement that fails, as psql
// runs a file without --single-transaction and ON_ERROR_STOP; it returns
// the errors.
func runAutocommit(ctx context.Context, conn *pgconn.PgConn, script string) []error {
	var errs []error
	for _, stmt := range statements(script) {
		if _, err := conn.Exec(ctx, stmt).ReadAll(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// The script of Schema run outside one transaction (psql without
// --single-transaction, a tool that sends it statement by statement),
// each statement committed on its own, and going on after a statement
// that failed, changes nothing, and says to run it in one transaction.
// Before, it ran without the install lock (held to the end of its first
// statement) and without its bound on the wait for the table, and a
// statement that failed halfway left the rest to run: a later release's
// function, which CREATE OR REPLACE may not change (42P13), stayed, and
// the table was marked with this release's schema all the same, so that
// New found nothing to install and its store called that function.
func TestSchemaScriptOutsideATransaction(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)

	run := func(t *testing.T, script string) []error {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		// The session the script leaves is not the pool's to keep.
		defer func() { require.NoError(t, conn.Hijack().Close(ctx)) }()
		return runAutocommit(ctx, conn.Conn().PgConn(), script)
	}
	requireRefused := func(t *testing.T, errs []error) {
		t.Helper()
		require.NotEmpty(t, errs)
		var pe *pgconn.PgError
		require.ErrorAs(t, errs[0], &pe)
		require.Equal(t, "RLTXN", pe.Code, "%v", errs[0])
		require.Contains(t, pe.Message, "one transaction")
		require.Contains(t, pe.Hint, "--single-transaction")
		// A connection of a pool that ran it stays read-only: it says so.
		require.Contains(t, pe.Hint, "close this connection")
		for _, err := range errs[1:] {
			require.ErrorAs(t, err, &pe)
			require.Equal(t, "25006", pe.Code, "a statement after the refusal: %v", err) // read_only_sql_transaction
		}
	}

	t.Run("fresh", func(t *testing.T) {
		name := uniqueTable(t, pool)
		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		requireRefused(t, run(t, sql))
		rels, fns := relations(t, pool, "public", name)
		require.Zero(t, rels, "a table made")
		require.Zero(t, fns, "functions made")
	})

	t.Run("later release", func(t *testing.T) {
		name := uniqueTable(t, pool)
		_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.NoError(t, err)
		one := pgx.Identifier{"public", name + "_one"}.Sanitize()
		table := pgx.Identifier{"public", name}.Sanitize()
		_, err = pool.Exec(ctx, "DROP FUNCTION "+one+oneArgs+"; CREATE FUNCTION "+one+`(
	p_id bytea, p_name bytea, p_key bytea, p_shard integer,
	p_kind integer, p_rate float8, p_period bigint, p_cap float8, p_maxr float8, p_phase bigint,
	p_now bigint, p_count float8, p_flags integer, p_wait integer,
	OUT ok boolean, OUT retry bigint, OUT remaining float8, OUT charged float8, OUT at bigint, OUT ts bigint, OUT later bigint
) LANGUAGE plpgsql AS $$BEGIN ok := true; END$$;
COMMENT ON FUNCTION `+one+oneArgs+` IS 'ratelimit pgstore function';
COMMENT ON TABLE `+table+` IS 'ratelimit pgstore schema 2 later';`)
		require.NoError(t, err)
		before := functionState(t, pool, name)

		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		errs := run(t, sql)
		var mark string
		require.NoError(t, pool.QueryRow(ctx, "SELECT obj_description($1::regclass, 'pg_class')", table).Scan(&mark))
		require.Equal(t, "ratelimit pgstore schema 2 later", mark, "the table marked as this release's")
		require.Equal(t, before, functionState(t, pool, name), "the functions changed")
		requireRefused(t, errs)
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.ErrorIs(t, err, pgstore.ErrSchema, "New finds the later release's schema")
	})

	// Run in one transaction, statement by statement (psql
	// --single-transaction) or at once, it installs.
	t.Run("one transaction", func(t *testing.T) {
		name := uniqueTable(t, pool)
		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		require.Empty(t, run(t, "BEGIN;\n"+sql+"\nCOMMIT;"))
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
		require.NoError(t, err)
	})

	t.Run("psql", func(t *testing.T) {
		psql, err := exec.LookPath("psql")
		if err != nil {
			t.Skip("no psql")
		}
		name := uniqueTable(t, pool)
		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", testserver.PostgresURL(t))
		cmd.Stdin = strings.NewReader(sql)
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "%s", out)
		require.Contains(t, string(out), "one transaction")
		rels, fns := relations(t, pool, "public", name)
		require.Zero(t, rels+fns, "made")

		cmd = exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction", testserver.PostgresURL(t))
		cmd.Stdin = strings.NewReader(sql)
		out, err = cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
		require.NoError(t, err)
	})
}
