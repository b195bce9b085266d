package ratelimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// applyCounter wraps a memstore by embedding it, and counts its Apply
// calls. It gets memstore's Bind by promotion, but not the fast path:
// the BoundLimit names memstore, not the wrapper, as its store.
type applyCounter struct {
	*memstore.Store
	applies atomic.Int64
}

func (c *applyCounter) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	c.applies.Add(1)
	return c.Store.Apply(ctx, op, out)
}

// decideCounter is a Binder of its own that counts Decide calls; its
// BoundLimits name owner (itself, or the store embedding it) as their
// store.
type decideCounter struct {
	applyCounter
	decides atomic.Int64
	owner   ratelimit.Store
}

func (c *decideCounter) Bind(name string, p driver.Params, phase func(string) int64) driver.BoundLimit {
	return &countedBound{BoundLimit: c.applyCounter.Store.Bind(name, p, phase), c: c}
}

type countedBound struct {
	driver.BoundLimit
	c *decideCounter
}

func (b *countedBound) Decide(ctx context.Context, key string, mode driver.Mode, now int64, count float64, reserve bool) (driver.Verdict, error) {
	b.c.decides.Add(1)
	return b.BoundLimit.Decide(ctx, key, mode, now, count, reserve)
}

func (b *countedBound) Store() ratelimit.Store { return b.c.owner }

var bindLimits = ratelimit.Limits{
	"one":     {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	"window":  {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second},
	"sharded": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, Shards: 4},
}

func TestBinderWrapperIsNotBypassed(t *testing.T) {
	ctx := context.Background()
	store := &applyCounter{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, bindLimits)
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "one", "k")
	require.NoError(t, err)
	_, err = lim.Check(ctx, "window", "k")
	require.NoError(t, err)
	_, err = lim.Reserve(ctx, "one", "k")
	require.NoError(t, err)
	assert.Equal(t, int64(3), store.applies.Load(), "every call must go through the wrapper's Apply")
}

func TestLimiterDecidesThroughBinder(t *testing.T) {
	ctx := context.Background()
	store := &decideCounter{applyCounter: applyCounter{Store: must(memstore.New())}}
	store.owner = store
	lim, err := ratelimit.New(store, bindLimits, ratelimit.WithClock(newMock()))
	require.NoError(t, err)

	// Single calls of declared unsharded limits: Decide.
	_, err = lim.Limit(ctx, "one", "k")
	require.NoError(t, err)
	_, err = lim.Check(ctx, "window", "k")
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "one", "k", ratelimit.Count(20))
	require.NoError(t, err)
	require.True(t, r.Result().Reserved())
	assert.Equal(t, int64(3), store.decides.Load())
	assert.Zero(t, store.applies.Load())

	// A refund, LimitAll, a sharded limit, an inline config: Apply.
	require.NoError(t, r.Cancel(ctx))
	_, err = lim.LimitAll(ctx, "k", []string{"one", "window"})
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "sharded", "k")
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "inline", "k", ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}))
	require.NoError(t, err)
	assert.Equal(t, int64(3), store.decides.Load())
	assert.Equal(t, int64(4), store.applies.Load())

	// The cancel handed the 20 reserved tokens back, through Apply, to the
	// record Decide charged.
	st, err := lim.Value(ctx, "one", "k")
	require.NoError(t, err)
	assert.Equal(t, 8.0, st.Remaining) // 10 - 1 (Limit) - 1 (LimitAll)
}

// A store that uses its own clock is not bound: a Verdict does not carry
// the store's time.
func TestOwnClockStoreIsNotBound(t *testing.T) {
	ctx := context.Background()
	store := &ownClockBinder{decideCounter: decideCounter{applyCounter: applyCounter{Store: must(memstore.New())}}}
	store.owner = store
	lim, err := ratelimit.New(store, bindLimits)
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "one", "k")
	require.NoError(t, err)
	assert.Zero(t, store.decides.Load())
	assert.Equal(t, int64(1), store.applies.Load())
}

type ownClockBinder struct{ decideCounter }

func (*ownClockBinder) OwnClock() bool { return true }

func (*ownClockBinder) Now(context.Context) (int64, error) { return time.Now().UnixMilli(), nil }
