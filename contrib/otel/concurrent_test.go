package ratelimitotel_test

import (
	"context"
	"testing"

	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/internal/observetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Decisions of more limits than the Observer keeps attribute sets of, and
// jobs, from many goroutines while the reader collects, are each recorded
// once, on a set of their own limit (run with -race).
func TestObserverConcurrent(t *testing.T) {
	ctx := context.Background()
	reader, mp := newReader(t)
	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	require.NoError(t, err)
	const workers, names = 4, 1100 // past the sets kept built
	observetest.Concurrently(obs, secretKey, workers, names, 3, func() {
		var rm metricdata.ResourceMetrics
		assert.NoError(t, reader.Collect(ctx, &rm))
	})

	sm := collect(t, reader)
	got := counts(t, sm)
	assert.Len(t, got, names)
	for k, v := range got {
		assert.Equal(t, int64(workers), v, k)
	}
	jobs := find(t, sm, "ratelimit.afterfunc.jobs").Data.(metricdata.Sum[int64])
	require.Len(t, jobs.DataPoints, 1)
	assert.Equal(t, int64(workers*11), jobs.DataPoints[0].Value)
	hist := find(t, sm, "ratelimit.decision.duration")
	assert.Equal(t, "s", hist.Unit, "seconds, as the semantic conventions spell a duration")
	assert.Equal(t, "{decision}", find(t, sm, "ratelimit.decisions").Unit)
	noKey(t, sm)
}
