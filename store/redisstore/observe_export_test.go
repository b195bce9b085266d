package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/coalesce"
	"github.com/redis/go-redis/v9"
)

// Observed is a store on s, whose client is client, that reports each op
// as Redis decides it (storetest.NewObservedStore's decided): in the order
// the calls of the function ran on the server, and within one call in the
// order of its requests, which the function decides one after another (on
// a Cluster, by hash tag: see send).
//
// The requests carry no context of their caller, so Observed makes its own
// Apply, as s's, and keeps each request's context beside it; and its own
// batchers, with s's options, whose sends put their requests in the context
// of the round trip. A hook on client lets one call of the function run at
// a time (Redis runs each atomically: this is one of the orders it may
// run concurrent calls in), and says, once one has answered, which
// requests it decided. unexpected is called with what the hook saw that
// it cannot place: a pipeline of calls of the function, which a batch of
// Apply on a Cluster that does not move its slots never sends; then the
// test fails rather than report an order that may not be the server's.
//
// Batches and ops count the round trips and ops decided, so that a test
// can tell that calls were gathered.
func Observed(s *Store, client redis.UniversalClient, decided func(ctx context.Context), unexpected func(string)) (store ratelimit.Store, batches, ops *atomic.Int64) {
	o := &observed{Store: s, decided: decided, unexpected: unexpected}
	co := coalesce.Options{MaxBatch: s.maxBatch, MaxInFlight: maxInFlight, Detach: true, Share: true}
	if s.nodes != nil {
		s.nodes = coalesce.NewGroup(func(ctx context.Context, dest string, reqs []*request, errs []error) error {
			return s.send(context.WithValue(ctx, batchKey{}, reqs), dest, reqs, errs)
		}, co)
	} else {
		s.one = coalesce.New(func(ctx context.Context, reqs []*request, errs []error) error {
			return s.send(context.WithValue(ctx, batchKey{}, reqs), "", reqs, errs)
		}, co)
	}
	client.AddHook(o)
	return o, &o.batches, &o.ops
}

type batchKey struct{}

type observed struct {
	*Store
	decided    func(ctx context.Context)
	unexpected func(string)
	ctxs       sync.Map // *request: the context of its caller
	mu         sync.Mutex
	batches    atomic.Int64
	ops        atomic.Int64
}

// Apply is Store.Apply, keeping the request's context for the hook.
func (o *observed) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if err := driver.CheckOut(op, out); err != nil || len(op.Items) == 0 {
		return err
	}
	s := o.Store
	r := s.newRequest(op)
	o.ctxs.Store(r, ctx)
	var res, err error
	if s.nodes == nil {
		res, err = s.one.Do(ctx, r)
	} else {
		var node string
		if node, err = s.server(ctx, r); err == nil {
			res, err = s.nodes.Do(ctx, node, r)
		}
	}
	o.ctxs.Delete(r)
	if err == nil {
		err = res
	}
	if err != nil {
		return fmt.Errorf("redisstore: apply: %w", err)
	}
	copy(out, r.out)
	release(r)
	return nil
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
			c, ok := o.ctxs.Load(r)
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
