// Package boltstore is a ratelimit.Store in an embedded bbolt file: the
// persistent default that needs no server.
//
// # Records and transactions
//
// Every record is one key of one bbolt bucket. Apply reads the records an
// op touches, runs ratelimit.Evaluate and writes the updates in one write
// transaction, so it is atomic and, bbolt's file being copy-on-write and
// synced at every commit, durable: a process killed in the middle of a write
// leaves a file that opens with the last committed state, holding no grant
// that was not made.
//
// A settlement (a reservation's or receipt's token settled by a Limiter)
// leaves a mark beside the records, a key of its own, so that the token is
// settled at most once. A mark the store cannot read (something other than
// this store wrote the key) fails the settlement with ErrBadMark, rather
// than be taken for no mark: the token may have been settled already. A
// record it cannot read, or one that no release writes, fails every call
// on it with ErrBadRecord, rather than be taken for a full bucket.
//
// # Group commit
//
// bbolt has a single writer, and each commit pays two fsyncs. A call that
// finds no write transaction under way runs its own at once: a caller
// alone waits for nobody (with a context that can end, its transaction
// runs on another goroutine, which its caller waits for, so that it can
// leave on time: see Deadlines). Calls that arrive while a transaction is
// under way wait for it, then go together in the next one (at most
// WithMaxBatch of them), decided one after another in their order of
// arrival: many callers share one transaction and one commit, with no
// timer. A transaction that writes nothing (its every op refused, say; a
// Delete of records that are not there; a step of DeleteExpired whose
// every record was written since it read them) is rolled back rather
// than committed, and pays no fsync. The store also implements
// driver.BatchApplier.
//
// A panic in a transaction rolls it back and leaves the store usable: a
// lone caller's, run on its goroutine (its context cannot end), goes on
// to that caller; one run in the background, a group's or a lone call's
// with a context that can end, fails every call of the transaction with
// an error instead ("a batch's send panicked: ..."). Delete's,
// ApplyBatch's and DeleteExpired's go on to their callers, if they are
// still there.
//
// # Deadlines
//
// A call whose context ends while it waits, queued for the next
// transaction or for the writer, leaves at once and is not decided. A call
// whose context ends before its op is decided in a transaction is not
// decided either; once decided, its op is committed with the others of its
// transaction (its caller, gone, hears the context's error), so it may
// have been charged, as for any call over a network. A caller alone in its
// transaction whose context ends before the commit rolls it back.
//
// bbolt itself knows no context: its writer lock waits for a write of the
// application's (through DB), and a write that grows the file past its
// memory map remaps it, in its commit, once every read transaction under
// way has ended, and every new read transaction waits for that remap:
// behind a long read transaction of the application (a backup through DB,
// say), all of them could wait as long. So, given a context that can end,
// a call runs its transaction, read or write, on another goroutine, and
// returns when its context ends, with the context's error; the
// transaction goes on in the background, touching nothing of the
// caller's. A write whose context ends before its commit rolls back (if
// it has not begun, it does when it begins); one whose context ends in
// its commit (the fsyncs, or the remap) commits: Apply's op, Delete's
// removals, a step of DeleteExpired may have taken effect, as for any
// call whose context ends. With a context that cannot end
// (context.Background()), a transaction runs on its caller's goroutine,
// which returns when bbolt does.
//
// # One process at a time
//
// A bbolt file is opened by one process at a time, and once per process:
// Open says so at once if this process already holds the file, and waits
// for another process's release up to WithTimeout (OpenContext: or until
// its context ends). For a fleet of processes sharing limits, use
// store/redisstore or store/pgstore.
package boltstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/coalesce"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// DefaultBucket is the bucket that holds the records unless WithBucket
// names another.
const DefaultBucket = "ratelimit"

// DefaultTimeout is how long Open waits for another process to release the
// file's lock.
const DefaultTimeout = 5 * time.Second

// DefaultMaxBatch is the most calls one write transaction decides unless
// WithMaxBatch says otherwise.
const DefaultMaxBatch = 128

// ErrAlreadyOpen is returned by Open for a file that this process already
// has open through another Store.
var ErrAlreadyOpen = errors.New("boltstore: the file is already open in this process")

