package pgstore

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/ratelimit-go/ratelimit/driver"
)

// Observe makes s report each op as PostgreSQL decides it
// (storetest.NewObservedStore's decided): in the order its statements
// ran, and within one in the order of its requests, which the function
// _apply decides one after another (the batch upsert decides ops on
// distinct records, which commute). Call it before s is used.
//
// Its hooks keep the context of each request's caller, which the request
// does not carry, and let one batch of the batcher go at a time
// (concurrent transactions commit in an order the client cannot see: this
// is one they may commit in), saying, once it has answered, which
// requests it decided.
//
// Batches and ops count the statements' batches and the ops decided, so
// that a test can tell that calls were gathered.
func Observe(s *Store, decided func(ctx context.Context)) (batches, ops *atomic.Int64) {
	o := &observed{}
	s.hooks.apply = func(ctx context.Context, r *request) { o.ctxs.Store(r, ctx) }
	s.hooks.batch = func(reqs []*request, send func() error) error {
		o.mu.Lock()
		defer o.mu.Unlock()
		if err := send(); err != nil {
			return err
		}
		o.batches.Add(1)
		for _, r := range reqs {
			if c, ok := o.ctxs.LoadAndDelete(r); ok && r.err == nil && driver.Mode(r.flags&3) != driver.ModeCheck {
				o.ops.Add(1)
				decided(c.(context.Context))
			}
		}
		return nil
	}
	return &o.batches, &o.ops
}

type observed struct {
	ctxs    sync.Map // *request: the context of its caller
	mu      sync.Mutex
	batches atomic.Int64
	ops     atomic.Int64
}
