package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// faultStore fails the settlements it is told to: before the store
// decides them (the request lost), or after (the reply lost).
// It counts, for each token ID, the first settlements the store took,
// and what they handed back.
type faultStore struct {
	ratelimit.Store
	fault int // 0: none; 1: the request lost; 2: the reply lost
	taken map[[16]byte]int
	back  map[[16]byte]float64
}

func (s *faultStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if s.fault == 1 {
		return errors.New("connection refused: the request was lost")
	}
	if err := s.Store.Apply(ctx, op, out); err != nil {
		return err
	}
	if op.Settle != nil && out[0].Settled == 0 {
		s.taken[op.Settle.ID]++
		for i := range op.Items {
			s.back[op.Settle.ID] -= out[i].Charged[0]
		}
	}
	if s.fault == 2 {
		return errors.New("connection reset: the reply was lost")
	}
	return nil
}

// Tokens settled every way, again and again, from three processes, the
// Reservation's owner among them, with requests and replies lost at
// random: the store takes one settlement of each token at most, handing
// back no more than it charged; one settler at most is told it settled
// the token (a job runs once, or its tokens come back once, never both,
// never twice), and what it was told is what the store did.
func TestSettlementsWithLostRepliesSettleOnce(t *testing.T) {
	ctx := context.Background()
	done, cancel := context.WithCancel(ctx)
	cancel()
	const tokens = 24
	for seed := range 6 {
		rng := rand.New(rand.NewPCG(uint64(seed), 0x5e77))
		store := &faultStore{Store: must(memstore.New()), taken: map[[16]byte]int{}, back: map[[16]byte]float64{}}
		limits := ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 1000, Capacity: 1000, Period: time.Hour, Start: t0}}
		var lims [3]*ratelimit.Limiter
		for i := range lims {
			lims[i] = must(ratelimit.New(store, limits, ratelimit.WithClock(newMock())))
		}
		owner := lims[0]
		value := func() float64 {
			store.fault = 0
			st, err := owner.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			return st.Remaining
		}
		var (
			rs      [tokens]*ratelimit.Reservation
			toks    [tokens]*ratelimit.Token
			amounts [tokens]float64
			// winners[i]: who settled token i, by a nil answer, and what
			// each handed back.
			winners [tokens]map[string]float64
		)
		for i := range rs {
			amounts[i] = float64(1 + rng.IntN(5))
			r, err := owner.Reserve(ctx, "jobs", "k", ratelimit.Count(amounts[i]))
			require.NoError(t, err)
			require.True(t, r.OK())
			rs[i] = r
			toks[i] = must(ratelimit.ParseToken(r.Token().String()))
			winners[i] = map[string]float64{}
		}
		base := value()
		attempt := [16]byte{0xa7}
		for step := range 600 {
			i := rng.IntN(tokens)
			lim := lims[rng.IntN(len(lims))]
			store.fault = []int{0, 0, 1, 2}[rng.IntN(4)]
			var (
				who  string
				back float64
				err  error
			)
			switch op := rng.IntN(8); op {
			case 0:
				who, err = fmt.Sprintf("Use %d", step), lim.Use(ctx, toks[i])
			case 1:
				// One job attempt, retried from any process.
				who, err = "Use by the attempt", lim.Use(ctx, toks[i], ratelimit.Settler(attempt))
			case 2:
				who, back, err = fmt.Sprintf("Refund %d", step), amounts[i], lim.Refund(ctx, toks[i])
			case 3:
				who, back, err = "Refund by the attempt", amounts[i], lim.Refund(ctx, toks[i], ratelimit.Settler(attempt))
			case 4:
				used := float64(rng.IntN(3))
				who, back, err = fmt.Sprintf("Settle %d", step), max(amounts[i]-used, 0), lim.Settle(ctx, toks[i], used)
			case 5:
				who, back, err = "the Reservation's Cancel", amounts[i], rs[i].Cancel(ctx)
			case 6:
				who, err = "the Reservation's Wait", rs[i].Wait(ctx)
			case 7:
				// Gives up at once, and hands the tokens back.
				who, back, err = "the Reservation's Cancel", amounts[i], rs[i].Wait(done)
				if errors.Is(err, context.Canceled) && strings.Contains(err.Error(), "its tokens were handed back") {
					err = nil // by this Wait, as its message says
				}
			}
			if err != nil {
				continue
			}
			winners[i][who] = back
			require.LessOrEqual(t, len(winners[i]), 1, "seed %d step %d: token %d settled by %v", seed, step, i, winners[i])
		}
		want := base
		for i, tok := range toks {
			id := tok.ID()
			require.LessOrEqual(t, store.taken[id], 1, "seed %d: token %d settled %d times", seed, i, store.taken[id])
			require.LessOrEqual(t, store.back[id], amounts[i], "seed %d: token %d handed back more than it charged", seed, i)
			for who, back := range winners[i] {
				require.Equal(t, back, store.back[id], "seed %d: token %d: %s was told it won, and handed back", seed, i, who)
			}
			want += store.back[id]
		}
		require.Equal(t, want, value(), "seed %d: the record holds what the settlements taken handed back", seed)
	}
}
