package redisstore_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/goroutines"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Close ends the goroutines that send the store's calls in the background
// (one per server: per master of a Cluster, per shard of a Ring): they
// lived on, parked, for as long as the store was reachable, which a check
// for leaked goroutines reports. A call after Close fails with
// driver.ErrClosed.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		c := client(t)
		closeLeavesNoGoroutine(t, c)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ",")})
		t.Cleanup(func() { c.Close() })
		closeLeavesNoGoroutine(t, c)
	})
	t.Run("ring", func(t *testing.T) {
		c := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": client(t).Options().Addr}})
		t.Cleanup(func() { c.Close() })
		closeLeavesNoGoroutine(t, c)
	})
}

func closeLeavesNoGoroutine(t *testing.T, c redis.UniversalClient) {
	others := goroutines.Running(goroutines.CoalesceWorker)
	s := newStore(c, uniquePrefix(t, c))
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}})
	require.NoError(t, err)
	// A context that can end: its calls are sent in the background.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for i := range 20 {
		_, err := lim.Limit(ctx, "l", "k"+string(rune('a'+i)))
		require.NoError(t, err)
	}
	var mine []string
	for _, g := range goroutines.Running(goroutines.CoalesceWorker) {
		if !slices.Contains(others, g) {
			mine = append(mine, g)
		}
	}
	require.NotEmpty(t, mine, "the store runs a worker")
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
	require.Eventually(t, func() bool {
		now := goroutines.Running(goroutines.CoalesceWorker)
		for _, g := range mine {
			if slices.Contains(now, g) {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "the store's workers outlive Close")
	_, err = lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, driver.ErrClosed)
	_, err = s.Now(ctx)
	require.ErrorIs(t, err, driver.ErrClosed, "the server's time after Close")
	// A context already done says so first, closed store or not, as the
	// store contract asks of every method.
	done, stop := context.WithCancel(ctx)
	stop()
	_, err = s.Now(done)
	require.ErrorIs(t, err, context.Canceled, "a done context after Close")
	require.ErrorIs(t, s.Delete(done, []driver.RecordID{{Name: "l", Key: "k"}}), context.Canceled, "a done context after Close")
	runtime.KeepAlive(s)
}

// gateFcalls holds every function call until release is closed, and
// counts those it holds.
type gateFcalls struct {
	entered chan struct{}
	release chan struct{}
}

func (h gateFcalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h gateFcalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "fcall" {
			h.entered <- struct{}{}
			<-h.release
		}
		return next(ctx, cmd)
	}
}

func (h gateFcalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A call still queued when the store is closed, behind round trips in
// flight, is never sent: it fails with driver.ErrClosed, and charges
// nothing. The calls in flight are answered. It was sent once a round
// trip in flight came back, after Close, as no call made after Close is.
func TestCloseFailsTheCallsQueued(t *testing.T) {
	ctx := context.Background() // calls sent on their callers' goroutines
	c := client(t)
	prefix := uniquePrefix(t, c)
	s := newStore(c, prefix)
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
	op := func(key string) *driver.Op {
		return &driver.Op{Now: t0.UnixMilli(), Items: []driver.Item{{Name: "l", Key: key, Count: 1, Shards: []driver.Shard{{Params: p}}}}}
	}
	require.NoError(t, s.Apply(ctx, op("warm"), make([]driver.Decision, 1))) // loads the library
	h := gateFcalls{entered: make(chan struct{}, 8), release: make(chan struct{})}
	c.AddHook(h)
	const inFlight = 3 // the store's round trips in flight to a server
	errs := make(chan error, inFlight+1)
	for i := range inFlight {
		go func() { errs <- s.Apply(ctx, op(fmt.Sprint("sent-", i)), make([]driver.Decision, 1)) }()
		<-h.entered
	}
	waiting := func() int { return len(goroutines.Running("coalesce.(*Batcher[...]).wait(")) }
	before := waiting()
	go func() { errs <- s.Apply(ctx, op("queued"), make([]driver.Decision, 1)) }()
	for waiting() == before { // until it waits in the queue
		runtime.Gosched()
	}
	require.NoError(t, s.Close())
	close(h.release)
	var failed []error
	for range inFlight + 1 {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	require.Len(t, failed, 1, "the calls in flight are answered; the one queued fails")
	require.ErrorIs(t, failed[0], driver.ErrClosed)
	n, err := c.Exists(context.Background(), s.Key(driver.RecordID{Name: "l", Key: "queued"})).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the call queued at Close was sent")
}

// A store whose client was closed fails every call with an error matching
// driver.ErrClosed, and go-redis's own, that names the store: as a closed
// store does, and as boltstore does when its database was closed. The
// caller closed what the store needs; no server is down.
func TestClosedClient(t *testing.T) {
	ctx := context.Background()
	opt, err := redis.ParseURL(testserver.RedisURL(t))
	require.NoError(t, err)
	c := redis.NewClient(opt)
	s := newStore(c, uniquePrefix(t, client(t)))
	t.Cleanup(func() { s.Close() })
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
	op := func() *driver.Op { return oneItemOp(driver.ModeLimit, t0.UnixMilli(), "l", "k", 1, p) }
	require.NoError(t, s.Apply(ctx, op(), make([]driver.Decision, 1)))
	require.NoError(t, c.Close())
	for name, call := range map[string]func() error{
		"Apply": func() error { return s.Apply(ctx, op(), make([]driver.Decision, 1)) },
		"ApplyBatch": func() error {
			return s.ApplyBatch(ctx, []*driver.Op{op(), op()}, [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)})
		},
		"Load":   func() error { return s.Load(ctx, []driver.RecordID{{Name: "l", Key: "k"}}, make([]driver.Record, 1)) },
		"Delete": func() error { return s.Delete(ctx, []driver.RecordID{{Name: "l", Key: "k"}}) },
		"Now": func() error {
			_, err := s.Now(ctx)
			return err
		},
	} {
		err := call()
		require.ErrorIs(t, err, driver.ErrClosed, name)
		require.ErrorIs(t, err, redis.ErrClosed, "%s: the client's own error", name)
		require.ErrorContains(t, err, "redisstore: ", name)
		require.ErrorContains(t, err, "close the client after the store's last call", "%s: says what to do", name)
	}
}
