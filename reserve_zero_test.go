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
