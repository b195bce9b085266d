package ratelimitgrpc_test

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// A limit that can never grant a call says how much it grants at once as
// a user writes it, as the library's errors do: %v wrote 1e-05.
func TestNeverGrantsWritesTheNumberAsAUserDoes(t *testing.T) {
	lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"slow": {Kind: ratelimit.TokenBucket, Rate: 1e-5, Period: time.Second, Capacity: 1e-5},
	}))
	_, err := ratelimitgrpc.New(lim, []string{"slow"})
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	require.ErrorContains(t, err, `limit "slow" can never grant a call: a call costs 1 token and the limit grants at most 1e-5 at once`)
}
