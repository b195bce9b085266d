package ratelimitotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// A decision during which the Limiter's clock stepped back (a clock of
// WithClock that follows the wall clock's corrections) took no time: it
// is recorded as 0 s. Recorded as it came, a negative time, it took from
// the histogram's sum, which backends read as growing only.
func TestObserverDurationClockStepsBack(t *testing.T) {
	ctx := context.Background()
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	require.NoError(t, err)
	mock := clock.NewMock()
	mock.Set(time.Unix(1_700_000_000, 0))
	store := &slowStore{Store: must(memstore.New()), mock: mock}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, ratelimit.WithObserver(obs), ratelimit.WithClock(mock))
	require.NoError(t, err)
	for _, d := range []time.Duration{3 * time.Millisecond, -time.Second} {
		store.delay = d
		_, err := lim.Limit(ctx, "api", secretKey)
		require.NoError(t, err)
	}
	h, ok := find(t, collect(t, reader), "ratelimit.decision.duration").Data.(metricdata.Histogram[float64])
	require.True(t, ok)
	require.Len(t, h.DataPoints, 1)
	p := h.DataPoints[0]
	assert.Equal(t, uint64(2), p.Count)
	assert.InDelta(t, 0.003, p.Sum, 1e-9)
	assert.Equal(t, uint64(1), p.BucketCounts[0], "0 s falls in the first bucket")
}
