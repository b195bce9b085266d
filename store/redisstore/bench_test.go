package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/redis/go-redis/v9"
)

// go test -run '^$' -bench . ./store/redisstore
//
// BenchmarkServerTime and BenchmarkBareCounter report the server's time
// per decision from INFO commandstats: run them against a server nothing
// else uses (REDIS_URL=redis://127.0.0.1:6390/0), or other clients' calls
// of the same command count too.

// BenchmarkLimit is storetest.BenchmarkLimit (Limiter.Limit on a token
// bucket that grants every call, one hot key or 10,000 keys, 1 or 64
// goroutines), with the server's time per decision and the decisions per
// round trip.
func BenchmarkLimit(b *testing.B) {
	benchmarkLimit(b)
}

// BenchmarkLimitUncoalesced is BenchmarkLimit with coalescing off.
func BenchmarkLimitUncoalesced(b *testing.B) {
	benchmarkLimit(b, redisstore.WithMaxBatch(1))
}

// BenchmarkLimitDeadline is BenchmarkLimit on one key with a deadline on
// every call, as a server's requests have: a call that goes at once is then
// sent from another goroutine, so that its caller can leave on time.
func BenchmarkLimitDeadline(b *testing.B) {
	c := client(b)
	lim, err := ratelimit.New(newStore(c, uniquePrefix(b, c)), ratelimit.Limits{"bench": {Kind: ratelimit.TokenBucket, Rate: 1e12, Period: time.Second}})
	if err != nil {
		b.Fatal(err)
	}
	for _, par := range []int{1, 64} {
		b.Run(fmt.Sprintf("keys=1/goroutines=%d", par), func(b *testing.B) {
			before := commandStats(b, c, "fcall")
			storetest.BenchmarkParallel(b, par, func(ctx context.Context, i int) error {
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				_, err := lim.Limit(ctx, "bench", "bench-0")
				return err
			})
			reportServerTime(b, before, commandStats(b, c, "fcall"), b.N)
		})
	}
}

// BenchmarkClusterLimit is BenchmarkLimit on the local Redis Cluster
// (server time not reported: it is spread over the nodes).
func BenchmarkClusterLimit(b *testing.B) {
	c := clusterClient(b)
	runLimit(b, c, newStore(c, uniquePrefix(b, c)))
}

// BenchmarkClusterBareCounter is BenchmarkBareCounter on the local Redis
// Cluster.
func BenchmarkClusterBareCounter(b *testing.B) {
	c := clusterClient(b)
	prefix := uniquePrefix(b, c)
	for _, keys := range []int{1, 10_000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprint(prefix, "bare-", i)
		}
		for _, par := range []int{1, 64} {
			b.Run(fmt.Sprintf("keys=%d/goroutines=%d", keys, par), func(b *testing.B) {
				storetest.BenchmarkParallel(b, par, func(ctx context.Context, i int) error {
					return bareCounter.Run(ctx, c, []string{names[i%keys]}, time.Minute.Milliseconds()).Err()
				})
			})
		}
	}
}

func clusterClient(b *testing.B) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(b), ",")})
	b.Cleanup(func() { c.Close() })
	return c
}

func benchmarkLimit(b *testing.B, opts ...redisstore.Option) {
	c := client(b)
	runLimit(b, c, newStore(c, uniquePrefix(b, c), opts...))
}

// runLimit runs the matrix of BenchmarkLimit on store; with a single
// server, it reports the server's time per decision and the decisions per
// round trip.
func runLimit(b *testing.B, c redis.UniversalClient, store *redisstore.Store) {
	lim, err := ratelimit.New(store, ratelimit.Limits{"bench": {Kind: ratelimit.TokenBucket, Rate: 1e12, Period: time.Second}})
	if err != nil {
		b.Fatal(err)
	}
	for _, keys := range []int{1, 10_000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprint("bench-", i)
		}
		for _, par := range []int{1, 64} {
			b.Run(fmt.Sprintf("keys=%d/goroutines=%d", keys, par), func(b *testing.B) {
				single, _ := c.(*redis.Client)
				var before cmdStat
				if single != nil {
					before = commandStats(b, single, "fcall")
				}
				storetest.BenchmarkParallel(b, par, func(ctx context.Context, i int) error {
					res, err := lim.Limit(ctx, "bench", names[i%keys])
					if err == nil && !res.OK {
						err = fmt.Errorf("refused: %+v", res)
					}
					return err
				})
				if single != nil {
					reportServerTime(b, before, commandStats(b, single, "fcall"), b.N)
				}
			})
		}
	}
}