// ErrBadMark is matched by the error of a settlement (Apply, ApplyBatch:
// a Limiter's Use, Refund, Settle or Reservation.Cancel) whose mark in the
// bucket cannot be read: a value of the wrong size, or of no kind of
// settlement, or a nested bucket, written by something other than this
// store. The mark's token
// may have been settled already, so the store settles it no more, and
// writes nothing for the op. It matches driver.ErrBadRecord too, the error
// every store gives for what no release of it writes.
var ErrBadMark error = badMarkError{}

// ErrBadRecord is matched by the error of a call (Apply, ApplyBatch, Load)
// that met, where a record belongs in the bucket, a value that no release
// writes: of another size, or a record of NaN or infinitely many tokens,
// or of a time beyond any call's (driver.CheckState), or a nested bucket
// (which Delete refuses too); written there by something else, or damaged. The error names the key and says what to do.
// The call changed nothing; every call on that record fails until the key
// is deleted. It is driver.ErrBadRecord, the error every store gives for
// what no release of it writes.
var ErrBadRecord = driver.ErrBadRecord

// badMarkError is the type of ErrBadMark: its own message, and a match for
// driver.ErrBadRecord.
type badMarkError struct{}

func (badMarkError) Error() string { return "a settlement's mark cannot be read" }

// Is reports whether target is driver.ErrBadRecord.
func (badMarkError) Is(target error) bool { return target == driver.ErrBadRecord }

