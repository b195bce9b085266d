package ratelimitprom_test

import (
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ratelimit-go/ratelimit"
	ratelimitprom "github.com/ratelimit-go/ratelimit/contrib/prometheus"
	"github.com/ratelimit-go/ratelimit/internal/doctest"
	"github.com/stretchr/testify/require"
)

// The example of docs/integrations.md that uses this module, word for
// word, so that the compiler checks it (package doctest): the body of an
// integrationsDoc function, but its final return.

func integrationsDocCollector(store ratelimit.Store, limits ratelimit.Limits) (*ratelimit.Limiter, error) {
	c, err := ratelimitprom.NewCollector()
	if err != nil {
		return nil, err // a nil Option, or one Prometheus would refuse: errors.Is(err, ratelimitprom.ErrInvalidOption)
	}
	if err := prometheus.Register(c); err != nil {
		return nil, err // its metrics are registered already
	}
	lim, err := ratelimit.New(store, limits, ratelimit.WithObserver(c))
	if err != nil {
		return nil, err
	}
	return lim, nil
}

var _ = integrationsDocCollector

// The Prometheus block of docs/integrations.md is the integrationsDoc
// function's body. It assigned err twice and read it never: a failed
// NewCollector went on to register a nil collector.
func TestIntegrationsDocExamples(t *testing.T) {
	require.Equal(t, doctest.Bodies(t, "integrationsDoc", "doc_test.go"),
		doctest.Blocks(t, filepath.Join("..", "..", "docs", "integrations.md"), doctest.IntegrationsSections["prometheus"]...))
}
