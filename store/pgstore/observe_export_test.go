package pgstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/coalesce"
)

// Observed is a store on s, built with the default batch options, that
// reports each op as PostgreSQL decides it (storetest.NewObservedStore's
// decided): in the order its statements ran, and within one in the order
// of its requests, which the function _apply decides one after another
// (the batch upsert decides ops on distinct records, which commute).
//
// The requests carry no context of their caller, so Observed makes its own
// Apply, as s's, and keeps each request's context beside it; and its own
// batcher, with the default options, whose send lets one batch go at a
// time (concurrent transactions commit in an order the client cannot
// see: this is one they may commit in) and says, once it has answered,
// which requests it decided.
//
// Batches and ops count the statements' batches and the ops decided, so
// that a test can tell that calls were gathered.
func Observed(s *Store, decided func(ctx context.Context)) (store ratelimit.Store, batches, ops *atomic.Int64) {
	o := &observed{Store: s, decided: decided}
	opt := coalesce.Options{MaxBatch: DefaultMaxBatch, MaxInFlight: DefaultMaxInFlight, Overlap: overlap(DefaultMaxBatch)}
	s.batcher = coalesce.New(func(ctx context.Context, reqs []*request, res []struct{}) error {
		o.mu.Lock()
		defer o.mu.Unlock()
		if err := s.send(ctx, reqs, res); err != nil {
			return err
		}
		o.batches.Add(1)
		for _, r := range reqs {
			if c, ok := o.ctxs.Load(r); ok && r.err == nil && driver.Mode(r.flags&3) != driver.ModeCheck {
				o.ops.Add(1)
				o.decided(c.(context.Context))
			}
		}
		return nil
	}, opt)
	return o, &o.batches, &o.ops
}

type observed struct {
	*Store
	decided func(ctx context.Context)
	ctxs    sync.Map // *request: the context of its caller
	mu      sync.Mutex
	batches atomic.Int64
	ops     atomic.Int64
}

// Apply is Store.Apply, keeping the request's context for the send.
func (o *observed) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if err := driver.CheckOut(op, out); err != nil {
		return err
	}
	r := o.newRequest(op)
	o.ctxs.Store(r, ctx)
	defer o.ctxs.Delete(r)
	_, err := o.batcher.Do(ctx, r)
	if err == nil {
		err = r.err
	}
	if err != nil {
		return fmt.Errorf("pgstore: apply: %w", err)
	}
	copy(out, r.out)
	return nil
}
