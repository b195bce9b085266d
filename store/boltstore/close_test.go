package boltstore_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/goroutines"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
)

// Close while calls are in flight, alone and in groups, with contexts
// that can end and with one that cannot: no call panics, every call after
// Close fails with driver.ErrClosed, and the file holds every grant a
// caller was told of, and no more than those and the calls whose callers
// heard their context's error.
func TestCloseWhileCallsAreInFlight(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	s, err := boltstore.Open(path)
	require.NoError(t, err)
	const capacity = 1e9
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 3_600_000, Capacity: capacity}
	var granted, undecided atomic.Int64
	started := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if g%2 == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Hour)
				}
				op := &driver.Op{Mode: driver.ModeLimit, Now: t0.UnixMilli(), Items: []driver.Item{
					{Name: "l", Key: "close", Count: 1, Shards: []driver.Shard{{Params: p}}}}}
				out := make([]driver.Decision, 1)
				err := s.Apply(ctx, op, out)
				cancel()
				switch {
				case err == nil && out[0].OK:
					if granted.Add(1) == 50 {
						once.Do(func() { close(started) })
					}
				case errors.Is(err, driver.ErrClosed):
					return
				case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
					undecided.Add(1)
				default:
					errs <- err
					return
				}
			}
		}()
	}
	<-started
	require.NoError(t, s.Close())
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a call failed otherwise than with ErrClosed: %v", err)
	}
	require.ErrorIs(t, s.Apply(context.Background(), &driver.Op{}, nil), driver.ErrClosed)

	s = open(t, path)
	out := make([]driver.Record, 1)
	require.NoError(t, s.Load(context.Background(), []driver.RecordID{{Name: "l", Key: "close"}}, out))
	require.True(t, out[0].Found)
	used := int64(capacity - out[0].State.Remaining)
	require.GreaterOrEqual(t, used, granted.Load(), "every grant a caller was told of is in the file")
	require.LessOrEqual(t, used, granted.Load()+undecided.Load())
}

// Close ends the goroutine that runs the store's transactions in the
// background: it lived on, parked, for as long as the closed store was
// reachable, which a check for leaked goroutines after Close reports.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	others := goroutines.Running(goroutines.CoalesceWorker)
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, ctx := range []context.Context{ctx, context.Background()} {
		require.NoError(t, s.Apply(ctx, takeOp("l", "k", 1, t0.UnixMilli()), make([]driver.Decision, 1)))
		_, err := s.DeleteExpired(ctx, t0)
		require.NoError(t, err)
	}
	var mine []string
	for _, g := range goroutines.Running(goroutines.CoalesceWorker) {
		if !slices.Contains(others, g) {
			mine = append(mine, g)
		}
	}
	require.Len(t, mine, 1, "the store runs a worker")
	require.NoError(t, s.Close())
	require.Eventually(t, func() bool { return !slices.Contains(goroutines.Running(goroutines.CoalesceWorker), mine[0]) }, 10*time.Second, time.Millisecond,
		"the store's worker outlives Close")
	// A call after Close starts none again.
	err := s.Apply(ctx, takeOp("l", "k", 1, t0.UnixMilli()), make([]driver.Decision, 1))
	require.ErrorIs(t, err, driver.ErrClosed)
	require.ErrorContains(t, err, "make calls before Close", "says what to do")
	runtime.KeepAlive(s)
}
