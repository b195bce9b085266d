package ratelimit_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A nil Option (an option variable never set, a slice of options with a
// hole) made New panic with a nil dereference that named nothing; a clock
// or shard source holding a nil pointer was taken, and the first call
// panicked on it. Each is an error matching ErrInvalidOption, which names
// what was wrong.
func TestNewRefusesNilOptionArguments(t *testing.T) {
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, Shards: 4}}
	for _, tt := range []struct {
		name string
		opt  ratelimit.Option
		says string
	}{
		{"nil option", nil, "nil Option"},
		{"nil mock clock", ratelimit.WithClock((*clock.Mock)(nil)), "WithClock"},
		{"nil source", ratelimit.WithRand((*rand.PCG)(nil)), "WithRand"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() {
				var lim *ratelimit.Limiter
				lim, err = ratelimit.New(must(memstore.New()), limits, ratelimit.WithBreaker(0, 0), tt.opt)
				if err == nil {
					_, err = lim.Limit(context.Background(), "l", "k")
				}
			})
			require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
			assert.Contains(t, err.Error(), tt.says)
		})
	}
	// A plain nil source is the default, as leaving WithRand out.
	lim, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithRand(nil))
	require.NoError(t, err)
	_, err = lim.Limit(context.Background(), "l", "k")
	require.NoError(t, err)
}
