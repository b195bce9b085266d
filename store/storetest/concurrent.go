package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// NewObservedStore returns a fresh, empty store for one test that calls
// decided(ctx) as it decides the op of each Apply whose context is ctx,
// in the order the ops take effect: for a store that gathers concurrent
// calls into one transaction, transaction after transaction, and within
// one, in the order its ops are decided. It need not call it for a check
// (driver.ModeCheck), which writes nothing.
type NewObservedStore func(t *testing.T, decided func(ctx context.Context)) ratelimit.Store

// opIndexKey is the key of the index of a call's op in its context.
type opIndexKey struct{}

// Concurrent goroutines, rounds of a seed and calls per goroutine and
// round of ConcurrentDifferential.
const (
	concGoroutines = 16
	concRounds     = 8
	concCalls      = 4
)

// ConcurrentDifferential is the differential test of the calls of many
// goroutines at once, which a store may gather into one transaction. In
// each of a few rounds, 16 goroutines, half of them with contexts that
// can end (but do not), make 4 calls each of mixed ops (limit, check,
// refund, reserving or not, several limits, two-shard items, the same
// records in many calls at once, settlements of a few IDs, so that two
// calls may settle one at once), at nows a few milliseconds apart; a mock
// clock moves between rounds. Then Model applies the round's ops in the
// order the store says it decided them (decided), and the answers must
// be the store's, bit for bit, and the records too; and each check must
// read what Model reads at some point of that order between the last op
// that had returned when the check began and the last op decided when it
// returned. So the store is serializable, in the order it reports, and
// equal to the pure transition.
func ConcurrentDifferential(t *testing.T, newStore NewObservedStore, seeds int) {
	ctx := context.Background()
	for seed := range max(seeds, 1) {
		var (
			mu        sync.Mutex
			order     []int       // ops' indexes, as the store decided them
			pos       map[int]int // op index: its place in order
			committed int         // a prefix of order known to have taken effect
		)
		pos = map[int]int{}
		decided := func(ctx context.Context) {
			i, ok := ctx.Value(opIndexKey{}).(int)
			if !ok {
				return // a call of the test's own, not of the goroutines
			}
			mu.Lock()
			defer mu.Unlock()
			pos[i] = len(order)
			order = append(order, i)
		}
		store, model := newStore(t, decided), NewModel()
		rng := rand.New(rand.NewPCG(uint64(seed), 0xc0c0))
		u := newUniverse(rng)
		var ids [3][16]byte
		for i := range ids {
			ids[i] = [16]byte{byte(seed), byte(i), 0xc0, 0xc0, byte(rng.Uint32())}
		}
		clk := newMock(epoch)
		var ops []*driver.Op
		var outs [][]driver.Decision
		var lo, hi []int // a check's bounds in order
		for round := range concRounds {
			clk.Add(time.Duration(randomStep(rng, periods[rng.IntN(len(periods))])) * time.Millisecond)
			now := clk.Now().UnixMilli()
			first := len(ops)
			work := make([][]int, concGoroutines)
			for g := range work {
				for range concCalls {
					op := u.randomOp(rng, now+rng.Int64N(7)-3)
					if rng.IntN(4) == 0 {
						op = u.randomSettle(rng, now+rng.Int64N(7)-3, ids[rng.IntN(len(ids))])
					}
					if len(op.Items) == 0 {
						continue
					}
					withRuns(ctx, rng, model, op)
					work[g] = append(work[g], len(ops))
					ops = append(ops, op)
					outs = append(outs, make([]driver.Decision, len(op.Items)))
					lo, hi = append(lo, 0), append(hi, 0)
				}
			}
			mu.Lock()
			start := len(order)
			mu.Unlock()

			errs := make([]error, len(ops))
			var wg sync.WaitGroup
			for g, calls := range work {
				base := ctx
				if g%2 == 1 {
					c, cancel := context.WithCancel(ctx)
					defer cancel()
					base = c
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, i := range calls {
						check := ops[i].Mode == driver.ModeCheck
						if check {
							mu.Lock()
							lo[i] = committed
							mu.Unlock()
						}
						errs[i] = store.Apply(context.WithValue(base, opIndexKey{}, i), ops[i], outs[i])
						mu.Lock()
						if check {
							hi[i] = len(order)
						} else if p, ok := pos[i]; ok && errs[i] == nil {
							committed = max(committed, p+1)
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			where := fmt.Sprintf("seed %d round %d", seed, round)
			for i := first; i < len(ops); i++ {
				require.NoError(t, errs[i], "%s: op %d: %s", where, i, describe(ops[i]))
			}

			// Every op but the checks decided once, in the round.
			var want []int
			for i := first; i < len(ops); i++ {
				if ops[i].Mode != driver.ModeCheck {
					want = append(want, i)
				}
			}
			got := append([]int(nil), order[start:]...)
			require.ElementsMatch(t, want, got, "%s: the ops the store says it decided", where)

			// Model, op after op in the store's order; each check matched
			// at a point of its span.
			matched := map[int]bool{}
			checkAt := func(p int) {
				for i := first; i < len(ops); i++ {
					if ops[i].Mode != driver.ModeCheck || matched[i] || p < lo[i] || p > hi[i] {
						continue
					}
					w := make([]driver.Decision, len(ops[i].Items))
					require.NoError(t, model.Apply(ctx, ops[i], w))
					if equalDecisions(w, outs[i]) {
						matched[i] = true
					}
				}
			}
			for p := start; p < len(order); p++ {
				checkAt(p)
				i := order[p]
				w := make([]driver.Decision, len(ops[i].Items))
				require.NoError(t, model.Apply(ctx, ops[i], w))
				require.Equal(t, w, outs[i], "%s: op %d, decided %d of %d in the round: %s", where, i, p-start, len(order)-start, describe(ops[i]))
			}
			checkAt(len(order))
			for i := first; i < len(ops); i++ {
				if ops[i].Mode == driver.ModeCheck {
					require.True(t, matched[i], "%s: check %d read %+v, which Model reads at no point from %d to %d of the order: %s",
						where, i, outs[i], lo[i], hi[i], describe(ops[i]))
				}
			}
			compareRecords(t, ctx, store, model, u, now+3, where)
		}
	}
}

func equalDecisions(a, b []driver.Decision) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
