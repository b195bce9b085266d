package ratelimit_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// Settlements never let a limit grant more than its bound. Two Limiters
// on one key, sharded or not, make plain calls with receipts and (in half
// the runs) reservations, with counts up to what a call may ask (debts
// spread over two shards included), and settle them: Cancel, Refund,
// Settle of a part, Use. Each charge counts at its time (a job's, for a
// reservation) as what was used of it: nothing once canceled. With plain
// calls alone, every span stays within the bound of plain calls
// (checkBound): a refund that hands back more than the rule allows, or
// twice, lets later calls take more than that. With reservations too, a
// job holds tokens granted before its time, so each span may hold up to
// the largest count on each of two shards more.
func TestSettlementsNeverLetTheLimitGrantMore(t *testing.T) {
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
			rng := rand.New(rand.NewPCG(97, uint64(len(v.name))))
			for i := range 30 {
				reserve := i%2 == 1
				shards := []int{0, 2, 3, 4}[rng.IntN(4)]
				n := float64(max(shards, 1))
				period := []int64{10, 1000}[rng.IntN(2)]
				rate := []float64{100, 37, 10.5, 7, 1000.0 / 3, 2.2}[rng.IntN(6)]
				capacity := rate * []float64{1, 0.5, 2, 1.7}[rng.IntN(4)]
				maxReserved := []float64{0, rate, 3.5 * rate}[rng.IntN(3)]
				cfg := ratelimit.Config{Kind: v.kind, Rate: rate, Capacity: capacity, MaxReserved: maxReserved,
					Period: time.Duration(period) * time.Millisecond, Shards: shards}
				if v.start {
					cfg.Start = t0
				}
				where := fmt.Sprintf("case %d: %+v", i, cfg)
				first := t0.Add(time.Duration(rng.Int64N(period)) * time.Millisecond)
				mock := &stepClock{Mock: clock.NewMock(), now: first}
				store := must(memstore.New())
				lims := []*ratelimit.Limiter{
					must(ratelimit.New(store, ratelimit.Limits{"l": cfg}, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(uint64(i), 1)))),
					must(ratelimit.New(store, ratelimit.Limits{"l": cfg}, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(uint64(i), 2)))),
				}
				reach := 2 * capacity / n
				if shards == 0 {
					reach = capacity
				}
				debtReach := reach * 3 // what a reservation may ask
				switch {
				case maxReserved > 0 && shards == 0:
					debtReach = capacity + maxReserved
				case maxReserved > 0:
					debtReach = math.Min(reach+2*maxReserved/n, reach*4)
				}
				type charge struct {
					r     *ratelimit.Reservation // nil for a receipt
					tok   *ratelimit.Token
					ms    int64   // when its tokens are spent: the job's time
					count float64 // spent, as far as the test knows
				}
				var charges []*charge
				for range 1000 {
					if rng.IntN(6) == 0 {
						mock.add(time.Duration(rng.Int64N(period)) * time.Millisecond)
					} else if rng.IntN(4) == 0 {
						mock.add(time.Duration(rng.Int64N(max(period/20, 2))) * time.Millisecond)
					}
					lim := lims[rng.IntN(2)]
					var c float64
					switch rng.IntN(3) {
					case 0:
						c = math.Min(1, reach)
					case 1:
						c = reach * rng.Float64()
					default:
						c = reach * (0.5 + rng.Float64()/2)
					}
					switch op := rng.IntN(10); {
					case op < 3:
						res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(c), ratelimit.WithReceipt())
						require.NoError(t, err, where)
						if res.OK {
							charges = append(charges, &charge{tok: res.Token, ms: mock.Now().UnixMilli(), count: c})
						}
					case op < 6 && reserve:
						if rng.IntN(3) == 0 {
							c = debtReach * rng.Float64()
						}
						r, err := lim.Reserve(ctx, "l", "k", ratelimit.Count(c))
						require.NoError(t, err, where)
						if r.OK() {
							charges = append(charges, &charge{r: r, ms: r.Time().UnixMilli(), count: c})
						}
					case len(charges) > 0:
						ch := charges[len(charges)-1-rng.IntN(min(len(charges), 20))]
						tok := ch.tok
						if ch.r != nil {
							if rng.IntN(3) == 0 {
								if ch.r.Cancel(ctx) == nil {
									ch.count = 0
								}
								continue
							}
							tok = ch.r.Token()
						}
						settler := lims[rng.IntN(2)]
						switch rng.IntN(3) {
						case 0:
							if settler.Refund(ctx, tok) == nil {
								ch.count = 0
							}
						case 1:
							used := ch.count * rng.Float64()
							if settler.Settle(ctx, tok, used) == nil {
								ch.count = used
							}
						default:
							_ = settler.Use(ctx, tok)
						}
					}
				}
				if !reserve {
					// Plain calls alone: every span within the bound of
					// plain calls (TestShardedGrantsNeverExceedTheBound).
					var got []grant
					for _, ch := range charges {
						if ch.count > 0 {
							got = append(got, grant{ch.ms, ch.count})
						}
					}
					checkBound(t, where, v.kind, v.start, t0.UnixMilli(), period, rate, capacity, got)
					continue
				}
				// With reservations, a job runs when the last of its tokens
				// is granted: the first job of a span may hold tokens granted
				// before it, up to its count on each shard it owes.
				var got []grant
				var largest float64
				for _, ch := range charges {
					if ch.count > 0 {
						got = append(got, grant{ch.ms, ch.count})
					}
					largest = math.Max(largest, ch.count)
				}
				checkBoundWithin(t, where, v.kind, v.start, t0.UnixMilli(), period, rate, capacity, 2*largest, got)
			}
		})
	}
}

