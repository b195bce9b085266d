package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

// ReservationRaces runs every way of letting a reservation's job run or
// handing its tokens back, called at once from many goroutines and from a
// second Limiter on store: Wait (some with a context canceled at a random
// moment), AfterFunc and its stop, Cancel, Token, and the second Limiter's
// Use and Refund of the token. Whatever the interleaving, the job runs at
// most once (a use whose answer was lost, the tokens spent, runs at the
// next Wait); if it ran, no Cancel, Wait or Refund said the tokens were
// back, and the record keeps the charge; if it did not, a last Cancel
// hands the tokens back, exactly once. Run it with -race. It takes a few
// seconds on an in-process store; it is for a store's own tests, beside
// Run, as the root package's tests run it on memstore and boltstore's on
// bbolt, whose concurrent writers share a transaction.
func ReservationRaces(t *testing.T, store ratelimit.Store) {
	t.Helper()
	ctx := context.Background()
	const trials = 150
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour, Start: epoch}
	// The real clock: the mock's AfterFunc may not be called while
	// another goroutine moves the mock (it sets the timer's function
	// after registering it, unlocked), and here stop must race with the
	// job's time. Nothing waits on it: every job's time is now, and the
	// window is an hour long.
	lim := mustNew(ratelimit.New(store, ratelimit.Limits{"jobs": cfg}))
	other := mustNew(ratelimit.New(store, ratelimit.Limits{"jobs": cfg}))
	rng := rand.New(rand.NewPCG(7, 11))
	const count = 3
	for trial := range trials {
		key := fmt.Sprintf("race-%d", trial)
		opts := []ratelimit.CallOption{ratelimit.Count(count)}
		receipt := rng.IntN(2) == 0
		if receipt {
			opts = append(opts, ratelimit.WithReceipt())
		}
		r, err := lim.Reserve(ctx, "jobs", key, opts...)
		require.NoError(t, err)
		require.True(t, r.OK())

		var (
			wg, jobs                    sync.WaitGroup
			ran, waitsOK, uses          atomic.Int32
			cancelsOK, stopsOK, refunds atomic.Int32
			mu                          sync.Mutex
			tokens                      []*ratelimit.Token
		)
		start := make(chan struct{})
		goes := func(f func()) {
			wg.Add(1)
			go func() { defer wg.Done(); <-start; f() }()
		}
		takeToken := func() *ratelimit.Token {
			tok := r.Token()
			mu.Lock()
			tokens = append(tokens, tok)
			mu.Unlock()
			return tok
		}
		if receipt {
			takeToken()
		}
		for range 2 {
			cancelAt := rng.IntN(3)
			goes(func() {
				wctx, cancel := context.WithCancel(ctx)
				defer cancel()
				switch cancelAt {
				case 0:
					cancel()
				case 1:
					go cancel()
				}
				if err := r.Wait(wctx); err == nil {
					waitsOK.Add(1)
					ran.Add(1)
				} else if strings.Contains(err.Error(), "its tokens were handed back") {
					// Gave up, and its refund handed the tokens back.
					cancelsOK.Add(1)
				}
			})
		}
		for range 2 {
			stopIt := rng.IntN(2) == 0
			goes(func() {
				jobs.Add(1)
				stop, err := r.AfterFunc(func() { ran.Add(1); jobs.Done() },
					ratelimit.OnDropped(func(error) { jobs.Done() }))
				if err != nil {
					jobs.Done()
					return
				}
				if stopIt && stop(ctx) {
					stopsOK.Add(1)
					jobs.Done()
				}
			})
		}
		for range 2 {
			goes(func() {
				if r.Cancel(ctx) == nil {
					cancelsOK.Add(1)
				}
			})
		}
		goes(func() {
			tok := takeToken()
			if tok == nil {
				return
			}
			if rng := rand.New(rand.NewPCG(uint64(trial), 1)); rng.IntN(2) == 0 {
				if other.Use(ctx, tok) == nil {
					uses.Add(1)
					ran.Add(1)
				}
			} else if other.Refund(ctx, tok) == nil {
				refunds.Add(1)
			}
		})
		close(start)
		wg.Wait()
		jobs.Wait() // each AfterFunc ran its job, was stopped, or dropped it
		final := r.Cancel(ctx)
		if ran.Load() == 0 && errors.Is(final, ratelimit.ErrReservationUsed) {
			// A Wait's use reached the store as its context ended, and
			// the answer was lost (a store may answer a call whose
			// context ends as it commits with the context's error): the
			// tokens are spent, and a Wait runs the job.
			require.NoError(t, r.Wait(ctx), "trial %d: the reservation's own use, its answer lost: a Wait lets the job run", trial)
			ran.Add(1)
		}
		st, err := lim.Value(ctx, "jobs", key)
		require.NoError(t, err)
		// A stop that reported true stopped the function; its refund may
		// have found the token used by its holder, and is not counted.
		backs := cancelsOK.Load() + refunds.Load()
		why := fmt.Sprintf("trial %d (receipt %v): ran %d (waits %d, holder's uses %d), cancels or give-ups %d, stops %d, holder's refunds %d, last Cancel %v, remaining %v",
			trial, receipt, ran.Load(), waitsOK.Load(), uses.Load(), cancelsOK.Load(), stopsOK.Load(), refunds.Load(), final, st.Remaining)
		require.LessOrEqual(t, ran.Load(), int32(1), why)
		if ran.Load() == 1 {
			require.Zero(t, backs, why)
			require.Equal(t, 10.0-count, st.Remaining, why)
			require.ErrorIs(t, final, ratelimit.ErrReservationUsed, why)
		} else {
			require.Equal(t, 10.0, st.Remaining, why)
			require.Zero(t, uses.Load(), why)
		}
		require.LessOrEqual(t, refunds.Load(), int32(1), why)
	}
}

// ShardedReservationsAtOnce makes sharded reservations at once from many
// goroutines of two Limiters on store, while the clock runs and
// reservations are canceled by their own Cancel or by the other Limiter's
// Refund of their token: they never schedule more than the limit into a
// window, 100 a second over 4 shards sharing Start, jobs of one token
// (docs/sharding.md). Every token is then used or found canceled once.
func ShardedReservationsAtOnce(t *testing.T, store ratelimit.Store) {
	t.Helper()
	ctx := context.Background()
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Second, MaxReserved: 100, Shards: 4, Start: epoch}
	mock := newMock(epoch)
	lims := []*ratelimit.Limiter{
		mustNew(ratelimit.New(store, ratelimit.Limits{"x": cfg}, ratelimit.WithClock(mock))),
		mustNew(ratelimit.New(store, ratelimit.Limits{"x": cfg}, ratelimit.WithClock(mock))),
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
			used[r.Time().Sub(epoch).Milliseconds()/1000]++
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

// mustNew returns the Limiter New made, and panics on its error.
func mustNew(lim *ratelimit.Limiter, err error) *ratelimit.Limiter {
	if err != nil {
		panic(err)
	}
	return lim
}
