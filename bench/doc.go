// Package bench compares ratelimit with other Go rate limiters. It is a Go
// module of its own, so that the library's go.mod never gains them as
// dependencies; a replace directive makes it measure the checkout it sits
// in.
//
// Two entry points:
//
//   - cmd/compare runs the library beside its peers and bare baselines on
//     memory, bbolt, Redis, a Redis Cluster and PostgreSQL, interleaved in
//     one run, prints Markdown tables with the library's ratios, and checks
//     every grant against each limiter's own bound (package compare);
//
//   - the benchmarks of this package compare the in-process limiters with
//     go test -bench, allocations included:
//
//     cd bench && go test -run '^$' -bench . -benchmem
//
// See docs/performance.md, "Comparison with other limiters".
package bench
