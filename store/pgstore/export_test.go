package pgstore

import (
	"context"
	"slices"

	"github.com/ratelimit-go/ratelimit/driver"
)

// Hooks let the tests watch and steer a store.
type Hooks struct {
	Resend func() // a batch's ops go again one by one, after the batch failed on one of them, before the first
}

// SetHooks sets s's hooks; call it before s is used.
func SetHooks(s *Store, h Hooks) { s.hooks = hooks{resend: h.Resend} }

// SetExpiredChunk sets how many rows one transaction of DeleteExpired
// walks, for a test, and returns a function that restores it.
func SetExpiredChunk(n int) (restore func()) {
	was := expiredChunk
	expiredChunk = n
	return func() { expiredChunk = was }
}

// SetInstallWait sets how long, in ms, the schema's SQL waits for its
// table's lock, for a test, and returns a function that restores it.
func SetInstallWait(ms int) (restore func()) {
	was := installWait
	installWait = ms
	return func() { installWait = was }
}

// LoneSQL returns the statement of a lone limit, for a test.
func LoneSQL(table string, fixed bool, reserve int, wait bool) string {
	return loneSQL(table, loneKind{fixed: fixed, reserve: reserve, wait: wait})
}

// UpsertSQL returns the statement of a batch upsert on table, whose read
// function is read, for a test.
func UpsertSQL(table, read string, wait bool) string { return upsertSQL(table, read, wait) }

// FreshSQL returns the fresh upsert of a lone limit, for a test.
func FreshSQL(table string, fixed, wait bool) string { return freshSQL(table, fixed, wait) }

// ClearHints forgets what s knows of its records' buckets, so that its
// next lone limits try the fresh upsert first, for a test.
func ClearHints(s *Store) {
	for i := range s.hints {
		s.hints[i].Store(0)
	}
}

// Direct reports whether s sends a lone call's statements straight to the
// connection (wire.go), for a test.
func Direct(s *Store) bool { return s.direct }

// ManyStatements returns s's statements that reach many records by id:
// the batch upsert's, Load's, Delete's and a step of DeleteExpired's, for
// a test.
func ManyStatements(s *Store) (upsert, load, del, sweep string) {
	return s.upsertSQL[0], s.loadSQL, s.deleteSQL, s.expiredSQL
}

// LockWait returns the lock_timeout, in ms, of a statement sent with ctx
// (0: no bound), for a test.
func LockWait(ctx context.Context) int32 { return lockWait(ctx) }

// ApplyNoneFresh sends a batch of no ops to the function _apply with an
// encoder fresh from its pool, for a test.
func ApplyNoneFresh(ctx context.Context, s *Store) error {
	return s.applyWith(ctx, s.pool, newEncoder(), nil)
}

// Retried returns how many statements s sent again after a serialization
// failure or a deadlock, for a test.
func Retried(s *Store) int64 { return s.retried.Load() }

// SerialRetries is how many times a statement that failed on a
// concurrent transaction is sent again, for a test.
const SerialRetries = serialRetries

// SchemaLock is the advisory lock under which New installs the schema.
const SchemaLock = int64(schemaLock)

// ApplyAsEarlierRelease decides op as a process of an earlier release
// sends it to the function _apply: without the refunds' job times, for a
// test.
func ApplyAsEarlierRelease(ctx context.Context, s *Store, op *driver.Op, out []driver.Decision) error {
	e := newEncoder()
	e.noRuns = true
	r := s.newRequest(op)
	if err := s.applyWith(ctx, s.pool, e, []*request{r}); err != nil {
		return err
	}
	copy(out, r.out)
	return nil
}

// SchemaSQL is the schema's SQL as the package holds it, placeholders and
// all, for a test.
var SchemaSQL = schemaSQL

// MarkOf returns the mark of the schema whose SQL (as SchemaSQL holds it)
// is sql, for a test.
func MarkOf(sql string) string { return markOf(sql) }

// SchemaVersion is the mark of this release's schema, for a test.
var SchemaVersion = schemaVersion

// Canonical returns what the schema's mark is a digest of, for sql, for a
// test.
func Canonical(sql string) string { return canonical(sql) }

// MarkWith returns the mark of this release's schema with the text that
// pgstore writes for each placeholder passed through edit, which returns
// it as it is or changed, for a test.
func MarkWith(edit func(placeholder, text string) string) string {
	return markWith(schemaSQL, func(subs []string) {
		for i := 0; i < len(subs); i += 2 {
			subs[i+1] = edit(subs[i], subs[i+1])
		}
	})
}

// SchemaPlaceholders returns the placeholders whose text pgstore writes
// into the schema's SQL, for a test.
func SchemaPlaceholders() []string {
	var ps []string
	for _, n := range markNames {
		_, subs := n.fill(schemaSQL)
		for i := 0; i < len(subs); i += 2 {
			if !slices.Contains(ps, subs[i]) {
				ps = append(ps, subs[i])
			}
		}
	}
	return ps
}

// Unrun reports whether err, a statement's, says that it took no effect.
func Unrun(err error) bool { return unrun(err) }

// Queued returns how many calls wait in s's batcher for a batch, for a
// test.
func Queued(s *Store) int { return s.batcher.Queued() }