// Store is a ratelimit.Store in a bbolt database, safe for concurrent use.
// Build it with Open or New: every call of the zero value, or of a nil
// *Store, Close included, fails with an error matching
// driver.ErrZeroStore.
type Store struct {
	db     *bolt.DB
	bucket []byte
	owned  bool       // Close closes db
	file   *openEntry // the file's entry in this process's registry (Open)

	batcher *coalesce.Batcher[*request, error]

	// writer is the store's writer lock, held by every write transaction
	// the store runs: unlike bbolt's own, a caller waiting for it leaves
	// when its context ends.
	writer chan struct{}
	// Scratch of the write transaction under way, guarded by writer.
	prev  []driver.Record
	next  []driver.Update
	vals  []byte
	wrote bool // an op of the transaction wrote: it commits

	sweepBatch int // the most keys one transaction of DeleteExpired visits
	hooks      hooks

	// broken is the error of the first transaction that bbolt failed
	// with a panic or a memory fault (guard): every call returns it
	// after.
	broken atomic.Pointer[error]

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// hooks let the package's tests watch and steer the store; all nil in use.
type hooks struct {
	waitWriter func()                    // a writer finds the writer lock held
	inWrite    func(tx *bolt.Tx)         // in a batch's transaction, before its ops
	inSweep    func(tx *bolt.Tx)         // in a sweep's transaction, before its deletes
	scanned    func()                    // a sweep's step has read its keys, before its write
	failOp     func(op *driver.Op) error // an op fails on its own, after its writes
	decided    func(ctx context.Context) // an op of a call of ctx was decided, in its transaction
}

var (
	_ ratelimit.Store     = (*Store)(nil)
	_ driver.BatchApplier = (*Store)(nil)
	_ driver.Expirer      = (*Store)(nil)
	_ driver.ZeroChecker  = (*Store)(nil)
)

// Option configures a Store in Open or New.
type Option func(*options)

type options struct {
	bucket   string
	timeout  time.Duration
	maxBatch int
}

// WithBucket sets the bucket that holds the records (default
// DefaultBucket), so that several stores may share one database.
func WithBucket(name string) Option { return func(o *options) { o.bucket = name } }

// WithTimeout sets how long Open waits for the file's lock when another
// process holds it (default DefaultTimeout). As for bbolt's
// Options.Timeout, 0 waits for as long as the other process holds it; a
// negative d tries once, and fails at once if the file is held.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithMaxBatch sets the most calls one write transaction decides (default
// DefaultMaxBatch). Calls that arrive while a transaction is under way wait
// and go together in the next one, sharing its commit. 1 turns coalescing
// off: every call runs its own transaction, one after another.
func WithMaxBatch(n int) Option { return func(o *options) { o.maxBatch = n } }

func newOptions(opts []Option) options {
	o := options{bucket: DefaultBucket, timeout: DefaultTimeout, maxBatch: DefaultMaxBatch}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Open opens the bbolt file at path, creating it if needed, and returns a
// store that owns it: Close releases the file. Its commits do not write
// bbolt's list of free pages, which Open rebuilds by reading the file
// when the last process to write it did not (about 30 ms for 150 MB). A file that this process
// already has open through another Store is refused at once with
// ErrAlreadyOpen: share that Store, or give another user a bucket of its
// own in the same file with New(store.DB(), WithBucket(name)). A file that
// is no bbolt database, or is damaged (cut short, or a page bbolt cannot
// read), is refused with ErrDamagedFile, rather than end the process: Open
// first reads every page of the file's last commit, which adds some 40% to
// the time bbolt's own Open takes. A file another opener holds is waited
// for WithTimeout; OpenContext also stops waiting when a context ends.
func Open(path string, opts ...Option) (*Store, error) {
	return OpenContext(context.Background(), path, opts...)
}

// OpenContext is Open, whose wait for a file that another opener holds
// (another process, or a bbolt.Open of this one) also ends when ctx ends,
// with an error that wraps ctx's: a service that starts with a deadline,
// or that is told to stop while it waits, bounds its start-up by ctx
// rather than by WithTimeout alone (whichever ends first ends the wait).
// It polls the file's lock every 50 ms, as bbolt does, and reads the file
// only once the lock is free. Where bbolt locks the file otherwise than by
// flock (Windows, Solaris, AIX, Plan 9, Android), only ctx's deadline
// bounds the wait, as bbolt's timeout. ctx bounds the opening alone, not
// the store's calls after.
func OpenContext(ctx context.Context, path string, opts ...Option) (*Store, error) {
	o := newOptions(opts)
	if err := o.check(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	// A named pipe, a device or a socket is no bbolt file; reading one (the
	// file's checks, the wait for its lock) could block for ever.
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("boltstore: open %s: it is no regular file (%s): a bbolt database is a file; check the path: %w",
			path, fi.Mode().Type(), ErrDamagedFile)
	}
	entry, err := register(path)
	if err != nil {
		return nil, err
	}
	db, err := openLocked(ctx, path, o.timeout)
	if err != nil {
		entry.release()
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, fmt.Errorf("boltstore: open %s: the context ended while another process, or a bbolt.Open of this one, held the file: %w", path, err)
		}
		if errors.Is(err, berrors.ErrTimeout) {
			// bbolt's lock does not tell this process from another: one
			// that opened the file with bbolt itself holds it too.
			return nil, fmt.Errorf("boltstore: open %s: another process holds the file, or this process opened it with bbolt: "+
				"a bbolt file serves one opener at a time (within this process, pass that *bbolt.DB to New, with WithBucket for a bucket of its own; "+
				"for a fleet of processes, use redisstore or pgstore): %w", path, err)
		}
		return nil, openError(path, err)
	}
	s, err := newStore(db, o)
	if err != nil {
		db.Close()
		entry.release()
		return nil, err
	}
	s.owned, s.file = true, entry
	return s, nil
}

// openError returns err, Open's refusal of the file at path, as
// "boltstore: open path: why", saying the package and the path once:
// ErrDamagedFile's errors name the package, and bbolt's of opening the
// file (an *fs.PathError) the path. It wraps err as it is.
func openError(path string, err error) error {
	why := strings.TrimPrefix(err.Error(), "boltstore: ")
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) && pe.Path == path {
		why = strings.TrimPrefix(why, pe.Op+" "+path+": ")
	}
	return &wordedError{text: "boltstore: open " + path + ": " + why, err: err}
}

// wordedError is err, said otherwise.
type wordedError struct {
	text string
	err  error
}

func (e *wordedError) Error() string { return e.text }
func (e *wordedError) Unwrap() error { return e.err }

// lockRetry is how often openLocked tries the lock of a file another
// opener holds: bbolt's own flockRetryTimeout.
const lockRetry = 50 * time.Millisecond

