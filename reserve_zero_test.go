package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every method of the zero Reservation, which no Reserve made and which
// knows no Limiter, answers without a panic: a refused reservation that
// holds nothing; Wait and AfterFunc say it is no Reservation to use.
func TestZeroReservation(t *testing.T) {
	ctx := context.Background()
	var r ratelimit.Reservation
	assert.False(t, r.OK())
	assert.Equal(t, ratelimit.Result{}, r.Result())
	assert.True(t, r.Time().IsZero())
	assert.Equal(t, time.Duration(0), r.Delay())
	assert.Nil(t, r.Token())
	assert.NoError(t, r.Cancel(ctx), "nothing to hand back")

	err := r.Wait(ctx)
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.NotErrorIs(t, err, ratelimit.ErrLimited, "not refused by a limit: no limit was called")

	ran, dropped := false, false
	stop, err := r.AfterFunc(func() { ran = true }, ratelimit.OnDropped(func(error) { dropped = true }))
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.NotErrorIs(t, err, ratelimit.ErrLimited)
	require.NotNil(t, stop)
	assert.False(t, stop(ctx), "nothing was scheduled")
	assert.False(t, ran)
	assert.False(t, dropped)

	// Nothing changed: the same answers again.
	assert.NoError(t, r.Cancel(ctx))
	assert.Equal(t, time.Duration(0), r.Delay())
	assert.Nil(t, r.Token())
}

// A nil *Reservation, as Reserve returns beside an error, answers as the
// zero Reservation does: a caller that reaches it (a deferred Cancel
// written before the error was checked, a Wait on a Reservation kept from
// a failed Reserve) gets no tokens and an error, not a panic of a nil
// receiver.
func TestNilReservation(t *testing.T) {
	ctx := context.Background()
	var r *ratelimit.Reservation
	require.NotPanics(t, func() {
		assert.False(t, r.OK())
		assert.Equal(t, ratelimit.Result{}, r.Result())
		assert.True(t, r.Time().IsZero())
		assert.Equal(t, time.Duration(0), r.Delay())
		assert.Nil(t, r.Token())
		assert.NoError(t, r.Cancel(ctx), "nothing to hand back")
	})

	var err error
	require.NotPanics(t, func() { err = r.Wait(ctx) })
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.NotErrorIs(t, err, ratelimit.ErrLimited)
	assert.ErrorContains(t, err, "nil")

	ran, dropped := false, false
	var stop func(context.Context) bool
	require.NotPanics(t, func() {
		stop, err = r.AfterFunc(func() { ran = true }, ratelimit.OnDropped(func(error) { dropped = true }))
	})
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	require.NotNil(t, stop)
	assert.False(t, stop(ctx), "nothing was scheduled")
	assert.False(t, ran)
	assert.False(t, dropped)
}

// The Reservation that Reserve returns beside an error that is not the
// store's (a done context here) is nil, and answers as the zero one.
func TestReserveErrorReservationAnswers(t *testing.T) {
	lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, err := lim.Reserve(ctx, "jobs", "k")
	require.ErrorIs(t, err, context.Canceled)
	require.NotPanics(t, func() {
		assert.False(t, r.OK())
		assert.NoError(t, r.Cancel(context.Background()))
		assert.ErrorIs(t, r.Wait(context.Background()), ratelimit.ErrInvalidOption)
	})
}
