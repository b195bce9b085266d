package httplimit_test

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// A limit that can never grant a request says how much it grants at once
// as a user writes it, as the library's errors do: %v wrote 1e-05.
func TestNeverGrantsWritesTheNumberAsAUserDoes(t *testing.T) {
	lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"slow": {Kind: ratelimit.TokenBucket, Rate: 1e-5, Period: time.Second, Capacity: 1e-5},
	}))
	_, err := httplimit.New(lim, []string{"slow"})
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	require.ErrorContains(t, err, `limit "slow" can never grant a request: a request costs 1 token and the limit grants at most 1e-5 at once`)
}
