package boltstore_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

var t0 = time.UnixMilli(1_700_000_000_000)

func newMock(at time.Time) *clock.Mock {
	m := clock.NewMock()
	m.Set(at)
	return m
}

func open(t *testing.T, path string, opts ...boltstore.Option) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(path, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) ratelimit.Store {
		return open(t, filepath.Join(t.TempDir(), "limits.db"))
	}, storetest.DifferentialRuns(20, 120), storetest.SpoilRecord(spoil))
}

// spoil writes, where the record id belongs in s, a value of no size a
// record has, which no release writes, for the suite (storetest.SpoilRecord).
func spoil(t *testing.T, s ratelimit.Store, id driver.RecordID) {
	t.Helper()
	require.NoError(t, s.(*boltstore.Store).DB().Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(boltstore.DefaultBucket)).Put(boltstore.RecordKey(id), []byte("spoiled"))
	}))
}

func TestNewOnCallersDB(t *testing.T) {
	ctx := context.Background()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "app.db"), 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	limits := ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute}}

	a, err := boltstore.New(db, boltstore.WithBucket("a"))
	require.NoError(t, err)
	b, err := boltstore.New(db, boltstore.WithBucket("b"))
	require.NoError(t, err)
	la, err := ratelimit.New(a, limits, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	lb, err := ratelimit.New(b, limits, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	res, err := la.Limit(ctx, "l", "k", ratelimit.Count(2))
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = lb.Limit(ctx, "l", "k", ratelimit.Count(2))
	require.NoError(t, err)
	require.True(t, res.OK, "two buckets of one database are independent")

	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "Close is idempotent")
	_, err = la.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, driver.ErrClosed)
	// The caller's database stays open.
	require.NoError(t, db.View(func(tx *bolt.Tx) error { return nil }))
	res, err = lb.Check(ctx, "l", "k")
	require.NoError(t, err)
	require.False(t, res.OK)

	_, err = boltstore.New(nil)
	require.Error(t, err)
	_, err = boltstore.New(db, boltstore.WithBucket(""))
	require.Error(t, err)
}

// New on a database the caller closed, or opened read-only, says so and
// what to do, and the closed one matches driver.ErrClosed, as a call on
// it would: it failed with bbolt's bare "database not open", or "read-only
// mode", as the failure to create a bucket.
func TestNewOnClosedOrReadOnlyDB(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	_, err = boltstore.New(db)
	require.ErrorIs(t, err, driver.ErrClosed)
	require.ErrorIs(t, err, berrors.ErrDatabaseNotOpen, "bbolt's own error is kept")
	require.ErrorContains(t, err, "pass an open one")

	db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	_, err = boltstore.New(db)
	require.ErrorIs(t, err, berrors.ErrDatabaseReadOnly)
	require.ErrorContains(t, err, "open it for writing")
}

// A file held by another process: Open waits WithTimeout for its lock,
// then says so.
const holdEnv = "BOLTSTORE_HOLD_CHILD"

