package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// Sharded reservations made at once by many goroutines of two Limiters on
// one store, while the clock runs and reservations are canceled by their
// own Cancel or by the other Limiter's Refund of their token, never
// schedule more than the limit into a window: 100 a second over 4 shards
// sharing Start, jobs of one token (docs/sharding.md). Every token is then
// used or found canceled once. store/boltstore runs the same on bbolt.
func TestShardedReservationsAtOnceKeepEveryWindow(t *testing.T) {
	testShardedReservationsAtOnce(t, must(memstore.New()))
}

func testShardedReservationsAtOnce(t *testing.T, store ratelimit.Store) {
	ctx := context.Background()
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Second, MaxReserved: 100, Shards: 4, Start: t0}
	mock := newMock()
	lims := []*ratelimit.Limiter{
		must(ratelimit.New(store, ratelimit.Limits{"x": cfg}, ratelimit.WithClock(mock))),
		must(ratelimit.New(store, ratelimit.Limits{"x": cfg}, ratelimit.WithClock(mock))),
	}
	var (
		mu      sync.Mutex
		jobs    []*ratelimit.Reservation
		clockMu sync.Mutex // the mock moves one step at a time
		wg      sync.WaitGroup
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			lim := lims[w%2]
			var mine []*ratelimit.Reservation
			for range 400 {
				if rng.IntN(8) == 0 {
					clockMu.Lock()
					mock.Add(time.Duration(rng.IntN(30)) * time.Millisecond)
					clockMu.Unlock()
				}
				if len(mine) > 0 && rng.IntN(5) == 0 {
					r := mine[rng.IntN(len(mine))]
					if rng.IntN(2) == 0 {
						_ = r.Cancel(ctx)
					} else {
						_ = lims[1-w%2].Refund(ctx, r.Token())
					}
					continue
				}
				r, err := lim.Reserve(ctx, "x", "k", ratelimit.WithReceipt())
				if err != nil {
					t.Error(err)
					return
				}
				if r.OK() {
					mine = append(mine, r)
				}
			}
			mu.Lock()
			jobs = append(jobs, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	used := map[int64]int{}
	ran := 0
	for _, r := range jobs {
		err := lims[0].Use(ctx, r.Token())
		if err == nil {
			used[r.Time().Sub(t0).Milliseconds()/1000]++
			ran++
			continue
		}
		require.ErrorIs(t, err, ratelimit.ErrReservationCanceled)
	}
	require.NotZero(t, ran)
	for w, n := range used {
		require.LessOrEqual(t, n, 100, fmt.Sprintf("window %d: %d jobs of %d reservations", w, n, len(jobs)))
	}
}
