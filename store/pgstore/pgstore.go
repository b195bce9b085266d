// Package pgstore is a ratelimit.Store on PostgreSQL (pgx v5), for a fleet
// of processes that already shares a database.
//
// # One statement per call, or per batch
//
// A call that finds no other in flight goes at once, alone, in one
// statement. Calls that arrive while a statement is in flight wait for it
// and then go together in the next one (group commit): one statement, one
// transaction and one commit for the batch, whose ops are decided one after
// another in arrival order. A lone caller waits for nobody, and many
// callers share a commit, so that even one hot key is no longer bound to
// one commit per decision. WithMaxBatch bounds a batch, or turns
// coalescing off.
//
// A panic in a batch sent in the background (the pool's QueryTracer's,
// say) fails, with the panic's error, only the calls it had not answered:
// a call whose statement committed, and whose answer was read, before it
// gets its decision. A call not answered may have been decided and
// charged: a tracer's TraceQueryEnd of the call's own statement, say,
// runs before its answer is read. So does a runtime.Goexit there
// (t.FailNow in a tracer of a test).
//
// Two PL/pgSQL functions, installed with the schema, run the transition (a
// port of ratelimit.Evaluate, equal to it to the last bit): one decides a
// batch, one a lone call judged at the server's clock. A lone call judged
// at the Limiter's clock, the common case, goes as one plain statement
// instead, an upsert whose SQL is the function's transition (lone.go),
// or a read when it cannot write; so does a batch of such calls on one
// token bucket with one count, many records in one upsert (many.go). The
// batch function locks a batch's records all at once, and the batch
// upsert its records one after another, in ascending order of their
// primary key, so that no interleaving of batches, from one process or
// many, can deadlock. Records whose bucket is full again are removed by
// DeleteExpired.
//
// # Isolation
//
// The store's statements expect READ COMMITTED, PostgreSQL's default
// isolation. Under a default_transaction_isolation of REPEATABLE READ or
// SERIALIZABLE, a statement on a record that a concurrent one changed
// fails with a serialization failure (SQLSTATE 40001); each statement runs
// alone in an implicit transaction, rolled back whole, so the store sends
// it again in an explicit READ COMMITTED transaction, at most three times
// (also after a deadlock, 40P01), and then returns the last error,
// wrapped. No op is applied twice: a statement that failed applied none.
// Each try bounds its lock wait by the time its context leaves then.
//
// # The schema
//
// New creates or upgrades the table and the functions (Schema returns the
// SQL). With WithoutDDL it only checks that they are there, for
// deployments that apply schema changes with a migration tool. Either way
// it never takes over a relation, nor replaces a function, that it did
// not make (ErrNotStoreTable, ErrNotStoreFunction): the functions it makes
// carry a mark, and those of earlier releases are told by rules that the
// SQL of Schema spells out. A New that finds this release's schema runs
// nothing, and the SQL, run again, replaces each function in place, so
// that processes start, and migrations run, while others serve calls.
package pgstore

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/coalesce"
	"github.com/ratelimit-go/ratelimit/internal/deadline"
)

// schemaSQL is the schema, with {{table}}, {{apply}} and {{one}} to be
// replaced by quoted identifiers, {{old_index}} by the name of version 1's
// index, and {{q}} by a dollar-quote tag that none of them holds.
//
//go:embed schema.sql
var schemaSQL string

// schemaVersion marks a table whose schema is this release's: New writes it
// as the table's comment, last, and reads it to know whether the schema
// must be installed or upgraded. It changes with every change of what the
// script does: of schema.sql, and of the SQL and the constants that
// pgstore writes into it (names.fill: the waits, the steps, the checks,
// driver's constants), but of its comments and layout alone (canonical):
// those would make every process install the schema again for nothing.
var schemaVersion = markOf(schemaSQL)

// markNames are the tables whose scripts the mark is a digest of: a name
// without a schema and one with, which write different SQL (pathCheck,
// pin, bareFunctions, fnSchema). A table's own name changes nothing
// else.
var markNames = [...]names{namesOf([]string{"t"}), namesOf([]string{"s", "t"})}

// markOf returns the mark of the schema whose SQL is sql (schemaVersion).
func markOf(sql string) string { return markWith(sql, nil) }

// markWith returns the mark of the schema whose SQL is sql, written out
// for each of markNames as Schema writes it but for the dollar-quote tags
// and the mark itself; edit, if not nil, may change the
// placeholder-replacement pairs first (a test's).
func markWith(sql string, edit func(subs []string)) string {
	h := sha256.New()
	for _, n := range markNames {
		text, subs := n.fill(sql)
		if edit != nil {
			edit(subs)
		}
		h.Write([]byte(canonical(strings.NewReplacer(subs...).Replace(text))))
		h.Write([]byte{0})
	}
	return "ratelimit pgstore schema 2 " + hex.EncodeToString(h.Sum(nil)[:6])
}