func TestOpenHeldByAnotherProcess(t *testing.T) {
	if path := os.Getenv(holdEnv); path != "" {
		s, err := boltstore.Open(path)
		require.NoError(t, err)
		fmt.Println("open")
		_, _ = io.Copy(io.Discard, os.Stdin) // hold the file until the parent closes stdin
		require.NoError(t, s.Close())
		return
	}
	if testing.Short() {
		t.Skip("starts a child process")
	}
	path := filepath.Join(t.TempDir(), "limits.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenHeldByAnotherProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), holdEnv+"="+path)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	require.True(t, sc.Scan(), "the child opens the file")
	require.Equal(t, "open", sc.Text())

	_, err = boltstore.Open(path, boltstore.WithTimeout(50*time.Millisecond))
	require.ErrorIs(t, err, berrors.ErrTimeout)
	require.NotErrorIs(t, err, boltstore.ErrAlreadyOpen)
	require.ErrorContains(t, err, "another process holds the file")
	// A negative timeout tries once.
	_, err = boltstore.Open(path, boltstore.WithTimeout(-1))
	require.ErrorIs(t, err, berrors.ErrTimeout)

	require.NoError(t, stdin.Close())
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	require.NoError(t, cmd.Wait())
	open(t, path) // the failed Open left nothing behind
}

// A file this process opened with bbolt itself, not through Open: bbolt's
// lock makes Open wait out its timeout, as for another process; the error
// said that another process held the file, and pointed to a shared store,
// where the application only had to pass its DB to New.
func TestOpenHeldByThisProcessDB(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	_, err = boltstore.Open(path, boltstore.WithTimeout(-1))
	require.ErrorIs(t, err, berrors.ErrTimeout)
	require.NotErrorIs(t, err, boltstore.ErrAlreadyOpen)
	require.ErrorContains(t, err, "or this process opened it with bbolt")
	require.ErrorContains(t, err, "pass that *bbolt.DB to New")
}

// A file this process already has open: Open says so at once, however the
// path is spelled, and opens it again once the first store is closed.
func TestOpenTwiceInOneProcess(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.db")
	first, err := boltstore.Open(path)
	require.NoError(t, err)
	require.NoError(t, os.Link(path, filepath.Join(dir, "hard.db")))
	require.NoError(t, os.Symlink(path, filepath.Join(dir, "soft.db")))
	wd, err := os.Getwd()
	require.NoError(t, err)
	rel, err := filepath.Rel(wd, path)
	require.NoError(t, err)
	for _, spelling := range []string{
		path,
		dir + "/./limits.db",
		dir + "//limits.db",
		rel,
		filepath.Join(dir, "hard.db"),
		filepath.Join(dir, "soft.db"),
	} {
		// Without the registry, Open would wait out the timeout for the
		// lock and blame another process.
		_, err := boltstore.Open(spelling, boltstore.WithTimeout(time.Second))
		require.ErrorIs(t, err, boltstore.ErrAlreadyOpen, spelling)
		require.ErrorContains(t, err, "this process already has the file open (as "+path+")")
		require.ErrorContains(t, err, "share that Store")
	}
	// Another file in the same directory is not the same file.
	other := open(t, filepath.Join(dir, "other.db"))
	require.NoError(t, other.Close())

	require.NoError(t, first.Close())
	second := open(t, filepath.Join(dir, "hard.db"))
	require.NoError(t, second.Close())
	third := open(t, path)
	require.NoError(t, third.Close())

	// A failed Open leaves the file out of the registry.
	bad := filepath.Join(dir, "bad.db")
	require.NoError(t, os.WriteFile(bad, []byte("not a bbolt file, but long enough to be read as one, or nearly"), 0o600))
	_, err = boltstore.Open(bad)
	require.Error(t, err)
	require.NotErrorIs(t, err, boltstore.ErrAlreadyOpen)
	_, err = boltstore.Open(bad)
	require.NotErrorIs(t, err, boltstore.ErrAlreadyOpen)
}

// lastTx returns the id of the last committed write transaction.
func lastTx(t *testing.T, db *bolt.DB) int {
	var id int
	require.NoError(t, db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }))
	return id
}

func TestLoneCallerCommitsAtOnce(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Second}},
		ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	for i := range 3 {
		before := lastTx(t, s.DB())
		res, err := lim.Limit(ctx, "l", "k")
		require.NoError(t, err)
		require.True(t, res.OK)
		require.Equal(t, before+1, lastTx(t, s.DB()), "call %d: a lone call commits its own transaction before it returns", i)
	}
}

func TestConcurrentCallersShareTransactions(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 500, Period: time.Hour, Start: time.UnixMilli(0)}},
		ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	before := lastTx(t, s.DB())
	granted, err := storetest.Hammer(ctx, lim, "l", "hot", 64, 10)
	require.NoError(t, err)
	require.Equal(t, 500, granted, "exact under batching")
	commits := lastTx(t, s.DB()) - before
	t.Logf("640 calls, %d write transactions", commits)
	require.Less(t, commits, 640, "concurrent callers must share write transactions")
}

func TestDebtSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "limits.db")
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, MaxReserved: 100}}
	mock := newMock(t0)
	s, err := boltstore.Open(path)
	require.NoError(t, err)
	lim, err := ratelimit.New(s, limits, ratelimit.WithClock(mock))
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "jobs", "batch", ratelimit.Count(40))
	require.NoError(t, err)
	require.True(t, r.OK())
	require.Equal(t, 3*time.Minute, r.Delay())
	require.NoError(t, s.Close())

	s = open(t, path)
	lim, err = ratelimit.New(s, limits, ratelimit.WithClock(mock))
	require.NoError(t, err)
	st, err := lim.Value(ctx, "jobs", "batch")
	require.NoError(t, err)
	require.Equal(t, -30.0, st.Remaining, "the debt is in the file")
}

