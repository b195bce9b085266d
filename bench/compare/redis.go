package compare

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-redis/redis_rate/v10"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/throttled/throttled/v2/store/goredisstore.v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// The contenders on Redis, on a single server or a Cluster alike: every
// one takes a redis.UniversalClient. Each writes only keys that contain
// the run's prefix, so that the run can delete them all at the end.
var redisContenders = []Contender{
	{
		Name: "ratelimit redisstore", Code: "lib", Role: Library, Bound: libraryBound,
		New: func(_ context.Context, e *env, l Limit) (Taker, error) {
			// The medium checked the server's settings once, as one
			// store of a user's would (warnRedis); each cell's store
			// would warn again.
			s, err := redisstore.New(e.redis, redisstore.WithPrefix(e.prefix+"lib:"), redisstore.WithLogger(nil))
			if err != nil {
				return nil, err
			}
			return newOwnLibrary(s, l)
		},
	},
	{
		// One script per call: INCRBY, and PEXPIRE when the count is new.
		Name: "ulule/limiter redis", Code: "ulule", Role: Peer, Bound: counterBound,
		New: func(ctx context.Context, e *env, l Limit) (Taker, error) {
			st, err := ululeredis.NewStoreWithOptions(e.redis, ulule.StoreOptions{
				Prefix: e.prefix + "ulule", MaxRetry: ulule.DefaultMaxRetry,
			})
			if err != nil {
				return nil, err
			}
			return NewUlule(st, l), nil
		},
	},
	{
		// GCRA in one script per call, judged at the server's TIME.
		Name: "go-redis/redis_rate", Code: "redisrate", Role: Peer, Bound: gcraBound,
		New: func(_ context.Context, e *env, l Limit) (Taker, error) {
			return &RedisRate{lim: redis_rate.NewLimiter(e.redis), limit: redis_rate.Limit{
				Rate: l.Rate, Burst: l.Rate, Period: l.Period,
			}}, nil
		},
	},
	{
		// GCRA in Go over a pipeline (TIME, GET) and a compare-and-swap
		// script: two round trips per granted call.
		Name: "throttled goredisstore", Code: "throttled", Role: Peer, Bound: throttledBound,
		New: func(_ context.Context, e *env, l Limit) (Taker, error) {
			st, err := goredisstore.NewCtx(e.redis, e.prefix+"throttled:")
			if err != nil {
				return nil, err
			}
			return NewThrottled(st, l)
		},
	},
	{
		Name: "bare INCR+PEXPIRE script", Code: "bare", Role: Bare, Bound: counterBound,
		New: func(_ context.Context, e *env, l Limit) (Taker, error) {
			return &bareRedis{c: e.redis, limit: int64(l.Rate), period: l.Period.Milliseconds()}, nil
		},
	},
}

// warnRedis says, once for the medium, each setting of its servers that
// lets them lose a limiter's records, as a redisstore does once it is in
// use (redisstore.WithLogger): a run makes a store for every cell. It says
// it with the progress (o.Progress), of which it is a note on the run's
// conditions rather than a fault of the run: logged, it went to standard
// error under -quiet too, which promises none.
func warnRedis(ctx context.Context, o *Options, e *env) {
	if o.Progress == nil {
		return
	}
	s, err := redisstore.New(e.redis, redisstore.WithLogger(nil))
	if err != nil {
		return
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(ctx, reachTimeout)
	defer cancel()
	ws, _ := s.CheckServer(ctx) // a server that cannot be reached fails the calls
	for _, w := range ws {
		o.progressf("warning: %s\n", w)
	}
}

// RedisRate is a go-redis/redis_rate limiter.
type RedisRate struct {
	lim   *redis_rate.Limiter
	limit redis_rate.Limit
}

// Take implements Taker.
func (r *RedisRate) Take(ctx context.Context, key string) (bool, error) {
	res, err := r.lim.Allow(ctx, key, r.limit)
	if err != nil {
		return false, err
	}
	return res.Allowed > 0, nil
}

// bareCounterScript counts a window's calls and sets the window's expiry
// at its first: a window starts at a key's first call after the last
// one expired.
var bareCounterScript = redis.NewScript(`
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n`)

// bareRedis grants a call when its window has counted at most limit
// calls: one EVALSHA per call.
type bareRedis struct {
	c      redis.UniversalClient
	limit  int64
	period int64
}

func (b *bareRedis) Take(ctx context.Context, key string) (bool, error) {
	n, err := bareCounterScript.Run(ctx, b.c, []string{key}, b.period).Int64()
	return err == nil && n <= b.limit, err
}

// deleteKeys deletes every key holding prefix, on every master of a
// Cluster.
func deleteKeys(ctx context.Context, c redis.UniversalClient, prefix string) (int, error) {
	n := 0
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
		var batch []string
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			// One key per DEL: a Cluster node refuses keys of several slots.
			pipe := c.Pipeline()
			for _, k := range batch {
				pipe.Del(ctx, k)
			}
			_, err := pipe.Exec(ctx)
			n += len(batch)
			batch = batch[:0]
			return err
		}
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == 1000 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		return flush()
	}
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex // ForEachMaster calls at once; del counts in n
		err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return del(ctx, node)
		})
	case *redis.Client:
		err = del(ctx, c)
	default:
		err = fmt.Errorf("cannot scan a %T", c)
	}
	return n, err
}
