package ratelimitprom_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/ratelimit-go/ratelimit"
	ratelimitprom "github.com/ratelimit-go/ratelimit/contrib/prometheus"
	"github.com/ratelimit-go/ratelimit/store/memstore"
)

// Decisions counted by limit and outcome, as a scrape shows them. (The
// mock clock makes the output repeatable; production leaves WithClock
// out, and serves the registry with promhttp.)
func Example() {
	ctx := context.Background()
	c, err := ratelimitprom.NewCollector(ratelimitprom.WithConstLabels(prometheus.Labels{"store": "memory"}))
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute},
	}, ratelimit.WithObserver(c), ratelimit.WithClock(clock.NewMock()))
	if err != nil {
		panic(err)
	}
	for range 3 {
		if _, err := lim.Limit(ctx, "api", "user-42"); err != nil {
			panic(err)
		}
	}

	text, err := testutil.CollectAndFormat(c, expfmt.TypeTextPlain, "ratelimit_decisions_total")
	if err != nil {
		panic(err)
	}
	fmt.Print(string(text))
	// Output:
	// # HELP ratelimit_decisions_total Decisions of rate limits, by limit and outcome.
	// # TYPE ratelimit_decisions_total counter
	// ratelimit_decisions_total{allowed="false",check="false",limit="api",local="false",outcome="denied",store="memory"} 1
	// ratelimit_decisions_total{allowed="true",check="false",limit="api",local="false",outcome="allowed",store="memory"} 2
}
