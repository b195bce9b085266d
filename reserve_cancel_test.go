package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A cancel of a reservation that later ones stand behind gives back
// nothing: they keep their times, so that its tokens handed back would
// be reserved again at the tail's time, two jobs in one window of one.
// At 1 a second: A, B and C run at 0 s, 1 s and 2 s; B is canceled; D
// used to be given 2 s too (the record's debt moved back under C), and
// the 1 s window ran nothing. A cancel of the tail (C) gives its slot
// back: D takes 2 s.
func TestCancelKeepsLaterReservationsSlots(t *testing.T) {
	for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
		t.Run(kind.String(), func(t *testing.T) {
			ctx := context.Background()
			cfg := ratelimit.Config{Kind: kind, Rate: 1, Period: time.Second, Capacity: 1, MaxReserved: 10}
			if kind == ratelimit.FixedWindow {
				cfg.Start = t0
			}
			for _, tc := range []struct {
				cancel int           // which of A, B, C
				want   time.Duration // D's time
			}{{cancel: 1, want: 3 * time.Second}, {cancel: 2, want: 2 * time.Second}} {
				lim, mock := newReserveLimiter(t, cfg)
				var rs []*ratelimit.Reservation
				for i := range 3 {
					r, err := lim.Reserve(ctx, "jobs", "k")
					require.NoError(t, err)
					require.True(t, r.OK())
					require.Equal(t, t0.Add(time.Duration(i)*time.Second), r.Time())
					rs = append(rs, r)
				}
				require.NoError(t, rs[tc.cancel].Cancel(ctx))
				d, err := lim.Reserve(ctx, "jobs", "k")
				require.NoError(t, err)
				require.True(t, d.OK())
				assert.Equal(t, t0.Add(tc.want), d.Time(), "D after a cancel of %c", 'A'+tc.cancel)
				require.Equal(t, t0, mock.Now())
			}
		})
	}
}

// A cancel at once of a reservation that nothing stood behind gives all
// of it back, at any rate: the time at which the record's debt is paid is
// computed from the record as the reservation left it, as its own time
// was, so that float noise cannot put it a millisecond later.
func TestCancelAtOnceGivesEverythingBack(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range 200 {
		kind := ratelimit.TokenBucket
		if i%4 == 0 {
			kind = ratelimit.FixedWindow
		}
		cfg := ratelimit.Config{Kind: kind, Rate: float64(1 + rng.IntN(997)), Period: time.Duration(1+rng.IntN(7919)) * time.Millisecond}
		cfg.Capacity = cfg.Rate * (0.1 + rng.Float64())
		if kind == ratelimit.FixedWindow {
			cfg.Start = t0
		}
		lim, mock := newReserveLimiter(t, cfg)
		mock.Add(time.Duration(rng.IntN(10_000)) * time.Millisecond)
		for range 1 + rng.IntN(5) {
			r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(cfg.Rate*rng.Float64()*3))
			require.NoError(t, err)
			require.True(t, r.OK())
			mock.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
		count := cfg.Rate * rng.Float64() * 2
		before, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(count))
		require.NoError(t, err)
		require.True(t, r.OK())
		require.NoError(t, r.Cancel(ctx))
		after, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		require.InDelta(t, before.Remaining, after.Remaining, 1e-9*cfg.Rate, "config %+v, count %v", cfg, count)
	}
}