// Settlements of reservations deep in a queue never crowd its tail. The
// clock mostly stands still while two Limiters on one key, sharded or
// not, reserve jobs of a few tokens windows ahead and settle waiting ones,
// the earliest mostly and at times a run of them: Cancel, Refund, Settle
// of a part. A refund of a reservation that later ones stand behind must
// give nothing back (queued, in state.go): the later ones keep their
// times, and tokens handed back would be reserved again at the tail's,
// which would then run its own jobs and those of the refunded ones. Each
// span may hold, beyond the limit's bound, only the tokens a job took of
// the window before its own, fewer than the largest count, on each shard
// (TestCancelOfASpanningReservationLendsItsEarlierTokens). The bound of
// TestSettlementsNeverLetTheLimitGrantMore allows twice the largest count
// in every span, and a window's phase is unknown to it: runs of refunds
// in breach of the rule pass it, and fail here. A fixed window keeps
// Capacity at Rate (a queue runs Rate a window, above a smaller Capacity)
// and shares Start; a token bucket's Capacity is small, so that its
// bound is tight.
func TestSettlementsOfAQueueNeverCrowdItsTail(t *testing.T) {
	type variant struct {
		name  string
		kind  ratelimit.Kind
		start bool
	}
	for _, v := range []variant{
		{"fixed window", ratelimit.FixedWindow, true},
		{"token bucket", ratelimit.TokenBucket, false},
	} {
		t.Run(v.name, func(t *testing.T) {
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(61, uint64(len(v.name))))
			for i := range 30 {
				shards := []int{0, 2}[i%2]
				const period = 1000
				rate := []float64{10, 12, 7.5}[rng.IntN(3)]
				capacity := rate
				if v.kind == ratelimit.TokenBucket {
					capacity = rate * []float64{1, 0.25}[rng.IntN(2)]
				}
				cfg := ratelimit.Config{Kind: v.kind, Rate: rate, Capacity: capacity, MaxReserved: 3 * rate,
					Period: period * time.Millisecond, Shards: shards}
				if v.start {
					cfg.Start = t0
				}
				where := fmt.Sprintf("case %d: %+v", i, cfg)
				mock := &stepClock{Mock: clock.NewMock(), now: t0.Add(time.Duration(rng.Int64N(period)) * time.Millisecond)}
				store := must(memstore.New())
				lims := []*ratelimit.Limiter{
					must(ratelimit.New(store, ratelimit.Limits{"l": cfg}, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(uint64(i), 3)))),
					must(ratelimit.New(store, ratelimit.Limits{"l": cfg}, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(uint64(i), 4)))),
				}
				type charge struct {
					r     *ratelimit.Reservation // nil for a receipt
					tok   *ratelimit.Token
					ms    int64   // when its tokens are spent: the job's time
					count float64 // spent, as far as the test knows
				}
				var charges, standing []*charge
				largest := 0.0
				for range 800 {
					if rng.IntN(4) == 0 {
						mock.add(time.Duration(rng.Int64N(period/2)) * time.Millisecond)
					}
					lim := lims[rng.IntN(2)]
					c := float64(1 + rng.IntN(3))
					switch op := rng.IntN(20); {
					case op < 3:
						c = math.Min(c, math.Floor(capacity)) // what a plain call may ask
						res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(c), ratelimit.WithReceipt())
						require.NoError(t, err, where)
						if res.OK {
							charges = append(charges, &charge{tok: res.Token, ms: mock.Now().UnixMilli(), count: c})
							largest = math.Max(largest, c)
						}
					case op < 15:
						r, err := lim.Reserve(ctx, "l", "k", ratelimit.Count(c))
						require.NoError(t, err, where)
						if r.OK() {
							ch := &charge{r: r, tok: r.Token(), ms: r.Time().UnixMilli(), count: c}
							charges = append(charges, ch)
							standing = append(standing, ch)
							largest = math.Max(largest, c)
						}
					case len(standing) > 0:
						// The earliest reservations still waiting, which the
						// most stand behind, mostly, and at times a run of
						// them: each run in the rule's breach would move
						// its tokens to the tail.
						for len(standing) > 1 && standing[0].ms < mock.Now().UnixMilli() {
							standing = standing[1:]
						}
						n := 1
						if rng.IntN(4) == 0 {
							n = 1 + rng.IntN(12)
						}
						kinds := 3 // Cancel, Refund, Settle of a part
						if n > 1 {
							kinds = 2 // a run hands back whole reservations
						}
						for ; n > 0 && len(standing) > 0; n-- {
							k := rng.IntN(rng.IntN(len(standing)) + 1)
							ch := standing[k]
							standing = append(standing[:k], standing[k+1:]...)
							switch rng.IntN(kinds) {
							case 0:
								if ch.r.Cancel(ctx) == nil {
									ch.count = 0
								}
							case 1:
								if lims[rng.IntN(2)].Refund(ctx, ch.tok) == nil {
									ch.count = 0
								}
							default:
								used := math.Floor(ch.count * rng.Float64())
								if lims[rng.IntN(2)].Settle(ctx, ch.tok, used) == nil {
									ch.count = used
								}
							}
						}
					}
				}
				var got []grant
				for _, ch := range charges {
					if ch.count > 0 {
						got = append(got, grant{ch.ms, ch.count})
					}
				}
				checkBoundWithin(t, where, v.kind, v.start, t0.UnixMilli(), period, rate, capacity, largest*float64(max(shards, 1)), got)
			}
		})
	}
}
