package memstore_test

import (
	"context"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// TestDecideBadCountWritesNumbersAsAUserDoes: Decide's error for a count
// no op carries writes the count and the bounds as a user writes them,
// as the library's errors do: %v wrote 1e+300, 1e-08 and 1e+15.
func TestDecideBadCountWritesNumbersAsAUserDoes(t *testing.T) {
	s, err := memstore.New()
	require.NoError(t, err)
	b := s.Bind("numtext", driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}, func(string) int64 { return 0 })
	_, err = b.Decide(context.Background(), "k", driver.ModeLimit, 0, 1e300, false)
	require.ErrorIs(t, err, driver.ErrInvalidOp)
	require.ErrorContains(t, err, "with a count of 1e300: give a time within ±driver.MaxTime "+
		"and a count of 0 or from ratelimit.MinCount (1e-8) to ratelimit.MaxTokens (1000000000000000)")
}
