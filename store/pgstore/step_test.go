package pgstore_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// dollarTag matches the tag of a dollar-quoted string where one starts.
var dollarTag = regexp.MustCompile(`^\$([A-Za-z_][A-Za-z_0-9]*)?\$`)

// bare returns stmt, one of statements', without the comments before
// it and its semicolon.
func bare(stmt string) string {
	for {
		stmt = strings.TrimSpace(stmt)
		if !strings.HasPrefix(stmt, "--") {
			return strings.TrimSuffix(stmt, ";")
		}
		_, stmt, _ = strings.Cut(stmt, "\n")
	}
}

func isWord(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// doBody returns the code of the DO block stmt, with every dollar-quoted
// string within it (a function's body) left out: what the block itself
// runs.
func doBody(t *testing.T, stmt string) string {
	t.Helper()
	require.True(t, strings.HasPrefix(stmt, "DO "), "a statement that is not a DO block: %.80q", stmt)
	rest := strings.TrimSpace(strings.TrimPrefix(stmt, "DO "))
	tag := dollarTag.FindString(rest)
	require.NotEmpty(t, tag, "a DO block without a dollar quote: %.80q", stmt)
	require.True(t, strings.HasSuffix(rest, tag), "a DO block that does not end with its tag %s: %.80q", tag, stmt)
	body := rest[len(tag) : len(rest)-len(tag)]
	var b strings.Builder
	for i := 0; i < len(body); {
		if m := dollarTag.FindString(body[i:]); m != "" && (i == 0 || !isWord(body[i-1])) {
			end := strings.Index(body[i+len(m):], m)
			require.GreaterOrEqual(t, end, 0, "a dollar quote %s that does not end in a DO block", m)
			i += len(m) + end + len(m)
			continue
		}
		b.WriteByte(body[i])
		i++
	}
	return b.String()
}

// Every statement of the script as Schema writes it out, after the one
// that takes the lock and starts the count, is a DO block that, in its own
// code (not in the body of a function it makes, which would run only when
// called), checks that the statement before it was the last to run and
// counts itself, in order and each once; the last statement, which marks
// the table, included. A statement without its step would let one that
// failed before it go unseen (psql -1 with ON_ERROR_ROLLBACK), and the
// table be marked over it. For names with and without a schema, and names
// that hold the dollar-quote tags.
func TestSchemaStepOnEveryStatement(t *testing.T) {
	for _, name := range []string{"t", "s.t", `"s$do$"."t$fn$x$do0$"`} {
		t.Run(name, func(t *testing.T) {
			sql, err := pgstore.Schema(name)
			require.NoError(t, err)
			var stmts []string
			for _, s := range statements(sql) {
				stmts = append(stmts, bare(s))
			}
			start := -1
			for i, s := range stmts {
				if strings.Contains(s, "pg_advisory_xact_lock(") {
					start = i
					break
				}
			}
			require.GreaterOrEqual(t, start, 0, "no statement takes the lock")
			require.Contains(t, stmts[start], "pg_catalog.set_config('ratelimit.install_step', '0', true)", "the lock's statement starts the count")
			for _, s := range stmts[:start] {
				require.NotContains(t, s, "ratelimit.install_step", "a statement before the lock's")
			}
			after := stmts[start+1:]
			require.Greater(t, len(after), 10)
			for i, s := range after {
				k := i + 1
				code := doBody(t, s)
				set := fmt.Sprintf("pg_catalog.set_config('ratelimit.install_step', '%d', true)", k)
				check := fmt.Sprintf("pg_catalog.current_setting('ratelimit.install_step', true) OPERATOR(pg_catalog.=) '%d'", k-1)
				require.Equal(t, 1, strings.Count(code, set), "statement %d of %d after the lock does not count itself once: %.200q", k, len(after), s)
				require.Equal(t, 1, strings.Count(code, check), "statement %d of %d after the lock does not check the one before it: %.200q", k, len(after), s)
				require.Equal(t, 1, strings.Count(s, "ratelimit.install_step', '"), "statement %d counts more than once", k)
				require.Less(t, strings.Index(code, check), strings.Index(code, set), "statement %d counts itself before its check", k)
			}
			require.Contains(t, after[len(after)-1], "COMMENT ON TABLE", "the last statement marks the table")
		})
	}
}
