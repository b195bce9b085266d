package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// fleetFault says, in a call's context, how the fleetStore under it
// fails the call: not at all, before the store sees it (the request
// lost), or after the store decided it (the answer lost).
type fleetFault int

const (
	faultNone fleetFault = iota
	faultRequest
	faultAnswer
)

type fleetFaultKey struct{}

// fleetStore fails each Apply as its context says (fleetFault), and
// notes, for each settlement the store took (found no mark of), what
// its items asked to hand back: the model's view of what the store did.
type fleetStore struct {
	ratelimit.Store
	mu    sync.Mutex
	taken map[[16]byte]int
	back  map[[16]byte]float64
}

func (s *fleetStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	fault, _ := ctx.Value(fleetFaultKey{}).(fleetFault)
	if fault == faultRequest {
		return errors.New("connection refused: the op never reached the store")
	}
	if err := s.Store.Apply(ctx, op, out); err != nil {
		return err
	}
	if op.Settle != nil && out[0].Settled == 0 {
		s.mu.Lock()
		s.taken[op.Settle.ID]++
		for _, it := range op.Items {
			s.back[op.Settle.ID] += it.Count
		}
		s.mu.Unlock()
	}
	if fault == faultAnswer {
		return errors.New("connection reset: the answer was lost")
	}
	return nil
}

// fleetClock and fleetRecordClock keep the store's own clock, and each
// record's, through the fleetStore, as failing does.
type fleetClock struct {
	*fleetStore
	driver.TimeSource
}

type fleetRecordClock struct {
	fleetClock
	driver.RecordClock
}

func fleetOf(store ratelimit.Store) (ratelimit.Store, *fleetStore) {
	f := &fleetStore{Store: store, taken: map[[16]byte]int{}, back: map[[16]byte]float64{}}
	if ts, ok := store.(driver.TimeSource); ok {
		if rc, ok := store.(driver.RecordClock); ok {
			return fleetRecordClock{fleetClock{f, ts}, rc}, f
		}
		return fleetClock{f, ts}, f
	}
	return f, f
}

// fleetToken is a charge of the fleet test: its token as another
// process reads it, the Reservation that made it (nil for a receipt),
// the limit it charged and how much.
type fleetToken struct {
	tok    *ratelimit.Token
	r      *ratelimit.Reservation
	name   string
	amount float64
	owner  int // the Limiter that made it
	// settlers are the two settler IDs its holders settle it as.
	settlers [2][16]byte

	mu sync.Mutex
	// won holds, for each settlement told it took effect (a nil
	// answer), who it was and what it hands back: one settlement of one
	// settler at most, however often retried.
	won map[string]float64
}

// fleetAction is one settlement of the fleet test, kept so that a
// goroutine can retry it as it was.
type fleetAction struct {
	tok     int
	what    int // 0 Use, 1 Refund, 2 Settle, 3 the owner's Cancel, 4 the owner's Wait, 5 the owner's Wait given up
	settler int // -1 none, else an index into the token's settlers
	used    float64
}

