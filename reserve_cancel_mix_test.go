package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// mixJob is the tokens of one limit that a job scheduled at a time uses.
type mixJob struct {
	lim string
	at  time.Time
	n   float64
}

// mixCharge is one charge still standing: its token and its jobs' use.
type mixCharge struct {
	tok  *ratelimit.Token
	res  *ratelimit.Reservation
	jobs []mixJob
}

// Reserves, plain calls with receipts, LimitAll reservations, refunds,
// cancels and partial settlements (Settle of half) on two limits at
// random, tokens of the latest and of long ago, the clock moving between
// them, never schedule more tokens of a limit over any span than it
// grants over it: Capacity, plus Rate for every window start the span may
// hold (a fixed window of any phase, its shards alike) or Rate times the
// span and a millisecond (a token bucket). A job's tokens count at its
// limit's own time (a LimitAll reservation's, each limit's). A token may
// be granted in part in the window before its job's (a fractional Rate, or
// a debt left between whole tokens by half of one used): one more then; a
// count spread over two shards, more than either owes alone, that count
// more. MaxReserved varies, so that some reservations are refused.
func TestCancelsNeverCrowdAWindowMixed(t *testing.T) {
	ctx := context.Background()
	type lc struct {
		kind          ratelimit.Kind
		rate, capa    float64
		shards        int
		start, period bool
	}
	cases := []lc{
		{ratelimit.FixedWindow, 2, 2, 1, true, false}, {ratelimit.FixedWindow, 3, 5, 1, false, false},
		{ratelimit.FixedWindow, 4, 2, 2, false, false}, {ratelimit.FixedWindow, 2.5, 2.5, 1, true, true},
		{ratelimit.TokenBucket, 2, 2, 1, false, false}, {ratelimit.TokenBucket, 3, 1.5, 1, false, true},
		{ratelimit.TokenBucket, 4, 6, 2, false, false}, {ratelimit.TokenBucket, 0.7, 1, 1, false, true},
	}
	for ci, a := range cases {
		for _, b := range []lc{cases[(ci+3)%len(cases)], cases[(ci+5)%len(cases)]} {
			for seed := range uint64(6) {
				t.Run(fmt.Sprintf("%d/%v-%v/seed %d", ci, a.kind, b.kind, seed), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, uint64(ci)))
					mock := newMock()
					cfgs := map[string]ratelimit.Config{}
					for name, c := range map[string]lc{"a": a, "b": b} {
						period := time.Second
						if c.period {
							period = 700 * time.Millisecond
						}
						cfg := ratelimit.Config{Kind: c.kind, Rate: c.rate, Period: period, Capacity: c.capa,
							MaxReserved: c.rate * float64(1+seed%3*5), Shards: c.shards}
						if c.start {
							cfg.Start = t0
						}
						cfgs[name] = cfg
					}
					lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"a": cfgs["a"], "b": cfgs["b"]},
						ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(seed, 5)))
					require.NoError(t, err)
					var live []*mixCharge
					var log []string
					var done []*mixCharge
					halves := false
					slack := map[string]float64{} // per limit, the largest count spread over two shards
					for range 300 {
						name := "a"
						if rng.IntN(3) == 0 {
							name = "b"
						}
						count := 1.0
						if c := cfgs[name]; c.Shards > 1 && rng.IntN(5) == 0 {
							// More than a shard's capacity and MaxReserved: a
							// debt spread over both shards.
							count = math.Ceil((c.Capacity+c.MaxReserved)/float64(c.Shards)) + 1
							slack[name] = max(slack[name], count)
						}
						switch x := rng.IntN(20); {
						case x < 4:
							d := time.Duration(rng.IntN(400)) * time.Millisecond
							if rng.IntN(10) == 0 {
								d = time.Duration(rng.IntN(20)) * time.Second
							}
							mock.Add(d)
							log = append(log, fmt.Sprintf("+%v", d))
						case x < 9:
							r, err := lim.Reserve(ctx, name, "k", ratelimit.Count(count))
							require.NoError(t, err)
							if r.OK() {
								live = append(live, &mixCharge{tok: r.Token(), res: r, jobs: []mixJob{{name, r.Time(), count}}})
								log = append(log, fmt.Sprintf("reserve %s %v at %v -> %v", name, count, mock.Now().Sub(t0), r.Time().Sub(t0)))
							}
						case x < 11:
							res, err := lim.Limit(ctx, name, "k", ratelimit.Count(count), ratelimit.WithReceipt())
							var cerr *ratelimit.CountError
							if errors.As(err, &cerr) {
								continue // more than the limit grants at once
							}
							require.NoError(t, err)
							if res.OK {
								live = append(live, &mixCharge{tok: res.Token, jobs: []mixJob{{name, mock.Now(), count}}})
								log = append(log, fmt.Sprintf("plain %s %v at %v", name, count, mock.Now().Sub(t0)))
							}
						case x < 13:
							res, err := lim.LimitAll(ctx, "k", []string{"a", "b"}, ratelimit.WithReserve(), ratelimit.WithReceipt())
							require.NoError(t, err)
							if res.OK {
								c := &mixCharge{tok: res.Token}
								for i, n := range []string{"a", "b"} {
									c.jobs = append(c.jobs, mixJob{n, res.Token.ChargedAt().Add(res.All[i].RetryAfter), 1})
								}
								live = append(live, c)
								log = append(log, fmt.Sprintf("all at %v -> %v %v", mock.Now().Sub(t0), c.jobs[0].at.Sub(t0), c.jobs[1].at.Sub(t0)))
							}
						case len(live) > 0:
							i := rng.IntN(len(live))
							if rng.IntN(3) > 0 {
								i = max(len(live)-1-rng.IntN(4), 0)
							}
							c := live[i]
							live = append(live[:i], live[i+1:]...)
							used := 0.0
							if seed%2 == 1 && rng.IntN(4) == 0 {
								used = c.jobs[0].n / 2
							}
							switch {
							case used > 0:
								require.NoError(t, lim.Settle(ctx, c.tok, used))
								halves = true
								for j := range c.jobs {
									c.jobs[j].n = math.Min(used, c.jobs[j].n)
								}
								done = append(done, c)
							case c.res != nil && rng.IntN(2) == 0:
								require.NoError(t, c.res.Cancel(ctx))
							default:
								require.NoError(t, lim.Refund(ctx, c.tok))
							}
							log = append(log, fmt.Sprintf("settle %v used %v (%v) at %v", c.jobs[0].lim, used, c.jobs[0].at.Sub(t0), mock.Now().Sub(t0)))
						}
					}
					for name, cfg := range cfgs {
						var jobs []mixJob
						for _, c := range append(live, done...) {
							for _, j := range c.jobs {
								if j.lim == name {
									jobs = append(jobs, j)
								}
							}
						}
						sort.Slice(jobs, func(i, j int) bool { return jobs[i].at.Before(jobs[j].at) })
						for i := range jobs {
							sum := 0.0
							for j := i; j < len(jobs); j++ {
								sum += jobs[j].n
								span := jobs[j].at.Sub(jobs[i].at)
								allowed := cfg.Capacity + cfg.Rate*math.Ceil(float64(span)/float64(cfg.Period))
								if cfg.Kind == ratelimit.TokenBucket {
									allowed = cfg.Capacity + cfg.Rate*float64(span+time.Millisecond)/float64(cfg.Period)
								}
								// A fractional Rate grants a job's token in
								// part in a window before its own.
								// So does a half used (a debt then falls between whole tokens).
								if cfg.Rate != math.Trunc(cfg.Rate) || halves {
									allowed++
								}
								allowed += slack[name]
								if sum > allowed+1e-9 {
									t.Fatalf("limit %s %+v: %v tokens from %v to %v, %v allowed\n%s", name, cfg, sum,
										jobs[i].at.Sub(t0), jobs[j].at.Sub(t0), allowed, strings.Join(log, "\n"))
								}
							}
						}
					}
				})
			}
		}
	}
}
