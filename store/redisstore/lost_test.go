package redisstore_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flakyClient returns a client of the single server that dials with
// dial, once per connection, and pauses little before sending again.
func flakyClient(t *testing.T, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *redis.Client {
	opt, err := redis.ParseURL(testserver.RedisURL(t))
	require.NoError(t, err)
	opt.Dialer, opt.DialerRetries, opt.MaxRetryBackoff = dial, 1, 10*time.Millisecond
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestBatchLostAnswer is TestClusterPipelineCallNeverSentTwice on a single
// server: the ops sent again one per call, pipelined, find no connection
// (a dial refused: they did not run, and go again), then lose their
// answers, which the server ran. ApplyBatch's error says that the ops may
// have been decided and charged; it joined an *OpError for each, which
// says that its op was not decided.
func TestBatchLostAnswer(t *testing.T) {
	d := &flakyDialer{}
	c := flakyClient(t, d.dial)
	pipelineCallsNeverSentTwice(t, c, d.arm)
	d.mu.Lock()
	require.Equal(t, 1, d.dials, "a dial failed")
	d.mu.Unlock()
}

// downDialer is a flakyDialer that, once armed, fails every dial: the
// server is down, and no call goes.
type downDialer struct {
	flakyDialer
	down atomic.Bool
}

func (d *downDialer) arm() {
	d.flakyDialer.mu.Lock()
	d.flakyDialer.gen++ // the connections pooled are dead
	d.flakyDialer.mu.Unlock()
	d.down.Store(true)
}

func (d *downDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.down.Load() {
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}
	return d.flakyDialer.dial(ctx, network, addr)
}

// An op of a batch whose call was never sent (no connection could be
// made) was not decided: ApplyBatch joins an *OpError for it, as for one
// that failed on its own, and the ops after a bad record, sent again one
// per call, charge nothing when the server is down.
func TestBatchUnsentOpsFailAlone(t *testing.T) {
	d := &downDialer{}
	c := flakyClient(t, d.dial)
	ctx := context.Background()
	store := newStore(c, uniquePrefix(t, c))
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour.Milliseconds(), Capacity: 100}
	now := t0.UnixMilli()
	ops := []*driver.Op{
		oneItemOp(driver.ModeLimit, now, "bad", "k", 1, p),
		oneItemOp(driver.ModeLimit, now, "a", "k", 1, p),
		oneItemOp(driver.ModeLimit, now, "b", "k", 1, p),
	}
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1), make([]driver.Decision, 1)}
	require.NoError(t, store.ApplyBatch(ctx, ops[1:], outs[1:])) // the library is loaded, a connection pooled
	require.NoError(t, c.Set(ctx, store.Key(driver.RecordID{Name: "bad", Key: "k"}), "garbage", 0).Err())
	c.AddHook(&armOnBadRecord{arm: d.arm})

	err := store.ApplyBatch(ctx, ops, outs)
	require.Equal(t, []int{0, 1, 2}, storetest.FailedOps(t, err), "no op was sent again: none was decided")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.NotContains(t, err.Error(), "may have been decided")

	d.down.Store(false)
	recs := make([]driver.Record, 2)
	require.NoError(t, store.Load(ctx, []driver.RecordID{{Name: "a", Key: "k"}, {Name: "b", Key: "k"}}, recs))
	for i, r := range recs {
		require.Equal(t, 99.0, r.State.Remaining, "op %d was charged by the first batch alone", i+1)
	}
}

// holdAfter holds, while armed, the first max calls of the function once
// their answers are read, until gate closes: the round trips stay in
// flight for the store's batcher, which queues the calls after them, but
// their connections are back in the pool, their work on the network done.
type holdAfter struct {
	armed atomic.Bool
	n     atomic.Int32
	max   int32
	held  chan struct{}
	gate  chan struct{}
}

func (h *holdAfter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.armed.Load() && cmd.Name() == "fcall" && h.n.Add(1) <= h.max {
			h.held <- struct{}{}
			<-h.gate
		}
		return err
	}
}

func (h *holdAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Callers of Apply whose ops went in one call, sent again one per call
// after one of them failed on a bad record, and whose answers were lost
// then, each get their own error, the connection's: not ApplyBatch's,
// which names an op of a batch. Each op was applied once.
func TestApplyLostAnswerIsEachCallers(t *testing.T) {
	d := &flakyDialer{}
	c := flakyClient(t, d.dial)
	hold := &holdAfter{max: 3, held: make(chan struct{}, 3), gate: make(chan struct{})}
	c.AddHook(hold)
	c.AddHook(&armOnBadRecord{arm: d.arm})
	store := newStore(c, uniquePrefix(t, c))
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour.Milliseconds(), Capacity: 100}
	now := t0.UnixMilli()
	apply := func(ctx context.Context, name string) error {
		return store.Apply(ctx, oneItemOp(driver.ModeLimit, now, name, "k", 1, p), make([]driver.Decision, 1))
	}
	ctx := context.Background()
	require.NoError(t, apply(ctx, "warm-up")) // the library is loaded
	require.NoError(t, c.Set(ctx, store.Key(driver.RecordID{Name: "bad", Key: "k"}), "garbage", 0).Err())

	hold.armed.Store(true)
	var wg sync.WaitGroup
	for range 3 { // the three round trips in flight, held
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, apply(ctx, "held"))
		}()
	}
	for range 3 {
		<-hold.held
	}
	names := []string{"bad", "a", "b"}
	errs := make([]chan error, len(names))
	for i, name := range names {
		errs[i] = make(chan error, 1)
		qctx := newQueuedCtx(ctx)
		go func() { errs[i] <- apply(qctx, name) }()
		qctx.waitQueued(t) // each queues behind the round trips held
	}
	close(hold.gate)
	wg.Wait()
	for i, name := range names {
		err := <-errs[i]
		require.ErrorIs(t, err, io.EOF, "%s: its answer was lost", name)
		require.ErrorContains(t, err, "redisstore: apply: ", name)
		require.NotContains(t, err.Error(), "of the batch", name)
		var oe *driver.OpError
		require.False(t, errors.As(err, &oe), "%s: %v", name, err)
	}
	d.mu.Lock()
	require.Equal(t, 1, d.dials, "a dial failed")
	d.mu.Unlock()
	recs := make([]driver.Record, 2)
	require.NoError(t, store.Load(ctx, []driver.RecordID{{Name: "a", Key: "k"}, {Name: "b", Key: "k"}}, recs))
	for i, r := range recs {
		require.Equal(t, 99.0, r.State.Remaining, "%s was applied once, by the call that lost its answer", names[i+1])
	}
}