// Open does not keep bbolt's free-page list in the file; the file still
// opens with bbolt's defaults, through New, and back through Open.
func TestFileOpensWithBboltDefaults(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "limits.db")
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}}
	mock := newMock(t0)
	take := func(s *boltstore.Store, want float64) {
		t.Helper()
		lim, err := ratelimit.New(s, limits, ratelimit.WithClock(mock))
		require.NoError(t, err)
		res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(2))
		require.NoError(t, err)
		require.Equal(t, want, res.Remaining)
	}
	s, err := boltstore.Open(path)
	require.NoError(t, err)
	take(s, 8)
	require.NoError(t, s.Close())

	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	s, err = boltstore.New(db)
	require.NoError(t, err)
	take(s, 6)
	require.NoError(t, db.Close())

	take(open(t, path), 4)
}

// Crash safety: a child process hammers a file and prints a line for each
// grant it has been told of; it is killed mid-run. The file must open, and
// hold every grant printed and no more than those plus the ones under way.
const crashEnv = "BOLTSTORE_CRASH_CHILD"

const (
	crashGoroutines = 4
	crashCapacity   = 1e6
)

var crashLimits = ratelimit.Limits{
	"l": {Kind: ratelimit.FixedWindow, Rate: crashCapacity, Period: time.Hour, Start: time.UnixMilli(0)},
}

func TestCrashLeavesConsistentFile(t *testing.T) {
	if path := os.Getenv(crashEnv); path != "" {
		crashChild(t, path)
		return
	}
	if testing.Short() {
		t.Skip("starts child processes")
	}
	ctx := context.Background()
	for round := range 3 {
		path := filepath.Join(t.TempDir(), "crash.db")
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashLeavesConsistentFile$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnv+"="+path)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		printed := 0
		sc := bufio.NewScanner(stdout)
		killed := false
		for sc.Scan() {
			if sc.Text() != "granted" {
				continue
			}
			printed++
			if !killed && printed >= 200*(round+1) {
				require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
				killed = true // read what it printed before it died
			}
		}
		require.True(t, killed, "the child ended before it was killed")
		_ = cmd.Wait()

		s := open(t, path)
		lim, err := ratelimit.New(s, crashLimits, ratelimit.WithClock(newMock(t0)))
		require.NoError(t, err)
		st, err := lim.Value(ctx, "l", "k")
		require.NoError(t, err)
		spent := int(crashCapacity - st.Remaining)
		t.Logf("round %d: %d grants printed, %d spent in the file", round, printed, spent)
		require.GreaterOrEqual(t, spent, printed, "a grant the child was told of is missing")
		require.LessOrEqual(t, spent, printed+crashGoroutines, "the file holds grants that were never made")
	}
}

