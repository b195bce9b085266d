package ratelimit_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// grant is a call granted at ms, of count tokens.
type grant struct {
	ms    int64
	count float64
}

// boundSlack is the float noise a run of grants may add to a bound: a
// call is granted when the tokens fall short of it by less than the noise.
func boundSlack(grants int) float64 { return 1e-6 + float64(grants)*2e-9 }

// A sharded limit never grants more than its bound, whatever the counts,
// the gaps between calls and the shards drawn: a fixed window whose shards
// share Start grants at most Capacity in each window; one whose shards
// each have a phase of their own at most Capacity plus min(Rate,
// Capacity) in any Period (as an unsharded limit does across its window's
// start), and at most Capacity plus Rate for each window start within a
// longer span; a token bucket at most Capacity plus the refill of any
// span, Rate·span/Period. Counts go up to two shards' share of Capacity,
// so that many calls need both shards; rates and capacities include
// fractions that the shards' shares do not hold exactly.
func TestShardedGrantsNeverExceedTheBound(t *testing.T) {
	type variant struct {
		name  string
		kind  ratelimit.Kind
		start bool
	}
	for _, v := range []variant{
		{"fixed window, shared start", ratelimit.FixedWindow, true},
		{"fixed window, own phases", ratelimit.FixedWindow, false},
		{"token bucket", ratelimit.TokenBucket, false},
	} {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(41, uint64(len(v.name))))
			for i := range 100 {
				shards := 2 + rng.IntN(7)
				period := []int64{10, 1000, 60_000}[rng.IntN(3)]
				rate := []float64{100, 37, 10.5, 7, 1000.0 / 3, 2.2}[rng.IntN(6)]
				capacity := rate * []float64{1, 1, 0.5, 2, 1.7}[rng.IntN(5)]
				cfg := ratelimit.Config{Kind: v.kind, Rate: rate, Capacity: capacity,
					Period: time.Duration(period) * time.Millisecond, Shards: shards}
				if v.start {
					cfg.Start = t0
				}
				mock := &stepClock{Mock: clock.NewMock(), now: t0.Add(time.Duration(rng.Int64N(period)) * time.Millisecond)}
				lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": cfg},
					ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(uint64(i), 3)))
				require.NoError(t, err, "case %d: %+v", i, cfg)
				reach := 2 * capacity / float64(shards)
				var got []grant
				for range 3000 {
					// Mostly bursts within a window, now and then a gap.
					if rng.IntN(8) == 0 {
						mock.add(time.Duration(rng.Int64N(period)) * time.Millisecond)
					} else if rng.IntN(4) == 0 {
						mock.add(time.Duration(rng.Int64N(max(period/50, 2))) * time.Millisecond)
					}
					var c float64
					switch rng.IntN(4) {
					case 0:
						c = math.Min(1, reach)
					case 1:
						c = math.Min(float64(1+rng.IntN(int(math.Max(reach, 1)))), reach)
					case 2:
						c = reach * rng.Float64()
					default:
						c = reach * (0.5 + rng.Float64()/2) // more than one shard's share, often
					}
					res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(c))
					require.NoError(t, err, "case %d: %+v count %v", i, cfg, c)
					if res.OK {
						got = append(got, grant{mock.Now().UnixMilli(), c})
					}
				}
				where := fmt.Sprintf("case %d: %+v", i, cfg)
				checkBound(t, where, v.kind, v.start, t0.UnixMilli(), period, rate, capacity, got)
			}
		})
	}
}

// checkBound checks the grants (in time order) against the bound of the
// limit (TestShardedGrantsNeverExceedTheBound).
func checkBound(t *testing.T, where string, kind ratelimit.Kind, start bool, startMs, period int64, rate, capacity float64, got []grant) {
	t.Helper()
	checkBoundWithin(t, where, kind, start, startMs, period, rate, capacity, 0, got)
}