// openLocked opens path with bbolt once its lock is free, waiting up to
// timeout (bbolt's Options.Timeout: 0 for ever, negative: one try) or
// until ctx ends, whichever comes first. Where the lock is a flock, it
// waits by trying the lock on a descriptor of its own (lockFree), so that
// ctx can end the wait, and gives bbolt one try once the lock is free,
// waiting again if another opener took it in between; elsewhere bbolt
// waits, up to ctx's deadline.
func openLocked(ctx context.Context, path string, timeout time.Duration) (*bolt.DB, error) {
	// Commits do not write bbolt's list of free pages (one page or more
	// per commit); Open rebuilds it by reading the file instead.
	opts := &bolt.Options{Timeout: timeout, NoFreelistSync: true}
	var stop <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		stop = t.C
	}
	for {
		free, ok := lockFree(path)
		if !ok {
			// No flock to try: bbolt waits, up to ctx's deadline.
			if d, has := ctx.Deadline(); has && (timeout == 0 || time.Until(d) < timeout) {
				opts.Timeout = max(time.Until(d), time.Nanosecond)
			}
			db, err := openBolt(path, opts)
			if errors.Is(err, berrors.ErrTimeout) && ctx.Err() != nil {
				return nil, fmt.Errorf("%w (%w)", ctx.Err(), err)
			}
			return db, err
		}
		if free {
			try := *opts
			try.Timeout = -1 // one try: another opener may have taken it since
			db, err := openBolt(path, &try)
			if !errors.Is(err, berrors.ErrTimeout) {
				return db, err
			}
		}
		if timeout < 0 {
			return nil, berrors.ErrTimeout
		}
		if lockWait != nil {
			lockWait()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-stop:
			return nil, berrors.ErrTimeout
		case <-time.After(lockRetry):
		}
	}
}

// lockWait, if set, is called each time openLocked finds the file held,
// before it waits to try again.
var lockWait func()

// New returns a store in db, a database the caller already has and keeps
// owning: Close does not close it. A database whose file bbolt cannot read
// where the store's bucket is kept (damaged since it was opened) is
// refused with ErrDamagedFile; a closed one with an error matching
// driver.ErrClosed; one opened read-only with bbolt's ErrDatabaseReadOnly.
// The store's transactions wait for the application's own write
// transactions on db, as bbolt makes every writer wait; a call whose
// context can end leaves when it ends (see Deadlines in the package doc).
func New(db *bolt.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("boltstore: New needs a *bbolt.DB: pass an open database, or use Open")
	}
	o := newOptions(opts)
	if err := o.check(); err != nil {
		return nil, err
	}
	return newStore(db, o)
}

func (o options) check() error {
	if o.bucket == "" {
		return errors.New("boltstore: the bucket name is empty: pass a name to WithBucket")
	}
	if o.maxBatch < 1 {
		return fmt.Errorf("boltstore: WithMaxBatch(%d): the most calls a transaction decides must be at least 1 (1 turns coalescing off)", o.maxBatch)
	}
	return nil
}

func newStore(db *bolt.DB, o options) (*Store, error) {
	s := &Store{db: db, bucket: []byte(o.bucket), writer: make(chan struct{}, 1), sweepBatch: defaultSweepBatch}
	// Guarded, as every transaction of the store's: New's database may
	// have been damaged since bbolt opened it, and bbolt panics, or
	// faults, on a damaged page.
	err := s.guard(func() error {
		return update(db, func(tx *bolt.Tx) error {
			_, err := tx.CreateBucketIfNotExists(s.bucket)
			return err
		})
	})
	switch {
	case errors.Is(err, ErrDamagedFile):
		return nil, err
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return nil, fmt.Errorf("boltstore: New: the database is closed: pass an open one: %w (%w)", driver.ErrClosed, err)
	case errors.Is(err, berrors.ErrDatabaseReadOnly):
		return nil, fmt.Errorf("boltstore: New: the database is open read-only (bbolt's Options.ReadOnly), and the store writes: open it for writing: %w", err)
	case err != nil:
		return nil, fmt.Errorf("boltstore: create bucket %q: %w", o.bucket, err)
	}
	// Detach: a lone call's transaction runs on another goroutine when its
	// context can end, so that its caller leaves on time even while bbolt
	// holds the transaction back, which no context interrupts (its writer
	// lock, behind a write of the application's; a remap, behind a long
	// read transaction). send writes only to its request's memory, which
	// Apply reads once Do has returned nil.
	co := coalesce.Options{MaxBatch: o.maxBatch, MaxInFlight: 1, Detach: true}
	if o.maxBatch == 1 {
		co = coalesce.Options{MaxBatch: 1, Detach: true}
	}
	s.batcher = coalesce.New(s.send, co)
	return s, nil
}