// bareCounter is the least a fixed-window limiter on Redis can do: one
// script that counts a window's calls and sets the window's expiry.
var bareCounter = redis.NewScript(`
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n`)

// BenchmarkBareCounter is the baseline of BenchmarkLimit: the same matrix
// of keys and goroutines, one script call per decision.
func BenchmarkBareCounter(b *testing.B) {
	c := client(b)
	prefix := uniquePrefix(b, c)
	for _, keys := range []int{1, 10_000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprint(prefix, "bare-", i)
		}
		for _, par := range []int{1, 64} {
			b.Run(fmt.Sprintf("keys=%d/goroutines=%d", keys, par), func(b *testing.B) {
				before := commandStats(b, c, "evalsha")
				storetest.BenchmarkParallel(b, par, func(ctx context.Context, i int) error {
					return bareCounter.Run(ctx, c, []string{names[i%keys]}, time.Minute.Milliseconds()).Err()
				})
				reportServerTime(b, before, commandStats(b, c, "evalsha"), b.N)
			})
		}
	}
}

// BenchmarkServerTime decides batches of 1, 8 and 64 ops (one token each,
// on one hot key or on 10,000 keys) with ApplyBatch, one round trip each,
// and reports the server's time per decision.
func BenchmarkServerTime(b *testing.B) {
	c := client(b)
	s := newStore(c, uniquePrefix(b, c))
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1e12, Period: 1000, Capacity: 1e12}
	for _, keys := range []int{1, 10_000} {
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprint("k-", i)
		}
		for _, size := range []int{1, 2, 8, 64} {
			b.Run(fmt.Sprintf("keys=%d/batch=%d", keys, size), func(b *testing.B) {
				ctx := context.Background()
				ops := make([]*driver.Op, size)
				outs := make([][]driver.Decision, size)
				for j := range ops {
					ops[j] = &driver.Op{Items: []driver.Item{{Name: "bench", Count: 1, Shards: []driver.Shard{{Params: p}}}}}
					outs[j] = make([]driver.Decision, 1)
				}
				b.ReportAllocs()
				before := commandStats(b, c, "fcall")
				n := 0
				for b.Loop() {
					now := time.Now().UnixMilli()
					for j, op := range ops {
						op.Now = now
						op.Items[0].Key = names[(n+j*7919)%keys]
					}
					if err := s.ApplyBatch(ctx, ops, outs); err != nil {
						b.Fatal(err)
					}
					n += size
				}
				reportServerTime(b, before, commandStats(b, c, "fcall"), n)
			})
		}
	}
}

type cmdStat struct{ calls, usec int64 }

// commandStats reads the calls and time of a command from INFO
// commandstats.
func commandStats(b *testing.B, c *redis.Client, cmd string) cmdStat {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var st cmdStat
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "calls":
				st.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return st
}

// reportServerTime reports the server's µs per decision and the decisions
// per call between two readings, over decisions decisions.
func reportServerTime(b *testing.B, before, after cmdStat, decisions int) {
	if calls := after.calls - before.calls; calls > 0 && decisions > 0 {
		b.ReportMetric(float64(after.usec-before.usec)/float64(decisions), "server-µs/decision")
		b.ReportMetric(float64(decisions)/float64(calls), "decisions/call")
	}
}

// BenchmarkSettle is storetest.BenchmarkSettle: a reservation canceled, a
// receipt refunded.
func BenchmarkSettle(b *testing.B) {
	c := client(b)
	storetest.BenchmarkSettle(b, newStore(c, uniquePrefix(b, c)))
}
