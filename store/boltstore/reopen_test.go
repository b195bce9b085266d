package boltstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// reopenLimits are the limits of TestReopenDifferential: both kinds, with
// and without reservations, sharded and not.
var reopenLimits = ratelimit.Limits{
	"fw":  {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Second, MaxReserved: 10},
	"tb":  {Kind: ratelimit.TokenBucket, Rate: 3, Period: time.Second, Capacity: 6, MaxReserved: 6},
	"fw0": {Kind: ratelimit.FixedWindow, Rate: 2, Period: 700 * time.Millisecond},
	"tbs": {Kind: ratelimit.TokenBucket, Rate: 8, Period: time.Second, Shards: 2, MaxReserved: 4},
}

// pairLimiters are the Limiters of one side each, over the bolt store and
// the memory store, built alike.
type pairLimiters struct{ bolt, mem *ratelimit.Limiter }

func newPairLimiters(t *testing.T, bs *boltstore.Store, ms *memstore.Store, mock *clock.Mock, seed, gen uint64) pairLimiters {
	t.Helper()
	opts := func() []ratelimit.Option {
		return []ratelimit.Option{ratelimit.WithClock(mock), ratelimit.WithPhaseSeed(seed),
			ratelimit.WithRand(rand.NewPCG(seed, gen)), ratelimit.WithTokenKey([]byte("reopen-differential-key-0123456789"))}
	}
	lb, err := ratelimit.New(bs, reopenLimits, opts()...)
	require.NoError(t, err)
	lm, err := ratelimit.New(ms, reopenLimits, opts()...)
	require.NoError(t, err)
	return pairLimiters{bolt: lb, mem: lm}
}

// settleClass names the errors of a call that the two stores must agree
// on.
func settleClass(err error) string {
	if err == nil {
		return "nil"
	}
	var c string
	for _, e := range []struct {
		name string
		err  error
	}{
		{"settled", ratelimit.ErrAlreadySettled}, {"used", ratelimit.ErrReservationUsed},
		{"canceled", ratelimit.ErrReservationCanceled}, {"expired", ratelimit.ErrTokenExpired},
		{"invalid", ratelimit.ErrInvalidToken}, {"store", ratelimit.ErrStoreUnavailable},
	} {
		if errors.Is(err, e.err) {
			c += e.name + " "
		}
	}
	if c == "" {
		return "other: " + err.Error()
	}
	return c
}

// sameResult requires the answers of the two stores to one call to agree.
func sameResult(t *testing.T, got, want ratelimit.Result, where string) {
	t.Helper()
	require.Equal(t, want.OK, got.OK, "%s: OK", where)
	require.Equal(t, want.RetryAfter, got.RetryAfter, "%s: RetryAfter", where)
	require.Equal(t, want.Remaining, got.Remaining, "%s: Remaining", where)
	require.Equal(t, want.ResetAfter, got.ResetAfter, "%s: ResetAfter", where)
	require.Equal(t, want.Name, got.Name, "%s: Name", where)
	require.Equal(t, want.Degraded, got.Degraded, "%s: Degraded", where)
	require.Equal(t, want.Token == nil, got.Token == nil, "%s: a token", where)
	if want.Token != nil {
		require.Equal(t, want.Token.RunAt(), got.Token.RunAt(), "%s: the token's RunAt", where)
		require.Equal(t, want.Token.Expires(), got.Token.Expires(), "%s: the token's Expires", where)
	}
	require.Equal(t, len(want.All), len(got.All), "%s: All", where)
	for i := range want.All {
		sameResult(t, got.All[i], want.All[i], fmt.Sprintf("%s: All[%d]", where, i))
	}
}

// sameStatus requires the Values of the two stores to agree, but for
// whether a record is stored: a record full again reads as a missing one,
// and the memory store drops such records as it sweeps, when its clock says.
func sameStatus(t *testing.T, got, want ratelimit.Status, where string) {
	t.Helper()
	for _, st := range []*ratelimit.Status{&got, &want} {
		st.Shards = slices.Clone(st.Shards)
		for i := range st.Shards {
			st.Shards[i].Stored = false
		}
	}
	require.Equal(t, want, got, where)
}

