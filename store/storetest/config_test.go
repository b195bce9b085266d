package storetest

import (
	"math/rand/v2"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

// Every config the Limiter differential draws is one ratelimit.New takes,
// however many seeds a store runs (DifferentialRuns): at seed 42, past the
// default 40, it drew a limit of 4 shards whose unset capacity left a call
// half a token, which New refuses, and the differential failed on every
// store that ran more seeds.
func TestRandomConfigsAreValid(t *testing.T) {
	for seed := range 2000 {
		rng := rand.New(rand.NewPCG(uint64(seed), 0x11))
		cfg := randomConfig(rng)
		_, err := ratelimit.New(NewModel(), ratelimit.Limits{"L": cfg})
		require.NoError(t, err, "seed %d: %+v", seed, cfg)
	}
}