// canonical returns sql without its comments, and with each run of
// whitespace and comments as one space (none at either end), but within
// string literals and quoted identifiers, whose text it keeps as it is:
// what the schema's mark is a digest of. The script's dollar-quoted bodies
// are code (functions and DO blocks; the tag is still {{q}} here), read as
// the rest is. Adjacent string literals, which SQL joins only across a line
// break, are told apart from those on one line no more: the script holds
// no such pair but across one (a statement that did would not run). Any
// other dollar-quoted string is a string, kept as it is.
func canonical(sql string) string {
	var b strings.Builder
	b.Grow(len(sql))
	space := false
	for i := 0; i < len(sql); {
		switch c := sql[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			space = true
			i++
			continue
		case strings.HasPrefix(sql[i:], "--"):
			end := strings.IndexAny(sql[i:], "\n\r") // either ends it
			if end < 0 {
				end = len(sql) - i
			}
			space = true
			i += end
			continue
		case strings.HasPrefix(sql[i:], "/*"): // they nest
			depth := 0
			for i < len(sql) {
				if strings.HasPrefix(sql[i:], "/*") {
					depth++
					i += 2
				} else if strings.HasPrefix(sql[i:], "*/") {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
			space = true
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		c := sql[i]
		if tag := dollarTag(sql, i); tag != "" {
			// Any other dollar-quoted string is a string: kept to its
			// closing tag (to the end if there is none).
			j := len(sql)
			if end := strings.Index(sql[i+len(tag):], tag); end >= 0 {
				j = i + len(tag) + end + len(tag)
			}
			b.WriteString(sql[i:j])
			i = j
			continue
		}
		if c != '\'' && c != '"' {
			b.WriteByte(c)
			i++
			continue
		}
		// A literal or quoted identifier ends at a lone closing quote; a
		// doubled one is a quote within. An escape string (E'…') takes a
		// backslash before a quote as one too.
		escape := c == '\'' && i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e') && (i < 2 || !identByte(sql[i-2]))
		j := i + 1
		for j < len(sql) {
			switch {
			case escape && sql[j] == '\\':
				j += 2
				continue
			case sql[j] != c:
				j++
				continue
			case j+1 < len(sql) && sql[j+1] == c:
				j += 2
				continue
			}
			j++
			break
		}
		j = min(j, len(sql))
		b.WriteString(sql[i:j])
		i = j
	}
	return b.String()
}

// dollarTag returns the tag ($$ or $name$) of the dollar-quoted string
// that starts at sql[i], or "" if none does: a $ within a name, or that of
// a parameter ($1), quotes nothing.
func dollarTag(sql string, i int) string {
	if sql[i] != '$' || i > 0 && identByte(sql[i-1]) {
		return ""
	}
	for j := i + 1; j < len(sql); j++ {
		switch c := sql[j]; {
		case c == '$':
			return sql[i : j+1]
		case c >= '0' && c <= '9' && j == i+1, !identByte(c):
			return ""
		}
	}
	return ""
}

// identByte reports whether c may be part of an SQL identifier or
// keyword, so that an E before a quote is a prefix only when it is not.
func identByte(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// DefaultTable is the table that holds the records unless WithTable names
// another.
const DefaultTable = "ratelimit"

// Defaults of the coalescing of calls.
const (
	// DefaultMaxBatch is the most calls one statement carries unless
	// WithMaxBatch sets another bound.
	DefaultMaxBatch = 128
	// DefaultMaxInFlight is how many statements a store has in flight at
	// once unless WithMaxInFlight sets another number: the second only
	// for a batch of at least a quarter of WithMaxBatch's calls.
	DefaultMaxInFlight = 2
)

// overlap is how many calls must wait before a statement goes beside
// another in flight (coalesce.Options.Overlap): a quarter of a batch.
func overlap(maxBatch int) int { return max(maxBatch/4, 2) }

// maxIdent is the longest identifier PostgreSQL keeps (NAMEDATALEN - 1
// bytes); it truncates longer ones, so that two names differing only
// beyond it would name one table.
const maxIdent = 63

// Suffixes of the functions' names, after the table's; applySuffix is the
// longest name derived from the table's.
const (
	applySuffix = "_apply"
	oneSuffix   = "_one"
	readSuffix  = "_read"
	delSuffix   = "_del"
	sweepSuffix = "_sweep"
	splitSuffix = "_split" // helpers of _apply, for two shards
	waitSuffix  = "_pwait"
)

// fnSuffixes are the suffixes of every function's name; from splitFn on,
// those of the functions that read no table (_split and _pwait).
var fnSuffixes = []string{applySuffix, oneSuffix, readSuffix, delSuffix, sweepSuffix, splitSuffix, waitSuffix}

const splitFn = 5

// dropIndexWait is the longest, in ms, that the schema's SQL waits for its
// table's lock to drop version 1's index on expires (when a process of
// version 1 made it again): while DROP INDEX waits for a transaction that
// holds the table, every call on the table, from every process, queues
// behind it. Past it, the script leaves the index, with a warning, and New
// drops it at its next run.
const dropIndexWait = 200

// installWait is the longest, in ms, that the schema's SQL waits for its
// table's SHARE UPDATE EXCLUSIVE lock, which it needs to change the table,
// unless the session's lock_timeout sets another bound: a transaction that
// holds the table in that mode or a stronger one (a VACUUM, a CREATE
// INDEX, a migration) would otherwise hold the install, and with it, as it
// holds the install lock, every New that has a schema to install, for as
// long as it lasts. The store's calls do not queue behind that wait. It is
// longer than PostgreSQL's default deadlock_timeout (1 s), after which an
// autovacuum that stands in the way is cancelled. A variable for tests.
var installWait = 5000

// schemaLock is the advisory lock key under which New installs the schema,
// so that processes starting together do not race on the DDL. It is
// documented (docs/stores/postgres.md), so that applications keep their
// own advisory locks clear of it, and earlier builds take it too: it
// does not change.
const schemaLock = 0x7261_7465_6c69_6d74 // "ratelimt"

// The schema's SQL records, as it takes the install lock (schemaLock), the
// transaction that took it, in a setting of that transaction's own
// (lockTaken), so that its later statements can check that they run in
// that transaction (lockHeld): that they run under the lock, which is held
// to the transaction's end, and roll back with it. PostgreSQL tells no
// transaction whether it holds an advisory lock at transaction level:
// pg_locks shows one row for a session's lock of a key, whether taken at
// session level, at transaction level or both, with the session's
// transaction of the moment as its virtualtransaction. A setting set with
// is_local is gone at the end of the transaction, and a transaction is
// told by its virtual ID, its lock on itself in pg_locks, which no other
// transaction of the session shares.
const (
	lockSetting = "ratelimit.install_lock"
	// thisTransaction is an SQL expression of type text: the virtual ID
	// of the transaction that evaluates it.
	thisTransaction = `(SELECT l.virtualxid FROM pg_catalog.pg_locks l WHERE l.locktype OPERATOR(pg_catalog.=) 'virtualxid' ` +
		`AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid() AND l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock' AND l.granted)`
	// lockTaken is an SQL expression that records the transaction that
	// evaluates it as the one that took the install lock.
	lockTaken = `pg_catalog.set_config('` + lockSetting + `', ` + thisTransaction + `, true)`
	// lockHeld is an SQL expression of type boolean: whether the
	// transaction that evaluates it took the install lock (lockTaken),
	// which it holds then, at transaction level, to its end.
	lockHeld = `coalesce(pg_catalog.current_setting('` + lockSetting + `', true) OPERATOR(pg_catalog.=) ` + thisTransaction + `, false)`
)

// Every statement of the schema's SQL after the one that takes the lock is
// a block that first checks that the statement before it ran to its end
// in this transaction, and records that it runs, in a setting of the
// transaction's own (stepSetting), which the statement that takes the lock
// sets to 0 (stepZero). A statement that fails leaves it as it was, also
// where the client goes on after it: psql's ON_ERROR_ROLLBACK (without
// ON_ERROR_STOP) runs each statement under a savepoint and rolls back to
// it, which undoes the statement's set_config too. Then every statement
// after it fails (SQLSTATE RLSTP) and changes nothing, the last, which
// marks the table, included: no function of an application's is
// replaced past a check that refused it, and the table is never marked
// as installed over a statement that failed.
const (
	stepSetting = "ratelimit.install_step"
	// stepZero is an SQL expression that starts the count of statements.
	stepZero = `pg_catalog.set_config('` + stepSetting + `', '0', true)`
	// codeStep is the SQLSTATE of a statement after one that failed.
	codeStep = "RLSTP"
)

// stepPlaceholder is how numberSteps writes the kth {{step}} of the script.
func stepPlaceholder(k int) string { return "{{step " + strconv.Itoa(k) + "}}" }

// numberSteps numbers the script's {{step}}s, from 1, as stepPlaceholder
// writes them, and returns the script and how many there are.
func numberSteps(sql string) (string, int) {
	parts := strings.Split(sql, "{{step}}")
	var b strings.Builder
	for k, part := range parts {
		if k > 0 {
			b.WriteString(stepPlaceholder(k))
		}
		b.WriteString(part)
	}
	return b.String(), len(parts) - 1
}

// stepCheck returns the PL/pgSQL statements of the kth step (see
// stepSetting): step k-1 must be the last that ran, in the transaction
// that took the install lock (lockHeld). The setting alone is not this
// transaction's: a session may hold a value of its own (SET without
// LOCAL, left on a pooler's session by another client), which a
// statement run in a transaction of its own, through a pooler in
// transaction mode, would read as the count.
func stepCheck(k int) string {
	return `IF NOT (` + lockHeld + ` AND coalesce(pg_catalog.current_setting('` + stepSetting + `', true) OPERATOR(pg_catalog.=) '` + strconv.Itoa(k-1) + `', false)) THEN
		RAISE EXCEPTION USING ERRCODE = '` + codeStep + `',
			MESSAGE = 'the schema script of a ratelimit store stopped at a statement that failed or did not run in this transaction: '
				'this statement, and every one after it, changes nothing, and the table is not marked as installed',
			HINT = 'apply it in one transaction that stops at its first error: psql --single-transaction (-1) -v ON_ERROR_STOP=1 '
				'(ON_ERROR_ROLLBACK goes on past a failed statement), or as migration tools apply a migration; see the first error';
	END IF;
	PERFORM pg_catalog.set_config('` + stepSetting + `', '` + strconv.Itoa(k) + `', true);`
}

var (
	// ErrTableName is matched (errors.Is) by the error of a table name
	// that PostgreSQL cannot keep as given, or that names a temporary
	// schema (see WithTable).
	ErrTableName = errors.New("pgstore: invalid table name")
	// ErrSchema is matched by the error of New WithoutDDL when the table or
	// the function is missing or from another release, or the functions
	// name the table without its schema (see Schema); of New, with or
	// without it, when a table name without a schema finds no schema to
	// be in: no schema of search_path exists (see WithTable); and of New
	// without it when a function of the store's has other results than
	// this release's, another release's, which New neither drops nor
	// changes under that release's calls.
	ErrSchema = errors.New("pgstore: schema missing or out of date")
	// ErrNotStoreTable is matched by the error of New, with or without
	// WithoutDDL, when a relation of the table's name exists and is not a
	// table of the store's (of any release): a view, or a table whose
	// columns or primary key are others (see the SQL that Schema returns).
	// New then creates, changes and marks nothing: a store never takes over
	// a table it did not make. The error names the relation, says what it
	// is, and what to do: give the store a table of its own (WithTable).
	// The SQL of Schema refuses such a relation too (SQLSTATE RLTBL).
	ErrNotStoreTable = errors.New("pgstore: the table is not the store's")
	// ErrNotStoreFunction is matched by the error of New, with or without
	// WithoutDDL, when a function that bears the name of one of the
	// store's (the table's name and a suffix: see WithTable), whatever its
	// arguments, exists in the table's schema and is not the store's: a
	// function of the application's. New then creates, replaces and drops
	// nothing: a store never replaces a function it did not make, nor makes
	// its own beside one of the same name. The error names the functions
	// and says what to do: give the store a table of another name
	// (WithTable). The SQL of Schema refuses them too (SQLSTATE RLFUN).
	// The functions of earlier releases, which carry no mark, are the
	// store's: see the SQL that Schema returns for how it tells them.
	ErrNotStoreFunction = errors.New("pgstore: a function of the store's name is not the store's")
	// ErrPermission is matched by the error of New when the database user
	// lacks a privilege that the store needs: USAGE on the table's schema,
	// EXECUTE on its functions (which PostgreSQL grants to PUBLIC unless
	// revoked), or, without WithoutDDL, the right to create or change a
	// schema that is not this release's. The error says what is missing
	// and gives the GRANT that gives it, to run as the role that owns the
	// table. (New does not check the privileges on the table, SELECT,
	// INSERT, UPDATE and DELETE: a call that lacks one fails at once, where
	// one of the functions fails only the calls that go through it, such
	// as batches.)
	ErrPermission = errors.New("pgstore: the database user lacks a privilege the store needs")
	// ErrBadRecord is matched by the error of a call (Apply, ApplyBatch,
	// Load) that met, in the store's table, a row that no release writes:
	// a record of NaN or infinitely many tokens, or of a ts NULL or beyond
	// any call's (driver.CheckState), or a settlement's mark of a kind
	// other than a cancel or a use. The error names the row and says what
	// to do. The call changed nothing; every call on that row fails until
	// it is deleted. A mark that cannot be read fails its settlement: the
	// token may have been settled already. It is driver.ErrBadRecord, the
	// error every store gives for what no release of it writes.
	ErrBadRecord = driver.ErrBadRecord
)

// Store is a ratelimit.Store on PostgreSQL, safe for concurrent use. Build
// it with New: every call of the zero value, or of a nil *Store, fails
// with an error matching driver.ErrZeroStore.
type Store struct {
	pool       *pgxpool.Pool
	table      string // quoted, for errors
	serverTime bool
	batcher    *coalesce.Batcher[*request, struct{}]
	// fresh is set while batches find records missing: the next batch
	// then locks its records with an insert at once, rather than first try
	// (and undo) locking them as rows that exist.
	fresh atomic.Bool

	applySQL, oneSQL, loadSQL, deleteSQL, expiredSQL string
	readSQL                                          stmt
	loneSQL                                          [12]stmt  // by loneKind.index
	upsertSQL                                        [2]string // by wait
	freshSQL                                         [4]stmt   // by freshIndex
	// direct: whether a lone call's statement goes straight to the
	// connection (see wire.go); tracer: the pool's.
	direct bool
	tracer pgx.QueryTracer
	// hints: see fullHint.
	hints [hintSlots]atomic.Int64
	// retried counts the statements sent again after a serialization
	// failure or a deadlock (retry.go).
	retried atomic.Int64
	hooks   hooks
}

// hooks let the package's tests watch and steer the store; all nil in use.
type hooks struct {
	resend func()                                         // sendApply sends a batch's ops again one by one, before the first
	apply  func(ctx context.Context, r *request)          // Apply made r, for its caller of ctx
	batch  func(reqs []*request, send func() error) error // the batcher sends reqs: send does
}

var (
	_ ratelimit.Store     = (*Store)(nil)
	_ driver.TimeSource   = (*Store)(nil)
	_ driver.BatchApplier = (*Store)(nil)
	_ driver.Expirer      = (*Store)(nil)
	_ driver.ZeroChecker  = (*Store)(nil)
)

// Option configures a Store in New.
type Option func(*options)

type options struct {
	table       string
	serverTime  bool
	noDDL       bool
	maxBatch    int
	maxInFlight int
}

// WithTable sets the table that holds the records (default DefaultTable).
// A dot separates a schema: "limits.records". Each part is the name as
// PostgreSQL keeps it, case and spaces included ("Limits" is not
// "limits"), unless it is in double quotes, as SQL quotes an identifier
// ("" for a quote): then it is the name between them, so that a schema
// whose name holds a dot is named `"my.schema".records`; a quoted part must
// end the name or be followed by the dot. The functions are named after
// the table, with the suffixes "_apply", "_one", "_read", "_del",
// "_sweep", "_split" and "_pwait". Names are quoted, so any characters are
// safe, but PostgreSQL keeps at most 63 bytes of a name: New refuses a
// table name longer than 57 bytes (63 with the longest suffix), a schema
// name longer than 63, rather than let two long names share one table, a
// name that holds a NUL byte or is not valid UTF-8, which no PostgreSQL
// name can be, a name that holds a control or other unprintable character
// (a line break, a tab, U+200B; unicode.IsGraphic), which the schema's SQL
// and the errors that show the name could not show as it is, and a name in a temporary schema (pg_temp, pg_temp_N),
// whose tables one session sees. Each is an error matching ErrTableName. Choose a name that
// no relation of the application's bears, nor a function of the
// application's with one of those suffixes: New refuses a name that is
// taken (ErrNotStoreTable, ErrNotStoreFunction).
//
// A name without a schema is resolved once, by New, on one of the pool's
// connections, as a query there resolves it: the schema of the relation
// of that name that search_path finds, if there is one; otherwise
// current_schema(), the first schema of search_path that exists, where
// CREATE TABLE makes a table. From then on the store names the table and
// its functions with that schema, whatever search_path a connection has,
// so that it checks, makes and writes one table. New refuses a name that
// finds a temporary table (ErrNotStoreTable), or no schema to be in
// (ErrSchema). Errors name the table with its schema.
func WithTable(name string) Option { return func(o *options) { o.table = name } }

// WithServerTime makes the store judge every call at the database
// server's time (clock_timestamp()) instead of the Limiter's clock. Choose
// it when the processes of a fleet have clocks that disagree by more than
// the precision the limits need: the server is then the one clock. Tests
// that drive the Limiter's clock by hand cannot use it.
func WithServerTime() Option { return func(o *options) { o.serverTime = true } }

// WithoutDDL makes New create and change nothing in the database: it
// checks that the table and the function of this release are there, and
// returns an error matching ErrSchema that says what is missing otherwise.
// Choose it when schema changes go through a migration tool, or when the
// application's database user may not run DDL; apply the SQL that Schema
// returns for the table's name with its schema (or `ratelimit schema
// --table SCHEMA.NAME` prints) beforehand.
func WithoutDDL() Option { return func(o *options) { o.noDDL = true } }

// WithMaxBatch sets the most calls one statement carries (default
// DefaultMaxBatch). Calls that arrive while statements are in flight wait
// and go together in the next one, sharing its commit. 1 turns coalescing
// off: every call is sent alone, at once, however many are in flight. New
// refuses a number below 1.
func WithMaxBatch(n int) Option { return func(o *options) { o.maxBatch = n } }

// WithMaxInFlight sets how many statements the store sends at once before
// calls start to wait for the next batch (default DefaultMaxInFlight). A
// call that finds none in flight goes at once; while one is in flight,
// calls wait, and go in a statement beside it once a quarter of a batch
// (WithMaxBatch) waits: a few concurrent callers share one statement and
// its commit, and many keep several in flight. Statements on one record
// wait for each other's row locks, so a hot key only gets smaller batches
// from more; calls on many keys gain, on a server with cores to spare.
// Each statement in flight holds one of the pool's connections. New
// refuses a number below 1.
func WithMaxInFlight(n int) Option { return func(o *options) { o.maxInFlight = n } }

// names are the quoted identifiers of a table and its function.
type names struct {
	table    string // quoted, schema-qualified if given
	apply    string
	one      string
	read     string
	del      string
	sweep    string
	split    string
	pwait    string
	oldIndex string   // version 1's index on expires
	sigs     []string // the functions' regprocedures, for to_regprocedure
	// fnSchema is the schema the functions are made in, as an SQL
	// expression: the one given, or current_schema(); fns are the
	// functions' names as the catalog keeps them (proname); bare is the
	// table's own name, quoted, as the functions' bodies name it.
	fnSchema string
	fns      []string
	bare     string
	// parts are the name's parts: the table's, or the schema's and the
	// table's.
	parts []string
}

// tableNames checks a WithTable name and returns its identifiers.
func tableNames(table string) (names, error) {
	if strings.IndexByte(table, 0) >= 0 {
		return names{}, fmt.Errorf("pgstore: table name %q holds a NUL byte, which PostgreSQL names cannot: %w", table, ErrTableName)
	}
	if !utf8.ValidString(table) {
		return names{}, fmt.Errorf("pgstore: table name %q is not valid UTF-8, the encoding pgx speaks to the server: %w", table, ErrTableName)
	}
	if i := strings.IndexFunc(table, func(r rune) bool { return !unicode.IsGraphic(r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(table[i:])
		return names{}, fmt.Errorf("pgstore: table name %q holds %U, a control or other unprintable character, "+
			"which would end a line of the schema's SQL or hide in the names it shows: use letters, digits, marks, punctuation, symbols and spaces: %w",
			table, r, ErrTableName)
	}
	parts, err := splitName(table)
	if err != nil {
		return names{}, err
	}
	last := len(parts) - 1
	if len(parts) == 2 && tempSchema(parts[0]) {
		return names{}, fmt.Errorf("pgstore: table name %q is in %s, a temporary schema, whose tables only one session sees, "+
			"where the store's calls go on every connection of the pool: name a schema of the database: %w", table, parts[0], ErrTableName)
	}
	if len(parts) == 2 && len(parts[0]) > maxIdent {
		return names{}, fmt.Errorf("pgstore: schema name %q is %d bytes: PostgreSQL keeps %d and would cut it, so that schemas differing only beyond would be one: use a shorter name: %w",
			parts[0], len(parts[0]), maxIdent, ErrTableName)
	}
	if n := len(parts[last]) + len(applySuffix); n > maxIdent {
		return names{}, fmt.Errorf("pgstore: table name %q is %d bytes: PostgreSQL keeps %d bytes of a name and would cut its function's, %q, so that tables differing only beyond would share records: use at most %d bytes: %w",
			parts[last], len(parts[last]), maxIdent, parts[last]+applySuffix, maxIdent-len(applySuffix), ErrTableName)
	}
	return namesOf(parts), nil
}

// splitName splits a WithTable name into its parts, the table's, or the
// schema's and the table's, at the first dot outside double quotes. A part
// that begins with a double quote is the name between it and the next
// lone one ("" standing for a quote), as SQL writes an identifier, and
// must end the name or be followed by the dot; a part without, the text
// up to that dot (the schema's) or to the end (the table's, dots
// included), as it is, case and spaces kept.
func splitName(table string) ([]string, error) {
	const how = `write "table", "schema.table", or a part in double quotes as SQL quotes an identifier ("my.schema"."table", "" for a quote)`
	var parts []string
	for rest := table; ; {
		var part string
		switch {
		case strings.HasPrefix(rest, `"`):
			var b strings.Builder
			i := 1
			for {
				j := strings.IndexByte(rest[i:], '"')
				if j < 0 {
					return nil, fmt.Errorf("pgstore: table name %q opens a double quote it does not close: %s: %w", table, how, ErrTableName)
				}
				b.WriteString(rest[i : i+j])
				i += j + 1
				if !strings.HasPrefix(rest[i:], `"`) {
					break
				}
				b.WriteByte('"')
				i++
			}
			part, rest = b.String(), rest[i:]
			if rest != "" && (rest[0] != '.' || len(parts) == 1) {
				return nil, fmt.Errorf("pgstore: table name %q has %q after a part in double quotes, where only a dot and the table's name may follow the schema's: %s: %w",
					table, rest, how, ErrTableName)
			}
		case len(parts) == 0:
			i := strings.IndexByte(rest, '.')
			if i < 0 {
				i = len(rest)
			}
			part, rest = rest[:i], rest[i:]
		default:
			part, rest = rest, ""
		}
		if part == "" {
			return nil, fmt.Errorf("pgstore: table name %q is empty or has an empty part: %s: %w", table, how, ErrTableName)
		}
		parts = append(parts, part)
		if rest == "" {
			return parts, nil
		}
		rest = rest[1:] // the dot
		if rest == "" {
			return nil, fmt.Errorf("pgstore: table name %q is empty or has an empty part: %s: %w", table, how, ErrTableName)
		}
	}
}

// tableOption returns the name, as WithTable takes it, of the table whose
// name's parts are parts: each in double quotes if it needs them.
func tableOption(parts []string) string {
	q := make([]string, len(parts))
	for i, p := range parts {
		q[i] = p
		if strings.Contains(p, ".") || strings.HasPrefix(p, `"`) {
			q[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
		}
	}
	return strings.Join(q, ".")
}

// tempSchema reports whether schema, as given (quoted), names a temporary
// schema: pg_temp, the session's own, or one of pg_temp_N and
// pg_toast_temp_N, the sessions' (PostgreSQL reserves names that begin
// with pg_ to its own schemas).
func tempSchema(schema string) bool {
	return schema == "pg_temp" || strings.HasPrefix(schema, "pg_temp_") || strings.HasPrefix(schema, "pg_toast_temp_")
}

// namesOf returns the identifiers of the table whose name's parts are
// parts: the table's, or the schema's and the table's, checked.
func namesOf(parts []string) names {
	last := len(parts) - 1
	ident := func(suffix string) string {
		id := append(pgx.Identifier(nil), parts...)
		id[last] = truncate(id[last] + suffix)
		return id.Sanitize()
	}
	n := names{table: ident(""), apply: ident(applySuffix), one: ident(oneSuffix), read: ident(readSuffix), del: ident(delSuffix),
		sweep: ident(sweepSuffix), split: ident(splitSuffix),
		pwait: ident(waitSuffix), oldIndex: ident("_expires_idx")}
	n.sigs = []string{
		n.apply + "(" + applyArgs + ")",
		n.one + "(" + oneArgs + ")",
		n.read + "(bytea[])",
		n.del + "(bytea[])",
		n.sweep + "(bytea, integer, bigint)",
		n.split + "(bigint, float8, bigint, float8, float8, bigint, float8, bigint, float8, float8, float8, bigint, float8, bigint, bigint, float8, boolean)",
		n.pwait + "(bigint, float8, bigint, float8, float8, bigint, boolean, float8, bigint, bigint, float8, bigint, float8, float8, bigint, boolean, float8, bigint, " +
			"float8, bigint, float8, bigint, bigint, float8, boolean)",
	}
	n.fnSchema = "current_schema()"
	if last == 1 {
		n.fnSchema = quoteLiteral(parts[0])
	}
	for _, suffix := range fnSuffixes {
		n.fns = append(n.fns, truncate(parts[last]+suffix))
	}
	n.bare = pgx.Identifier{parts[last]}.Sanitize()
	n.parts = parts
	return n
}

// applyArgs and oneArgs are the argument types of this release's _apply
// and _one.
const (
	applyArgs = "bigint[], float8[], integer[], bytea[], bytea[], bytea[], integer[], integer, bigint[], float8[], integer, boolean, bigint[]"
	oneArgs   = "bytea, bytea, bytea, integer, integer, float8, bigint, float8, float8, bigint, bigint, float8, integer, integer"
)

// params returns the parameters $1, $2, … of a call of a function of the
// argument types args, each cast to its type.
func params(args string) string {
	types := strings.Split(args, ", ")
	for i, t := range types {
		types[i] = "$" + strconv.Itoa(i+1) + "::" + qualified(t)
	}
	return strings.Join(types, ", ")
}

// qualified returns the type t (of those of applyArgs and oneArgs) named
// with pg_catalog unless SQL names it by a keyword: a type of its name in a
// schema listed before pg_catalog along search_path is not the one a cast
// names (see lone.go).
func qualified(t string) string {
	if strings.HasPrefix(t, "float8") || strings.HasPrefix(t, "bytea") {
		return "pg_catalog." + t
	}
	return t
}

// The argument types of the functions _apply of earlier releases, which
// carry no mark (funcMark): version 1's, and two of version 2's, which
// builds of version 2 made before this release's. They are the store's
// (funcCheck).
const (
	applyArgsV1 = "integer, bigint, boolean, float8[], integer[], bytea[], bytea[], bytea[], integer[], integer[], float8[], bigint[], float8[], float8[], bigint[]"
	applyArgs11 = "bigint[], float8[], integer[], bytea[], bytea[], bytea[], integer[], integer, bigint[], float8[], integer"
	applyArgs12 = applyArgs11 + ", boolean"
)

// funcMark marks a function as the store's: the schema's SQL writes it as
// the comment of every function it makes, and funcCheck reads it.
const funcMark = "ratelimit pgstore function"

// funcCheck returns an SQL expression of type text that names the
// functions that are not the store's among those that bear the names the
// store gives its functions (whatever their arguments), in the schema
// where the schema's SQL makes them: "function f(integer)" or "functions
// f(integer), g(text)"; NULL when there are none. New reads it, and the
// schema's SQL checks it before it replaces or drops a function, so that
// neither replaces a function of the application's, nor makes the store's
// beside one as an overload (a call of the store's, whose parameters the
// server types, could then find two candidates, or the application's
// calls the store's function).
//
// A function is the store's when its comment is funcMark, which the
// schema's SQL writes on each function it makes. Those of earlier releases
// have no comment: such a function is the store's when it is PL/pgSQL and
// either version 1's _apply, by its argument types, or one of the
// functions of version 2, by its name and argument types, while the table
// carries a mark of version 2, which every build of version 2 wrote in the
// transaction that made its functions, and, but for _split and _pwait,
// which read no table, the function's body names the table. (The table
// itself is checked first: tableCheck.)
func (n names) funcCheck() string {
	list := func(ss []string, f func(string) string, sep string) string {
		q := make([]string, len(ss))
		for i, s := range ss {
			q[i] = f(quoteLiteral(s))
		}
		return strings.Join(q, sep)
	}
	lit := func(s string) string { return s }
	reg := func(s string) string { return "pg_catalog.to_regprocedure(" + s + ")" }
	v2 := append(slices.Clone(n.sigs), n.apply+"("+applyArgs11+")", n.apply+"("+applyArgs12+")")
	table := quoteLiteral(n.table)
	return `(SELECT CASE WHEN pg_catalog.count(*) OPERATOR(pg_catalog.=) 1 THEN 'function ' ELSE 'functions ' END
		OPERATOR(pg_catalog.||) pg_catalog.string_agg(f.sig, ', ' ORDER BY f.sig)
	FROM (SELECT p.oid::pg_catalog.regprocedure::pg_catalog.text AS sig FROM pg_catalog.pg_proc p
		WHERE p.pronamespace OPERATOR(pg_catalog.=) (SELECT s.oid FROM pg_catalog.pg_namespace s WHERE s.nspname OPERATOR(pg_catalog.=) ` + n.fnSchema + `)
		AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY[` + list(n.fns, lit, ", ") + `]::pg_catalog.name[])
		AND NOT coalesce(pg_catalog.obj_description(p.oid, 'pg_proc') OPERATOR(pg_catalog.=) ` + quoteLiteral(funcMark) + `, false)
		AND NOT coalesce(pg_catalog.obj_description(p.oid, 'pg_proc') IS NULL
			AND p.prolang OPERATOR(pg_catalog.=) (SELECT l.oid FROM pg_catalog.pg_language l WHERE l.lanname OPERATOR(pg_catalog.=) 'plpgsql')
			AND (p.oid OPERATOR(pg_catalog.=) ` + reg(quoteLiteral(n.apply+"("+applyArgsV1+")")) + `
				OR p.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
					` + list(v2, reg, ",\n\t\t\t\t\t") + `]::pg_catalog.oid[])
				AND pg_catalog.obj_description(pg_catalog.to_regclass(` + table + `), 'pg_class') OPERATOR(pg_catalog.~~) 'ratelimit pgstore schema 2 %'
				AND (p.proname OPERATOR(pg_catalog.=) ANY (ARRAY[` + list(n.fns[splitFn:], lit, ", ") + `]::pg_catalog.name[])
					OR pg_catalog.strpos(p.prosrc, ` + quoteLiteral(n.bare) + `) OPERATOR(pg_catalog.>) 0)), false)) f
	HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0)`
}

// pathCheck returns an SQL expression of type text that says why the
// schema's SQL, for a table name without a schema, would check one
// relation and make another: no schema of search_path exists to make the
// table in, or the name finds a relation along search_path in a schema
// other than current_schema() (a later one of the path, or the session's
// temporary schema), or current_schema() is the temporary schema; NULL
// when none holds, and for a name with a schema. New always names the
// schema (resolve).
func (n names) pathCheck() string {
	if len(n.parts) == 2 {
		return "NULL::text"
	}
	bare := quoteLiteral(n.parts[0])
	return `(SELECT CASE
		WHEN pg_catalog.current_schema() IS NULL
			THEN pg_catalog.format('no schema of search_path (%s) exists to make it in', pg_catalog.current_setting('search_path'))
		WHEN f.nsp OPERATOR(pg_catalog.<>) pg_catalog.current_schema()::pg_catalog.text
			THEN pg_catalog.format('the name finds %I.%I along search_path (%s), where the script would make the table in %I, current_schema()',
				f.nsp, ` + bare + `::pg_catalog.text, pg_catalog.current_setting('search_path'), pg_catalog.current_schema())
		WHEN pg_catalog.current_schema() OPERATOR(pg_catalog.=) (SELECT s.nspname FROM pg_catalog.pg_namespace s
			WHERE s.oid OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())
			THEN pg_catalog.format('search_path (%s) would make it a temporary table, which only one session sees', pg_catalog.current_setting('search_path'))
	END
	FROM (SELECT (SELECT s.nspname::pg_catalog.text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace s ON s.oid OPERATOR(pg_catalog.=) c.relnamespace
		WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(` + quoteLiteral(n.table) + `)::pg_catalog.oid) AS nsp) f)`
}

// storeColumns are the columns of the store's table, each with its type as
// format_type writes it, in the order the schema creates them. Every
// schema version (1 and 2) has these, with id the primary key: a relation
// of the table's name with others is not the store's (tableCheck).
var storeColumns = []string{"id bytea", "name bytea", "key bytea", "shard integer", "value double precision", "ts bigint", "expires bigint"}

// tableCheck returns an SQL expression of type text that says what keeps
// the relation rel (an expression of type regclass) from being a table of
// the store's, as the rest of a sentence that begins "it": "is a view",
// "has the columns a integer, id text", "has no primary key"; NULL when
// it is one, or when rel is NULL (no such relation). New reads it, and
// the schema's SQL checks it first ({{table_check}}), so that neither
// takes over a table of the application's. The columns are compared as a
// set, by name and type; the rows are never read.
func tableCheck(rel string) string {
	want := slices.Sorted(slices.Values(storeColumns)) // in attname's order (collation C)
	for i, c := range want {
		want[i] = quoteLiteral(c)
	}
	kind := func(k string) string { return "c.relkind OPERATOR(pg_catalog.=) '" + k + "'" }
	return `(SELECT CASE
		WHEN NOT (` + kind("r") + ` OR ` + kind("p") + `) THEN 'is ' OPERATOR(pg_catalog.||) CASE WHEN ` + kind("v") + ` THEN 'a view'
			WHEN ` + kind("m") + ` THEN 'a materialized view' WHEN ` + kind("i") + ` OR ` + kind("I") + ` THEN 'an index'
			WHEN ` + kind("S") + ` THEN 'a sequence' WHEN ` + kind("f") + ` THEN 'a foreign table'
			WHEN ` + kind("c") + ` THEN 'a composite type' ELSE 'not a table' END
		WHEN NOT coalesce(a.cols OPERATOR(pg_catalog.=) ARRAY[` + strings.Join(want, ", ") + `]::pg_catalog.text[], false)
			THEN 'has the columns ' OPERATOR(pg_catalog.||) coalesce(pg_catalog.array_to_string(a.cols, ', '), 'none')
		WHEN k.pk IS NULL THEN 'has no primary key'
		WHEN k.pk OPERATOR(pg_catalog.<>) ARRAY['id']::pg_catalog.text[]
			THEN 'has the primary key (' OPERATOR(pg_catalog.||) pg_catalog.array_to_string(k.pk, ', ') OPERATOR(pg_catalog.||) ')'
	END
	FROM pg_catalog.pg_class c
	CROSS JOIN LATERAL (SELECT pg_catalog.array_agg(t.attname::pg_catalog.text OPERATOR(pg_catalog.||) ' '
			OPERATOR(pg_catalog.||) pg_catalog.format_type(t.atttypid, t.atttypmod) ORDER BY t.attname) AS cols
		FROM pg_catalog.pg_attribute t WHERE t.attrelid OPERATOR(pg_catalog.=) c.oid AND t.attnum OPERATOR(pg_catalog.>) 0 AND NOT t.attisdropped) a
	CROSS JOIN LATERAL (SELECT pg_catalog.array_agg(t.attname::pg_catalog.text ORDER BY t.attname) AS pk
		FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute t ON t.attrelid OPERATOR(pg_catalog.=) i.indrelid
			AND t.attnum OPERATOR(pg_catalog.=) ANY (i.indkey::pg_catalog.int2[])
		WHERE i.indrelid OPERATOR(pg_catalog.=) c.oid AND i.indisprimary) k
	WHERE c.oid OPERATOR(pg_catalog.=) ` + rel + `::pg_catalog.oid)`
}

// notStoreTable returns the error, matching ErrNotStoreTable, of the
// relation named table (quoted) that is not the store's table: why says
// what it is (tableCheck).
func notStoreTable(table, why string) error {
	return fmt.Errorf("pgstore: %s exists and is not the store's table: it %s, where the store's has the columns %s, "+
		"with id its primary key; the store neither takes over nor changes a table it did not make: give it a table of its own "+
		"with WithTable (a name no other relation has; New creates it), or drop or rename that relation if nothing needs it: %w",
		table, why, strings.Join(storeColumns, ", "), ErrNotStoreTable)
}

// truncate cuts name to the bytes PostgreSQL keeps of it, at a character
// boundary, as it does: the name version 1 gave its index on a long table
// name, which this release drops.
func truncate(name string) string {
	if len(name) <= maxIdent {
		return name
	}
	n := maxIdent
	for n > 0 && !utf8.RuneStart(name[n]) {
		n--
	}
	return name[:n]
}

// Schema returns the SQL that creates the table named table (as WithTable
// takes it) and its function, or upgrades them from an earlier release:
// what New runs unless WithoutDDL is given, for migration tools. It is
// idempotent; apply it in one transaction, which holds the advisory lock
// it takes against installs beside it (pg_advisory_xact_lock of the one
// key 8241996772024085876, for every table of the database), and to whose
// end its first statement sets search_path to pg_catalog, pg_temp, the
// search_path of the functions it makes (see schema.sql). Run a
// transaction per statement (psql without --single-transaction), it
// changes nothing: at its second statement it warns (SQLSTATE RLTXN) and
// ends its own session (SQLSTATE 57P01), so that no statement after it
// runs there, and a pool drops the connection; its last statement marks
// the table with the schema's version only in the transaction that took
// the lock, and fails otherwise (SQLSTATE RLTXN: the statements after the
// second, which a pooler in transaction mode may run on other sessions),
// leaving the table's mark as it was, so that New installs the schema
// again. Each statement after the second first checks that the one before
// it ran to its end in its transaction, and otherwise fails (SQLSTATE
// RLSTP) and changes nothing: a client that goes on in the transaction
// after a statement that failed (psql -1 with ON_ERROR_ROLLBACK and
// without ON_ERROR_STOP) neither replaces a function past a check that
// refused it nor marks the table. It waits for
// the table's SHARE UPDATE EXCLUSIVE lock, which a VACUUM, a CREATE INDEX
// or another migration may hold, at most 5 s, or up to the session's
// lock_timeout if it sets one, and then fails (SQLSTATE 55P03), naming the
// sessions that hold it, and those that asked for it first and wait (a
// migration's ALTER TABLE behind a long report), with the sessions they
// wait for. The command `ratelimit schema --table NAME`
// prints it.
//
// Name the schema. For a name without one, the SQL runs under the
// session's search_path, makes the table and its functions in the
// session's current_schema(), and refuses (SQLSTATE RLSCH) a name that
// finds a relation in another schema along search_path, or a search_path
// of which no schema exists; its functions then name the table without
// its schema, and find it in theirs: their search_path is pg_catalog, that
// schema and pg_temp. New, which resolves the
// name first (see WithTable), runs the SQL of the name with its schema,
// and names the table with it in every statement: it counts functions
// that name it without as out of date, installs them again (in place),
// and WithoutDDL refuses them (ErrSchema), since they could reach another
// table of that name than its statements do.
func Schema(table string) (string, error) {
	n, err := tableNames(table)
	if err != nil {
		return "", err
	}
	return n.schema(), nil
}

func (n names) schema() string {
	sql, subs := n.fill(schemaSQL)
	subs = append(subs, "'ratelimit pgstore schema 2'", quoteLiteral(schemaVersion))
	// Dollar-quote tags that neither the script nor anything written into
	// it holds, so that the functions' bodies ({{q}}) and the blocks that
	// make them ({{qd}}) end where they should whatever the names. They
	// are written in with the names, in one pass: a name that holds a
	// placeholder, such as {{q}}, stays as it is.
	tag, outer := "$fn$", "$do$"
	for i := 0; holds(sql, subs, tag); i++ {
		tag = fmt.Sprintf("$fn%d$", i)
	}
	for i := 0; holds(sql, subs, outer); i++ {
		outer = fmt.Sprintf("$do%d$", i)
	}
	return strings.NewReplacer(append(subs, "{{q}}", tag, "{{qd}}", outer)...).Replace(sql)
}

// fill returns sql, a script as schemaSQL holds it, with its waits and
// okats written out (expand) and its steps numbered (numberSteps), and the
// placeholder-replacement pairs that write n's names, driver's constants
// and the SQL that pgstore builds into it: all but the dollar-quote tags
// and the schema's mark, which Schema writes in last.
func (n names) fill(sql string) (string, []string) {
	sql, steps := numberSteps(expand(sql))
	subs := []string{
		"{{table}}", n.table,
		"{{apply}}", n.apply,
		"{{one}}", n.one,
		"{{read}}", n.read,
		"{{del}}", n.del,
		"{{sweep}}", n.sweep,
		"{{split}}", n.split,
		"{{pwait}}", n.pwait,
		"{{noise}}", strconv.FormatFloat(driver.Noise, 'g', -1, 64),
		"{{fixed}}", strconv.Itoa(int(driver.FixedWindow)),
		"{{mode_limit}}", strconv.Itoa(int(driver.ModeLimit)),
		"{{mode_refund}}", strconv.Itoa(int(driver.ModeRefund)),
		"{{max_retry}}", strconv.FormatInt(driver.MaxRetryAfter, 10),
		"{{never}}", strconv.FormatInt(driver.Never, 10),
		"{{never_span}}", strconv.FormatInt(driver.Never-driver.MaxTime, 10),
		"{{min_ts}}", sqlMinTS,
		"{{max_ts}}", sqlMaxTS,
		"{{pair_tries}}", strconv.Itoa(driver.PairTries),
		"{{wait_tries}}", strconv.Itoa(driver.WaitTries),
		"{{old_index}}", n.oldIndex,
		"{{old_index_literal}}", quoteLiteral(n.oldIndex),
		"{{drop_wait}}", strconv.Itoa(dropIndexWait),
		"{{install_wait}}", strconv.Itoa(installWait),
		"{{fn_schema}}", n.fnSchema,
		"{{apply_name}}", quoteLiteral(n.fns[0]),
		"{{one_name}}", quoteLiteral(n.fns[1]),
		"{{path_check}}", n.pathCheck(),
		"{{lock}}", strconv.FormatInt(schemaLock, 10),
		"{{lock_taken}}", lockTaken,
		"{{lock_held}}", lockHeld,
		"{{table_literal}}", quoteLiteral(n.table),
		"{{table_check}}", tableCheck("pg_catalog.to_regclass(" + quoteLiteral(n.table) + ")"),
		"{{function_check}}", n.funcCheck(),
		"{{mark_functions}}", n.markFunctions(),
		"{{pin}}", n.pin(),
		"{{pin_script}}", n.pinScript(),
		"{{bare_functions}}", n.bareFunctions(),
		"{{step_zero}}", stepZero,
	}
	for k := 1; k <= steps; k++ {
		subs = append(subs, stepPlaceholder(k), stepCheck(k))
	}
	return sql, subs
}

// pinnedPath is the search_path under which the store's functions run,
// and the schema's SQL for a table named with its schema, so that what
// they name without a schema is PostgreSQL's own: pg_catalog first, and
// the session's temporary schema last, as it would otherwise come first
// for relations and types. The store's table and functions are named with
// their schema. See schema.sql.
const pinnedPath = "pg_catalog, pg_temp"

// pin returns the clause that sets the search_path of a function (all but
// _split, see schema.sql), in its CREATE FUNCTION: pinnedPath for a table
// named with its schema; for one without, whose functions name it without
// its schema too, the script sets it at the end (bareFunctions).
func (n names) pin() string {
	if len(n.parts) == 1 {
		return "-- search_path: set at the end of the script, with the schema the function is made in"
	}
	return "SET search_path = " + pinnedPath
}

// pinScript returns the script's first statement: for a table named with
// its schema, it sets the search_path of the rest of the transaction to
// pinnedPath; for one without, which the session's search_path resolves,
// it is a comment.
func (n names) pinScript() string {
	if len(n.parts) == 1 {
		return "-- (the table is named without its schema: the script runs under the session's search_path)"
	}
	return "SELECT pg_catalog.set_config('search_path', " + quoteLiteral(pinnedPath) + ", true);"
}

// bareFunctions returns an SQL array of the functions that run under a
// search_path of their own (all but _split), named as the script names
// them, whose search_path the script sets at the end for a table named
// without its schema; empty for a table named with its schema (pin).
func (n names) bareFunctions() string {
	if len(n.parts) == 2 {
		return "ARRAY[]"
	}
	var q []string
	for i, sig := range n.sigs {
		if i != splitFn {
			q = append(q, quoteLiteral(sig))
		}
	}
	return "ARRAY[" + strings.Join(q, ", ") + "]"
}

// markFunctions returns the statements that mark each of n's functions
// as the store's (funcMark).
func (n names) markFunctions() string {
	var b strings.Builder
	for _, sig := range n.sigs {
		b.WriteString("COMMENT ON FUNCTION " + sig + " IS " + quoteLiteral(funcMark) + ";\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// holds reports whether sql, or one of the replacements of the
// placeholder-replacement pairs subs, holds tag.
func holds(sql string, subs []string, tag string) bool {
	if strings.Contains(sql, tag) {
		return true
	}
	for i := 1; i < len(subs); i += 2 {
		if strings.Contains(subs[i], tag) {
			return true
		}
	}
	return false
}

// expand writes out the script's calls of wait and of okat.
func expand(sql string) string {
	return strings.ReplaceAll(expandWaits(sql), "{{ok := okat(t)}}", okAt)
}

// okAt is {{pwait}}'s one spelling of state.go's okAt, written where the
// script says {{ok := okat(t)}} (the forward search from each estimate,
// the test at the cap when none succeeded, and searchBack): it sets ok to whether split grants the call at t on
// the two shards, each refreshed to t from its record as stored (fresh at
// t if missing), as StateAt refreshes it. It uses the function's
// variables s, k, off, lv and lt.
const okAt = `FOR s IN 1 .. 2 LOOP -- each shard as the transition sees it at t
				IF NOT fnd[s] THEN
					lv[s] := cc[s];
					IF kk[s] = {{fixed}} THEN
						off := (t - ph[s]) % pp[s];
						IF off < 0 THEN off := off + pp[s]; END IF;
						lt[s] := t - off;
					ELSE
						lt[s] := t;
					END IF;
				ELSIF kk[s] = {{fixed}} THEN
					lv[s] := v0[s]; lt[s] := t0[s];
					k := (greatest(t, t0[s]) - t0[s]) / pp[s];
					IF k > 0 THEN
						lv[s] := lv[s] + rt[s] * k::float8;
						lt[s] := t0[s] + k * pp[s];
					END IF;
					lv[s] := least(lv[s], cc[s]);
				ELSE
					lt[s] := greatest(t, t0[s]);
					lv[s] := least(v0[s] + (lt[s] - t0[s])::float8 * rt[s] / pp[s]::float8, cc[s]);
				END IF;
			END LOOP;
			SELECT z.ok INTO ok FROM {{split}}(ka, rta, pa, ca, ma, kb, rtb, pb, cb, mb,
				lv[1], lt[1], lv[2], lt[2], t, cnt, reserve) z;`

// waitCall is the script's one spelling of state.go's wait:
// {{target := wait(kind, period, rate, capacity, bv, bts, v, ts, cnt, allow)}}
// sets target to the milliseconds from now until a call of cnt that may
// leave a debt of allow is granted on a record of that kind, period, rate
// and capacity, stored as (bv, bts), whose state at now is (v, ts). It is
// written out as statements where it stands, in the operations and order
// of the Go function, so that the functions pay no call for it and stay
// equal to Go to the last bit; they use the function's variables wj and
// wk (float8) and noise, and a loop variable wi.
var waitCall = regexp.MustCompile(`\{\{(\w+) := wait\(` + strings.Repeat(`([^,]+), `, 9) + `([^)]+)\)\}\}`)

// expandWaits writes out every {{… := wait(…)}} of sql.
func expandWaits(sql string) string {
	// ${1} target; ${2} kind, ${3} period, ${4} rate, ${5} capacity;
	// ${6} bv, ${7} bts; ${8} v, ${9} ts; ${10} cnt, ${11} allow.
	grants := func(v string) string { return "(least(" + v + ", ${5}) - ${10}) + ${11} > -noise" }
	// search settles wj, the estimate (at least 0), on the first step at
	// which the record, holding at(step) tokens uncapped, grants the
	// call: a step less, or up to {{wait_tries}} more.
	search := func(at func(step string) string) string {
		return " IF wj > 0 AND " + grants(at("wj - 1")) + " THEN wj := wj - 1;" +
			" ELSE FOR wi IN 1 .. {{wait_tries}} LOOP" +
			" EXIT WHEN " + grants(at("wj")) + "; wj := wj + 1; END LOOP;" +
			" END IF;"
	}
	return waitCall.ReplaceAllString(sql, "IF ${2} = {{fixed}} THEN"+
		" wj := ceil((-((${8} - ${10}) + ${11}) - noise) / ${4});"+
		" IF wj < 0 THEN wj := 0; END IF;"+
		" wk := ((${9} - ${7}) / ${3})::float8;"+
		search(func(step string) string { return "${6} + ${4} * (wk + " + step + ")" })+
		" ${1} := ${3}::float8 * wj + (${9} - now)::float8;"+
		" ELSE"+
		" wj := ceil((-((${8} - ${10}) + ${11}) - noise) * ${3}::float8 / ${4});"+
		" IF wj < 0 THEN wj := 0; END IF;"+
		" wk := (${9} - ${7})::float8;"+
		search(func(step string) string { return "${6} + (wk + " + step + ") * ${4} / ${3}::float8" })+
		" ${1} := (greatest(now, ${9}) - now)::float8 + wj;"+
		" END IF;")
}

// quoteLiteral returns s as an SQL string literal, as PostgreSQL's
// quote_literal does: quotes doubled, and, if s holds a backslash, an
// escape string (E'...') with backslashes doubled, which reads the same
// whatever standard_conforming_strings is. A plain literal would read a
// backslash before a quote as an escape in a session where it is off (a
// role's setting, or psql's for the script `ratelimit schema` prints), and
// end where the name goes on.
func quoteLiteral(s string) string {
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.Contains(s, `\`) {
		q = "E" + strings.ReplaceAll(q, `\`, `\\`)
	}
	return q
}

// New returns a store on pool. It creates or upgrades the table and the
// function if they are not this release's (safe to run from several
// processes at once), or, WithoutDDL, checks that they are. An install
// waits a few seconds at most for a transaction that holds the table
// against it (a VACUUM, a CREATE INDEX, a migration), and fails then, as
// Schema says; ctx bounds every wait. The store does
// not own the pool; close it yourself, after the store's last call: New
// given a closed pool fails with an error matching driver.ErrClosed.
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	o := options{table: DefaultTable, maxBatch: DefaultMaxBatch, maxInFlight: DefaultMaxInFlight}
	for _, f := range opts {
		f(&o)
	}
	if pool == nil {
		return nil, errors.New("pgstore: New needs a pool: pass pgxpool.New(ctx, url)")
	}
	if o.maxBatch < 1 {
		return nil, fmt.Errorf("pgstore: WithMaxBatch(%d): the most calls a statement carries must be at least 1 (1 turns coalescing off)", o.maxBatch)
	}
	if o.maxInFlight < 1 {
		return nil, fmt.Errorf("pgstore: WithMaxInFlight(%d): the statements in flight at once must be at least 1", o.maxInFlight)
	}
	n, err := tableNames(o.table)
	if err != nil {
		return nil, err
	}
	if len(n.parts) == 1 {
		if n, err = resolve(ctx, pool, n); err != nil {
			return nil, err
		}
	}
	s := &Store{
		pool:       pool,
		table:      n.table,
		serverTime: o.serverTime,
		// The arguments typed as the functions take them: no function of
		// other arguments, made beside them later, is a closer match.
		applySQL: "SELECT ok, retry, num, fresh FROM " + n.apply + "(" + params(applyArgs) + ")",
		oneSQL:   "SELECT ok, retry, remaining, charged, at, ts FROM " + n.one + "(" + params(oneArgs) + ")",
		readSQL:  newStmt("SELECT value, ts FROM " + n.table + " WHERE " + op("id", "=", "$1"+tBytea)),
		// The functions that reach many records by id (schema.sql).
		loadSQL:    "SELECT id, value, ts FROM " + n.read + "($1::pg_catalog.bytea[]) WHERE value IS NOT NULL",
		deleteSQL:  "SELECT FROM " + n.del + "($1::pg_catalog.bytea[])",
		expiredSQL: "SELECT last, scanned, gone FROM " + n.sweep + "($1" + tBytea + ", $2::integer, $3::bigint)",
	}
	for _, fixed := range []bool{false, true} {
		for reserve := range 3 {
			for _, wait := range []bool{false, true} {
				k := loneKind{fixed: fixed, reserve: reserve, wait: wait}
				s.loneSQL[k.index()] = newStmt(loneSQL(n.table, k))
			}
		}
	}
	s.upsertSQL = [2]string{upsertSQL(n.table, n.read, false), upsertSQL(n.table, n.read, true)}
	for _, fixed := range []bool{false, true} {
		for _, wait := range []bool{false, true} {
			s.freshSQL[freshIndex(fixed, wait)] = newStmt(freshSQL(n.table, fixed, wait))
		}
	}
	s.direct, s.tracer = directPool(pool)
	// The name to give `ratelimit schema --table`: with the schema it
	// resolved to, which a migration must make the table in.
	if err := s.installSchema(ctx, n, tableOption(n.parts), o.noDDL); err != nil {
		return nil, err
	}
	opt := coalesce.Options{MaxBatch: o.maxBatch, MaxInFlight: o.maxInFlight, Overlap: overlap(o.maxBatch)}
	if o.maxBatch == 1 {
		opt = coalesce.Off
	}
	s.batcher = coalesce.New(s.sendBatch, opt)
	return s, nil
}

// resolve returns the names of n, a table's name without a schema,
// qualified with the schema it names on pool's connections: that of the
// relation of its name that a query finds along search_path, if there is
// one; otherwise the schema in which CREATE TABLE makes it,
// current_schema(), the first schema of search_path that exists. From
// then on the store names its table and its functions with that schema,
// whatever search_path a connection has: its checks, the schema's SQL and
// every statement are about one relation. A temporary relation is one
// session's, which other connections do not see: the table is never one.
func resolve(ctx context.Context, pool *pgxpool.Pool, n names) (names, error) {
	var (
		schema     *string
		found, tmp bool
		path       string
	)
	// Under the connection's search_path, which resolves the name: what
	// the query names itself is named with pg_catalog, operators too, so
	// that no object of a schema of the path takes its place (schema.sql).
	err := pool.QueryRow(ctx, `SELECT r.nsp, r.found, EXISTS (SELECT FROM pg_catalog.pg_namespace s
			WHERE s.oid OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema() AND s.nspname::pg_catalog.text OPERATOR(pg_catalog.=) r.nsp),
		pg_catalog.current_setting('search_path')
	FROM (SELECT coalesce(f.nsp, pg_catalog.current_schema()::pg_catalog.text) AS nsp, f.nsp IS NOT NULL AS found
		FROM (SELECT (SELECT s.nspname::pg_catalog.text FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace s ON s.oid OPERATOR(pg_catalog.=) c.relnamespace
			WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1::pg_catalog.text)::pg_catalog.oid) AS nsp) f) r`, n.table).Scan(&schema, &found, &tmp, &path)
	if err != nil {
		return names{}, fmt.Errorf("pgstore: find the schema of table %s along search_path: %w", n.table, callerError(ctx, newClosedPool(err)))
	}
	switch {
	case schema == nil:
		return names{}, fmt.Errorf("pgstore: table name %s has no schema, and no schema of search_path (%s) exists to make it in: "+
			"name the table's schema (WithTable(\"schema.table\")), or create a schema of search_path: %w", n.table, path, ErrSchema)
	case tmp && found:
		return names{}, fmt.Errorf("pgstore: table name %s names a temporary table along search_path (%s), which only one session sees: "+
			"name the table's schema (WithTable(\"schema.table\")): %w", n.table, path, ErrNotStoreTable)
	case tmp:
		return names{}, fmt.Errorf("pgstore: table name %s has no schema, and search_path (%s) would make it a temporary table, which only one session sees: "+
			"name the table's schema (WithTable(\"schema.table\")): %w", n.table, path, ErrSchema)
	}
	return namesOf([]string{*schema, n.parts[0]}), nil
}

// schemaState is what the database holds of a store's schema.
type schemaState struct {
	comment string // the table's comment; empty if none
	table   bool   // whether a relation of the table's name exists
	fn      bool   // whether every function of this release exists
	foreign string // what keeps that relation from being the store's table (tableCheck); empty if nothing
	fns     string // the functions of the store's names that are not the store's (funcCheck); empty if none
	// bare: whether a function that reads the table names it without its
	// schema, as the SQL of Schema for a name without one makes them
	// (see readSchema).
	bare bool
	// user is current_user; noExec the functions it may not execute
	// (of n.sigs).
	user   string
	noExec []string
	// oldIndex: whether version 1's index on expires is on the table,
	// made again by a process of version 1 that started after the
	// upgrade; it rules out HOT updates, and the script drops it.
	oldIndex bool
}

// current reports whether the schema is this release's: nothing to do.
func (st schemaState) current() bool {
	return st.table && st.foreign == "" && st.fns == "" && st.fn && !st.bare && st.comment == schemaVersion
}

// done reports whether New has nothing to install: the schema is this
// release's and, but for a check (WithoutDDL), which changes nothing,
// version 1's index is gone.
func (st schemaState) done(check bool) bool {
	return st.current() && (check || !st.oldIndex)
}

// readSchema reads, on q, what the database holds of n's schema, n a
// name with its schema, as New names the table.
//
// The functions that read the table must name it as n does, with its
// schema: the SQL of Schema for a name without one makes functions that
// name it without, which find the table in the schema they were made in
// (those of earlier releases, along the search_path of the session that
// calls them). Beside the store's statements, which name it with the
// schema New resolved, they could then reach another table of that name
// (made later in an earlier schema of a connection's path), so that a
// store's lone calls and its batches went to two tables. Such functions
// carry the mark of this release all the same; New counts them as out of
// date.
//
// New reads it under the search_path pg_catalog, pg_temp (pinPath), so
// that the functions it names are listed with their schema.
func readSchema(ctx context.Context, q querier, n names) (schemaState, error) {
	var (
		st       schemaState
		why, fns *string
	)
	err := q.QueryRow(ctx, "SELECT coalesce(obj_description(to_regclass($1), 'pg_class'), ''), "+
		"to_regclass($1) IS NOT NULL, NOT EXISTS (SELECT FROM unnest($2::text[]) f WHERE to_regprocedure(f) IS NULL), "+
		"EXISTS (SELECT FROM unnest($3::text[]) f JOIN pg_proc p ON p.oid = to_regprocedure(f) WHERE strpos(p.prosrc, $1) = 0), "+
		tableCheck("to_regclass($1)")+", "+n.funcCheck()+", current_user::text, "+privilegeCheck+", "+
		"EXISTS (SELECT FROM pg_index WHERE indexrelid = to_regclass($4) AND indrelid = to_regclass($1))",
		n.table, n.sigs, n.sigs[:splitFn], n.oldIndex).Scan(&st.comment, &st.table, &st.fn, &st.bare, &why, &fns, &st.user, &st.noExec, &st.oldIndex)
	if why != nil {
		st.foreign = *why
	}
	if fns != nil {
		st.fns = *fns
	}
	return st, err
}

// privilegeCheck is an SQL expression of type text[]: the functions of $2
// (regprocedures) that current_user may not execute; NULL for none, and
// for a function that does not exist. The store's lone calls are plain
// statements, which need none of them; its batches, Load, Delete and
// DeleteExpired go through them, and every function that reads the table
// calls _split and _pwait.
const privilegeCheck = `(SELECT array_agg(u.f ORDER BY u.o) FROM unnest($2::text[]) WITH ORDINALITY u(f, o)
		WHERE NOT has_function_privilege(to_regprocedure(u.f), 'EXECUTE'))`

// codePermission is PostgreSQL's SQLSTATE insufficient_privilege.
const codePermission = "42501"

// codeLockTimeout is PostgreSQL's SQLSTATE lock_not_available, of a lock
// wait that outlasted lock_timeout (schema.sql bounds the install's).
const codeLockTimeout = "55P03"

// codeOtherResults is PostgreSQL's SQLSTATE invalid_function_definition,
// with which CREATE OR REPLACE FUNCTION refuses to change the results of a
// function: one of another release's (schema.sql).
const codeOtherResults = "42P13"

// permitted returns nil if st's user may execute every function of the
// store, and otherwise the error, matching ErrPermission, that gives the
// GRANT of those it may not.
func (st schemaState) permitted(n names) error {
	if st.noExec == nil {
		return nil
	}
	user := pgx.Identifier{st.user}.Sanitize()
	return fmt.Errorf("pgstore: the database user %s may not execute functions of the store of table %s: its lone calls would go through, "+
		"and its batches, Load, Delete and DeleteExpired fail; grant it, as the role that owns them (GRANT EXECUTE ON FUNCTION %s TO %s): %w",
		user, n.table, strings.Join(st.noExec, ", "), user, ErrPermission)
}

// mayNotUse returns the error, matching ErrPermission, of New reading the
// schema of n, which the database user may not (err): use the table's
// schema, most likely.
func mayNotUse(ctx context.Context, q querier, n names, err error) error {
	var (
		user  string
		usage *bool
	)
	if e := q.QueryRow(ctx, "SELECT current_user::pg_catalog.text, (SELECT pg_catalog.has_schema_privilege(s.oid, 'USAGE') "+
		"FROM pg_catalog.pg_namespace s WHERE s.nspname OPERATOR(pg_catalog.=) $1::pg_catalog.name)",
		n.parts[0]).Scan(&user, &usage); e != nil || usage == nil || *usage {
		return fmt.Errorf("pgstore: read the schema of %s: the database user may not (%w): %w", n.table, err, ErrPermission)
	}
	user = pgx.Identifier{user}.Sanitize()
	schema := pgx.Identifier{n.parts[0]}.Sanitize()
	return fmt.Errorf("pgstore: the database user %s may not use schema %s, table %s's (%w): grant it, as the role that owns the schema "+
		"(GRANT USAGE ON SCHEMA %s TO %s), or give the store a table in another schema: %w", user, schema, n.table, err, schema, user, ErrPermission)
}

// The SQLSTATEs with which the schema's SQL refuses a relation of the
// table's name that is not the store's table, with what it is
// (tableCheck) as the error's DETAIL, and functions of the store's names
// that are not the store's, named (funcCheck) in the DETAIL.
const (
	codeNotStoreTable    = "RLTBL"
	codeNotStoreFunction = "RLFUN"
)

// notStoreFunction returns the error, matching ErrNotStoreFunction, of
// fns (funcCheck), functions of the names of the functions of the store
// of table (quoted) that are not the store's.
func notStoreFunction(table, fns string) error {
	return fmt.Errorf("pgstore: %s: not the store's, yet named as the store of table %s names its functions (the table's name and %s): "+
		"the store neither replaces nor drops a function it did not make, nor makes its own beside one of the same name: "+
		"give it a table of another name with WithTable, or, if nothing needs them, drop or rename the functions listed: %w",
		fns, table, strings.Join(fnSuffixes, ", "), ErrNotStoreFunction)
}

// installSchema creates or upgrades n's schema unless it is this
// release's; with check only, it says what is missing instead. A relation
// of the table's name that is not the store's table, and functions of the
// store's names that are not the store's, are refused either way, and
// left as they are.
func (s *Store) installSchema(ctx context.Context, n names, table string, check bool) error {
	var st schemaState
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := pinPath(ctx, tx); err != nil {
			return err
		}
		var err error
		st, err = readSchema(ctx, tx, n)
		return err
	})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == codePermission {
		return mayNotUse(ctx, s.pool, n, err)
	}
	if err != nil {
		return fmt.Errorf("pgstore: read the schema of %s: %w", n.table, callerError(ctx, newClosedPool(err)))
	}
	comment, exists := st.comment, st.table
	if exists && st.foreign != "" {
		return notStoreTable(n.table, st.foreign)
	}
	if st.fns != "" {
		return notStoreFunction(n.table, st.fns)
	}
	if st.done(check) {
		return st.permitted(n)
	}
	if check {
		apply := fmt.Sprintf("apply the SQL that pgstore.Schema returns (`ratelimit schema --table %s` prints it), or let New install it (without WithoutDDL)", shellQuote(table))
		switch {
		case !exists:
			return fmt.Errorf("pgstore: table %s does not exist: %s: %w", n.table, apply, ErrSchema)
		case comment != schemaVersion:
			was := "an earlier release"
			if comment != "" {
				was = fmt.Sprintf("another release (%q)", comment)
			}
			return fmt.Errorf("pgstore: table %s has the schema of %s, not this release's (%q): %s: %w", n.table, was, schemaVersion, apply, ErrSchema)
		case !st.fn:
			return fmt.Errorf("pgstore: one of the functions %s does not exist: %s: %w", strings.Join(n.sigs, ", "), apply, ErrSchema)
		default:
			return fmt.Errorf("pgstore: the functions of table %s name it without its schema, as the SQL of Schema makes them for a table name "+
				"without one: they would find a table along the search_path of each connection, where the store names it with its schema; "+
				"apply the SQL for the name with its schema (`ratelimit schema --table %s` prints it), or let New install it (without WithoutDDL): %w",
				n.table, shellQuote(table), ErrSchema)
		}
	}
	// READ COMMITTED whatever default_transaction_isolation: under the
	// lock, readSchema must see what was committed while this waited for
	// it, where a snapshot of REPEATABLE READ or SERIALIZABLE, taken by
	// the statement that waited, would not.
	//
	// When only version 1's index is left to drop, New takes the lock
	// only if it is free: another process that holds it is installing,
	// and drops the index, or a migration is; processes that start
	// together then do not each wait in turn, up to dropIndexWait, for a
	// table that a long transaction holds. The next New drops it.
	indexOnly := st.current()
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if err := pinPath(ctx, tx); err != nil {
			return err
		}
		if indexOnly {
			var got bool
			if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", int64(schemaLock)).Scan(&got); err != nil || !got {
				return cmp.Or(err, st.permitted(n))
			}
		} else if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(schemaLock)); err != nil {
			return installLockError{err}
		}
		// Another process may have installed it while this one waited for
		// the lock (processes that start together): then the script runs
		// not again, and replaces nothing that the stores of those
		// processes use. What is not the store's, the script refuses.
		if st, err := readSchema(ctx, tx, n); err != nil || st.done(false) {
			return cmp.Or(err, st.permitted(n))
		}
		_, err := tx.Exec(ctx, n.schema())
		return err
	})
	// A relation or function made under the names since readSchema read
	// them: the script's own checks refused them, under the lock.
	var lockErr installLockError
	switch {
	case errors.As(err, &lockErr) && errors.As(err, &pe) && pe.Code == codeLockTimeout:
		return s.installLockHeld(ctx, n, lockErr.err)
	case errors.As(err, &pe) && pe.Code == codeNotStoreTable:
		return notStoreTable(n.table, pe.Detail)
	case errors.As(err, &pe) && pe.Code == codeNotStoreFunction:
		return notStoreFunction(n.table, pe.Detail)
	case errors.As(err, &pe) && pe.Code == codeOtherResults:
		return fmt.Errorf("pgstore: create or upgrade table %s and its functions: a function of the store's has other results than this release's (%w; %s): "+
			"another release made it, a later one most likely, whose processes call it; New neither drops nor changes it: "+
			"run this release once that release's processes are gone, and, to go back to this release from it, drop that function first (as its owner): %w",
			n.table, err, pe.Hint, ErrSchema)
	case errors.As(err, &pe) && pe.Code == codeLockTimeout:
		detail := ""
		if pe.Detail != "" {
			detail = "; " + pe.Detail
		}
		return fmt.Errorf("pgstore: create or upgrade table %s and its functions: another transaction holds the table, or one of the functions, "+
			"or waits for the table ahead of the install, in a mode that keeps the schema from being installed (%w%s): call New again once it has ended "+
			"(the store's calls on the table are not held up meanwhile), or end it; the install waits for the table "+
			"up to the session's lock_timeout, or %d ms if it sets none", n.table, err, detail, installWait)
	case errors.As(err, &pe) && pe.Code == codePermission:
		return fmt.Errorf("pgstore: create or upgrade table %s and its functions: the database user may not (%w): "+
			"apply the SQL that pgstore.Schema returns (`ratelimit schema --table %s` prints it) as the role that owns the table, "+
			"and give New WithoutDDL; or run New as that role: %w", n.table, err, shellQuote(table), ErrPermission)
	}
	if err != nil {
		return fmt.Errorf("pgstore: create or upgrade table %s and its function: %w", n.table, callerError(ctx, newClosedPool(err)))
	}
	return nil
}

// installLockError is the error of New's wait for the install lock
// (schemaLock), before the install touched the table or its functions.
type installLockError struct{ err error }

func (e installLockError) Error() string { return e.err.Error() }
func (e installLockError) Unwrap() error { return e.err }

// installLockHeld returns the error of an install of n whose wait for the
// install lock outlasted the session's lock_timeout (err): another
// install holds the lock, which it names, with the session's lock_timeout,
// read on another of the pool's connections, which set the same.
func (s *Store) installLockHeld(ctx context.Context, n names, err error) error {
	var holders, wait string
	if e := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT pg_catalog.string_agg(pg_catalog.format('pid %s', l.pid), ', ' ORDER BY l.pid)
		FROM pg_catalog.pg_locks l
		WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted AND l.objsubid OPERATOR(pg_catalog.=) 1
		AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
		AND (l.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32 OPERATOR(pg_catalog.|) l.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) $1::pg_catalog.int8),
		'a transaction that has ended since'), pg_catalog.current_setting('lock_timeout')`, int64(schemaLock)).Scan(&holders, &wait); e != nil {
		holders, wait = "a session that could not be read ("+e.Error()+")", "its setting"
	}
	return fmt.Errorf("pgstore: create or upgrade table %s and its functions: another session held the install lock "+
		"(pg_advisory_xact_lock(%d), one for every table of the database) for more than the session's lock_timeout (%s), "+
		"held by %s (%w): a New of another process, or a migration applying the SQL of Schema, most likely "+
		"(pg_stat_activity shows what that session runs); the table and its functions were not touched: call New again once it has ended, "+
		"or give the pool's sessions a longer lock_timeout (or none) for New", n.table, int64(schemaLock), wait, holders, err)
}

// pinPath sets the search_path of tx, to its end, to pinnedPath: New reads
// and installs the schema under it, as the functions run, so that the
// checks' functions and operators are PostgreSQL's own whatever the
// connection's search_path (see schema.sql). Every name of the store's is
// given with its schema by then.
func pinPath(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "SET LOCAL search_path = "+pinnedPath)
	return err
}

// shellQuote quotes s for a shell command line, if it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// OwnClock implements driver.TimeSource: it reports whether the store
// was built WithServerTime: false for a store that New did not make.
func (s *Store) OwnClock() bool { return s != nil && s.serverTime }

// Now implements driver.TimeSource: the server's time in Unix ms.
func (s *Store) Now(ctx context.Context) (int64, error) {
	if s == nil || s.batcher == nil {
		return 0, s.unmade(ctx, "Now")
	}
	var ms int64
	err := s.pool.QueryRow(ctx, "SELECT pg_catalog.floor(extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000)::bigint").Scan(&ms)
	if err != nil {
		return 0, fmt.Errorf("pgstore: time: %w", callerError(ctx, closedPool(err)))
	}
	return ms, nil
}

// CheckZero implements driver.ZeroChecker: an error matching
// driver.ErrZeroStore for the zero Store or a nil *Store, which New did
// not make, else nil.
func (s *Store) CheckZero() error {
	if s == nil || s.batcher == nil {
		return s.unmade(context.Background(), "CheckZero")
	}
	return nil
}

// unmade returns, for a call on s, nil or a Store that New did not make
// (it has no batcher, which New sets last), which has no pool and would
// panic: ctx's error if ctx is done, as for any store, else an error
// matching driver.ErrZeroStore that names call.
func (s *Store) unmade(ctx context.Context, call string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	what := "the zero pgstore.Store"
	if s == nil {
		what = "a nil *pgstore.Store"
	}
	return fmt.Errorf("pgstore: %s: the store is %s, which New did not make: build it with pgstore.New, and use the store it returns: %w", call, what, driver.ErrZeroStore)
}

// recordID returns the primary key of a record: the SHA-256 digest of
// driver.RecordID.AppendKey, an encoding no two records share. A
// digest keeps index entries small whatever the key's length.
func recordID(id driver.RecordID) [sha256.Size]byte {
	var buf [64]byte
	return sha256.Sum256(id.AppendKey(buf[:0]))
}

// Op flags, as the function reads them.
const (
	flagReserve    = 4
	flagServerTime = 8
)

// request is one op, copied from the caller's so that a batch sent after
// the caller has left (and its Op been reused) reads nothing of it; the
// statement's answer is copied into out, which the caller copies back.
type request struct {
	flags  int64
	now    int64
	items  []item
	out    []driver.Decision
	one    [1]item // items of a one-limit op, without another allocation
	outOne [1]driver.Decision
	// mark is the row of the op's settlement, if any, and settle the
	// settlement.
	mark   *record
	settle driver.Settlement
	// err is the error of an op that failed apart from the others of its
	// batch: on its own (a bad record: ErrBadRecord), or sent again alone
	// (sendApply) or after them (sendUpsert's redo); lost if its statement
	// may have run (see failed).
	err  error
	lost bool
	// answered is set once the send has given the op its answer: its
	// decisions in out, its statement committed, or its own err. Should
	// the send then panic in the background, where the batcher fails
	// every call of the batch with a *coalesce.PanicError (or call
	// runtime.Goexit: coalesce.ErrGoexit), Apply gives the op that
	// answer, and the error to the ops not answered, whose statement may
	// have run (see Apply).
	answered bool
}

// failed sets err, the error of r's statement, which failed not on r's
// own, as r's: r is lost if the statement may have run (see unrun), and
// its error says so.
func (r *request) failed(err error) {
	r.err, r.answered = err, true
	if !unrun(err) {
		r.lost = true
		r.err = fmt.Errorf("the op may have been decided and charged, its answer lost: %w", err)
	}
}

type item struct {
	count float64
	at    int64 // a refund: when the tokens were charged
	run   int64 // a refund: when the job of the charge may run
	n     int   // shards: 1 or 2
	recs  [2]record
}

type record struct {
	id     [sha256.Size]byte
	mark   bool // a settlement's mark: its id is id[:16], its key the settler (empty: none)
	name   string
	key    string
	shard  int32
	params driver.Params
}

func (s *Store) newRequest(op *driver.Op) *request {
	r := &request{flags: int64(op.Mode), now: op.Now}
	if op.Reserve {
		r.flags |= flagReserve
	}
	if s.serverTime {
		r.flags |= flagServerTime
	}
	if op.Settle != nil && op.Mode == driver.ModeRefund {
		r.settle = *op.Settle
		r.mark = &record{mark: true}
		copy(r.mark.id[:], op.Settle.ID[:])
		if op.Settle.Settler != ([16]byte{}) {
			r.mark.key = string(op.Settle.Settler[:]) // kept in the mark's key column
		}
	}
	if len(op.Items) == 1 {
		r.items, r.out = r.one[:], r.outOne[:]
	} else {
		r.items, r.out = make([]item, len(op.Items)), make([]driver.Decision, len(op.Items))
	}
	for i := range op.Items {
		it := &op.Items[i]
		r.items[i] = item{count: it.Count, at: it.At, run: it.Run, n: len(it.Shards)}
		for j, sh := range it.Shards {
			r.items[i].recs[j] = record{
				id:   recordID(driver.RecordID{Name: it.Name, Key: it.Key, Shard: sh.Index}),
				name: it.Name, key: it.Key, shard: int32(sh.Index), params: sh.Params,
			}
		}
	}
	return r
}

// encoder lays a batch out as the function's arrays, each record and each
// limit once.
type encoder struct {
	ops    []int64
	counts []float64
	refs   []int32
	ids    [][]byte
	names  [][]byte
	keys   [][]byte
	shards []int32
	nlock  int32
	marks  []int64
	// runs holds, per item, a refund's job time (0 for other items), and
	// refunds whether the batch holds a refund: only then do the runs
	// follow the marks (schema.sql's p_marks).
	runs    []int64
	refunds bool
	// noRuns sends a batch as an earlier release does, without the runs:
	// for a test.
	noRuns bool
	pint   []int64
	// settlers: two ops of the batch settle one ID as different settlers
	// (driver.Settlement.Settler); the function takes one per mark, so the
	// batch goes op by op (errSettlers).
	settlers bool
	pflt     []float64

	recs   map[[sha256.Size]byte]int32 // 1-based index in list
	list   []*record
	lock   []bool // per record of list
	order  []int32
	pos    []int32
	buf    []byte
	params map[driver.Params]int32
}

var encoders = sync.Pool{New: func() any { return newEncoder() }}

// newEncoder returns an encoder whose arrays are empty, never nil: pgx
// sends a nil slice as NULL, whose cardinality the function cannot take.
func newEncoder() *encoder {
	return &encoder{
		ops: []int64{}, counts: []float64{}, refs: []int32{}, ids: [][]byte{}, names: [][]byte{}, keys: [][]byte{},
		shards: []int32{}, marks: []int64{}, runs: []int64{}, pint: []int64{}, pflt: []float64{},
		recs: make(map[[sha256.Size]byte]int32), params: make(map[driver.Params]int32),
	}
}

func (e *encoder) reset() {
	e.ops, e.counts, e.refs, e.marks, e.runs = e.ops[:0], e.counts[:0], e.refs[:0], e.marks[:0], e.runs[:0]
	e.refunds = false
	clear(e.ids)
	clear(e.names)
	clear(e.keys)
	clear(e.list)
	e.ids, e.names, e.keys, e.list = e.ids[:0], e.names[:0], e.keys[:0], e.list[:0]
	e.shards, e.lock, e.order, e.pint, e.pflt = e.shards[:0], e.lock[:0], e.order[:0], e.pint[:0], e.pflt[:0]
	e.nlock = 0
	e.settlers = false
	clear(e.recs)
	clear(e.params)
}

func (e *encoder) add(r *request) {
	e.ops = append(e.ops, r.flags, r.now, int64(len(r.items)))
	write := driver.Mode(r.flags&3) != driver.ModeCheck
	refund := driver.Mode(r.flags&3) == driver.ModeRefund
	e.refunds = e.refunds || refund && len(r.items) > 0
	for i := range r.items {
		it := &r.items[i]
		e.counts = append(e.counts, it.count, float64(it.at))
		if refund {
			e.runs = append(e.runs, it.run)
		} else {
			e.runs = append(e.runs, 0)
		}
		var refs [4]int32
		for j := range it.recs[:it.n] {
			refs[2*j], refs[2*j+1] = e.record(&it.recs[j], write), e.limit(it.recs[j].params)
		}
		e.refs = append(e.refs, refs[:]...)
	}
	if r.mark != nil {
		if i, ok := e.recs[r.mark.id]; ok && e.list[i-1].key != r.mark.key {
			// Two settlers of one ID: the function knows one per mark.
			e.settlers = true
		}
		e.marks = append(e.marks, int64(e.record(r.mark, true)), int64(r.settle.Kind), r.settle.Until)
	} else {
		e.marks = append(e.marks, 0, 0, 0)
	}
}

// rowID returns the primary key of rec's row.
func (rec *record) rowID() []byte {
	if rec.mark {
		return rec.id[:16]
	}
	return rec.id[:]
}

// record returns the 1-based index of rec among the batch's records as
// they arrive; finish renumbers them.
func (e *encoder) record(rec *record, write bool) int32 {
	if i, ok := e.recs[rec.id]; ok {
		e.lock[i-1] = e.lock[i-1] || write
		return i
	}
	e.list = append(e.list, rec)
	e.lock = append(e.lock, write)
	i := int32(len(e.list))
	e.recs[rec.id] = i
	return i
}

// finish lays the records out as the function takes them: first those an
// op may write, in ascending order of id (the order of their locks), then
// those only checked; and points the items' references at them.
func (e *encoder) finish() {
	for i := range e.list {
		e.order = append(e.order, int32(i))
	}
	slices.SortFunc(e.order, func(a, b int32) int {
		if e.lock[a] != e.lock[b] {
			if e.lock[a] {
				return -1
			}
			return 1
		}
		return bytes.Compare(e.list[a].rowID(), e.list[b].rowID())
	})
	// The names and keys as bytes, copied into one buffer sized first, so
	// that its slices stay valid.
	size := 0
	for _, rec := range e.list {
		size += len(rec.name) + len(rec.key)
	}
	if e.buf == nil || cap(e.buf) < size { // never nil: a nil key would be NULL
		e.buf = make([]byte, 0, max(size, 256))
	}
	buf := e.buf[:0]
	e.pos = slices.Grow(e.pos[:0], len(e.list))[:len(e.list)] // arrival index → 1-based position
	for p, i := range e.order {
		rec := e.list[i]
		e.pos[i] = int32(p + 1)
		e.ids = append(e.ids, rec.rowID())
		n := len(buf)
		buf = append(buf, rec.name...)
		e.names = append(e.names, buf[n:len(buf):len(buf)])
		n = len(buf)
		buf = append(buf, rec.key...)
		e.keys = append(e.keys, buf[n:len(buf):len(buf)])
		e.shards = append(e.shards, rec.shard)
		if e.lock[i] {
			e.nlock++
		}
	}
	for j := 0; j < len(e.refs); j += 2 {
		if e.refs[j] != 0 {
			e.refs[j] = e.pos[e.refs[j]-1]
		}
	}
	for j := 0; j < len(e.marks); j += 3 {
		if e.marks[j] != 0 {
			e.marks[j] = int64(e.pos[e.marks[j]-1])
		}
	}
	if e.refunds && !e.noRuns {
		e.marks = append(e.marks, e.runs...)
	}
}

// limit returns the 1-based index of p among the batch's limits.
func (e *encoder) limit(p driver.Params) int32 {
	if i, ok := e.params[p]; ok {
		return i
	}
	e.pint = append(e.pint, int64(p.Kind), p.Period, p.Phase)
	e.pflt = append(e.pflt, p.Rate, p.Capacity, p.MaxReserved)
	i := int32(len(e.pint) / 3)
	e.params[p] = i
	return i
}

// sendBatch is the Batcher's SendFunc: send.
func (s *Store) sendBatch(ctx context.Context, reqs []*request, _ []struct{}) error {
	if s.hooks.batch != nil {
		return s.hooks.batch(reqs, func() error { return s.send(ctx, reqs) })
	}
	return s.send(ctx, reqs)
}

// send decides a batch in one statement: the Batcher's and ApplyBatch's.
func (s *Store) send(ctx context.Context, reqs []*request) error {
	if len(reqs) == 1 && reqs[0].single() {
		if reqs[0].flags&flagServerTime != 0 {
			return s.sendOne(ctx, reqs[0], newWaits(ctx))
		}
		return s.sendLone(ctx, reqs[0])
	}
	if len(reqs) > 1 && sharedBatch(reqs) {
		if done, err := s.sendUpsert(ctx, reqs); done || err != nil {
			return err
		}
	}
	return s.sendApply(ctx, reqs)
}

// errSettlers is applyWith's answer for a batch in which two ops settle
// one ID as different settlers: sendApply sends them one by one.
var errSettlers = errors.New("pgstore: two settlers of one settlement in a batch")

// sendApply decides a batch with the function _apply. When the function
// fails the batch on a row that no release writes (ErrBadRecord), each op
// goes again alone, on one connection: a statement that failed wrote
// nothing, so each takes effect once, and only the op that read the row
// fails (its request's err), rather than every call coalesced with it. An
// op sent again that fails otherwise (its context ended, the pool was
// closed, the server is down or its connection broke) ends the resends:
// the ops after it fail at once, unsent, with its error, rather than each
// meet the failure in turn (a down server's connect timeout, one after
// another); it fails itself as failed says, lost if its statement may
// have run.
func (s *Store) sendApply(ctx context.Context, reqs []*request) error {
	e := encoders.Get().(*encoder)
	defer encoders.Put(e)
	err := s.applyWith(ctx, s.pool, e, reqs)
	if len(reqs) == 1 || !(errors.Is(err, ErrBadRecord) || err == errSettlers) {
		return err
	}
	if s.hooks.resend != nil {
		s.hooks.resend()
	}
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		unsent(reqs, err)
		return nil
	}
	defer c.Release()
	for i, r := range reqs {
		err := s.applyWith(ctx, c, e, reqs[i:i+1])
		if err == nil || errors.Is(err, ErrBadRecord) {
			r.err, r.answered = err, true
			continue
		}
		r.failed(err)
		unsent(reqs[i+1:], err)
		break
	}
	return nil
}

// unsent fails reqs, none of them sent again, for err.
func unsent(reqs []*request, err error) {
	err = fmt.Errorf("the op was not sent again: %w", err)
	for _, r := range reqs {
		r.err, r.answered = err, true
	}
}

// applyWith is sendApply's statement, with the encoder e, on db.
func (s *Store) applyWith(ctx context.Context, db txQuerier, e *encoder, reqs []*request) error {
	e.reset()
	for _, r := range reqs {
		e.add(r) // the ids point into the requests, alive until send returns
	}
	e.finish()
	if e.settlers && len(reqs) > 1 {
		return errSettlers
	}
	var (
		oks     []bool
		retries []int64
		nums    []float64
		fresh   bool
	)
	w := newWaits(ctx)
	err := s.serial(ctx, db, func(q querier) error {
		wait, _ := w.next()
		return q.QueryRow(ctx, s.applySQL, e.ops, e.counts, e.refs, e.ids, e.names, e.keys, e.shards, e.nlock, e.pint, e.pflt,
			wait, s.fresh.Load(), e.marks).Scan(&oks, &retries, &nums, &fresh)
	})
	if err != nil {
		return s.asBadRecord(err)
	}
	s.fresh.Store(fresh)
	n := len(e.counts) / 2
	if len(oks) != n || len(retries) != n || len(nums) != 5*n {
		return fmt.Errorf("the function answered %d items for %d: is another version installed?", len(oks), n)
	}
	i := 0
	for _, r := range reqs {
		for j := range r.out {
			num := nums[5*i:]
			r.out[j] = driver.Decision{OK: oks[i], RetryAfter: retries[i], Remaining: num[0],
				Charged: [2]float64{num[1], num[2]}, Now: int64(num[3]), TS: int64(num[4])}
			if retries[i] < 0 { // the op found its settlement's mark: minus its kind, and 4 if its settler's
				r.out[j].RetryAfter, r.out[j].Settled, r.out[j].Own = 0, driver.SettleKind(-retries[i]&3), -retries[i]&4 != 0
			}
			i++
		}
		r.answered = true
	}
	return nil
}

// single reports whether r is one limit or check of one item on one
// record: what the function _one decides.
func (r *request) single() bool {
	return len(r.items) == 1 && r.items[0].n == 1 && driver.Mode(r.flags&3) != driver.ModeRefund
}

// sendOne decides a single request (see single) with the function made
// for it, its lock wait first w's.
func (s *Store) sendOne(ctx context.Context, r *request, w waits) error {
	it := &r.items[0]
	rec := &it.recs[0]
	p := rec.params
	var now *int64
	if r.flags&flagServerTime == 0 {
		now = &r.now
	}
	d := &r.out[0]
	return s.asBadRecord(s.serial(ctx, s.pool, func(q querier) error {
		wait, _ := w.next()
		return q.QueryRow(ctx, s.oneSQL, rec.id[:], []byte(rec.name), []byte(rec.key), rec.shard,
			int32(p.Kind), p.Rate, p.Period, p.Capacity, p.MaxReserved, p.Phase, now, it.count, int32(r.flags), wait).
			Scan(&d.OK, &d.RetryAfter, &d.Remaining, &d.Charged[0], &d.Now, &d.TS)
	}))
}

// lockWait returns how long, in ms, the statement of a call with ctx may
// wait for a lock (0: no bound): a little longer than ctx leaves. pgx
// returns when ctx ends and asks the server to cancel the statement; if
// that request does not get through (the network is what failed), the
// statement still gives up soon after, and frees its locks and its
// connection, rather than wait on a stalled lock holder for as long as it
// holds. A deadline beyond lock_timeout's largest value (math.MaxInt32
// ms, some 24 days) waits that long: the sum below would overflow for one
// centuries away, as context.WithTimeout(ctx, math.MaxInt64) sets.
//
// A deadline is read off the wall clock by the rule of internal/deadline.
// One the wall clock is past, of a context that has not ended (Unmet), is
// of another clock: a test's mock.WithTimeout, or the Limiter's own check
// of the store on its WithClock. It bounds nothing the wall clock can
// measure, and the statement waits as without one (0), rather than give
// the server 1 ms, which failed a call that met any row lock with
// SQLSTATE 55P03 long before its context ended. A context that has ended
// (Met) gets 1 ms: pgx does not send its statement anyway.
func lockWait(ctx context.Context) int32 {
	switch left, st := deadline.Of(ctx); {
	case st == deadline.None || st == deadline.Unmet:
		return 0
	case st == deadline.Met:
		return 1
	case left >= math.MaxInt32*time.Millisecond:
		return math.MaxInt32
	default:
		ms := (left + left/8 + 50*time.Millisecond).Milliseconds()
		return int32(min(ms, math.MaxInt32))
	}
}

// waits is the lock wait (lockWait) of each try of one statement: the
// first try's read before it, each retry's (after a serialization failure
// or a deadlock, see serial) read anew, so that a retry waits no longer
// than the time its context then leaves, rather than as long as the first
// try might. A statement first sent without a bound (0: no deadline, or
// one of another clock) is sent again without one; one sent with a bound
// keeps one, of at least 1 ms (a wall-clock deadline past, its context's
// timer not run yet, is a context about to end).
type waits struct {
	ctx  context.Context
	ms   int32
	sent bool // a try was sent with ms
}

func newWaits(ctx context.Context) waits { return waits{ctx: ctx, ms: lockWait(ctx)} }

// next returns the lock wait of the next try, and whether it differs from
// the last try's.
func (w *waits) next() (int32, bool) {
	was := w.ms
	if w.sent {
		w.ms = w.left()
	}
	w.sent = true
	return w.ms, w.ms != was
}

// then returns the waits of the next statement of the same call, sent
// after w's (a lone call's upsert after its fresh upsert): its lock wait
// is the time left now, bounded as a retry's is (see next). Read afresh
// with newWaits, a wall-clock deadline passed meanwhile, its context's
// timer not run yet (deadline.Unmet), gave 0, no bound: a statement that
// could wait on a row lock for as long as its holder held it.
func (w waits) then() waits { return waits{ctx: w.ctx, ms: w.left()} }

// left is the lock wait of a statement sent after one with w.ms: the
// time left now, no longer than w.ms, and at least 1 ms if w.ms bounded
// the wait (0 for no bound stays 0).
func (w *waits) left() int32 {
	if w.ms == 0 {
		return 0
	}
	return min(w.ms, max(lockWait(w.ctx), 1))
}

// Apply implements ratelimit.Store. The op goes in one statement, alone or
// with the ops of other calls in flight at the same time. A call whose
// context ends while it waits for a batch leaves undecided; one whose
// statement was sent may have been decided and charged, as for any call
// over a network. An out shorter than op's items, or an invalid op
// (driver.CheckOp), is refused with an error, and nothing is sent.
func (s *Store) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil || s.batcher == nil {
		return s.unmade(ctx, "Apply")
	}
	if err := driver.CheckOut(op, out); err != nil {
		return fmt.Errorf("pgstore: Apply: %w", err)
	}
	r := s.newRequest(op)
	if s.hooks.apply != nil {
		s.hooks.apply(ctx, r)
	}
	_, err := s.batcher.Do(ctx, r)
	var pe *coalesce.PanicError
	if (errors.As(err, &pe) || errors.Is(err, coalesce.ErrGoexit)) && r.answered {
		// The send panicked, or called runtime.Goexit, in the background
		// after it had answered r (its statement committed, say, and a
		// later one of the batch panicked): r keeps its answer, which the
		// batch's error would hide. Do has returned: the send is over.
		err = nil
	}
	if err == nil {
		err = r.err
	}
	if err != nil {
		return fmt.Errorf("pgstore: apply: %w", callerError(ctx, closedPool(err)))
	}
	copy(out, r.out)
	return nil
}

// ApplyBatch implements driver.BatchApplier: ops decided one after
// another, in one statement; none for no ops. Outs of the wrong length, or
// an invalid op, are refused with an error, and nothing is sent. An op
// that fails on its own (a row no release writes: ErrBadRecord) fails
// alone: the others are decided and their outs filled, and the error
// joins a *driver.OpError for each op that failed. (The batch's ops go
// again one by one for that.) Once one of them fails otherwise (ctx
// ended, the pool closed, the server down), those after it are not sent:
// each is an *OpError wrapping that failure, undecided, and so is that op
// if its statement did not run. One whose answer was lost (ctx ended, or
// the connection broke, while its statement ran) may have been decided
// and charged: it is no *OpError, and the error is then the batch's,
// naming the op, under which any op of the batch may have been decided.
func (s *Store) ApplyBatch(ctx context.Context, ops []*driver.Op, outs [][]driver.Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil || s.batcher == nil {
		return s.unmade(ctx, "ApplyBatch")
	}
	if err := driver.CheckOuts(ops, outs); err != nil {
		return fmt.Errorf("pgstore: ApplyBatch: %w", err)
	}
	if len(ops) == 0 {
		return nil
	}
	reqs := make([]*request, len(ops))
	for i, op := range ops {
		reqs[i] = s.newRequest(op)
	}
	if err := s.send(ctx, reqs); err != nil {
		if len(reqs) > 1 || !errors.Is(err, ErrBadRecord) {
			return fmt.Errorf("pgstore: apply: %w", callerError(ctx, closedPool(err)))
		}
		// The op of a batch of one failed on its own, as it would beside
		// others: its send failed it alone, on the batch's path.
		reqs[0].err = err
	}
	var failed []error
	lost := -1
	for i, r := range reqs {
		if r.err != nil {
			if r.lost && lost < 0 {
				lost = i
			}
			failed = append(failed, &driver.OpError{Index: i, Err: fmt.Errorf("pgstore: %w", callerError(ctx, closedPool(r.err)))})
			continue
		}
		copy(outs[i], r.out)
	}
	if lost >= 0 {
		// Not an *OpError, which says that its op was left undecided.
		return fmt.Errorf("pgstore: apply: op %d of the batch: %w", lost, callerError(ctx, closedPool(reqs[lost].err)))
	}
	if failed != nil {
		return errors.Join(failed...)
	}
	return nil
}

// Load implements ratelimit.Store: one statement. An id given more than
// once is read once, and its record reported at each of its positions. A
// record that no release writes (driver.CheckState) fails it with
// ErrBadRecord.
func (s *Store) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil || s.batcher == nil {
		return s.unmade(ctx, "Load")
	}
	if err := driver.CheckRecords(ids, out); err != nil {
		return fmt.Errorf("pgstore: Load: %w", err)
	}
	keys := make([][]byte, 0, len(ids))
	first := make([]int, len(ids)) // the first position of ids[i]
	index := make(map[[sha256.Size]byte]int, len(ids))
	for i, id := range ids {
		k := recordID(id)
		j, ok := index[k]
		if !ok {
			j = i
			index[k] = i
			keys = append(keys, k[:])
		}
		first[i] = j
	}
	err := s.serial(ctx, s.pool, func(q querier) error {
		clear(out[:len(ids)])
		rows, err := q.Query(ctx, s.loadSQL, keys)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				id []byte
				v  float64
				ts *int64
			)
			if err := rows.Scan(&id, &v, &ts); err != nil {
				return err
			}
			if len(id) != sha256.Size {
				continue // no id asked for (a nil or short one would panic as an array)
			}
			if i, ok := index[[sha256.Size]byte(id)]; ok {
				if err := s.checkRow(id, v, ts); err != nil {
					return err
				}
				out[i] = driver.Record{State: driver.State{Remaining: v, TS: *ts}, Found: true}
			}
		}
		return rows.Err()
	})
	if err != nil {
		return fmt.Errorf("pgstore: load: %w", callerError(ctx, closedPool(err)))
	}
	for i, j := range first {
		out[i] = out[j]
	}
	return nil
}

// Delete implements ratelimit.Store: one statement.
func (s *Store) Delete(ctx context.Context, ids []driver.RecordID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil || s.batcher == nil {
		return s.unmade(ctx, "Delete")
	}
	keys := make([][]byte, len(ids))
	for i, id := range ids {
		k := recordID(id)
		keys[i] = k[:]
	}
	err := s.serial(ctx, s.pool, func(q querier) error {
		_, err := q.Exec(ctx, s.deleteSQL, keys)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgstore: delete: %w", callerError(ctx, closedPool(err)))
	}
	return nil
}

// expiredChunk is how many rows of the primary key one transaction of
// DeleteExpired walks.
var expiredChunk = 1000

// DeleteExpired removes the records whose bucket has been full again for
// driver.ExpiryGrace (a minute) at now, taken within ±driver.MaxTime
// (driver.ClampMilli), and the settlement marks past
// their expiry, and returns how many it removed. It removes as well,
// uncounted, the placeholders of records that an op locked and then
// refused to write: they were never records, and read as missing. The
// grace keeps exact the calls in flight, judged at a now read a moment
// before. Such records read as a full bucket whether kept or not; removing
// them keeps the table proportional to the keys active recently.
//
// It walks the table along its primary key in small transactions of a
// thousand rows, each of which holds its rows for a moment only, and
// skips the rows that calls in flight hold (they go at the next sweep), so
// that it never makes a call wait for long and cannot deadlock with one.
// Call it periodically, say every minute, from one process or several; it
// returns ctx's error, and what it removed so far, when ctx ends.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time) (int, error) {
	if s == nil || s.batcher == nil {
		return 0, s.unmade(ctx, "DeleteExpired")
	}
	cutoff := driver.ClampMilli(now) - driver.ExpiryGrace
	var (
		after   = []byte{}
		deleted int
	)
	for {
		var (
			last    []byte
			scanned int64
			gone    int64
		)
		err := s.serial(ctx, s.pool, func(q querier) error {
			return q.QueryRow(ctx, s.expiredSQL, after, expiredChunk, cutoff).Scan(&last, &scanned, &gone)
		})
		if err != nil {
			return deleted, fmt.Errorf("pgstore: delete expired: %w", callerError(ctx, closedPool(err)))
		}
		deleted += int(gone)
		if scanned < int64(expiredChunk) {
			return deleted, nil
		}
		after = last
	}
}

// The SQLSTATEs with which the functions fail on a row that no release
// writes (schema.sql), with the row's id in hex as the error's DETAIL.
const (
	codeBadMark   = "RLBMK" // a settlement's mark of another kind than a cancel or a use
	codeBadRecord = "RLBAD" // a record that driver.CheckState refuses
)

// asBadRecord returns err, a statement's error, as an error matching
// ErrBadRecord, which says what to do, when it is a function failing on a
// row that no release writes; otherwise err.
func (s *Store) asBadRecord(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case codeBadMark:
		return fmt.Errorf("%w: table %s: %s: the token may have been settled already: treat it as settled "+
			"(do not run its job, nor hand its tokens back); once the token has expired (Token.Expires), delete the row "+
			"(DELETE FROM %s WHERE id = '\\x%s'); if something else writes into the table, give the store a table of its own (WithTable)",
			ErrBadRecord, s.table, pe.Message, s.table, pe.Detail)
	case codeBadRecord:
		return s.badRecord(pe.Detail, pe.Message)
	}
	return err
}

// badRecord returns the error, matching ErrBadRecord, of the record whose
// row's id is id (in hex), which holds what no release writes (what).
func (s *Store) badRecord(id, what string) error {
	return fmt.Errorf("%w: table %s: %s, which no release writes (a record holds a finite number of tokens at a time from %d to %d ms): "+
		"delete the row (DELETE FROM %s WHERE id = '\\x%s'), and its limit starts full again; "+
		"if something else writes into the table, give the store a table of its own (WithTable)",
		ErrBadRecord, s.table, what, driver.MinRecordTime, driver.MaxTime, s.table, id)
}

// checkRow returns nil if the row id holds a record that a release writes
// (driver.CheckState), of v tokens at ts (nil: NULL), and otherwise
// badRecord's error: the check of a record read in Go, as the functions
// check those they read.
func (s *Store) checkRow(id []byte, v float64, ts *int64) error {
	if ts != nil && driver.CheckState(driver.State{Remaining: v, TS: *ts}) == nil {
		return nil
	}
	t := "NULL"
	if ts != nil {
		t = strconv.FormatInt(*ts, 10)
	}
	return s.badRecord(hex.EncodeToString(id), fmt.Sprintf("the record %x holds value %v, ts %s", id, v, t))
}

// The bounds of a record's ts (driver.CheckState) as SQL.
var (
	sqlMinTS = strconv.FormatInt(driver.MinRecordTime, 10)
	sqlMaxTS = strconv.FormatInt(driver.MaxTime, 10)
)