// Close releases the file when the store owns it (Open), after the write
// transaction under way, if any, and ends the goroutine that runs the
// store's transactions in the background, once idle. It is idempotent;
// the store's methods return driver.ErrClosed afterwards. Close of a store
// that neither Open nor New made does nothing, and returns the error of
// its every call (driver.ErrZeroStore).
func (s *Store) Close() error {
	if s == nil || s.batcher == nil {
		return s.unmade("Close")
	}
	s.closeOnce.Do(func() {
		s.writer <- struct{}{}
		s.closed.Store(true)
		<-s.writer
		s.batcher.Close()
		if s.owned {
			s.closeErr = s.db.Close()
			s.file.release()
		}
	})
	return s.closeErr
}

// DB returns the underlying database: nil for a store that neither Open
// nor New made.
func (s *Store) DB() *bolt.DB {
	if s == nil {
		return nil
	}
	return s.db
}

// usable returns ctx's error if it is done, else the error of call on a
// store that neither Open nor New made (unmade), or on a closed one, or
// nil.
func (s *Store) usable(ctx context.Context, call string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil || s.batcher == nil {
		return s.unmade(call)
	}
	if s.closed.Load() {
		return errClosed
	}
	return nil
}

// CheckZero implements driver.ZeroChecker: an error matching
// driver.ErrZeroStore for the zero Store or a nil *Store, which neither
// Open nor New made, else nil, closed or not.
func (s *Store) CheckZero() error {
	if s == nil || s.batcher == nil {
		return s.unmade("CheckZero")
	}
	return nil
}

// unmade returns the error of call on s, nil or a Store that neither
// Open nor New made (it has no batcher, which both set last): it has no
// database, and would panic, or block in Close.
func (s *Store) unmade(call string) error {
	what := "the zero boltstore.Store"
	if s == nil {
		what = "a nil *boltstore.Store"
	}
	return fmt.Errorf("boltstore: %s: the store is %s, which neither Open nor New made: build it with boltstore.Open or boltstore.New, and use the store it returns: %w", call, what, driver.ErrZeroStore)
}

// errClosed is the error of a call of a closed store, or of one whose
// database was closed.
var errClosed = fmt.Errorf("boltstore: the store was closed (Close), or its database: "+
	"make calls before Close, or on a store opened again (Open, New): %w", driver.ErrClosed)

// wrap adds the package to err, and says ErrClosed for a database closed
// under a call. An error matching ErrDamagedFile names the package
// already.
func wrap(err error) error {
	if errors.Is(err, driver.ErrClosed) || errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return errClosed
	}
	if errors.Is(err, ErrDamagedFile) {
		return err
	}
	return fmt.Errorf("boltstore: %w", err)
}

// lock takes the writer lock, or returns ctx's error if ctx ends first,
// or ErrClosed once the store is closed.
func (s *Store) lock(ctx context.Context) error {
	select {
	case s.writer <- struct{}{}:
	default:
		if s.hooks.waitWriter != nil {
			s.hooks.waitWriter()
		}
		select {
		case s.writer <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if s.closed.Load() {
		<-s.writer
		return errClosed
	}
	return nil
}

func (s *Store) unlock() { <-s.writer }

// update runs fn in a write transaction under the writer lock; fn's
// changes are rolled back if ctx ends before the commit. fn returns
// errNoWrite when it changed nothing: the transaction is rolled back, and
// update returns nil (ctx's error if ctx has ended). When ctx can
// end, it runs the transaction on another goroutine and returns ctx's
// error once ctx ends first (coalesce.Detached): bbolt's own writer lock, held by
// a write of the application's, and a remap of the file in the commit,
// which waits for every read transaction under way, know no context. fn
// must then write only to memory its caller reads after update returns
// nil. A transaction left behind rolls back if it has not reached its
// commit; one left in its commit commits.
func (s *Store) update(ctx context.Context, fn func(*bolt.Tx) error) error {
	if ctx.Done() == nil {
		return s.write(ctx, fn)
	}
	return coalesce.Detached(ctx, func() error { return s.write(ctx, fn) })
}

// write runs fn in a write transaction under the writer lock, on the
// caller's goroutine, for update.
func (s *Store) write(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.unlock()
	err := s.guard(func() error {
		return update(s.db, func(tx *bolt.Tx) error {
			err := fn(tx)
			if err != nil && err != errNoWrite {
				return err
			}
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			return err
		})
	})
	if err == errNoWrite {
		return nil
	}
	return err
}

func (s *Store) bucketOf(tx *bolt.Tx) (*bolt.Bucket, error) {
	b := tx.Bucket(s.bucket)
	if b == nil {
		return nil, fmt.Errorf("bucket %q is missing: it was deleted through the database, and the store makes it only as it opens: "+
			"open the store again (Open, New); to reset limits, delete records (Delete) or keys of the bucket, not the bucket", s.bucket)
	}
	return b, nil
}

// Apply implements ratelimit.Store. A check runs in a read transaction,
// beside any writer; other ops go to the next write transaction, alone or
// with the calls of other goroutines. An out shorter than op's items, or an
// invalid op (driver.CheckOp), is refused with an error, and nothing is
// decided or written. A transaction whose commit fails (a full disk, a
// write error) fails every call of it with bbolt's error, and charges none
// of them; but one that fails in its last flush, after bbolt wrote the
// commit's meta page, may have taken effect, as bbolt reads that page from
// then on. A call whose context ends once its op is decided may have been
// charged too (see Deadlines in the package doc).
func (s *Store) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if err := s.usable(ctx, "Apply"); err != nil {
		return err
	}
	if err := driver.CheckOut(op, out); err != nil {
		return fmt.Errorf("boltstore: Apply: %w", err)
	}
	if op.Mode == driver.ModeCheck {
		return s.check(ctx, op, out)
	}
	// The request is the call's own copy: the caller may leave (its context
	// ended) while its request is still in a transaction, and reuse op.
	req := newRequest(ctx, op, true)
	opErr, err := s.batcher.Do(ctx, req)
	if err == nil {
		err = opErr
	}
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return fmt.Errorf("boltstore: Apply: %w", err)
		}
		return wrap(err)
	}
	copy(out, req.out)
	return nil
}

