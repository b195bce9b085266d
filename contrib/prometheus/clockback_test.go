package ratelimitprom_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ratelimit-go/ratelimit"
	ratelimitprom "github.com/ratelimit-go/ratelimit/contrib/prometheus"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// A decision during which the Limiter's clock stepped back (a clock of
// WithClock that follows the wall clock's corrections) took no time: it
// is recorded as 0 s, in the first bucket. Recorded as it came, a
// negative time, it took from the histogram's sum, which Prometheus
// reads as a counter: a sum that goes down is a reset, and rate() of it
// then counts the whole sum again.
func TestCollectorDurationClockStepsBack(t *testing.T) {
	ctx := context.Background()
	c, reg := newCollector(t, ratelimitprom.WithBuckets([]float64{0.001, 0.01}))
	mock := clock.NewMock()
	mock.Set(time.Unix(1_700_000_000, 0))
	store := &slowStore{Store: must(memstore.New()), mock: mock}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, ratelimit.WithObserver(c), ratelimit.WithClock(mock))
	require.NoError(t, err)
	for _, d := range []time.Duration{3 * time.Millisecond, -time.Second} {
		store.delay = d
		_, err := lim.Limit(ctx, "api", secretKey)
		require.NoError(t, err)
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP ratelimit_decision_duration_seconds Time a rate limit decision took, on the Limiter's clock.
# TYPE ratelimit_decision_duration_seconds histogram
ratelimit_decision_duration_seconds_bucket{allowed="true",check="false",limit="api",local="false",outcome="allowed",le="0.001"} 1
ratelimit_decision_duration_seconds_bucket{allowed="true",check="false",limit="api",local="false",outcome="allowed",le="0.01"} 2
ratelimit_decision_duration_seconds_bucket{allowed="true",check="false",limit="api",local="false",outcome="allowed",le="+Inf"} 2
ratelimit_decision_duration_seconds_sum{allowed="true",check="false",limit="api",local="false",outcome="allowed"} 0.003
ratelimit_decision_duration_seconds_count{allowed="true",check="false",limit="api",local="false",outcome="allowed"} 2
`), "ratelimit_decision_duration_seconds"))
}
