package ratelimitprom_test

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ratelimit-go/ratelimit"
	ratelimitprom "github.com/ratelimit-go/ratelimit/contrib/prometheus"
	"github.com/ratelimit-go/ratelimit/internal/observetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Collector registered twice, or two Collectors of the same names on one
// registry (two Limiters in one process), are refused by the registry with
// AlreadyRegisteredError, not exported twice; const labels that tell the
// Limiters apart let both register, each with its own series.
func TestCollectorRegisteredTwice(t *testing.T) {
	c, reg := newCollector(t)
	var already prometheus.AlreadyRegisteredError
	require.ErrorAs(t, reg.Register(c), &already)

	other := must(ratelimitprom.NewCollector())
	require.ErrorAs(t, reg.Register(other), &already)

	reg = prometheus.NewPedanticRegistry()
	a := must(ratelimitprom.NewCollector(ratelimitprom.WithConstLabels(prometheus.Labels{"limiter": "a"})))
	b := must(ratelimitprom.NewCollector(ratelimitprom.WithConstLabels(prometheus.Labels{"limiter": "b"})))
	require.NoError(t, reg.Register(a))
	require.NoError(t, reg.Register(b))
	ctx := context.Background()
	a.Observe(ctx, ratelimit.Event{Result: ratelimit.Result{Name: "api", Key: secretKey, OK: true}, Outcome: ratelimit.Allowed})
	b.Observe(ctx, ratelimit.Event{Result: ratelimit.Result{Name: "api", Key: secretKey}, Outcome: ratelimit.Denied})
	assert.Equal(t, 2, testutil.CollectAndCount(reg, "ratelimit_decisions_total"))
	noKey(t, reg)
}

// Decisions of more limits than the Collector keeps series of, from many
// goroutines while the registry gathers, count each once (run with -race).
func TestCollectorConcurrent(t *testing.T) {
	c, reg := newCollector(t)
	const workers, names = 4, 1100 // past the series kept found
	observetest.Concurrently(c, secretKey, workers, names, 5, func() {
		_, err := reg.Gather()
		assert.NoError(t, err)
	})
	assert.Equal(t, names, testutil.CollectAndCount(c, "ratelimit_decisions_total"))
	assert.InDelta(t, float64(workers*names), sumCounter(t, reg, "ratelimit_decisions_total"), 0)
	assert.InDelta(t, float64(workers*11), sumCounter(t, reg, "ratelimit_afterfunc_jobs_total"), 0)
	noKey(t, reg)
}

func sumCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// Options Prometheus would refuse at registration, or at the first
// decision with a panic, are refused by NewCollector.
func TestCollectorRefusesHostileOptions(t *testing.T) {
	for name, opts := range map[string][]ratelimitprom.Option{
		"const label value not UTF-8": {ratelimitprom.WithConstLabels(prometheus.Labels{"service": "\xff"})},
		"const label named limit":     {ratelimitprom.WithConstLabels(prometheus.Labels{ratelimitprom.LabelLimit: "x"})},
		"const label reserved":        {ratelimitprom.WithConstLabels(prometheus.Labels{"__name__": "x"})},
		"namespace with a dash":       {ratelimitprom.WithNamespace("rate-limit")},
		"subsystem with a space":      {ratelimitprom.WithSubsystem("a b")},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ratelimitprom.NewCollector(opts...)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ratelimitprom.ErrInvalidOption), "got %v", err)
		})
	}
}
