package memstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// A bound limit decides as Apply does, bit for bit, the remembered
// refusals included: random params (fractional rates, periods of a
// millisecond, a rate of 1e15), phases, counts, modes and reservations,
// on two keys, at times that repeat, step forward and back by up to
// three periods, and jump by 2^16 ms (the memo's elapsed time wraps).
// The stores' sweeps judge records at the first call's time plus the time
// elapsed on the store's clock since; the clocks step far back after the
// first call, so that no sweep drops a record: once the calls' clock has
// stepped back, two stores that drop records in different orders may
// answer a call differently.
func TestBoundDecidesAsApply(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(400) {
		rng := rand.New(rand.NewPCG(seed, 99))
		p := driver.Params{
			Kind:   []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket}[rng.IntN(2)],
			Rate:   []float64{1, 3, 0.1, 1.0 / 3, 7.5, 1e9, 1e-9, 1e15, 0.7}[rng.IntN(9)],
			Period: []int64{1, 2, 7, 1000, 60_000, 86_400_000}[rng.IntN(6)],
		}
		p.Capacity = min(p.Rate*[]float64{1, 1.5, 3, 0.25, 2.5}[rng.IntN(5)], ratelimit.MaxTokens)
		if rng.IntN(3) == 0 {
			p.MaxReserved = min(p.Capacity*float64(rng.IntN(3)), ratelimit.MaxTokens)
		}
		phase := int64(0)
		if p.Kind == ratelimit.FixedWindow {
			phase = rng.Int64N(p.Period)
		}
		c1, c2 := newStepClock(0), newStepClock(0)
		s := must(memstore.New(memstore.WithClock(c1)))
		ref := must(memstore.New(memstore.WithClock(c2)))
		b := s.Bind("l", p, func(string) int64 { return phase })
		q := p
		q.Phase = phase
		now := int64(1_700_000_000_000)
		for i := range 400 {
			switch rng.IntN(6) {
			case 0:
				now += rng.Int64N(3)
			case 1:
				now -= rng.Int64N(5) + int64(rng.IntN(2))*rng.Int64N(3*p.Period)
			case 2:
				now += rng.Int64N(2 * p.Period)
			case 3:
				now += 1 << 16
			}
			count := 1.0
			if rng.IntN(5) == 0 {
				count = []float64{0, 0.5, 2, p.Capacity, 1e-8}[rng.IntN(5)]
			}
			if count > 0 && count < ratelimit.MinCount {
				count = 0
			}
			reserve := rng.IntN(6) == 0
			mode := driver.ModeLimit
			if rng.IntN(4) == 0 {
				mode = driver.ModeCheck
			}
			key := fmt.Sprint("k", rng.IntN(2))
			v, err := b.Decide(ctx, key, mode, now, count, reserve)
			require.NoError(t, err)
			out := make([]driver.Decision, 1)
			op := &driver.Op{Mode: mode, Now: now, Reserve: reserve, Items: []driver.Item{{Name: "l", Key: key, Count: count, Shards: []driver.Shard{{Params: q}}}}}
			require.NoError(t, ref.Apply(ctx, op, out))
			if i == 0 { // the stores anchored their clocks: step them far back
				c1.ms.Store(-1e15)
				c2.ms.Store(-1e15)
			}
			require.Equal(t, out[0], v.Decision(now, count), "seed %d step %d params %+v", seed, i, q)
		}
	}
}