// testSettleFleet has three Limiters, processes of one fleet whose
// clocks are up to 40 seconds apart, settle reservations and receipts of
// an unsharded and a sharded limit at once, each way (Use, Refund, Settle
// of part, the owner's Cancel and Wait), with a settler or without,
// retrying half their settlements as they were, from any process, with
// requests and answers lost at random. The store takes one settlement of
// each token at most; the settlements told they took effect are one
// settler's one settlement per token, which is what the store took; and
// each limit holds exactly its capacity less the charges plus what the
// settlements taken handed back. The limits' one window spans the test,
// and they owe nothing: a refund then hands back all it asks.
func testSettleFleet(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	given, canceled := context.WithCancel(ctx)
	canceled()
	for seed := range 3 {
		rng := rand.New(rand.NewPCG(uint64(seed), 0xf1ee7))
		wrapped, store := fleetOf(newStore(t))
		// On the store's clock, if it keeps one, the window is the real
		// time's day from an hour ago.
		start := epoch.Add(-time.Hour)
		if ts, ok := store.Store.(driver.TimeSource); ok && ts.OwnClock() {
			start = time.Now().Add(-time.Hour)
		}
		limits := ratelimit.Limits{
			"fleet":     {Kind: ratelimit.FixedWindow, Rate: 1e5, Period: 24 * time.Hour, MaxReserved: 1e5, Start: start},
			"fleetwide": {Kind: ratelimit.FixedWindow, Rate: 1e5, Period: 24 * time.Hour, Shards: 2, MaxReserved: 1e5, Start: start},
		}
		key := fmt.Sprintf("fleet-%d-%d", seed, time.Now().UnixNano())
		clocks := []*clock.Mock{newMock(epoch), newMock(epoch.Add(40 * time.Second)), newMock(epoch.Add(-40 * time.Second))}
		lims := make([]*ratelimit.Limiter, len(clocks))
		for i, c := range clocks {
			l, err := ratelimit.New(wrapped, limits, ratelimit.WithClock(c))
			require.NoError(t, err)
			lims[i] = l
		}
		var toks []*fleetToken
		charged := map[string]float64{}
		for i := range 24 {
			ft := &fleetToken{name: []string{"fleet", "fleetwide"}[i%2], amount: float64(1 + rng.IntN(6)), won: map[string]float64{}}
			ft.owner = i % len(lims)
			owner := lims[ft.owner]
			var tok *ratelimit.Token
			if i%3 == 2 {
				res, err := owner.Limit(ctx, ft.name, key, ratelimit.Count(ft.amount), ratelimit.WithReceipt())
				require.NoError(t, err)
				require.True(t, res.OK)
				tok = res.Token
			} else {
				r, err := owner.Reserve(ctx, ft.name, key, ratelimit.Count(ft.amount))
				require.NoError(t, err)
				require.True(t, r.OK())
				require.Zero(t, r.Delay(), "the job may run at once")
				ft.r, tok = r, r.Token()
			}
			require.NotNil(t, tok)
			var err error
			ft.tok, err = ratelimit.ParseToken(tok.String())
			require.NoError(t, err)
			ft.settlers = [2][16]byte{{0x5a, byte(i), 1}, {0x5b, byte(i), 2}}
			charged[ft.name] += ft.amount
			toks = append(toks, ft)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		// Two workers in each process: the first moves the process's
		// clock, the second does not, nor has a Wait give up (its refund's
		// context is timed by the clock the first moves).
		for w := range 2 * len(lims) {
			g, mover := w%len(lims), w < len(lims)
			lim := lims[g]
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(w)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				var last *fleetAction
				for step := range 80 {
					if mover {
						clocks[g].Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
					}
					a := last
					if a == nil || rng.IntN(2) == 0 {
						a = &fleetAction{tok: rng.IntN(len(toks)), what: rng.IntN(6), settler: rng.IntN(3) - 1, used: float64(rng.IntN(8))}
					}
					last = a
					ft := toks[a.tok]
					what := a.what
					if what >= 3 && (ft.r == nil || ft.owner != g) {
						// A receipt has no Reservation, and the
						// Reservation is its owner's, whose clock
						// times its refund's context: a clock
						// another process moves would end it midway.
						what -= 3
					}
					if what == 5 && !mover {
						what = 3
					}
					fctx := context.WithValue(ctx, fleetFaultKey{}, []fleetFault{faultNone, faultNone, faultRequest, faultAnswer}[rng.IntN(4)])
					var opts []ratelimit.SettleOption
					who := fmt.Sprintf("worker %d step %d", w, step) // nobody's retry
					if a.settler >= 0 {
						opts = append(opts, ratelimit.Settler(ft.settlers[a.settler]))
						who = fmt.Sprintf("settler %d", a.settler)
					}
					var (
						back float64
						err  error
					)
					switch what {
					case 0:
						who, err = who+" Use", lim.Use(fctx, ft.tok, opts...)
					case 1:
						who, back, err = who+" Refund", ft.amount, lim.Refund(fctx, ft.tok, opts...)
					case 2:
						// Settle of at least the charge is a Use, of 0 a
						// Refund: the same settlement, by the settler's
						// digest, and so named here.
						back = max(ft.amount-a.used, 0)
						switch {
						case back == 0:
							who += " Use"
						case back == ft.amount:
							who += " Refund"
						default:
							who += fmt.Sprintf(" Settle of %v", a.used)
						}
						err = lim.Settle(fctx, ft.tok, a.used, opts...)
					case 3:
						who, back, err = "the owner's cancel", ft.amount, ft.r.Cancel(fctx)
					case 4:
						who, err = "the owner's use", ft.r.Wait(fctx)
					case 5:
						// Gives up at once, and hands the tokens back, as
						// its message says, or says it did not.
						who, back, err = "the owner's cancel", ft.amount, ft.r.Wait(context.WithValue(given, fleetFaultKey{}, fctx.Value(fleetFaultKey{})))
						if errors.Is(err, context.Canceled) && strings.Contains(err.Error(), "its tokens were handed back") {
							err = nil
						}
					}
					switch {
					case err == nil:
						ft.mu.Lock()
						ft.won[who] = back
						ft.mu.Unlock()
					case errors.Is(err, ratelimit.ErrAlreadySettled), errors.Is(err, ratelimit.ErrStoreUnavailable),
						errors.Is(err, ratelimit.ErrReservationCanceled), errors.Is(err, ratelimit.ErrReservationUsed),
						errors.Is(err, context.Canceled),
						errors.Is(err, ratelimit.ErrReservationScheduled): // another worker's Wait under way
					default:
						errs <- fmt.Errorf("worker %d step %d: %s: %w", w, step, who, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		want := map[string]float64{}
		for i, ft := range toks {
			id := ft.tok.ID()
			require.LessOrEqual(t, store.taken[id], 1, "seed %d: token %d settled %d times", seed, i, store.taken[id])
			require.LessOrEqual(t, len(ft.won), 1, "seed %d: token %d: more than one settlement told it took effect: %v", seed, i, ft.won)
			for who, back := range ft.won {
				require.Equal(t, 1, store.taken[id], "seed %d: token %d: %s was told it took effect, and the store took none", seed, i, who)
				require.InDelta(t, back, store.back[id], 1e-9, "seed %d: token %d: %s was told it took effect, and the store handed back", seed, i, who)
			}
			want[ft.name] += store.back[id]
		}
		for name, back := range want {
			st, err := lims[0].Value(ctx, name, key)
			require.NoError(t, err)
			require.InDelta(t, 1e5-charged[name]+back, st.Remaining, 1e-6,
				"seed %d: %s holds its capacity less the charges plus what the settlements taken handed back", seed, name)
		}
	}
}
