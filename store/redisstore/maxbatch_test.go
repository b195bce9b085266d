package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// opsPerCall records how many records each function call a client sends
// carries (one per op here: ops of one item, of one shard).
type opsPerCall struct {
	mu    sync.Mutex
	calls []int
}

func (h *opsPerCall) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *opsPerCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.record(cmd)
		return next(ctx, cmd)
	}
}

func (h *opsPerCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.record(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *opsPerCall) record(cmd redis.Cmder) {
	if cmd.Name() != "fcall" {
		return
	}
	args := cmd.Args()
	n := len(args) - 4 // fcall, the function, the keys' count, the batch
	if args[2] == 2 && len(args) > 5 && strings.HasSuffix(args[4].(string), "}") {
		n = len(args) - 6 // over several slots: the first key and routeKey's before the batch
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, n)
}

// ApplyBatch keeps to WithMaxBatch: the ops go in calls of the function of
// at most that many, as the batcher's batches do, rather than in one call
// that holds the server for all of them (10,000 ops, say). They decide as
// Model does, in order.
func TestApplyBatchKeepsToMaxBatch(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		c    redis.UniversalClient
	}{
		{"server", client(t)},
		{"cluster", clusterClientT(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.c
			store := newStore(c, uniquePrefix(t, c), redisstore.WithMaxBatch(3))
			model := storetest.NewModel()
			p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
			var ops []*driver.Op
			for i := range 20 {
				key := fmt.Sprint("k-", i%4) // the same keys several times
				ops = append(ops, &driver.Op{Now: t0.UnixMilli() + int64(i), Items: []driver.Item{
					{Name: "l", Key: key, Count: float64(1 + i%3), Shards: []driver.Shard{{Params: p}}}}})
			}
			// Load the library first (on every master), outside the count.
			require.NoError(t, newStore(c, uniquePrefix(t, c)).ApplyBatch(ctx, ops, outsOf(ops)))
			h := &opsPerCall{}
			c.AddHook(h)
			got := outsOf(ops)
			require.NoError(t, store.ApplyBatch(ctx, ops, got))
			h.mu.Lock()
			calls := h.calls
			h.mu.Unlock()
			sum := 0
			for _, n := range calls {
				require.LessOrEqual(t, n, 3, "ops in one call of the function: %v", calls)
				sum += n
			}
			require.Equal(t, len(ops), sum, "ops sent: %v", calls)
			for i, op := range ops {
				want := make([]driver.Decision, 1)
				require.NoError(t, model.Apply(ctx, op, want))
				require.Equal(t, want, got[i], "op %d", i)
			}
		})
	}
}

func outsOf(ops []*driver.Op) [][]driver.Decision {
	outs := make([][]driver.Decision, len(ops))
	for i, op := range ops {
		outs[i] = make([]driver.Decision, len(op.Items))
	}
	return outs
}