// Reservations and cancels at random never schedule more jobs in a window
// than the limit grants in one: whole counts, a whole Rate and Capacity
// equal to it, so that at most Rate jobs of one token each run in any
// window (for a token bucket, at most Capacity plus the refill over any
// span between two jobs' times), whichever reservations were canceled,
// before or after their time.
func TestCancelsNeverCrowdAWindow(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		kind   ratelimit.Kind
		rate   float64
		shards int
	}{
		{ratelimit.FixedWindow, 1, 1}, {ratelimit.FixedWindow, 3, 1}, {ratelimit.FixedWindow, 4, 2},
		{ratelimit.TokenBucket, 1, 1}, {ratelimit.TokenBucket, 3, 1}, {ratelimit.TokenBucket, 4, 2},
	} {
		for seed := range uint64(6) {
			t.Run(fmt.Sprintf("%v/rate %v/shards %d/seed %d", tc.kind, tc.rate, tc.shards, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 3))
				mock := newMock()
				period := time.Second
				cfg := ratelimit.Config{Kind: tc.kind, Rate: tc.rate, Period: period, Capacity: tc.rate,
					MaxReserved: 20 * tc.rate, Shards: tc.shards}
				if tc.kind == ratelimit.FixedWindow {
					cfg.Start = t0
				}
				lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"jobs": cfg},
					ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(seed, 5)))
				require.NoError(t, err)
				var live []*ratelimit.Reservation
				for range 200 {
					switch x := rng.IntN(10); {
					case x < 2:
						mock.Add(time.Duration(rng.IntN(int(period/time.Millisecond))) * time.Millisecond / 4)
					case x < 7:
						r, err := lim.Reserve(ctx, "jobs", "k")
						require.NoError(t, err)
						if r.OK() {
							live = append(live, r)
						}
					case len(live) > 0:
						// Mostly one of the last made, whose job is still
						// to come, and which later ones may stand behind.
						i := rng.IntN(len(live))
						if rng.IntN(4) > 0 {
							i = max(len(live)-1-rng.IntN(4), 0)
						}
						require.NoError(t, live[i].Cancel(ctx))
						live = append(live[:i], live[i+1:]...)
					}
				}
				runs := make([]time.Time, len(live))
				for i, r := range live {
					runs[i] = r.Time()
				}
				sort.Slice(runs, func(i, j int) bool { return runs[i].Before(runs[j]) })
				if tc.kind == ratelimit.FixedWindow {
					per := map[time.Time]int{}
					for _, at := range runs {
						w := t0.Add(at.Sub(t0).Truncate(period))
						per[w]++
						require.LessOrEqual(t, per[w], int(tc.rate), "jobs in the window of %v", w.Sub(t0))
					}
					return
				}
				// A token bucket: the jobs from the i-th to the j-th took
				// j-i+1 tokens, at most Capacity plus what the refill
				// granted between their times (each rounded up to the
				// millisecond: one more).
				for i := range runs {
					for j := i + 1; j < len(runs); j++ {
						span := runs[j].Sub(runs[i]) + time.Millisecond
						allowed := tc.rate + tc.rate*float64(span)/float64(period)
						require.LessOrEqual(t, float64(j-i+1), allowed+1e-9,
							"jobs from %v to %v", runs[i].Sub(t0), runs[j].Sub(t0))
					}
				}
			})
		}
	}
}

// On a store that keeps its own clock, a reservation's token carries its
// job's time on that clock, as it carries its charge's: the refund judges
// the record's debt against it. The token used to carry the time on the
// Limiter's clock, here 5 s ahead of the store's, so that B, canceled,
// seemed to run after the tail (C at 2 s on the store's clock) and gave
// its token back: D then took 2 s too.
func TestCancelOnAStoreClockKeepsLaterSlots(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := &clockStore{Store: must(memstore.New()), own: true, now: t0.Add(-5 * time.Second)}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 1, MaxReserved: 10},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	var rs []*ratelimit.Reservation
	for range 3 {
		r, err := lim.Reserve(ctx, "jobs", "k")
		require.NoError(t, err)
		require.True(t, r.OK())
		rs = append(rs, r)
	}
	tok := rs[1].Token()
	require.Equal(t, store.now.Add(time.Second).UnixMilli(), tok.RunAt().UnixMilli(), "B's job time, on the store's clock")
	require.NoError(t, rs[1].Cancel(ctx))
	d, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	require.True(t, d.OK())
	assert.Equal(t, 3*time.Second, d.Delay(), "D after C, not beside it")
}
