package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/redis/go-redis/v9"
)

// Observe makes s, whose client is client, report each op as Redis
// decides it (storetest.NewObservedStore's decided): in the order the
// calls of the function ran on the server, and within one call in the
// order of its requests, which the function decides one after another (on
// a Cluster, by hash tag: see send). Call it before s is used.
//
// Its hooks keep the context of each request's caller, which the request
// does not carry, and put a batch's requests in the context of its round
// trip. A hook on client lets one call of the function run at a time
// (Redis runs each atomically: this is one of the orders it may run
// concurrent calls in), and says, once one has answered, which requests
// it decided. unexpected is called with what the hook saw that it cannot
// place: a pipeline of calls of the function, which a batch of Apply on a
// Cluster that does not move its slots never sends; then the test fails
// rather than report an order that may not be the server's.
//
// Batches and ops count the round trips and ops decided, so that a test
// can tell that calls were gathered.
func Observe(s *Store, client redis.UniversalClient, decided func(ctx context.Context), unexpected func(string)) (batches, ops *atomic.Int64) {
	o := &observed{single: s.single, decided: decided, unexpected: unexpected}
	s.hooks.apply = func(ctx context.Context, r *request) { o.ctxs.Store(r, ctx) }
	s.hooks.send = func(ctx context.Context, reqs []*request) context.Context {
		return context.WithValue(ctx, batchKey{}, reqs)
	}
	client.AddHook(o)
	return &o.batches, &o.ops
}

type batchKey struct{}

type observed struct {
	single     bool
	decided    func(ctx context.Context)
	unexpected func(string)
	ctxs       sync.Map // *request: the context of its caller
	mu         sync.Mutex
	batches    atomic.Int64
	ops        atomic.Int64
}

func (o *observed) DialHook(next redis.DialHook) redis.DialHook { return next }

func (o *observed) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		reqs, ok := ctx.Value(batchKey{}).([]*request)
		if !ok || !function(cmd) {
			return next(ctx, cmd)
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		err := next(ctx, cmd)
		if err != nil || cmd.Err() != nil {
			return err
		}
		o.batches.Add(1)
		if !o.single {
			// One call over the slots of a master: its requests by hash
			// tag, as send gathers them (groupByTag).
			var byTag []*request
			for _, c := range groupByTag(reqs) {
				byTag = append(byTag, c.reqs...)
			}
			reqs = byTag
		}
		for _, r := range reqs {
			c, ok := o.ctxs.LoadAndDelete(r) // before Apply returns, and the request is reused
			if !ok {
				o.unexpected(fmt.Sprintf("a call of the function decided a request that no call of Apply waits for: %+v", r))
				continue
			}
			if r.mode != driver.ModeCheck {
				o.ops.Add(1)
				o.decided(c.(context.Context))
			}
		}
		return nil
	}
}

func (o *observed) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if _, ok := ctx.Value(batchKey{}).([]*request); ok {
			for _, cmd := range cmds {
				if function(cmd) {
					o.unexpected(fmt.Sprintf("a batch's calls of the function went in a pipeline of %d commands", len(cmds)))
					break
				}
			}
		}
		return next(ctx, cmds)
	}
}

// function reports whether cmd calls the store's function or script.
func function(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "fcall", "evalsha", "eval":
		return true
	}
	return false
}
