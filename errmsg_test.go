package ratelimit_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The numbers of a config's or a count's error read as a user writes
// them: %v wrote 1e300 as 1e+300, and 8388607 as 8.388607e+06.
func TestErrorNumbersAsWritten(t *testing.T) {
	err := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1e300, Period: time.Second}.Validate()
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	assert.EqualError(t, err, "ratelimit: invalid config: Rate is 1e300: it must be a number of tokens from 1e-9 to 1000000000000000")

	err = ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 8388607.5, MaxReserved: 1}.Validate()
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	assert.EqualError(t, err, "ratelimit: invalid config: MaxReserved is 1 and Capacity 8388607.5: above 8388608 tokens together, "+
		"a fraction of a token is finer than a decision resolves, and a reservation of Capacity plus MaxReserved would be refused forever: "+
		"make both whole numbers of tokens, or keep their sum at most 8388608")

	lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"big": {Kind: ratelimit.TokenBucket, Rate: 8388607, Period: time.Second, MaxReserved: 1e14},
	}, ratelimit.WithClock(newMock())))
	_, err = lim.Limit(context.Background(), "big", "k", ratelimit.Count(8388608))
	var ce *ratelimit.CountError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "ratelimit: limit \"big\": count 8388608 exceeds 8388607, the most the limit can grant at once: "+
		"raise Capacity, split the call, or ask with WithReserve()", err.Error())
	_, err = lim.Limit(context.Background(), "big", "k", ratelimit.Count(1.5e20), ratelimit.WithReserve())
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
	assert.Equal(t, "ratelimit: limit \"big\": count 1.5e20 exceeds 1000000000000000, the most tokens one call may ask for: split the call", err.Error())
}

// A count that is no number ≥ 0 is told what it is: negative, not a
// number, or infinite. "-1e300 is not a finite number ≥ 0" read as if
// -1e300 were not finite.
func TestCountErrorSaysWhatIsWrong(t *testing.T) {
	ctx := context.Background()
	lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(newMock())))
	for count, want := range map[float64]string{
		-1e300:       "count -1e300 is negative: ",
		-1:           "count -1 is negative: ",
		math.Inf(-1): "count -Inf is negative: ",
		math.NaN():   "count NaN is not a number: ",
		math.Inf(1):  "count +Inf is infinite: ",
	} {
		_, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(count))
		require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
		assert.Equal(t, `ratelimit: limit "jobs": `+want+"a count is a number from 0 to 1000000000000000", err.Error())
		assert.NotContains(t, err.Error(), "finite number")
	}
	res, err := lim.Limit(ctx, "jobs", "k", ratelimit.WithReceipt())
	require.NoError(t, err)
	err = lim.Settle(ctx, res.Token, -1e300)
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
	assert.EqualError(t, err, "ratelimit: count -1e300 used, given to Settle, is negative: give the tokens the job used, a number ≥ 0 (0 hands them all back)")
	err = lim.Settle(ctx, res.Token, math.NaN())
	assert.EqualError(t, err, "ratelimit: count NaN used, given to Settle, is not a number: give the tokens the job used, a number ≥ 0 (0 hands them all back)")
}
