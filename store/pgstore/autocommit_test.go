package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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
// that failed, changes nothing: it warns that it must run in one
// transaction and ends its own session, so that no statement after it
// runs there, and nothing of the session is left for a pool to hand out.
// Before, it ran without the install lock (held to the end of its first
// statement) and without its bound on the wait for the table, and a
// statement that failed halfway left the rest to run: a later release's
// function, which CREATE OR REPLACE may not change (42P13), stayed, and
// the table was marked with this release's schema all the same, so that
// New found nothing to install and its store called that function.
func TestSchemaScriptOutsideATransaction(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)

	// run runs script on a session of its own, which records the
	// warnings it is sent, statement by statement.
	run := func(t *testing.T, script string) (errs []error, warnings []*pgconn.Notice) {
		cfg, err := pgconn.ParseConfig(testserver.PostgresURL(t))
		require.NoError(t, err)
		cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			if n.Severity == "WARNING" {
				warnings = append(warnings, n)
			}
		}
		conn, err := pgconn.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		defer func() { _ = conn.Close(ctx) }()
		return runAutocommit(ctx, conn, script), warnings
	}
	requireRefused := func(t *testing.T, script string, errs []error, warnings []*pgconn.Notice) {
		t.Helper()
		require.Len(t, warnings, 1)
		require.Equal(t, "RLTXN", warnings[0].Code)
		require.Contains(t, warnings[0].Message, "one transaction")
		require.Contains(t, warnings[0].Hint, "--single-transaction")
		// The guard ended the session: it and every statement after it
		// failed, none before it.
		stmts := statements(script)
		guard := slices.IndexFunc(stmts, func(s string) bool { return strings.Contains(s, "pg_terminate_backend") })
		require.Positive(t, guard)
		require.Len(t, errs, len(stmts)-guard)
		var pe *pgconn.PgError
		require.ErrorAs(t, errs[0], &pe)
		require.Equal(t, "57P01", pe.Code, "%v", errs[0]) // admin_shutdown: the session ended
	}

	t.Run("fresh", func(t *testing.T) {
		name := uniqueTable(t, pool)
		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		errs, warnings := run(t, sql)
		requireRefused(t, sql, errs, warnings)
		rels, fns := relations(t, pool, "public", name)
		require.Zero(t, rels, "a table made")
		require.Zero(t, fns, "functions made")
	})

	// On a session that holds the install lock at session level
	// (pg_advisory_lock, not the transaction's pg_advisory_xact_lock: a
	// session of a pooler's may hold one that a client took and left),
	// each statement still runs in a transaction of its own. Before, the
	// guard found the lock held by its session and let the script run on,
	// a transaction per statement.
	t.Run("session lock", func(t *testing.T) {
		name := uniqueTable(t, pool)
		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		script := fmt.Sprintf("SELECT pg_advisory_lock(%d);\n", pgstore.SchemaLock) + sql
		errs, warnings := run(t, script)
		requireRefused(t, script, errs, warnings)
		rels, fns := relations(t, pool, "public", name)
		require.Zero(t, rels+fns, "made")
	})

	// Run by a superuser's session after SET ROLE to the role that owns
	// the schema (as a migration runs so that the role owns what it
	// makes), the guard may not end its session (only a superuser ends a
	// superuser's): it fails with RLTXN, saying so, and the table is left
	// unmarked. Before, pg_terminate_backend's own error (42501, "must be
	// a superuser to terminate superuser process") was the guard's.
	t.Run("role that may not end the session", func(t *testing.T) {
		role, schema := otherRole(t, pool)
		sql, err := pgstore.Schema(schema + ".t")
		require.NoError(t, err)
		script := "SET ROLE " + role + ";\n" + sql
		errs, warnings := run(t, script)
		require.Len(t, warnings, 1)
		require.Equal(t, "RLTXN", warnings[0].Code)
		require.NotEmpty(t, errs)
		var pe *pgconn.PgError
		require.ErrorAs(t, errs[0], &pe)
		require.Equal(t, "RLTXN", pe.Code, "%v", errs[0])
		require.Contains(t, pe.Message, "could not end this session")
		require.ErrorAs(t, errs[len(errs)-1], &pe)
		require.Equal(t, "RLTXN", pe.Code, "%v", errs[len(errs)-1])
		var mark *string
		require.NoError(t, pool.QueryRow(ctx, "SELECT obj_description(to_regclass($1), 'pg_class')", schema+".t").Scan(&mark))
		require.Nil(t, mark, "the table marked as installed")
	})

	t.Run("later release", func(t *testing.T) {
		name := uniqueTable(t, pool)
		_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.NoError(t, err)
		table := installLaterRelease(t, pool, name)
		before := functionState(t, pool, name)

		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		errs, warnings := run(t, sql)
		var mark string
		require.NoError(t, pool.QueryRow(ctx, "SELECT obj_description($1::regclass, 'pg_class')", table).Scan(&mark))
		require.Equal(t, "ratelimit pgstore schema 2 later", mark, "the table marked as this release's")
		require.Equal(t, before, functionState(t, pool, name), "the functions changed")
		requireRefused(t, sql, errs, warnings)
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.ErrorIs(t, err, pgstore.ErrSchema, "New finds the later release's schema")
	})

	// Run in one transaction, statement by statement (psql
	// --single-transaction) or at once, it installs.
	t.Run("one transaction", func(t *testing.T) {
		name := uniqueTable(t, pool)
		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		errs, warnings := run(t, "BEGIN;\n"+sql+"\nCOMMIT;")
		require.Empty(t, errs)
		require.Empty(t, warnings)
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
		require.NoError(t, err)
	})

	// Run so on a connection of the application's pool (goose with
	// -- +goose NO TRANSACTION on its *sql.DB, say), the refusal leaves
	// the pool nothing of the session: before, the session was left
	// read-only, and the pool handed it out to the work that came after,
	// whose every write failed (25006).
	t.Run("pool", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
		require.NoError(t, err)
		cfg.MaxConns = 1
		one, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer one.Close()
		name := uniqueTable(t, pool)
		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		conn, err := one.Acquire(ctx)
		require.NoError(t, err)
		errs := runAutocommit(ctx, conn.Conn().PgConn(), sql)
		conn.Release()
		require.NotEmpty(t, errs)
		var readOnly string
		require.NoError(t, one.QueryRow(ctx, "SHOW default_transaction_read_only").Scan(&readOnly))
		require.Equal(t, "off", readOnly, "the pool's next session is read-only")
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

// runPooled runs script statement by statement, each in a transaction of
// its own on a session of its own, as a pooler in transaction mode
// (PgBouncer's pool_mode = transaction) may hand a client's statements to
// its server sessions, and goes on after a statement that fails; it
// returns each statement's error, nil for none. The session of the last
// statement first takes the install lock at session level, and holds it
// as the statement runs, as a server session may hold a lock that a client
// took there and left.
func runPooled(ctx context.Context, t *testing.T, script string) []error {
	t.Helper()
	stmts := statements(script)
	errs := make([]error, len(stmts))
	for i, stmt := range stmts {
		conn, err := pgconn.Connect(ctx, testserver.PostgresURL(t))
		require.NoError(t, err)
		if i == len(stmts)-1 {
			_, err := conn.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_lock(%d)", pgstore.SchemaLock)).ReadAll()
			require.NoError(t, err)
		}
		_, errs[i] = conn.Exec(ctx, stmt).ReadAll()
		_ = conn.Close(ctx)
	}
	return errs
}

// The script of Schema run a transaction per statement through a pooler
// that hands each statement to another session: the guard ends its own
// session, which the statements after it do not run on, and they run
// without the install lock. The last one, which marks the table with
// the schema's version, refuses (SQLSTATE RLTXN) unless its own
// transaction took the lock, and leaves the table unmarked: New installs
// the schema again, under the lock, and WithoutDDL refuses it. Before,
// the table was marked as this release's over what the statements did
// without the lock, and over a later release's mark, its functions
// changed or not.
func TestSchemaScriptThroughAPooler(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	requireUnmarked := func(t *testing.T, errs []error) {
		t.Helper()
		var pe *pgconn.PgError
		guard := slices.IndexFunc(errs, func(err error) bool { return errors.As(err, &pe) && pe.Code == "57P01" })
		require.Positive(t, guard, "the guard ended its session: %v", errs)
		require.ErrorAs(t, errs[len(errs)-1], &pe)
		require.Equal(t, "RLTXN", pe.Code, "%v", errs[len(errs)-1])
		require.Contains(t, pe.Message, "one transaction")
		require.Contains(t, pe.Hint, "--single-transaction")
	}
	mark := func(t *testing.T, name string) *string {
		t.Helper()
		var m *string
		require.NoError(t, pool.QueryRow(ctx, "SELECT obj_description(to_regclass($1), 'pg_class')",
			pgx.Identifier{"public", name}.Sanitize()).Scan(&m))
		return m
	}

	t.Run("fresh", func(t *testing.T) {
		name := uniqueTable(t, pool)
		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		errs := runPooled(ctx, t, sql)
		require.Nil(t, mark(t, name), "the table marked as installed")
		requireUnmarked(t, errs)
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
		require.ErrorIs(t, err, pgstore.ErrSchema)
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.NoError(t, err)
		require.Equal(t, pgstore.SchemaVersion, *mark(t, name))
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
		require.NoError(t, err)
	})

	t.Run("later release", func(t *testing.T) {
		name := uniqueTable(t, pool)
		_, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.NoError(t, err)
		installLaterRelease(t, pool, name)
		sql, err := pgstore.Schema("public." + name)
		require.NoError(t, err)
		errs := runPooled(ctx, t, sql)
		require.Equal(t, "ratelimit pgstore schema 2 later", *mark(t, name), "the table marked as this release's")
		requireUnmarked(t, errs)
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.ErrorIs(t, err, pgstore.ErrSchema, "New finds the later release's schema")
	})
}

// The script of Schema run in one transaction by psql -1 with
// ON_ERROR_ROLLBACK on and without ON_ERROR_STOP, which runs each
// statement under a savepoint, rolls back to it when the statement fails
// and goes on, commits what the rest did: every statement after one that
// failed refuses (SQLSTATE RLSTP) and changes nothing, so that the table
// is not marked as installed, and an application's function that the
// script's check refused is left as it is. New installs the schema then.
// Before, the statements after the failed one ran: the table was marked,
// and the application's function replaced by the store's.
func TestSchemaScriptOnErrorRollback(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql")
	}
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	run := func(t *testing.T, sql string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, psql, "-X", "-q", "--single-transaction", "-v", "ON_ERROR_ROLLBACK=on", testserver.PostgresURL(t))
		cmd.Stdin = strings.NewReader(sql)
		out, _ := cmd.CombinedOutput() // psql exits 0 past a failed statement
		return string(out)
	}
	mark := func(t *testing.T, table string) *string {
		t.Helper()
		var m *string
		require.NoError(t, pool.QueryRow(ctx, "SELECT obj_description(to_regclass($1), 'pg_class')", table).Scan(&m))
		return m
	}
	installs := func(t *testing.T, name string) {
		t.Helper()
		_, err := pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
		require.ErrorIs(t, err, pgstore.ErrSchema)
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.NoError(t, err)
	}

	t.Run("no failure", func(t *testing.T) {
		name := uniqueSchema(t, pool) + ".t"
		sql, err := pgstore.Schema(name)
		require.NoError(t, err)
		out := run(t, sql)
		require.NotContains(t, out, "ERROR")
		require.Equal(t, pgstore.SchemaVersion, *mark(t, name))
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
		require.NoError(t, err)
	})

	t.Run("a statement fails", func(t *testing.T) {
		schema := uniqueSchema(t, pool)
		name := schema + ".t"
		sql, err := pgstore.Schema(name)
		require.NoError(t, err)
		const code = "SET (fillfactor = 70);"
		require.Equal(t, 1, strings.Count(sql, code))
		out := run(t, strings.Replace(sql, code, "SET (fillfactor = 700);", 1))
		require.Nil(t, mark(t, name), "the table marked as installed")
		rels, fns := relations(t, pool, schema, "t")
		require.Zero(t, rels+fns, "made after the failed statement")
		require.Contains(t, out, "fillfactor")
		require.Contains(t, out, "stopped at a statement that failed")
		installs(t, name)
	})

	t.Run("an application's function", func(t *testing.T) {
		schema := uniqueSchema(t, pool)
		name := schema + ".t"
		del := pgx.Identifier{schema, "t_del"}.Sanitize()
		_, err := pool.Exec(ctx, "CREATE FUNCTION "+del+"(p_id bytea[]) RETURNS void LANGUAGE sql AS 'SELECT'")
		require.NoError(t, err)
		sql, err := pgstore.Schema(name)
		require.NoError(t, err)
		out := run(t, sql)
		require.Nil(t, mark(t, name), "the table marked as installed")
		var lang string
		require.NoError(t, pool.QueryRow(ctx, "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = $1::regprocedure",
			del+"(bytea[])").Scan(&lang))
		require.Equal(t, "sql", lang, "the application's function replaced")
		require.Contains(t, out, "not a ratelimit store's")
		_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.ErrorIs(t, err, pgstore.ErrNotStoreFunction)
	})
}