func crashChild(t *testing.T, path string) {
	s, err := boltstore.Open(path)
	require.NoError(t, err)
	lim, err := ratelimit.New(s, crashLimits, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	var wg sync.WaitGroup
	for range crashGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1_000_000 { // killed long before
				res, err := lim.Limit(context.Background(), "l", "k")
				if err != nil || !res.OK {
					panic(fmt.Sprint("child: ", err))
				}
				mu.Lock()
				out.WriteString("granted\n")
				out.Flush()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// OpenContext's wait for a file another opener holds (here a bbolt.Open
// of this process, which the lock does not tell from another process)
// ends when its context ends, however long WithTimeout would wait, with
// the context's error; the file is free to open after, and OpenContext
// opens it once the holder lets go while it waits.
func TestOpenContextWhileHeld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	defer boltstore.SetLockWait(nil)

	// Canceled while it waits: at once, and not bbolt's timeout.
	ctx, cancel := context.WithCancel(context.Background())
	boltstore.SetLockWait(cancel)
	_, err = boltstore.OpenContext(ctx, path, boltstore.WithTimeout(0))
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, berrors.ErrTimeout)
	require.ErrorContains(t, err, "boltstore: open "+path+": the context ended while another process, or a bbolt.Open of this one, held the file")

	// A deadline bounds the wait as WithTimeout does, whichever is first.
	waits := 0
	boltstore.SetLockWait(func() { waits++ })
	dctx, dcancel := context.WithTimeout(context.Background(), 120*time.Millisecond)
	defer dcancel()
	_, err = boltstore.OpenContext(dctx, path, boltstore.WithTimeout(0))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.GreaterOrEqual(t, waits, 2, "tried again while it waited")
	_, err = boltstore.OpenContext(context.Background(), path, boltstore.WithTimeout(120*time.Millisecond))
	require.ErrorIs(t, err, berrors.ErrTimeout, "WithTimeout, shorter than no deadline")
	require.ErrorContains(t, err, "or this process opened it with bbolt")
	waits = 0
	_, err = boltstore.OpenContext(context.Background(), path, boltstore.WithTimeout(-1))
	require.ErrorIs(t, err, berrors.ErrTimeout, "one try")
	require.Zero(t, waits, "one try does not wait")

	// A context that ended before is refused before the file is touched.
	_, err = boltstore.OpenContext(ctx, filepath.Join(t.TempDir(), "new.db"))
	require.ErrorIs(t, err, context.Canceled)

	// Released while it waits: opened.
	boltstore.SetLockWait(func() { require.NoError(t, db.Close()) })
	s, err := boltstore.OpenContext(context.Background(), path, boltstore.WithTimeout(0))
	require.NoError(t, err)
	boltstore.SetLockWait(nil)
	require.NoError(t, s.Close())
}

// A bucket deleted through the store's DB fails every call with an error
// that says what to do (it asked whether the bucket was deleted, and said
// nothing more); a store opened again makes the bucket again.
func TestBucketDeletedThroughDB(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "limits.db")
	s, err := boltstore.Open(path)
	require.NoError(t, err)
	require.NoError(t, s.Apply(ctx, takeOp("l", "k", 1, t0.UnixMilli()), make([]driver.Decision, 1)))
	require.NoError(t, s.DB().Update(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte(boltstore.DefaultBucket)) }))
	ids := []driver.RecordID{{Name: "l", Key: "k"}}
	_, sweepErr := s.DeleteExpired(ctx, t0)
	for name, err := range map[string]error{
		"Apply":         s.Apply(ctx, takeOp("l", "k", 1, t0.UnixMilli()), make([]driver.Decision, 1)),
		"Load":          s.Load(ctx, ids, make([]driver.Record, 1)),
		"Delete":        s.Delete(ctx, ids),
		"DeleteExpired": sweepErr,
	} {
		require.ErrorContains(t, err, `bucket "ratelimit" is missing`, name)
		require.ErrorContains(t, err, "open the store again", "%s: says what to do", name)
	}
	require.NoError(t, s.Close())
	s = open(t, path)
	require.NoError(t, s.Apply(ctx, takeOp("l", "k", 1, t0.UnixMilli()), make([]driver.Decision, 1)))
}

// A Delete that finds none of its records is rolled back rather than
// committed: it committed, and paid bbolt's two fsyncs, for nothing. One
// that finds a record among others missing commits, and the record is gone
// from the file.
func TestDeleteOfNothingDoesNotCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	s := open(t, path)
	now := t0.UnixMilli()
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctxs := []context.Context{context.Background(), cctx} // the caller's goroutine; another, left when cctx ends
	for i := range ctxs {
		require.NoError(t, s.Apply(context.Background(), takeOp("l", fmt.Sprint(i), 1, now), make([]driver.Decision, 1)))
	}
	missing := []driver.RecordID{{Name: "l", Key: "missing"}, {Name: "other", Key: "0"}}

	before := lastTx(t, s.DB())
	for _, ctx := range ctxs {
		require.NoError(t, s.Delete(ctx, missing))
		require.NoError(t, s.Delete(ctx, nil))
	}
	require.Equal(t, before, lastTx(t, s.DB()), "a Delete that deleted nothing committed")
	ended, end := context.WithCancel(context.Background())
	end()
	require.ErrorIs(t, s.Delete(ended, missing), context.Canceled)

	for i, ctx := range ctxs {
		require.NoError(t, s.Delete(ctx, append(missing, driver.RecordID{Name: "l", Key: fmt.Sprint(i)})))
		require.Equal(t, before+i+1, lastTx(t, s.DB()), "a Delete that deleted a record commits")
	}
	require.NoError(t, s.Close())
	s = open(t, path)
	for i := range ctxs {
		require.False(t, stored(t, s, "l", fmt.Sprint(i)).Found, "deleted, committed")
	}
}
