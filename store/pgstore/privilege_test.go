package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// testRole creates a role of the test's own that may log in, dropped with
// what it owns and its privileges at cleanup, and returns its name and a
// pool of its connections.
func testRole(t *testing.T, def *pgxpool.Pool) (string, *pgxpool.Pool) {
	ctx := context.Background()
	role := fmt.Sprintf("ratelimit_test_role_%d", time.Now().UnixNano())
	_, err := def.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = def.Exec(ctx, "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	return role, newPool(t, strings.Replace(testserver.PostgresURL(t), "postgres@", role+"@", 1), nil)
}

// The application's database user of a store made by a migration needs
// USAGE on its schema and EXECUTE on its functions; New, with or without
// WithoutDDL, refuses a user that lacks one, with an error matching
// ErrPermission that gives the GRANT to run. New accepted a user that
// might not execute the functions: its lone calls, plain statements, went
// through, while every batch, Load, Delete and DeleteExpired failed
// (permission denied for function), as soon as calls came together.
func TestNewChecksPrivileges(t *testing.T) {
	ctx := context.Background()
	def := newPool(t, testserver.PostgresURL(t), nil)
	schema := testSchema(t, def)
	table := pgx.Identifier{schema, "limits"}.Sanitize()
	name := schema + ".limits"
	_, err := pgstore.New(ctx, def, pgstore.WithTable(name))
	require.NoError(t, err)
	role, pool := testRole(t, def)
	grantee := pgx.Identifier{role}.Sanitize() // as the errors name it
	exec := func(sql string) {
		t.Helper()
		_, err := def.Exec(ctx, sql)
		require.NoError(t, err)
	}
	refused := func(want ...string) {
		t.Helper()
		for _, opts := range [][]pgstore.Option{{pgstore.WithoutDDL()}, nil} {
			_, err := pgstore.New(ctx, pool, append(opts, pgstore.WithTable(name))...)
			require.ErrorIs(t, err, pgstore.ErrPermission)
			for _, w := range want {
				require.ErrorContains(t, err, w)
			}
		}
	}

	refused("GRANT USAGE ON SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + grantee)
	exec("GRANT USAGE ON SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + role)
	exec("GRANT SELECT, INSERT, UPDATE, DELETE ON " + table + " TO " + role)

	// EXECUTE, which PostgreSQL grants to PUBLIC unless revoked.
	apply := pgx.Identifier{schema, "limits_apply"}.Sanitize()
	read := pgx.Identifier{schema, "limits_read"}.Sanitize() + "(bytea[])"
	exec("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA " + pgx.Identifier{schema}.Sanitize() + " FROM PUBLIC; " +
		"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA " + pgx.Identifier{schema}.Sanitize() + " TO " + role + "; " +
		"REVOKE EXECUTE ON FUNCTION " + read + " FROM " + role + "; REVOKE EXECUTE ON FUNCTION " + apply + applyArgs + " FROM " + role)
	refused("GRANT EXECUTE ON FUNCTION "+apply+"(bigint[], float8[], integer[]", read+" TO "+grantee)
	exec("GRANT EXECUTE ON FUNCTION " + read + ", " + apply + applyArgs + " TO " + role)

	for _, opts := range [][]pgstore.Option{{pgstore.WithoutDDL()}, nil} {
		s, err := pgstore.New(ctx, pool, append(opts, pgstore.WithTable(name))...)
		require.NoError(t, err)
		require.NoError(t, s.Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1)))
		require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{limitOp("k", 1), limitOp("k", 1)},
			[][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}))
		got, found := remaining(t, s, "k")
		require.True(t, found)
		require.Equal(t, 7.0, got)
		require.NoError(t, s.Delete(ctx, []driver.RecordID{{Name: "l", Key: "k"}}))
		_, err = s.DeleteExpired(ctx, t0)
		require.NoError(t, err)
	}

	// A schema to upgrade, which the user may not: New says what to do.
	exec("COMMENT ON TABLE " + table + " IS 'ratelimit pgstore schema 2 000000000000'")
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.ErrorIs(t, err, pgstore.ErrPermission)
	require.ErrorContains(t, err, "as the role that owns the table, and give New WithoutDDL")
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.ErrorIs(t, err, pgstore.ErrSchema)
}
