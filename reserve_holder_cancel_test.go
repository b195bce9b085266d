package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// Reservation.Cancel's promise: if a holder of the token settled it
// first, Cancel returns a *SettledError, matching ErrReservationUsed when
// the token was used, "and so does every Cancel after it, also when a
// Wait or an AfterFunc found the holder's mark first". A Cancel after a
// Wait, an AfterFunc or an earlier Cancel had found the holder's use
// returned a bare ErrReservationUsed, as after the reservation's own job
// ran: no *SettledError, not ErrAlreadySettled, nothing to tell the
// caller that the job was the holder's.
func TestCancelAfterAHolderUsedTheTokenSaysSoEveryTime(t *testing.T) {
	ctx := context.Background()
	for _, first := range []string{"Wait", "AfterFunc", "Cancel"} {
		t.Run(first, func(t *testing.T) {
			mock := newMock()
			store := must(memstore.New())
			limits := ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0}}
			owner := must(ratelimit.New(store, limits, ratelimit.WithClock(mock)))
			worker := must(ratelimit.New(store, limits, ratelimit.WithClock(mock)))
			r, err := owner.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
			require.NoError(t, err)
			require.NoError(t, worker.Use(ctx, r.Token()), "the worker runs the job")
			switch first {
			case "Wait":
				require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationUsed)
			case "AfterFunc":
				dropped := make(chan error, 1)
				_, err := r.AfterFunc(func() { t.Error("AfterFunc ran the worker's job") },
					ratelimit.OnDropped(func(err error) { dropped <- err }))
				require.NoError(t, err)
				mock.Add(0)
				require.ErrorIs(t, <-dropped, ratelimit.ErrReservationUsed)
			}
			for i := range 3 {
				err := r.Cancel(ctx)
				var se *ratelimit.SettledError
				require.ErrorAs(t, err, &se, "Cancel %d after the holder's use found by %s: %v", i, first, err)
				require.Equal(t, driver.SettleUse, se.Kind)
				require.ErrorIs(t, err, ratelimit.ErrReservationUsed)
				require.ErrorIs(t, err, ratelimit.ErrAlreadySettled)
				require.ErrorContains(t, err, "holder")
			}
		})
	}
}

// A mark of a kind no Limiter writes says the token is settled, and not
// how: the Wait that finds it does not say canceled (TestSettledOfAnUnknownKind),
// and neither does any Wait, AfterFunc or Cancel after it. A second Wait
// said the reservation was canceled (a bare ErrReservationCanceled), which
// nobody did, that the mark can tell.
func TestUnknownMarkIsReportedAlikeEveryTime(t *testing.T) {
	ctx := context.Background()
	lim := jobsLimiter(&settledAsStore{Store: must(memstore.New()), kind: 3})
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.WithReceipt())
	require.NoError(t, err)
	afterFunc := func() error {
		_, err := r.AfterFunc(func() { t.Error("the job ran") })
		return err
	}
	for i := range 3 {
		for _, c := range []struct {
			what string
			call func() error
		}{{"Wait", func() error { return r.Wait(ctx) }}, {"Cancel", func() error { return r.Cancel(ctx) }}, {"AfterFunc", afterFunc}} {
			err := c.call()
			require.ErrorIs(t, err, ratelimit.ErrAlreadySettled, "%s %d", c.what, i)
			require.NotErrorIs(t, err, ratelimit.ErrReservationCanceled, "%s %d: %v", c.what, i, err)
			require.NotErrorIs(t, err, ratelimit.ErrReservationUsed, "%s %d: %v", c.what, i, err)
		}
	}
}