// checkBoundWithin is checkBound with extra tokens allowed in every span.
func checkBoundWithin(t *testing.T, where string, kind ratelimit.Kind, start bool, startMs, period int64, rate, capacity, extra float64, got []grant) {
	t.Helper()
	sort.SliceStable(got, func(i, j int) bool { return got[i].ms < got[j].ms })
	sum := make([]float64, len(got)+1) // sum[j]: grants before got[j]
	for j, g := range got {
		sum[j+1] = sum[j] + g.count
	}
	// upto returns the index of the first grant at or after ms.
	upto := func(ms int64) int {
		return sort.Search(len(got), func(j int) bool { return got[j].ms >= ms })
	}
	for i, g := range got {
		switch {
		case kind == ratelimit.FixedWindow && start:
			ws := startMs + (g.ms-startMs)/period*period // calls are all after startMs
			if i > 0 && got[i-1].ms >= ws {
				continue // checked from the window's first grant
			}
			j := upto(ws + period)
			total := sum[j] - sum[i]
			if total > capacity+extra+boundSlack(j-i) {
				t.Fatalf("%s: the window from %d granted %v", where, ws, total)
			}
		case kind == ratelimit.FixedWindow:
			for k := int64(1); k <= 4; k++ {
				j := upto(g.ms + k*period)
				total := sum[j] - sum[i]
				bound := capacity + math.Min(rate, capacity) + float64(k-1)*rate
				if total > bound+extra+boundSlack(j-i) {
					t.Fatalf("%s: %d periods from %d granted %v, above %v", where, k, g.ms, total, bound)
				}
			}
		default:
			// Any span [g.ms, e]: at most capacity plus the refill.
			for j := i; j < len(got); j++ {
				total := sum[j+1] - sum[i]
				bound := capacity + rate*float64(got[j].ms-g.ms)/float64(period)
				if total > bound+extra+boundSlack(j+1-i) {
					t.Fatalf("%s: %d ms from %d granted %v, above %v", where, got[j].ms-g.ms, g.ms, total, bound)
				}
				if got[j].ms-g.ms > 3*period {
					break
				}
			}
		}
	}
}

// Reservations on a sharded limit never owe more than MaxReserved, nor
// any shard more than its share, whatever the counts (up to two shards'
// Capacity plus MaxReserved) and the gaps between calls; and, on a fixed
// window whose shards share Start and hold whole tokens, no window serves
// more than Capacity in plain calls of one token and jobs of one token
// that run in it. Plain calls, and in some runs cancels, are mixed in.
func TestShardedReservationsStayWithinMaxReserved(t *testing.T) {
	for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
		t.Run(kind.String(), func(t *testing.T) {
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(43, uint64(kind)))
			for i := range 25 {
				shards := []int{2, 4, 5}[rng.IntN(3)]
				n := float64(shards)
				rate := n * float64(1+rng.IntN(20))
				maxReserved := n * float64(1+rng.IntN(30))
				cfg := ratelimit.Config{Kind: kind, Rate: rate, Period: time.Second, MaxReserved: maxReserved, Shards: shards}
				unit := rng.IntN(2) == 0 // jobs of one token only
				// A cancel does not move the jobs reserved after it, sharded
				// or not: a window may then run more jobs than Rate
				// (docs/reservations.md). Runs that count jobs cancel none.
				cancels := rng.IntN(2) == 0
				if kind == ratelimit.FixedWindow && rng.IntN(2) == 0 {
					cfg.Start = t0
				}
				mock := &stepClock{Mock: clock.NewMock(), now: t0.Add(time.Duration(rng.Int64N(1000)) * time.Millisecond)}
				lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": cfg},
					ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(uint64(i), 7)))
				require.NoError(t, err)
				where := fmt.Sprintf("case %d: %+v", i, cfg)
				jobs := map[int64]float64{} // tokens of plain calls and jobs by the window they run in
				var live []*ratelimit.Reservation
				for range 1500 {
					if rng.IntN(6) == 0 {
						mock.add(time.Duration(rng.Int64N(300)) * time.Millisecond)
					}
					c := 1.0
					if !unit {
						c = math.Min(float64(1+rng.IntN(int(2*(rate+maxReserved)/n))), 2*(rate+maxReserved)/n)
					}
					op := rng.IntN(8)
					if op == 1 && !cancels {
						op = 0
					}
					switch op {
					case 0:
						res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(math.Min(c, 2*rate/n)))
						if err != nil {
							t.Fatalf("%s: %v", where, err)
						}
						if res.OK {
							jobs[mock.Now().Sub(t0).Milliseconds()/1000] += res.Count
						}
					case 1:
						if len(live) > 0 {
							j := rng.IntN(len(live))
							r := live[j]
							live = append(live[:j], live[j+1:]...)
							if r.Delay() > 0 {
								require.NoError(t, r.Cancel(ctx))
								jobs[r.Time().Sub(t0).Milliseconds()/1000] -= r.Result().Count
							}
						}
					default:
						r, err := lim.Reserve(ctx, "l", "k", ratelimit.Count(c))
						if err != nil {
							t.Fatalf("%s: reserve %v: %v", where, c, err)
						}
						if r.OK() {
							jobs[r.Time().Sub(t0).Milliseconds()/1000] += c
							live = append(live, r)
						}
					}
					st, err := lim.Value(ctx, "l", "k")
					require.NoError(t, err)
					if st.Remaining < -maxReserved-1e-6 {
						t.Fatalf("%s: owes %v, beyond MaxReserved", where, -st.Remaining)
					}
					for _, sh := range st.Shards {
						if sh.Remaining < -maxReserved/n-1e-6 {
							t.Fatalf("%s: shard %d owes %v, beyond its share of MaxReserved", where, sh.Index, -sh.Remaining)
						}
					}
				}
				if kind == ratelimit.FixedWindow && !cfg.Start.IsZero() && unit && !cancels {
					for w, tokens := range jobs {
						if tokens > rate+1e-6 {
							t.Fatalf("%s: window %d serves %v tokens", where, w, tokens)
						}
					}
				}
			}
		})
	}
}

