package ratelimitotel_test

import (
	"context"
	"fmt"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Decisions counted by limit and outcome, and a span around every store
// call. (A ManualReader and an in-memory exporter stand in for the
// exporters of production, which leaves out both providers and uses the
// global ones; the mock clock makes the output repeatable.)
func Example() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))

	obs, err := ratelimitotel.NewObserver(ratelimitotel.WithMeterProvider(mp))
	if err != nil {
		panic(err)
	}
	mem, err := memstore.New()
	if err != nil {
		panic(err)
	}
	store := ratelimitotel.WrapStore(mem, ratelimitotel.WithTracerProvider(tp))
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute},
	}, ratelimit.WithObserver(obs), ratelimit.WithClock(clock.NewMock()))
	if err != nil {
		panic(err)
	}
	for range 3 {
		if _, err := lim.Limit(ctx, "api", "user-42"); err != nil {
			panic(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, p := range sum.DataPoints {
				limit, _ := p.Attributes.Value(ratelimitotel.LimitKey)
				outcome, _ := p.Attributes.Value(ratelimitotel.OutcomeKey)
				fmt.Printf("%s{limit=%s, outcome=%s} %d\n", m.Name, limit.AsString(), outcome.AsString(), p.Value)
			}
		}
	}
	for _, s := range spans.GetSpans() {
		fmt.Println("span", s.Name)
	}
	// Unordered output:
	// ratelimit.decisions{limit=api, outcome=allowed} 2
	// ratelimit.decisions{limit=api, outcome=denied} 1
	// span ratelimit.store.apply
	// span ratelimit.store.apply
	// span ratelimit.store.apply
}
