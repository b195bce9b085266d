package pgstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// An error says that its statement took no effect only when it is known
// to: a server's ERROR, which rolled the statement back, named so. A
// server whose lc_messages is Russian names a FATAL "ВАЖНО" (the session
// ended, perhaps after the statement committed), and an ERROR "ОШИБКА":
// either may have run. The FATAL was read as never run, so that an op of
// ApplyBatch whose answer it lost was an *OpError, as though undecided.
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
		{fmt.Errorf("%w: table t: a bad record", pgstore.ErrBadRecord), true},
		{context.Canceled, false},
	} {
		require.Equal(t, c.unrun, pgstore.Unrun(c.err), "%v", c.err)
	}
}