// The script of Schema run a transaction per statement through a pooler
// whose sessions were left with ratelimit.install_step set, at session
// level, by another of its clients (SET without LOCAL), to the count each
// statement looks for: the statements after the guard run without the
// lock, and each still refuses (SQLSTATE RLSTP), the count being this
// transaction's only where it took the lock; an application's function of
// a store's name, which the script's check refused on its own session, is
// left as it is. Before, a session's own value passed the check, and the
// store's function replaced the application's.
func TestSchemaStepOfAnotherTransaction(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	schema := uniqueSchema(t, pool)
	del := pgx.Identifier{schema, "t_del"}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE FUNCTION "+del+"(p_id bytea[]) RETURNS void LANGUAGE sql AS 'SELECT'")
	require.NoError(t, err)
	sql, err := pgstore.Schema(schema + ".t")
	require.NoError(t, err)
	stmts := statements(sql)
	lock := slices.IndexFunc(stmts, func(s string) bool { return strings.Contains(s, "pg_advisory_xact_lock(") })
	require.Positive(t, lock)
	var refused int
	for i, stmt := range stmts {
		conn, err := pgconn.Connect(ctx, testserver.PostgresURL(t))
		require.NoError(t, err)
		if i > lock {
			_, err := conn.Exec(ctx, fmt.Sprintf("SET ratelimit.install_step = '%d'", i-lock-1)).ReadAll()
			require.NoError(t, err)
		}
		_, err = conn.Exec(ctx, stmt).ReadAll()
		var pe *pgconn.PgError
		if i > lock+1 && errors.As(err, &pe) && pe.Code == "RLSTP" {
			refused++
		}
		_ = conn.Close(ctx)
	}
	var lang string
	require.NoError(t, pool.QueryRow(ctx, "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = $1::regprocedure",
		del+"(bytea[])").Scan(&lang))
	require.Equal(t, "sql", lang, "the application's function replaced")
	rels, fns := relations(t, pool, schema, "t")
	require.Zero(t, rels, "the table made without the lock")
	require.Equal(t, 1, fns, "functions made without the lock")
	require.Equal(t, len(stmts)-lock-3, refused, "statements after the guard that refused, all but the last (RLTXN)")
}