// check decides a ModeCheck op: it reads the op's records in a read
// transaction, then decides on the caller's goroutine, so that a read left
// behind when ctx ends writes only to memory of its own.
func (s *Store) check(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	n := op.NumRecords()
	prev := make([]driver.Record, n)
	keys := appendKeys(nil, make([]byte, 0, keysLen(op)), op)
	now := op.Now
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b, err := s.bucketOf(tx)
		if err != nil {
			return err
		}
		for i, k := range keys {
			if prev[i], err = s.get(b, k, now); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return fmt.Errorf("boltstore: Apply: %w", err)
		}
		return wrap(err)
	}
	ratelimit.Evaluate(op, prev, out, make([]driver.Update, n))
	return nil
}

// view runs fn in a read transaction. When ctx can end, it runs it on
// another goroutine and returns ctx's error once ctx ends first
// (coalesce.Detached): a read transaction waits to begin while bbolt remaps the
// file, which a write that grows it does once every read transaction
// under way has ended, so that a long one of the application (a backup,
// say) would keep the caller past its deadline. fn must then write only
// to memory its caller reads after view returns nil.
func (s *Store) view(ctx context.Context, fn func(*bolt.Tx) error) error {
	if ctx.Done() == nil {
		return s.guard(func() error { return s.db.View(fn) })
	}
	return coalesce.Detached(ctx, func() error { return s.guard(func() error { return s.db.View(fn) }) })
}

// get reads the record at k; one whose bucket is full again by now reads
// as missing, which is the same full bucket. A value that no release
// writes there, expired or not, is an error matching ErrBadRecord: read
// as missing, a damaged file would let every limit start over.
func (s *Store) get(b *bolt.Bucket, k []byte, now int64) (driver.Record, error) {
	v := b.Get(k)
	if v == nil {
		// Get reads a nested bucket, which something else made there,
		// as no key at all: taken for a missing record, it read as a
		// full bucket, and the write after failed with bbolt's bare
		// ErrIncompatibleValue.
		if b.Bucket(k) != nil {
			return driver.Record{}, s.bucketAt(k)
		}
		return driver.Record{}, nil
	}
	st, expires, ok := decodeValue(v)
	if !ok {
		return driver.Record{}, s.badRecord(k, v, fmt.Sprintf("a record is %d bytes", valueLen))
	}
	if err := driver.CheckState(st); err != nil {
		return driver.Record{}, s.badRecord(k, v, err.Error())
	}
	if expires <= now {
		return driver.Record{}, nil
	}
	return driver.Record{State: st, Found: true}, nil
}

