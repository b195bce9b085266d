package pgstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// An error says that its statement took no effect only when it is known
// to: a server's ERROR, which rolled the statement back. A server whose
// lc_messages is Russian names a FATAL "ВАЖНО" (the session ended,
// perhaps after the statement committed), and an ERROR "ОШИБКА"; since
// PostgreSQL 9.6 it names either in English too, unlocalized. The FATAL
// was read as never run, so that an op of ApplyBatch whose answer it lost
// was an *OpError, as though undecided; then, reading the localized name
// alone, every ERROR of such a server as one that may have run, so that
// an op that was not decided was reported as perhaps charged. Without the
// unlocalized name (a server before 9.6) only "ERROR" is known.
func TestUnrun(t *testing.T) {
	for _, c := range []struct {
		err   error
		unrun bool
	}{
		{&pgconn.PgError{Severity: "ERROR", Code: "40001"}, true},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Severity: "ERROR", Code: "55P03"}), true},
		{&pgconn.PgError{Severity: "FATAL", Code: "57P01"}, false},
		{&pgconn.PgError{Severity: "PANIC", Code: "XX000"}, false},
		{&pgconn.PgError{Severity: "ВАЖНО", Code: "57P01"}, false},
		{&pgconn.PgError{Severity: "ОШИБКА", Code: "40001"}, false},
		{&pgconn.PgError{Severity: "ОШИБКА", SeverityUnlocalized: "ERROR", Code: "40001"}, true},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Severity: "ОШИБКА", SeverityUnlocalized: "ERROR", Code: "55P03"}), true},
		{&pgconn.PgError{Severity: "ВАЖНО", SeverityUnlocalized: "FATAL", Code: "57P01"}, false},
		{&pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "FATAL", Code: "57P01"}, false},
		{&pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "40001"}, true},
		{fmt.Errorf("%w: table t: a bad record", pgstore.ErrBadRecord), true},
		{context.Canceled, false},
		// pgx's deallocation ahead of the statement failed: not sent.
		{fmt.Errorf("wrapped: %w", fmt.Errorf("failed to deallocate cached statement(s): %w", context.Canceled)), true},
		{fmt.Errorf("%w: %w", context.Canceled, fmt.Errorf("failed to deallocate cached statement(s): %w", context.Canceled)), true},
		// Only pgx's own error, which begins so, says it: not its words
		// quoted in another's. The deallocation that Prepare makes first
		// in later pgx (v5.12) of a statement whose description failed is
		// not matched: its op reads as one that may have run, the safe
		// side.
		{fmt.Errorf("wrapped: %v", fmt.Errorf("failed to deallocate cached statement(s): %w", context.Canceled)), false},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Severity: "FATAL", Message: "failed to deallocate cached statement(s): x"}), false},
		{fmt.Errorf(`failed to deallocate previously failed statement "s": %w`, context.Canceled), false},
	} {
		require.Equal(t, c.unrun, pgstore.Unrun(c.err), "%v", c.err)
	}
}

// A server's ERROR, as pgx reads it off the wire, carries the unlocalized
// severity, and so reads as unrun whatever the server's lc_messages; under
// a German lc_messages, where the server has that locale and the test's
// role may set it, its localized name is "FEHLER".
func TestUnrunServerError(t *testing.T) {
	pool := newPool(t, testserver.PostgresURL(t), nil)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, lc := range []string{"C", "de_DE.UTF-8", "de_DE.utf8"} {
		if _, err := conn.Exec(ctx, "SELECT pg_catalog.set_config('lc_messages', $1, false)", lc); err != nil {
			t.Logf("lc_messages %s: %v", lc, err)
			continue
		}
		_, err := conn.Exec(ctx, "SELECT 1/0")
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe)
		t.Logf("lc_messages %s: severity %q, unlocalized %q", lc, pe.Severity, pe.SeverityUnlocalized)
		require.Equal(t, "ERROR", pe.SeverityUnlocalized)
		require.True(t, pgstore.Unrun(err), "%v", err)
	}
	_, err = conn.Exec(ctx, "RESET lc_messages")
	require.NoError(t, err)
}
