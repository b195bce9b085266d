package boltstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/coalesce"
	bolt "go.etcd.io/bbolt"
)

// request is one op on its way to a write transaction, with the bbolt keys
// of its records and room for its decisions.
type request struct {
	ctx  context.Context // the caller's: once it ends, the op is not decided
	op   driver.Op
	out  []driver.Decision
	keys [][]byte

	// Room for the common op, of one item of one or two records, so that
	// its request is two allocations (this and the keys' bytes).
	item   [1]driver.Item
	shards [2]driver.Shard
	dec    [1]driver.Decision
	key    [2][]byte
}

// newRequest returns the request of op. With own, the request holds
// copies of the op's slices and decides into its own out: the caller may
// leave while it is in a transaction, and the Limiter then reuses the
// memory of op; without, it refers to op and decides into out.
func newRequest(ctx context.Context, op *driver.Op, own bool) *request {
	r := &request{ctx: ctx, op: *op}
	if op.Settle != nil {
		st := *op.Settle
		r.op.Settle = &st
	}
	if own {
		if len(op.Items) == 1 && len(op.Items[0].Shards) <= len(r.shards) {
			r.item[0] = op.Items[0]
			r.item[0].Shards = append(r.shards[:0], op.Items[0].Shards...)
			r.op.Items, r.out = r.item[:], r.dec[:]
		} else {
			r.op.Items = slices.Clone(op.Items)
			for i := range r.op.Items {
				r.op.Items[i].Shards = slices.Clone(r.op.Items[i].Shards)
			}
			r.out = make([]driver.Decision, len(op.Items))
		}
	}
	keys := r.key[:0]
	if n := op.NumRecords(); n > len(r.key) {
		keys = make([][]byte, 0, n)
	}
	r.keys = appendKeys(keys, make([]byte, 0, keysLen(op)), op)
	return r
}

// OpError is the error of one op of a batch that failed on its own, in
// the error of ApplyBatch. The other ops of the batch were decided and
// committed without it. It is driver.OpError, the error every store's
// ApplyBatch gives for such an op.
type OpError = driver.OpError

// ApplyBatch implements driver.BatchApplier: it decides ops one after
// another, in one write transaction, and fills outs[i] (one Decision per
// item of ops[i]). An op that fails on its own (a record that no release
// writes: ErrBadRecord; a settlement whose mark cannot be read:
// ErrBadMark; the decisions are pure) is left out: the
// others are decided and committed without it, and the error joins an
// *OpError for each op left out. Any other error
// means that nothing was written (outs of the wrong length, or an invalid
// op (driver.CheckOp), are refused before any op is decided), but ctx's:
// a call whose context ends while its transaction commits returns at once
// with ctx's error, and the batch is committed (see Deadlines in the
// package doc); and a commit's failure in its last flush, after bbolt
// wrote the commit's meta page: the batch may then have taken effect, as
// bbolt reads that page from then on.
func (s *Store) ApplyBatch(ctx context.Context, ops []*driver.Op, outs [][]driver.Decision) error {
	if err := s.usable(ctx, "ApplyBatch"); err != nil {
		return err
	}
	if err := driver.CheckOuts(ops, outs); err != nil {
		return fmt.Errorf("boltstore: ApplyBatch: %w", err)
	}
	// When ctx can end, the transaction runs on another goroutine, which
	// the caller leaves when ctx ends (coalesce.Detached): the requests are then
	// copies that decide into memory of their own, read once it is done.
	own := ctx.Done() != nil
	reqs := make([]*request, len(ops))
	for i, op := range ops {
		reqs[i] = newRequest(ctx, op, own)
		if !own {
			reqs[i].out = outs[i]
		}
	}
	res := make([]error, len(ops))
	var err error
	if own {
		err = coalesce.Detached(ctx, func() error { return s.send(ctx, reqs, res) })
	} else {
		err = s.send(ctx, reqs, res)
	}
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return fmt.Errorf("boltstore: ApplyBatch: %w", err)
		}
		return wrap(err)
	}
	var errs []error
	for i, err := range res {
		if err != nil {
			errs = append(errs, &OpError{Index: i, Err: fmt.Errorf("boltstore: %w", err)})
		} else if own {
			copy(outs[i], reqs[i].out)
		}
	}
	return errors.Join(errs...)
}

