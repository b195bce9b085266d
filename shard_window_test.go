package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// docs/sharding.md: a sharded fixed window whose shards share Start, and
// whose shares of Rate and Capacity are whole multiples of the count,
// schedules at most Capacity tokens of jobs into a window. Here two
// Limiters on one store reserve (a count that divides a shard's share),
// make plain calls, cancel reservations (their own, and by token from the
// other Limiter, at once or after the job's time) and let the clock run;
// every window's plain grants and jobs not canceled stay within Rate.
//
// Counts of several sizes are not covered by that bound, sharded or not:
// a reservation that takes a shard's last tokens of a window and owes the
// rest runs in the next one, whose whole grant is reserved too. Each
// shard schedules at most one such job into a window, so the window
// holds at most Rate plus, for each shard (one, unsharded), the largest
// count less one (the least a job takes from the window before, counts
// being whole).
func TestShardedWindowsStayWithinTheLimitUnderCancels(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		shards      int
		maxReserved float64
		counts      []float64
	}{
		{2, 50, []float64{1}},
		{2, 50, []float64{5}},
		{4, 200, []float64{1}},
		{5, 100, []float64{4}},
		{5, 400, []float64{20}},
		{0, 50, []float64{1, 2, 5}},
		{2, 50, []float64{1, 2, 5}},
		{4, 200, []float64{1, 5}},
		{5, 400, []float64{1, 4, 20}},
	} {
		t.Run(fmt.Sprintf("shards=%d/maxReserved=%v/counts=%v", tc.shards, tc.maxReserved, tc.counts), func(t *testing.T) {
			t.Parallel() // each moves a mock of its own, which sleeps a millisecond a move
			cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Second, MaxReserved: tc.maxReserved, Shards: tc.shards, Start: t0}
			store := must(memstore.New())
			mock := newMock()
			rng := rand.New(rand.NewPCG(uint64(tc.shards), uint64(tc.maxReserved)))
			lims := []*ratelimit.Limiter{
				must(ratelimit.New(store, ratelimit.Limits{"x": cfg}, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(1, uint64(tc.shards))))),
				must(ratelimit.New(store, ratelimit.Limits{"x": cfg}, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(2, uint64(tc.shards))))),
			}
			type job struct {
				r     *ratelimit.Reservation
				count float64
			}
			var jobs []job
			plain := map[int64]float64{} // window → tokens of plain calls
			for i := range 4000 {
				if i%4 == 0 { // the mock sleeps a millisecond at each move
					mock.Add(time.Duration(rng.IntN(50)) * time.Millisecond)
				}
				lim := lims[rng.IntN(2)]
				count := tc.counts[rng.IntN(len(tc.counts))]
				switch x := rng.IntN(10); {
				case x < 2:
					res, err := lim.Limit(ctx, "x", "k", ratelimit.Count(count))
					require.NoError(t, err)
					if res.OK {
						plain[mock.Now().Sub(t0).Milliseconds()/1000] += count
					}
				case x < 8:
					r, err := lim.Reserve(ctx, "x", "k", ratelimit.Count(count))
					require.NoError(t, err)
					if r.OK() {
						jobs = append(jobs, job{r, count})
					}
				case len(jobs) > 0:
					j := jobs[rng.IntN(len(jobs))]
					if rng.IntN(2) == 0 {
						_ = j.r.Cancel(ctx)
					} else if tok := j.r.Token(); tok != nil {
						_ = lims[rng.IntN(2)].Refund(ctx, tok)
					}
				}
			}
			used := map[int64]float64{}
			for w, n := range plain {
				used[w] += n
			}
			for _, j := range jobs {
				// A job runs unless its reservation was canceled, by its
				// own Cancel or a holder's Refund: its token's Use says.
				err := lims[0].Use(ctx, j.r.Token())
				if err == nil {
					used[j.r.Time().Sub(t0).Milliseconds()/1000] += j.count
				} else {
					require.ErrorIs(t, err, ratelimit.ErrReservationCanceled)
				}
			}
			bound := 100.0
			for _, c := range tc.counts {
				bound = max(bound, 100+float64(max(tc.shards, 1))*(c-1))
			}
			if len(tc.counts) == 1 {
				bound = 100
			}
			for w, n := range used {
				require.LessOrEqual(t, n, bound, "window %d: %v tokens: %v of plain calls", w, n, plain[w])
			}
		})
	}
}