// A random mix of calls (Limit, LimitAll, Check, Reserve, Cancel, Refund,
// Settle, Use, each settlement repeated at times, Value) answers alike on
// the bolt store and on the memory store, under one mock clock, while the
// bolt file is closed and opened again at random points: what a call
// changed, granted or refused, persists (a refused call, a settlement
// found made before, a check, rolled back rather than committed, never
// lose a write that an answer after it depends on).
func TestReopenDifferential(t *testing.T) {
	ctx := context.Background()
	names := []string{"fw", "tb", "fw0", "tbs"}
	keys := []string{"a", "b", "c"}
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			path := filepath.Join(t.TempDir(), "limits.db")
			mock := newMock(t0)
			bs, err := boltstore.Open(path)
			require.NoError(t, err)
			defer func() { bs.Close() }()
			ms, err := memstore.New(memstore.WithClock(mock))
			require.NoError(t, err)
			lims := newPairLimiters(t, bs, ms, mock, seed, 0)

			type resPair struct{ bolt, mem *ratelimit.Reservation }
			type tokPair struct{ bolt, mem *ratelimit.Token }
			var reservations []resPair
			var tokens []tokPair
			reopens := 0
			for step := range 400 {
				switch rng.IntN(4) {
				case 0:
				case 1:
					mock.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
				default:
					mock.Add(time.Duration(rng.IntN(900)) * time.Millisecond)
				}
				name, key := names[rng.IntN(len(names))], keys[rng.IntN(len(keys))]
				count := ratelimit.Count(float64(rng.IntN(5)))
				if rng.IntN(4) == 0 {
					count = ratelimit.Count(rng.Float64() * 4)
				}
				where := func(what string) string {
					return fmt.Sprintf("seed %d step %d (after %d reopens): %s %s/%s at %v", seed, step, reopens, what, name, key, mock.Now().Sub(t0))
				}
				switch op := rng.IntN(13); op {
				case 0, 1, 2:
					rb, eb := lims.bolt.Limit(ctx, name, key, count, ratelimit.WithReceipt())
					rm, em := lims.mem.Limit(ctx, name, key, count, ratelimit.WithReceipt())
					require.Equal(t, settleClass(em), settleClass(eb), where("Limit"))
					sameResult(t, rb, rm, where("Limit"))
					if rm.Token != nil {
						tokens = append(tokens, tokPair{rb.Token, rm.Token})
					}
				case 3:
					two := []string{name, names[rng.IntN(len(names))]}
					if two[0] == two[1] {
						two = two[:1]
					}
					rb, eb := lims.bolt.LimitAll(ctx, key, two, count, ratelimit.WithReceipt())
					rm, em := lims.mem.LimitAll(ctx, key, two, count, ratelimit.WithReceipt())
					require.Equal(t, settleClass(em), settleClass(eb), where("LimitAll"))
					sameResult(t, rb, rm, where(fmt.Sprintf("LimitAll %v", two)))
					if rm.Token != nil {
						tokens = append(tokens, tokPair{rb.Token, rm.Token})
					}
				case 4:
					rb, eb := lims.bolt.Check(ctx, name, key, count)
					rm, em := lims.mem.Check(ctx, name, key, count)
					require.Equal(t, settleClass(em), settleClass(eb), where("Check"))
					sameResult(t, rb, rm, where("Check"))
				case 5, 6:
					rb, eb := lims.bolt.Reserve(ctx, name, key, count, ratelimit.WithReceipt())
					rm, em := lims.mem.Reserve(ctx, name, key, count, ratelimit.WithReceipt())
					require.Equal(t, settleClass(em), settleClass(eb), where("Reserve"))
					if rm == nil || rb == nil {
						require.Equal(t, rm == nil, rb == nil, where("Reserve"))
						continue
					}
					sameResult(t, rb.Result(), rm.Result(), where("Reserve"))
					if rm.OK() {
						reservations = append(reservations, resPair{rb, rm})
					}
				case 7:
					if len(reservations) == 0 {
						continue
					}
					i := rng.IntN(len(reservations))
					r := reservations[i]
					eb, em := r.bolt.Cancel(ctx), r.mem.Cancel(ctx)
					require.Equal(t, settleClass(em), settleClass(eb), where("Cancel"))
					if rng.IntN(3) > 0 {
						reservations = append(reservations[:i], reservations[i+1:]...)
					}
				case 8, 9, 10:
					if len(tokens) == 0 {
						continue
					}
					i := rng.IntN(len(tokens))
					tp := tokens[i]
					var eb, em error
					what := "Refund"
					switch rng.IntN(3) {
					case 0:
						eb, em = lims.bolt.Refund(ctx, tp.bolt), lims.mem.Refund(ctx, tp.mem)
					case 1:
						used := rng.Float64() * 3
						what = fmt.Sprintf("Settle %v", used)
						eb, em = lims.bolt.Settle(ctx, tp.bolt, used), lims.mem.Settle(ctx, tp.mem, used)
					default:
						what = "Use"
						eb, em = lims.bolt.Use(ctx, tp.bolt), lims.mem.Use(ctx, tp.mem)
					}
					require.Equal(t, settleClass(em), settleClass(eb), where(what))
					if rng.IntN(3) == 0 { // kept otherwise, to be settled again
						tokens = append(tokens[:i], tokens[i+1:]...)
					}
				case 11:
					sb, eb := lims.bolt.Value(ctx, name, key)
					sm, em := lims.mem.Value(ctx, name, key)
					require.NoError(t, eb, where("Value"))
					require.NoError(t, em, where("Value"))
					sameStatus(t, sb, sm, where("Value"))
				case 12:
					if rng.IntN(2) == 0 {
						continue
					}
					// Close the file and open it again: only what was
					// committed is left. The reservations go on as their
					// tokens, settled through the new Limiters.
					require.NoError(t, bs.Close())
					bs, err = boltstore.Open(path)
					require.NoError(t, err)
					lims = newPairLimiters(t, bs, ms, mock, seed, uint64(step))
					for _, r := range reservations {
						tokens = append(tokens, tokPair{r.bolt.Token(), r.mem.Token()})
					}
					reservations = reservations[:0]
					reopens++
					for _, n := range names {
						for _, k := range keys {
							sb, eb := lims.bolt.Value(ctx, n, k)
							sm, em := lims.mem.Value(ctx, n, k)
							require.NoError(t, eb)
							require.NoError(t, em)
							sameStatus(t, sb, sm, fmt.Sprintf("seed %d step %d: %s/%s reopened", seed, step, n, k))
						}
					}
				}
			}
			require.Positive(t, reopens)
		})
	}
}