// badRecord returns the error, matching ErrBadRecord, of the value v at
// the record's key k, which no release writes, for why.
func (s *Store) badRecord(k, v []byte, why string) error {
	return fmt.Errorf("%w: key %q of bucket %q holds %d bytes, %x: %s: "+
		"delete the key through the store's DB (its limit starts full again); "+
		"if something else writes into the bucket, give the store a bucket of its own (WithBucket)",
		ErrBadRecord, k, s.bucket, len(v), v[:min(len(v), 2*valueLen)], why)
}

// bucketAt returns the error, matching ErrBadRecord, of the nested bucket
// at the record's key k.
func (s *Store) bucketAt(k []byte) error {
	return fmt.Errorf("%w: key %q of bucket %q is a bucket, where a record belongs: "+
		"delete it through the store's DB (its limit starts full again); "+
		"if something else writes into the bucket, give the store a bucket of its own (WithBucket)",
		ErrBadRecord, k, s.bucket)
}

// Load implements ratelimit.Store.
func (s *Store) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	if err := s.usable(ctx, "Load"); err != nil {
		return err
	}
	if err := driver.CheckRecords(ids, out); err != nil {
		return fmt.Errorf("boltstore: Load: %w", err)
	}
	// Read into out when the read runs on the caller's goroutine; when it
	// may be left behind (view), into records of its own, from keys laid
	// out beforehand, so that it touches no memory of the caller's.
	recs, keys := out, [][]byte(nil)
	if ctx.Done() != nil {
		recs, keys = make([]driver.Record, len(ids)), make([][]byte, len(ids))
		for i, id := range ids {
			keys[i] = appendRecordKey(nil, id)
		}
	}
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b, err := s.bucketOf(tx)
		if err != nil {
			return err
		}
		var buf []byte
		for i := range recs {
			k := buf
			if keys != nil {
				k = keys[i]
			} else {
				buf = appendRecordKey(buf[:0], ids[i])
				k = buf
			}
			if recs[i], err = s.get(b, k, math.MinInt64); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return fmt.Errorf("boltstore: Load: %w", err)
		}
		return wrap(err)
	}
	copy(out, recs)
	return nil
}

