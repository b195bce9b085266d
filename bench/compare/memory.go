package compare

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/store/memstore"
	sethvargo "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	throttledmem "github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"
)

// The in-process contenders. Each is built as its README shows, with a
// limit of l.Rate per l.Period and a burst of l.Rate.
var memoryContenders = []Contender{
	{
		Name: "ratelimit memstore", Code: "lib", Role: Library, Bound: libraryBound,
		New: func(_ context.Context, _ *env, l Limit) (Taker, error) {
			s, err := memstore.New()
			if err != nil {
				return nil, err
			}
			return newLibrary(s, l)
		},
	},
	{
		// Windows that start at a key's first call after the last one
		// expired, and count calls, refused ones included.
		Name: "ulule/limiter memory", Code: "ulule", Role: Peer, Bound: counterBound,
		New: func(_ context.Context, _ *env, l Limit) (Taker, error) {
			return NewUlule(ululemem.NewStore(), l), nil
		},
	},
	{
		// An LRU cache of keys, as its README shows (which holds 65,536),
		// made to hold every key of the cell: a key it dropped would
		// start again with a full burst.
		Name: "throttled memstore", Code: "throttled", Role: Peer, Bound: throttledBound,
		New: func(_ context.Context, e *env, l Limit) (Taker, error) {
			st, err := throttledmem.NewCtx(e.keys)
			if err != nil {
				return nil, err
			}
			return NewThrottled(st, l)
		},
	},
	{
		// A bucket per key that is refilled to Tokens at every Interval
		// since the bucket was made: windows on a grid of the key's own.
		Name: "sethvargo/go-limiter memorystore", Code: "sethvargo", Role: Peer, Bound: counterBound,
		New: func(_ context.Context, _ *env, l Limit) (Taker, error) { return NewSethvargo(l) },
	},
	{
		Name: "x/time/rate in a sync.Map", Code: "xrate", Role: Peer, Bound: xrateBound,
		New: func(_ context.Context, _ *env, l Limit) (Taker, error) { return NewXRate(l), nil },
	},
}

// Ulule is a ulule/limiter limiter on store (memory or Redis).
type Ulule struct{ lim *ulule.Limiter }

// NewUlule returns a ulule/limiter limiter of l.Rate calls per l.Period.
func NewUlule(store ulule.Store, l Limit) *Ulule {
	return &Ulule{ulule.New(store, ulule.Rate{Period: l.Period, Limit: int64(l.Rate)})}
}

// Take implements Taker.
func (u *Ulule) Take(ctx context.Context, key string) (bool, error) {
	c, err := u.lim.Get(ctx, key)
	return !c.Reached, err
}

// Throttled is a throttled GCRA limiter on a store (memory or Redis).
type Throttled struct{ rl *throttled.GCRARateLimiterCtx }

// NewThrottled returns a throttled limiter of l.Rate per l.Period with a
// burst of l.Rate (MaxBurst counts the calls beyond the first).
func NewThrottled(st throttled.GCRAStoreCtx, l Limit) (*Throttled, error) {
	rl, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{
		MaxRate:  throttled.PerDuration(l.Rate, l.Period),
		MaxBurst: l.Rate - 1,
	})
	return &Throttled{rl}, err
}

// Take implements Taker.
func (t *Throttled) Take(ctx context.Context, key string) (bool, error) {
	limited, _, err := t.rl.RateLimitCtx(ctx, key, 1)
	return !limited && err == nil, err
}

// throttledBound is GCRA at throttled's emission interval, which it
// rounds down to a whole nanosecond (Period/Rate).
func throttledBound(l Limit) Bound {
	interval := l.Period / time.Duration(l.Rate)
	return BucketBound("GCRA", float64(l.Rate), 1e9/float64(interval))
}

// Sethvargo is a sethvargo/go-limiter memorystore.
type Sethvargo struct{ st sethvargo.Store }

// NewSethvargo returns a memorystore of l.Rate tokens per l.Period.
func NewSethvargo(l Limit) (*Sethvargo, error) {
	st, err := memorystore.New(&memorystore.Config{Tokens: uint64(l.Rate), Interval: l.Period})
	return &Sethvargo{st}, err
}

// Take implements Taker.
func (s *Sethvargo) Take(ctx context.Context, key string) (bool, error) {
	_, _, _, ok, err := s.st.Take(ctx, key)
	return ok, err
}

// Close stops the store's sweeper.
func (s *Sethvargo) Close() error { return s.st.Close(context.Background()) }

// XRate keeps a golang.org/x/time/rate Limiter per key in a sync.Map, the
// usual way of limiting many keys with it.
type XRate struct {
	limiters sync.Map
	limit    rate.Limit
	burst    int
}

// NewXRate returns limiters of l.Rate per l.Period with a burst of l.Rate.
func NewXRate(l Limit) *XRate {
	return &XRate{limit: rate.Limit(l.PerSecond()), burst: l.Rate}
}

// Take implements Taker.
func (x *XRate) Take(_ context.Context, key string) (bool, error) {
	v, ok := x.limiters.Load(key)
	if !ok {
		v, _ = x.limiters.LoadOrStore(key, rate.NewLimiter(x.limit, x.burst))
	}
	return v.(*rate.Limiter).Allow(), nil
}

// xrateBound is a token bucket of capacity burst refilled at the limit.
func xrateBound(l Limit) Bound {
	return BucketBound("token bucket", float64(l.Rate), l.PerSecond())
}

var _ io.Closer = (*Sethvargo)(nil)
