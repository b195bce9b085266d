package boltstore_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// Calls on one key whose contexts end at random points, sweeps among them,
// and Close in their midst: no call fails but with its context's error or
// ErrClosed, none is granted beyond the window's quota, and the file,
// opened again, holds a record charged at least for every grant its
// callers heard of (a call whose context ended may have been charged
// unheard, as the package doc says).
func TestCancelAndCloseStorm(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	s := open(t, path)
	const quota = 200
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: quota, Period: 3_600_000, Capacity: quota}
	now := t0.UnixMilli() / 3_600_000 * 3_600_000
	var granted, closed atomic.Int64
	var closeOnce sync.Once
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 100 {
				ctx, cancel := context.WithCancel(context.Background())
				cancelSoon(rng, cancel)
				out := make([]driver.Decision, 1)
				op := &driver.Op{Now: now, Items: []driver.Item{{Name: "l", Key: "k", Count: 1, Shards: []driver.Shard{{Params: p}}}}}
				switch err := s.Apply(ctx, op, out); {
				case err == nil:
					if out[0].OK && granted.Add(1) == quota/4 {
						closeOnce.Do(func() { s.Close() })
					}
				case errors.Is(err, driver.ErrClosed):
					closed.Add(1)
				case !errors.Is(err, context.Canceled):
					t.Errorf("Apply: %v", err)
				}
				if rng.IntN(10) == 0 {
					_, err := s.DeleteExpired(ctx, time.UnixMilli(now))
					if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, driver.ErrClosed) {
						t.Errorf("DeleteExpired: %v", err)
					}
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	out := make([]driver.Decision, 1)
	op := &driver.Op{Now: now, Items: []driver.Item{{Name: "l", Key: "k", Count: 1, Shards: []driver.Shard{{Params: p}}}}}
	require.ErrorIs(t, s.Apply(context.Background(), op, out), driver.ErrClosed)
	t.Logf("granted %d, refused as closed %d", granted.Load(), closed.Load())
	s = open(t, path)
	rec := stored(t, s, "l", "k")
	require.True(t, rec.Found)
	require.LessOrEqual(t, granted.Load(), int64(quota))
	require.GreaterOrEqual(t, rec.State.Remaining, 0.0)
	require.LessOrEqual(t, float64(granted.Load()), quota-rec.State.Remaining, "grants heard of but not charged")
}

// cancelSoon cancels, for one call in two drawn from rng, a call's context
// after up to 50 yields of a goroutine of its own: while it is queued,
// decided or written, or after it returned.
func cancelSoon(rng *rand.Rand, cancel context.CancelFunc) {
	if rng.IntN(2) == 0 {
		n := rng.IntN(50)
		go func() {
			for range n {
				runtime.Gosched()
			}
			cancel()
		}()
	}
}
