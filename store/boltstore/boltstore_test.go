package boltstore_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
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
	}, storetest.DifferentialRuns(20, 120))
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
	require.ErrorIs(t, err, ratelimit.ErrClosed)
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

func TestOpenLockedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	open(t, path)
	_, err := boltstore.Open(path, boltstore.WithTimeout(50*time.Millisecond))
	require.ErrorIs(t, err, berrors.ErrTimeout)
	require.ErrorContains(t, err, "one process at a time")
}

// lastTx returns the id of the last committed write transaction.
func lastTx(t *testing.T, db *bolt.DB) int {
	var id int
	require.NoError(t, db.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }))
	return id
}

func TestLoneCallerIsNotBatched(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	// A batch would wait ten minutes for company; a lone caller must not.
	s.DB().MaxBatchDelay = 10 * time.Minute
	s.DB().MaxBatchSize = 1 << 20
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Second}},
		ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		for range 3 {
			if _, err := lim.Limit(ctx, "l", "k"); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute): // a hang guard, far beyond any machine's speed
		t.Fatal("a lone caller waited for the batching delay")
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

func TestDeleteExpired(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	mock := newMock(t0)
	lim, err := ratelimit.New(s, ratelimit.Limits{
		"fw": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: time.UnixMilli(0)},
		"tb": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	for i := range 50 {
		_, err := lim.Limit(ctx, "fw", fmt.Sprint("user-", i), ratelimit.Count(5))
		require.NoError(t, err)
	}
	_, err = lim.Limit(ctx, "tb", "k", ratelimit.Count(10))
	require.NoError(t, err)
	// No record is full yet.
	n, err := s.DeleteExpired(ctx, mock.Now())
	require.NoError(t, err)
	require.Zero(t, n)
	// The fixed windows refill at the next window start; the bucket 60s
	// after its call.
	grace := time.Duration(ratelimit.ExpiryGrace) * time.Millisecond
	nextWindow := time.UnixMilli(t0.UnixMilli()/60_000*60_000 + 60_000)
	n, err = s.DeleteExpired(ctx, nextWindow)
	require.NoError(t, err)
	require.Zero(t, n, "full again, but not for ExpiryGrace yet")
	n, err = s.DeleteExpired(ctx, nextWindow.Add(grace))
	require.NoError(t, err)
	require.Equal(t, 50, n)
	st, err := lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.True(t, st.Shards[0].Stored)
	n, err = s.DeleteExpired(ctx, mock.Now().Add(time.Minute+grace))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st, err = lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.False(t, st.Shards[0].Stored)
	require.Equal(t, 10.0, st.Tokens)
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
	require.Equal(t, -30.0, st.Tokens, "the debt is in the file")
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
		spent := int(crashCapacity - st.Tokens)
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
