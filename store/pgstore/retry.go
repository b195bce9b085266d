package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// The store's statements expect READ COMMITTED, PostgreSQL's default
// isolation: an upsert or a lock of a row that a concurrent transaction
// changed then reads the row's newest version, as the transition must. A
// role or database whose default_transaction_isolation is REPEATABLE READ
// or SERIALIZABLE makes such a statement fail instead, with a
// serialization failure (SQLSTATE 40001): under its snapshot the newest
// version is not visible. On a hot key most statements would.
//
// Every statement of the store runs alone in an implicit transaction,
// which such a failure (or a deadlock, 40P01) rolls back whole: it wrote
// nothing, and no op of it was applied. The store then sends it again, in
// an explicit READ COMMITTED transaction (three round trips rather than
// one, only after a failure), where the row's newest version is read as
// it should be, at most serialRetries times; after that it returns the
// last error, wrapped.

// serialRetries is how many times a statement that failed with a
// serialization failure or a deadlock is sent again.
const serialRetries = 3

// readCommitted is the transaction a statement is sent again in.
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// retryable reports an error of a statement whose transaction the server
// rolled back for a concurrent one: a serialization failure or a deadlock.
func retryable(err error) bool {
	if err == nil { // before pe, which escapes: no allocation on success
		return false
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// unrun reports whether err, a statement's, says that the statement took
// no effect: it was not sent (the pool was closed, no connection could be
// made, its context had ended: what pgx calls safe to retry; pgx's
// deallocation, on the connection, of the statements that failed there,
// which it sends ahead of the statement, failed: see deallocFailed), or the
// server failed it with an ERROR, which rolled its transaction back (a
// function's on a row that no release writes among them: ErrBadRecord,
// which does not wrap the server's error). Otherwise (its context ended
// or its connection broke while it ran, its answer could not be read, the
// server ended the session: FATAL) it may have run and committed: its ops
// may have been decided and charged.
//
// The server names the severity in the language of its lc_messages
// (Severity: "ОШИБКА" for ERROR in Russian), and, since PostgreSQL 9.6,
// in English too, whatever lc_messages says (SeverityUnlocalized): that
// one is read when the server sent it. A server before 9.6 sends only the
// localized name, and only an ERROR named "ERROR" is then known to have
// rolled back: any other name is read as one whose statement may have run.
func unrun(err error) bool {
	var (
		pe   *pgconn.PgError
		ce   *pgconn.ConnectError
		safe interface{ SafeToRetry() bool }
	)
	return errors.Is(err, puddle.ErrClosedPool) || errors.Is(err, ErrBadRecord) || errors.As(err, &ce) ||
		errors.As(err, &pe) && severity(pe) == "ERROR" ||
		errors.As(err, &safe) && safe.SafeToRetry() || deallocFailed(err)
}

// pgxDeallocate begins the error with which pgx fails a statement, or a
// transaction's BEGIN or COMMIT, whose connection holds cached statements
// that failed there since its last statement: it deallocates them first,
// and, when that fails (its context ended, the connection broke), returns
// this error, wrapping the failure, without sending the statement
// (TestContextEndsWhileDeallocating fails should pgx word it otherwise).
// The text is all there is to match: pgx makes the error with fmt.Errorf,
// no type or sentinel of its marks it, and the failure it wraps (the
// pipeline's: a timeout, "conn closed") says nothing of a deallocation.
// Nothing of the statement was written: pgx sends the deallocations as a
// pipeline of their own, synced and read to its end, before it encodes
// the statement (v5.6.0 through v5.12.0). Should pgx word the error
// otherwise, its op reads as one that may have run: the safe side.
const pgxDeallocate = "failed to deallocate cached statement(s): "

// deallocFailed reports whether err is, or wraps, the error of pgx's
// deallocation ahead of a statement (pgxDeallocate): the statement was not
// sent. (A transaction's COMMIT, which would leave a statement run and not
// committed, follows a statement that succeeded, which left nothing to
// deallocate.)
func deallocFailed(err error) bool {
	if err == nil {
		return false
	}
	if strings.HasPrefix(err.Error(), pgxDeallocate) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return deallocFailed(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if deallocFailed(e) {
				return true
			}
		}
	}
	return false
}

// severity returns the severity of pe unlocalized, as the server sends it
// since PostgreSQL 9.6, or else as the server's lc_messages names it.
func severity(pe *pgconn.PgError) string {
	if pe.SeverityUnlocalized != "" {
		return pe.SeverityUnlocalized
	}
	return pe.Severity
}

// querier is what a statement is sent on: the pool, one of its
// connections, or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// txQuerier is a querier that begins transactions: the pool or a
// connection.
type txQuerier interface {
	querier
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// serial calls send, which sends one statement on q, with db; while the
// statement fails with a serialization failure or a deadlock, it calls it
// again in a READ COMMITTED transaction on db, at most serialRetries
// times, unless ctx has ended. send must write its results anew at every
// call. A statement the server no longer holds as prepared (stale) must
// fail send with its error, leaving it to be prepared afresh at the next
// call (pgx forgets a cached statement that failed; runFresh in a
// transaction deallocates it), and not be prepared again in the
// transaction that error aborted (see again).
func (s *Store) serial(ctx context.Context, db txQuerier, send func(q querier) error) error {
	return s.again(ctx, db, send(db), send)
}

// again is serial after a first try that failed with err.
//
// A statement prepared on the connection may be gone from the server by
// the time it is sent again (a pooler's DISCARD ALL, DEALLOCATE ALL, a
// change of its table since the first try). It then fails, without
// running, and aborts the transaction: anything sent there after it fails
// with 25P02 ("current transaction is aborted"), which would hide what
// happened. The transaction is rolled back and the statement sent once
// more, in a transaction of its own, prepared afresh; if it fails again
// so, that error is returned.
func (s *Store) again(ctx context.Context, db txQuerier, err error, send func(q querier) error) error {
	for retry := 1; retryable(err); retry++ {
		if retry > serialRetries || ctx.Err() != nil {
			return serialError(ctx, retry, err)
		}
		s.retried.Add(1)
		err = pgx.BeginTxFunc(ctx, db, readCommitted, func(tx pgx.Tx) error { return send(tx) })
		if stale(err) {
			err = pgx.BeginTxFunc(ctx, db, readCommitted, func(tx pgx.Tx) error { return send(tx) })
		}
	}
	return err
}

// serialError is the error of a statement that failed tries times on
// concurrent transactions, the last time with err.
func serialError(ctx context.Context, tries int, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w, after %d tries of the statement failed on concurrent transactions: %w", ctx.Err(), tries, err)
	}
	return fmt.Errorf("pgstore: the statement failed on concurrent transactions %d times, the last %d in READ COMMITTED "+
		"(a serialization failure or a deadlock; the store expects default_transaction_isolation = 'read committed'): %w",
		tries, tries-1, err)
}