// RetryAfter of a refused sharded call is the least wait for the two
// shards it drew; a retry draws two again. Where every pair is alike at
// that time, the retry succeeds when nothing else was spent meanwhile: a
// limit of two shards (there is one pair), and a fixed window whose shards
// share Start and hold a whole Rate each (every shard is full again at
// each window). Elsewhere the shards drawn by the retry may hold less, and
// it may be refused again (docs/sharding.md); the test logs how often.
func TestShardedRetryAfterWithShardsDrawnAgain(t *testing.T) {
	type variant struct {
		name   string
		kind   ratelimit.Kind
		start  bool
		shards int
		always bool // a retry at RetryAfter always succeeds
	}
	var vs []variant
	for _, shards := range []int{2, 4, 8} {
		vs = append(vs,
			variant{"fixed window, shared start", ratelimit.FixedWindow, true, shards, true},
			variant{"fixed window, own phases", ratelimit.FixedWindow, false, shards, shards == 2},
			variant{"token bucket", ratelimit.TokenBucket, false, shards, shards == 2})
	}
	ctx := context.Background()
	for _, v := range vs {
		t.Run(fmt.Sprintf("%s/shards=%d", v.name, v.shards), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(47, uint64(v.shards)))
			refused, again := 0, 0
			for i := range 300 {
				cfg := ratelimit.Config{Kind: v.kind, Rate: 100, Period: time.Second, Shards: v.shards}
				if v.start {
					cfg.Start = t0
				}
				mock := &stepClock{Mock: clock.NewMock(), now: t0.Add(time.Duration(rng.Int64N(1000)) * time.Millisecond)}
				lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": cfg},
					ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(uint64(i), 9)))
				require.NoError(t, err)
				reach := 200 / float64(v.shards)
				count := func() float64 { return math.Ceil(reach * rng.Float64()) }
				for range 100 + rng.IntN(200) {
					if rng.IntN(10) == 0 {
						mock.add(time.Duration(rng.Int64N(100)) * time.Millisecond)
					}
					_, err := lim.Limit(ctx, "l", "k", ratelimit.Count(count()))
					require.NoError(t, err)
				}
				c := count()
				res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(c))
				require.NoError(t, err)
				if res.OK {
					continue
				}
				refused++
				require.Positive(t, res.RetryAfter, "case %d: count %v refused", i, c)
				mock.add(res.RetryAfter)
				again2, err := lim.Limit(ctx, "l", "k", ratelimit.Count(c))
				require.NoError(t, err)
				if !again2.OK {
					again++
					require.False(t, v.always, "case %d: count %v refused again at its RetryAfter %v", i, c, res.RetryAfter)
				}
			}
			t.Logf("%d refused, %d (%.0f%%) refused again at their RetryAfter", refused, again, 100*float64(again)/float64(refused))
			require.Greater(t, refused, 200)
		})
	}
}