// Delete implements ratelimit.Store. A Delete that finds none of ids'
// records commits nothing (see the package doc).
func (s *Store) Delete(ctx context.Context, ids []driver.RecordID) error {
	if err := s.usable(ctx, "Delete"); err != nil {
		return err
	}
	keys := make([][]byte, len(ids))
	for i, id := range ids {
		keys[i] = appendRecordKey(nil, id)
	}
	err := s.update(ctx, func(tx *bolt.Tx) error {
		b, err := s.bucketOf(tx)
		if err != nil {
			return err
		}
		wrote := false
		for _, k := range keys {
			// Delete of a key that is not there changes nothing; one that
			// is, a record's or a bucket's (which Delete refuses), it sees.
			if found, _ := b.Cursor().Seek(k); !bytes.Equal(found, k) {
				continue
			}
			if err := b.Delete(k); err != nil {
				if errors.Is(err, berrors.ErrIncompatibleValue) {
					return s.bucketAt(k) // a bucket is no record to reset
				}
				return err
			}
			wrote = true
		}
		if !wrote {
			return errNoWrite
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return fmt.Errorf("boltstore: Delete: %w", err)
		}
		return wrap(err)
	}
	return nil
}

// Key encoding: a tag byte, then driver.RecordID.AppendKey, which no
// two ids share. bbolt keys are at most 32 KiB, so an encoding longer than
// maxRawKey is replaced by its SHA-256 digest; the tag keeps raw and
// digested keys apart, and from the marks of settlements (tagMark and the
// settlement's ID), which no record reads.
const (
	maxRawKey = 512
	tagRaw    = 0
	tagDigest = 1
	tagMark   = 2
	markLen   = 1 + 16 // a mark's key: tagMark and the settlement's ID
)

// markKey returns the bbolt key of the mark of a settlement.
func markKey(id [16]byte) []byte {
	return append([]byte{tagMark}, id[:]...)
}

// A settlement's mark is a value like a record's: the settlement's kind
// (as the value), the time it was made, and when it may be dropped. A
// settlement of a settler (driver.Settlement.Settler, not zero) appends
// the settler's 16 bytes (markSettlerLen in all); one of none is the
// record-sized value alone, as releases that kept no settler write every
// mark, and read only that.
const markSettlerLen = valueLen + 16

// appendMark appends the mark of the settlement st, made at now.
func appendMark(dst []byte, st *driver.Settlement, now int64) []byte {
	dst = appendValue(dst, driver.State{Remaining: float64(st.Kind), TS: now}, st.Until)
	if st.Settler != ([16]byte{}) {
		dst = append(dst, st.Settler[:]...)
	}
	return dst
}

// decodeMark returns the kind, the settler (zero: none) and the expiry of
// the settlement whose mark is v; false for a value that is no mark.
func decodeMark(v []byte) (kind driver.SettleKind, settler [16]byte, expires int64, ok bool) {
	if len(v) == markSettlerLen {
		copy(settler[:], v[valueLen:])
		if settler == ([16]byte{}) {
			return 0, settler, 0, false // written as a mark of none
		}
		v = v[:valueLen]
	}
	st, expires, ok := decodeValue(v)
	switch k := st.Remaining; {
	case !ok:
		return 0, settler, 0, false
	case k == float64(driver.SettleCancel):
		return driver.SettleCancel, settler, expires, true
	case k == float64(driver.SettleUse):
		return driver.SettleUse, settler, expires, true
	}
	return 0, settler, 0, false
}

// badMark returns the error, matching ErrBadMark, of the settlement id
// whose mark v, in bucket, cannot be read.
func badMark(bucket []byte, id [16]byte, v []byte) error {
	return fmt.Errorf("%w: token %x: the value at its mark's key %x in bucket %q (%d bytes: %x) is not a mark of this store: "+
		"the token may have been settled already: treat it as settled (do not run its job, nor hand its tokens back); "+
		"once the token has expired (Token.Expires), delete the key through the store's DB; "+
		"if something else writes into the bucket, give the store a bucket of its own (WithBucket)",
		ErrBadMark, id[:4], markKey(id), bucket, len(v), v[:min(len(v), markSettlerLen)])
}

// appendRecordKey appends the bbolt key of id to dst.
func appendRecordKey(dst []byte, id driver.RecordID) []byte {
	start := len(dst)
	dst = append(dst, tagRaw)
	dst = id.AppendKey(dst)
	if len(dst)-start <= maxRawKey {
		return dst
	}
	sum := sha256.Sum256(dst[start+1:])
	return append(append(dst[:start], tagDigest), sum[:]...)
}

// keyLen bounds the length of the bbolt key of one record of it.
func keyLen(it *driver.Item) int {
	return 1 + 2*binary.MaxVarintLen64 + len(it.Name) + len(it.Key)
}

// keysLen bounds the length of the bbolt keys of op's records.
func keysLen(op *driver.Op) int {
	n := 0
	for i := range op.Items {
		n += len(op.Items[i].Shards) * keyLen(&op.Items[i])
	}
	return n
}

// appendKeys appends to keys the bbolt keys of op's records, in the order
// of AppendRecordIDs, laid out in buf; buf must have the capacity keysLen.
func appendKeys(keys [][]byte, buf []byte, op *driver.Op) [][]byte {
	for i := range op.Items {
		it := &op.Items[i]
		for _, sh := range it.Shards {
			start := len(buf)
			buf = appendRecordKey(buf, driver.RecordID{Name: it.Name, Key: it.Key, Shard: sh.Index})
			keys = append(keys, buf[start:len(buf):len(buf)])
		}
	}
	return keys
}

// Value encoding: value (float64 bits), ts, expires (Unix ms from which
// the bucket is full again), each 8 bytes big-endian.
const valueLen = 24

func appendValue(dst []byte, st driver.State, expires int64) []byte {
	dst = binary.BigEndian.AppendUint64(dst, math.Float64bits(st.Remaining))
	dst = binary.BigEndian.AppendUint64(dst, uint64(st.TS))
	return binary.BigEndian.AppendUint64(dst, uint64(expires))
}

func decodeValue(v []byte) (st driver.State, expires int64, ok bool) {
	if len(v) != valueLen {
		return st, 0, false
	}
	st.Remaining = math.Float64frombits(binary.BigEndian.Uint64(v[0:]))
	st.TS = int64(binary.BigEndian.Uint64(v[8:]))
	return st, int64(binary.BigEndian.Uint64(v[16:])), true
}
