package ratelimitotel_test

import (
	"path/filepath"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/internal/doctest"
	"github.com/stretchr/testify/require"
)

// The examples of docs/integrations.md that use this module, word for
// word, so that the compiler checks them (package doctest): each is the
// body of an integrationsDoc function, but its final return.

func integrationsDocObserver(store ratelimit.Store, limits ratelimit.Limits) (*ratelimit.Limiter, error) {
	obs, err := ratelimitotel.NewObserver() // the global MeterProvider
	if err != nil {
		return nil, err // a nil Option or provider: errors.Is(err, ratelimitotel.ErrInvalidOption)
	}
	lim, err := ratelimit.New(store, limits, ratelimit.WithObserver(obs))
	if err != nil {
		return nil, err
	}
	return lim, nil
}

func integrationsDocWrapStore(store ratelimit.Store, limits ratelimit.Limits) (*ratelimit.Limiter, error) {
	lim, err := ratelimit.New(ratelimitotel.WrapStore(store), limits) // the global TracerProvider
	if err != nil {
		return nil, err
	}
	return lim, nil
}

var _ = []any{integrationsDocObserver, integrationsDocWrapStore}

// The OpenTelemetry blocks of docs/integrations.md are the
// integrationsDoc functions' bodies. They assigned err twice and read it
// never: a failed NewObserver went on to ratelimit.New with a nil
// observer.
func TestIntegrationsDocExamples(t *testing.T) {
	require.Equal(t, doctest.Bodies(t, "integrationsDoc", "doc_test.go"),
		doctest.Blocks(t, filepath.Join("..", "..", "docs", "integrations.md"), doctest.IntegrationsSections["otel"]...))
}
