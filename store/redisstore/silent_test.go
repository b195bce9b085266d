package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
)

// storeCall is one call of the store, made with ctx.
type storeCall struct {
	name string
	call func(ctx context.Context, s *redisstore.Store) error
}

// storeCalls are the calls of the store that reach the server.
var storeCalls = []storeCall{
	{"Apply", func(ctx context.Context, s *redisstore.Store) error {
		return s.Apply(ctx, silentOp(), make([]driver.Decision, 1))
	}},
	{"ApplyBatch", func(ctx context.Context, s *redisstore.Store) error {
		return s.ApplyBatch(ctx, []*driver.Op{silentOp(), silentOp()}, [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)})
	}},
	{"Load", func(ctx context.Context, s *redisstore.Store) error {
		return s.Load(ctx, []driver.RecordID{{Name: "l", Key: "k"}}, make([]driver.Record, 1))
	}},
	{"Delete", func(ctx context.Context, s *redisstore.Store) error {
		return s.Delete(ctx, []driver.RecordID{{Name: "l", Key: "k"}})
	}},
	{"Now", func(ctx context.Context, s *redisstore.Store) error { _, err := s.Now(ctx); return err }},
	{"CheckServer", func(ctx context.Context, s *redisstore.Store) error { _, err := s.CheckServer(ctx); return err }},
}

func silentOp() *driver.Op {
	p := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: 60_000, Capacity: 10}
	return &driver.Op{Mode: driver.ModeLimit, Now: t0.UnixMilli(), Items: []driver.Item{
		{Name: "l", Key: "k", Count: 1, Shards: []driver.Shard{{Index: 0, Params: p}}}}}
}

// silentClients returns a client of one server and one of a Cluster,
// each of a silent server of its own, built with opts; they are closed at
// cleanup, once their servers have dropped their connections.
func silentClients(t *testing.T, opts redis.Options) map[string]redis.UniversalClient {
	one, dropOne := testserver.Silent(t)
	nodes, dropNodes := testserver.Silent(t)
	single := opts
	single.Addr = one
	c := redis.NewClient(&single)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes}, ReadTimeout: opts.ReadTimeout,
		ContextTimeoutEnabled: opts.ContextTimeoutEnabled, MaxRetries: opts.MaxRetries})
	t.Cleanup(func() {
		dropOne()
		dropNodes()
		c.Close()
		cc.Close()
	})
	return map[string]redis.UniversalClient{"server": c, "cluster": cc}
}

// TestDeadlineErrorOnAContextTimeoutClient: on a client with
// ContextTimeoutEnabled, as docs/stores/redis.md suggests, go-redis ends a
// read at its context's deadline with a network timeout ("i/o timeout"),
// which the call's goroutine may report before the caller sees its
// context end. Every call of the store whose deadline passed must still
// fail with an error that matches context.DeadlineExceeded, so that the
// caller's deadline does not count as the store's failure: about half of
// them failed with "i/o timeout" alone.
func TestDeadlineErrorOnAContextTimeoutClient(t *testing.T) {
	for kind, c := range silentClients(t, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}) {
		s := newStore(c, "ratelimit-test:silent:")
		for _, sc := range storeCalls {
			var wg sync.WaitGroup
			for i := range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(20+i%5)*time.Millisecond)
					defer cancel()
					err := sc.call(ctx, s)
					assert.ErrorIs(t, err, context.DeadlineExceeded, "%s on a %s", sc.name, kind)
				}()
			}
			wg.Wait()
		}
	}
}

// TestSilentServer: every call of the store returns when its context
// ends, by deadline or by cancel, from a server that accepts connections
// and never answers, not when go-redis's read timeout passes (10 s here),
// a Cluster client's first call included: it asks a node for the slots
// (CLUSTER SLOTS), a read that go-redis bounds by its read timeout only,
// and Apply did so on its caller's goroutine, which it held until then.
func TestSilentServer(t *testing.T) {
	const wait = 200 * time.Millisecond
	for kind, c := range silentClients(t, redis.Options{ReadTimeout: 10 * time.Second}) {
		for _, sc := range storeCalls {
			for _, cancel := range []bool{false, true} {
				s := newStore(c, "ratelimit-test:silent:") // a fresh store: its first call
				ctx, stop := context.WithTimeout(context.Background(), wait)
				want := context.DeadlineExceeded
				if cancel {
					ctx, stop = context.WithCancel(context.Background())
					time.AfterFunc(wait, stop)
					want = context.Canceled
				}
				start := time.Now()
				err := sc.call(ctx, s)
				took := time.Since(start)
				stop()
				assert.ErrorIs(t, err, want, "%s on a %s", sc.name, kind)
				assert.Less(t, took, wait+2*time.Second, "%s on a %s returned after %v, not when its context ended", sc.name, kind, took)
			}
		}
	}
}
