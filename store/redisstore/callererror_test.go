package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mute returns the address of a server that accepts connections and never
// answers; it drops them at cleanup. Close its clients at a cleanup
// registered before: go-redis's Close waits for the reads in flight.
func mute(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestStoreErrorOnAMockDeadline: a caller's context may carry a deadline
// of another clock than the wall's, as a test's mock.WithTimeout does (the
// Limiter's own check of the store makes one on its clock too). The store
// must judge such a deadline by the context (ctx.Err), not by the wall
// clock: a mock deadline that the wall clock is past, while the mock has
// not reached it, made every error of the store, a connection refused or a
// read timeout of a server too slow, match context.DeadlineExceeded, the
// caller's own end rather than the store's failure. The wall clock may
// judge a deadline only where go-redis did: a read or write it ended at the
// context's deadline, on a client with ContextTimeoutEnabled
// (TestDeadlineErrorOnAContextTimeoutClient).
func TestStoreErrorOnAMockDeadline(t *testing.T) {
	mock := newMock(t0) // years before the wall clock
	var clients map[string]redis.UniversalClient
	t.Cleanup(func() {
		for _, c := range clients {
			c.Close()
		}
	})
	refused := redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1}
	refusedCtx := refused
	refusedCtx.ContextTimeoutEnabled = true
	slow := redis.Options{Addr: mute(t), MaxRetries: -1, ReadTimeout: 100 * time.Millisecond}
	clients = map[string]redis.UniversalClient{
		"refused":                    redis.NewClient(&refused),
		"refused, context timeouts":  redis.NewClient(&refusedCtx),
		"slow":                       redis.NewClient(&slow),
		"refused Cluster":            redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, MaxRedirects: -1, DialerRetries: 1}),
		"slow Cluster, on its slots": redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{slow.Addr}, ReadTimeout: 100 * time.Millisecond}),
	}
	for kind, c := range clients {
		s := newStore(c, "ratelimit-test:mockdeadline:")
		for _, sc := range storeCalls {
			ctx, cancel := mock.WithTimeout(context.Background(), time.Minute)
			err := sc.call(ctx, s)
			require.NoError(t, ctx.Err(), "the mock did not move")
			cancel()
			if sc.name == "CheckServer" && err == nil {
				continue // a server it cannot ask is not checked
			}
			require.Error(t, err, "%s on %s", sc.name, kind)
			assert.NotErrorIs(t, err, context.DeadlineExceeded, "%s on %s: the store failed, before the caller's deadline", sc.name, kind)
		}
	}
}

// TestBatchOnAMockDeadline: calls whose contexts carry deadlines of a mock
// clock, which the wall clock is past, and which have not ended, are
// decided alone and in batches alike. A batch's context ended at once at
// the latest of its callers' deadlines, read on the wall clock: every call
// that went in a batch failed with context.DeadlineExceeded, which its
// caller, whose context had not ended, took for the store's failure.
func TestBatchOnAMockDeadline(t *testing.T) {
	c := client(t)
	s := newStore(c, uniquePrefix(t, c))
	mock := newMock(t0)
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 1e9, Period: time.Hour.Milliseconds(), Capacity: 1e9}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				ctx, cancel := mock.WithTimeout(context.Background(), time.Minute)
				err := s.Apply(ctx, oneItemOp(driver.ModeLimit, t0.UnixMilli(), "l", fmt.Sprint(g, "-", i), 1, p), make([]driver.Decision, 1))
				cancel()
				if !assert.NoError(t, err, "goroutine %d, call %d", g, i) {
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestLimiterTakesTheDeadlineForTheCallers: on a client with
// ContextTimeoutEnabled, go-redis ends a read at its context's deadline
// with a network timeout, and the store's error matches
// context.DeadlineExceeded, so that a Limiter takes the deadline for its
// caller's. But the Limiter asks the context, whose timer runs a moment
// after the read ended: about one call in a hundred found it not ended
// yet, and was answered by its failure policy, as a failure of the store,
// which counted towards the breaker.
func TestLimiterTakesTheDeadlineForTheCallers(t *testing.T) {
	var c *redis.Client
	t.Cleanup(func() { c.Close() })
	c = redis.NewClient(&redis.Options{Addr: mute(t), ContextTimeoutEnabled: true, MaxRetries: -1})
	lim, err := ratelimit.New(newStore(c, "ratelimit-test:mute:"), ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}},
		ratelimit.WithBreaker(0, 0))
	require.NoError(t, err)
	for range 5 {
		var wg sync.WaitGroup
		for i := range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(20+i%5)*time.Millisecond)
				defer cancel()
				start := time.Now()
				_, err := lim.Limit(ctx, "l", "k")
				// A call that took the breaker's slow call (250 ms: on a
				// machine too busy to run it sooner) while the store
				// answered no one is the store's failure, by the
				// breaker's rule (docs/production.md), whatever the
				// caller's deadline.
				if time.Since(start) < 250*time.Millisecond {
					assert.NotErrorIs(t, err, ratelimit.ErrStoreUnavailable, "call %d: the caller's deadline, not the store's failure", i)
				}
				assert.ErrorIs(t, err, context.DeadlineExceeded, "call %d", i)
			}()
		}
		wg.Wait()
	}
}
