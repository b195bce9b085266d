package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// Reservations at the bounds of the config space (the least and the
// greatest Rate, Period, Capacity and MaxReserved, fractions, 2 and
// MaxShards shards) and of the counts (0, the least fraction, a whole
// bucket, the most a reservation may owe, MaxTokens, and past it, NaN and
// ∞): Reserve answers with a Reservation or an error matching
// ErrInvalidCount, never a panic; a granted one runs no earlier than now,
// its token reads back and is settled by a second Limiter on the same
// store, and that refund, in the reservation's own millisecond, leaves
// the record as it was before the reservation; a Wait whose deadline
// comes before the job's time gives up at once and hands the tokens back.
func TestReservationsAtTheBounds(t *testing.T) {
	ctx := context.Background()
	type cfgCase struct {
		kind               ratelimit.Kind
		rate, capa, maxRes float64
		period             time.Duration
		shards             int
	}
	var cfgs []cfgCase
	for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
		for _, rp := range []struct {
			rate   float64
			period time.Duration
		}{{1e-9, ratelimit.MaxPeriod}, {1e-9, time.Millisecond}, {0.3, time.Second}, {ratelimit.MaxTokens, time.Millisecond}, {ratelimit.MaxTokens, ratelimit.MaxPeriod}} {
			for _, shards := range []int{1, 2, ratelimit.MaxShards} {
				for _, cm := range [][2]float64{{0, 0}, {1, 0.5}, {ratelimit.MaxTokens, ratelimit.MaxTokens}, {2.5, 1e-3}} {
					capa := cm[0]
					if capa == 0 && rp.rate < 1 {
						capa = 1 // a Rate below 1 needs a Capacity
					}
					c := cfgCase{kind, rp.rate, capa, cm[1], rp.period, shards}
					if shards > 1 && ((capa != 0 && capa/float64(shards) < 1e-9) || (cm[1] != 0 && cm[1]/float64(shards) < 1e-9)) {
						continue
					}
					cfgs = append(cfgs, c)
				}
			}
		}
	}
	counts := []float64{0, 1e-9, 0.5, 1, 2.5, 3.5, 1e6, ratelimit.MaxTokens / 2, ratelimit.MaxTokens, math.Nextafter(ratelimit.MaxTokens, math.Inf(1)), 2 * ratelimit.MaxTokens, math.Inf(1), math.NaN(), -1, math.Copysign(0, -1)}
	for ci, c := range cfgs {
		cfg := ratelimit.Config{Kind: c.kind, Rate: c.rate, Period: c.period, Capacity: c.capa, MaxReserved: c.maxRes, Shards: c.shards, Start: t0}
		store := must(memstore.New())
		mock := newMock()
		lim, err := ratelimit.New(store, ratelimit.Limits{"x": cfg}, ratelimit.WithClock(mock))
		if err != nil {
			var ce *ratelimit.ConfigError
			require.ErrorAs(t, err, &ce, "config %d %+v", ci, cfg)
			continue
		}
		other := must(ratelimit.New(store, ratelimit.Limits{"x": cfg}, ratelimit.WithClock(mock)))
		for ki, count := range counts {
			key := fmt.Sprintf("k%d", ki)
			why := fmt.Sprintf("config %d %+v, count %v", ci, cfg, count)
			// Half the bucket taken first, so that counts go into debt.
			if _, err := lim.Limit(ctx, "x", key, ratelimit.Count(cfg.Rate/4)); err != nil {
				require.ErrorIs(t, err, ratelimit.ErrInvalidCount, why)
			}
			before, err := lim.Value(ctx, "x", key)
			require.NoError(t, err, why)
			r, err := lim.Reserve(ctx, "x", key, ratelimit.Count(count), ratelimit.WithReceipt())
			if err != nil {
				require.Nil(t, r, why)
				require.ErrorIs(t, err, ratelimit.ErrInvalidCount, why)
				continue
			}
			if !r.OK() {
				require.GreaterOrEqual(t, r.Result().RetryAfter, time.Duration(0), why)
				require.NoError(t, r.Cancel(ctx), why)
				continue
			}
			require.False(t, r.Time().Before(mock.Now()), why)
			after, err := lim.Value(ctx, "x", key)
			require.NoError(t, err, why)
			tok := r.Token()
			require.NotNil(t, tok, why)
			back, err := ratelimit.ParseToken(tok.String())
			require.NoError(t, err, why)
			require.Equal(t, tok.Charged("x"), back.Charged("x"), why)
			require.InDelta(t, count, back.Charged("x"), count*1e-12, why)
			// A Wait whose deadline comes first gives up at once, and
			// hands the tokens back; or, when the job may run now, the
			// second Limiter's Refund does.
			if r.Delay() > 0 {
				wctx, cancel := mock.WithTimeout(ctx, r.Delay()/2)
				err := r.Wait(wctx)
				cancel()
				require.ErrorIs(t, err, context.DeadlineExceeded, why)
				require.NotErrorIs(t, err, ratelimit.ErrNotRefunded, why)
				require.ErrorIs(t, other.Refund(ctx, back), ratelimit.ErrReservationCanceled, why)
			} else {
				require.NoError(t, other.Refund(ctx, back), why)
				require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled, why)
			}
			if err := r.Cancel(ctx); err != nil {
				require.ErrorIs(t, err, ratelimit.ErrReservationCanceled, why) // the holder's
			}
			restored, err := lim.Value(ctx, "x", key)
			require.NoError(t, err, why)
			tol := 1e-9 * max(math.Abs(before.Remaining), count, 1)
			require.InDelta(t, before.Remaining, restored.Remaining, tol, "%s: before %v, reserved %v, after the refund %v", why, before.Remaining, after.Remaining, restored.Remaining)
			if errors.Is(r.Wait(ctx), nil) {
				t.Fatalf("%s: a canceled reservation's Wait returned nil", why)
			}
		}
	}
}