// errRetry rolls back a transaction in which an op failed on its own, to
// decide the batch again without it.
var errRetry = errors.New("an op failed: again without it")

// errNoWrite rolls back a transaction that wrote nothing (a batch whose
// every op was refused, a check, a settlement made before; a Delete of
// records that are not there; a sweep's step whose every key was written
// since it read them): its answers read only what was committed, and a
// commit would cost bbolt's two fsyncs for nothing.
var errNoWrite = errors.New("nothing written")

// send decides reqs, in order, in one write transaction, and commits it
// if an op wrote (else rolls it back: see errNoWrite). It sets res[i] for
// an op that is not decided: its caller's context ended first, or it
// failed on its own. It returns an error when nothing was written: ctx
// ended (every caller of the batch has gone) before the commit, or the
// transaction failed.
func (s *Store) send(ctx context.Context, reqs []*request, res []error) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.unlock()
	for {
		err := s.guard(func() error {
			return update(s.db, func(tx *bolt.Tx) error {
				b, err := s.bucketOf(tx)
				if err != nil {
					return err
				}
				if s.hooks.inWrite != nil {
					s.hooks.inWrite(tx)
				}
				s.vals, s.wrote = s.vals[:0], false
				for i, r := range reqs {
					if res[i] != nil {
						continue
					}
					if err := r.ctx.Err(); err != nil {
						res[i] = err
						continue
					}
					if err := s.decide(b, r); err != nil {
						res[i] = err
						return errRetry
					}
					if s.hooks.decided != nil {
						s.hooks.decided(r.ctx)
					}
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				if !s.wrote {
					return errNoWrite
				}
				return nil
			})
		})
		if err == errNoWrite {
			return nil
		}
		if err != errRetry {
			return err
		}
	}
}

// decide reads r's records, decides r's op and writes its updates. The
// writer lock is held.
func (s *Store) decide(b *bolt.Bucket, r *request) error {
	op := &r.op
	n := len(r.keys)
	prev, next := s.prev[:0], s.next[:0]
	if cap(prev) < n {
		prev, next = make([]driver.Record, n), make([]driver.Update, n)
		s.prev, s.next = prev, next
	}
	prev, next = prev[:n], next[:n]
	var mark []byte
	if op.Settle != nil {
		// A settlement: at most once per ID. Its mark is a value like a
		// record's (the kind, the time, the expiry, and the settler if
		// any), swept as records are.
		// One that cannot be read may be a settlement's: the op fails,
		// rather than settle the token a second time.
		mark = markKey(op.Settle.ID)
		if v := b.Get(mark); v != nil {
			kind, settler, _, ok := decodeMark(v)
			if !ok {
				return badMark(s.bucket, op.Settle.ID, v)
			}
			op.SettledBeforeBy(kind, settler, r.out)
			return nil
		} else if b.Bucket(mark) != nil {
			return badMark(s.bucket, op.Settle.ID, nil) // a nested bucket: no mark either
		}
	}
	for i, k := range r.keys {
		var err error
		if prev[i], err = s.get(b, k, op.Now); err != nil {
			return err // a record no release writes: the op fails alone
		}
	}
	ratelimit.Evaluate(op, prev, r.out, next)
	if mark != nil {
		v := appendMark(make([]byte, 0, markSettlerLen), op.Settle, op.Now)
		s.wrote = true
		if err := b.Put(mark, v); err != nil {
			return err
		}
	}
	i := 0
	for j := range op.Items {
		for _, sh := range op.Items[j].Shards {
			if u := next[i]; u.Write {
				// bbolt keeps the value until the commit: each its own bytes.
				if cap(s.vals)-len(s.vals) < valueLen {
					s.vals = make([]byte, 0, max(64*valueLen, 2*cap(s.vals)))
				}
				start := len(s.vals)
				s.vals = appendValue(s.vals, u.State, ratelimit.FullAt(sh.Params, u.State))
				s.wrote = true
				if err := b.Put(r.keys[i], s.vals[start:len(s.vals):len(s.vals)]); err != nil {
					return err
				}
			}
			i++
		}
	}
	if s.hooks.failOp != nil {
		return s.hooks.failOp(op)
	}
	return nil
}
