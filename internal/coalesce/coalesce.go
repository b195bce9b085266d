// Package coalesce gathers concurrent calls to one destination into
// batches, the way a database's group commit does.
//
// A call that arrives while fewer than MaxInFlight batches are in flight
// goes at once, alone, on its caller's goroutine: a lone caller waits for
// nobody. (Options.Overlap and Options.Share keep the slots beside a batch
// in flight for batches.) A call that arrives while the destination is
// busy waits in a queue; when a batch in flight completes, everything
// queued (up to MaxBatch calls, in arrival order) goes together in the
// next one. Many callers then share a few round trips, and a round trip's
// cost is spread over the calls it carries.
//
// A caller whose context ends while its call is queued leaves, and the
// call is never sent, even when a batch is taken between the end of its
// context and its caller's leaving. Once sent, a call may take effect
// even if its caller has left: the caller gets its context's error at
// once, and the batch's answer for it is dropped. A lone call sent on its caller's goroutine
// returns when its send does; with Options.Detach it is sent on another
// goroutine, so that its caller can leave on time even when the send does
// not watch the context.
//
// A panic in a send on a caller's goroutine goes on to that caller, with
// the call out of flight: a caller that recovers finds the Batcher usable.
// A panic in a send in the background, where no caller could recover it,
// fails every call of the batch with a *PanicError instead, and the
// Batcher goes on. So with runtime.Goexit (t.FailNow in a test's send): on
// a caller's goroutine it ends that goroutine, the call out of flight; in
// the background it fails every call of the batch with ErrGoexit, and the
// Batcher goes on.
package coalesce

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxBatch    = 128
	DefaultMaxInFlight = 1
)

// Options bounds a Batcher. The zero value takes the defaults.
type Options struct {
	// MaxBatch is the most calls one batch carries (default
	// DefaultMaxBatch). 1 turns coalescing off: every call is sent alone,
	// at once, on its caller's goroutine, with no bound on concurrency.
	MaxBatch int
	// MaxInFlight is the most batches sent at once (default
	// DefaultMaxInFlight). A call that finds fewer in flight goes at once.
	MaxInFlight int
	// Overlap, when above 0, keeps every slot but the first for large
	// batches: while a batch is in flight, a call queues (it does not go
	// at once), and the queued calls go together, in a slot of their
	// own, as soon as Overlap of them wait. Choose it when batches in
	// flight side by side pay only if each carries many calls (say, each
	// waits for a disk flush): a few concurrent callers are then batched
	// as with one slot, and many keep MaxInFlight batches in flight.
	Overlap int
	// Share, when Overlap is 0 and MaxInFlight is above 1, gives each
	// slot a fair share of the callers: while a batch is in flight, a call
	// queues unless the calls in flight and queued, itself included, are
	// at most MaxInFlight; the queued calls go together in a free slot
	// once they number at least 1/MaxInFlight of the calls in flight and
	// queued. A few callers then go at once, each in a slot of its own, as
	// without it; many go in MaxInFlight batches of about equal size, where
	// without it a caller that finds a slot free goes alone and the others
	// pile up behind the batches in flight. In a Group, the calls counted
	// are all of the Group's, so that of several destinations equally
	// busy each keeps to about one slot, and one that has most of the
	// calls gets more. Choose it when a round trip costs the destination
	// much more than each call it carries.
	Share bool
	// Detach sends a call that goes at once (a lone call, or every call
	// when coalescing is off) on another goroutine, as a batch of one with
	// its caller's context, when that context can end; its caller waits
	// as a queued caller does and leaves when its context ends, while the
	// send finishes in the background (and still counts as in flight).
	// Choose it when send may block past its context's end, e.g. on a
	// client that bounds a stalled read by its own timeout only. The call
	// goes to the Batcher's worker, a goroutine that lives as long as the
	// Batcher (or until Close), or, while that one is busy, to a goroutine
	// of its own; it costs two goroutine switches a call.
	Detach bool
}

func (o Options) withDefaults() Options {
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	return o
}

// Off is the Options that turns coalescing off.
var Off = Options{MaxBatch: 1}

// SendFunc sends one batch: reqs in arrival order. It fills res, which
// has the same length, and returns nil, or an error that fails every call
// of the batch. It must not keep reqs or res after it returns.
//
// A batch of one is sent with its caller's context; a larger batch with a
// context that keeps the first caller's values, reports the latest of the
// callers' deadlines as its own (if they all have one), and is canceled
// once every caller of the batch has left: it ends when the last of them
// does, by whatever clock their deadlines are on, not at that deadline by
// the wall clock.
type SendFunc[Req, Res any] func(ctx context.Context, reqs []Req, res []Res) error

// Batcher coalesces the calls to one destination. It is safe for
// concurrent use; build it with New.
type Batcher[Req, Res any] struct {
	send SendFunc[Req, Res]
	opts Options

	mu       sync.Mutex
	queue    []*call[Req, Res]
	inflight int
	// share counts the calls in flight and queued for Options.Share:
	// this Batcher's, or all of its Group's (nil without Share).
	share *tally
	// worker takes a detached lone call to the Batcher's worker (nil
	// until the first such call, and after Close), when it is not busy.
	worker  chan *call[Req, Res]
	busy    bool
	cleanup runtime.Cleanup // closes worker once the Batcher is collected
	closed  bool            // Close was called: no worker starts again

	// calls holds calls whose callers took their answer, for reuse: a
	// call and its channel are two allocations a call otherwise.
	calls sync.Pool

	// used says, in a Group, that the Batcher had a call since the Group
	// last dropped the Batchers of destinations gone (Group.mu).
	used bool
}

// call is one queued call.
type call[Req, Res any] struct {
	ctx  context.Context
	req  Req
	res  Res
	err  error
	done chan struct{} // receives one value once res and err are set

	// Guarded by Batcher.mu.
	batch *batch // nil while queued
	left  bool   // the caller has gone

	own batch              // the batch of a call sent alone (a detached lone call, or one queued)
	b   *Batcher[Req, Res] // a detached lone call's, for the worker
}

func noCancel() {}

// batch tracks the callers of one batch sent in the background, so that
// its context ends when the last of them leaves.
type batch struct {
	waiting int
	cancel  context.CancelFunc
}

// tally counts the calls in flight and queued of the Batchers that share
// their slots fairly (Options.Share): one Batcher's, or a Group's.
type tally struct {
	sent, queued atomic.Int64
}

// New returns a Batcher that sends batches with send.
func New[Req, Res any](send SendFunc[Req, Res], opts Options) *Batcher[Req, Res] {
	var share *tally
	if opts.Share {
		share = new(tally)
	}
	return newBatcher(send, opts, share)
}

func newBatcher[Req, Res any](send SendFunc[Req, Res], opts Options, share *tally) *Batcher[Req, Res] {
	return &Batcher[Req, Res]{send: send, opts: opts.withDefaults(), share: share}
}

// count adds sent calls in flight and queued calls to the share's tally.
func (b *Batcher[Req, Res]) count(sent, queued int) {
	if t := b.share; t != nil {
		if sent != 0 {
			t.sent.Add(int64(sent))
		}
		if queued != 0 {
			t.queued.Add(int64(queued))
		}
	}
}

// Do sends req, alone or with others, and returns its result. It returns
// ctx's error when ctx ends first: before the call was sent (then it was
// not), or while it was in flight (then it may have taken effect).
func (b *Batcher[Req, Res]) Do(ctx context.Context, req Req) (Res, error) {
	var zero Res
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	detach := b.opts.Detach && ctx.Done() != nil
	if b.opts.MaxBatch == 1 && !detach {
		return b.sendOne(ctx, req)
	}
	b.mu.Lock()
	if b.opts.MaxBatch == 1 || (b.inflight < b.opts.MaxInFlight && len(b.queue) == 0 && (b.inflight == 0 || b.alone())) {
		b.inflight++
		b.count(1, 0)
		if detach {
			// A batch of one, sent with its caller's context: it ends
			// when its caller leaves, with nothing to cancel.
			c := b.newCall(ctx, req)
			c.own = batch{waiting: 1, cancel: noCancel}
			c.batch = &c.own
			b.detach(c)
			b.mu.Unlock()
			return b.wait(ctx, c)
		}
		b.mu.Unlock()
		// Out of flight when send returns, or panics: the panic goes on
		// to the caller, and the Batcher stays usable if it recovers.
		defer b.landed()
		return b.sendOne(ctx, req)
	}
	c := b.newCall(ctx, req)
	b.queue = append(b.queue, c)
	b.count(0, 1)
	if b.opts.Overlap > 0 || b.opts.Share {
		b.next() // unlocks; starts a batch once enough calls wait
	} else {
		b.mu.Unlock()
	}
	return b.wait(ctx, c)
}

// Queued returns how many calls wait in the queue for a batch: queued
// behind the batches in flight, not yet sent.
func (b *Batcher[Req, Res]) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// newCall returns a call of req, reused if one is free.
func (b *Batcher[Req, Res]) newCall(ctx context.Context, req Req) *call[Req, Res] {
	c, _ := b.calls.Get().(*call[Req, Res])
	if c == nil {
		return &call[Req, Res]{ctx: ctx, req: req, done: make(chan struct{}, 1)}
	}
	c.ctx, c.req = ctx, req
	return c
}

// signal tells c's caller that res and err are set; nothing may touch
// c after, since its caller may reuse it at once.
func signal[Req, Res any](c *call[Req, Res]) {
	c.done <- struct{}{} // never blocks: one answer per call, in a buffer of one
}

// reuse returns its answer and puts c, answered and taken by its caller,
// back for another call.
func (b *Batcher[Req, Res]) reuse(c *call[Req, Res]) (Res, error) {
	res, err := c.res, c.err
	*c = call[Req, Res]{done: c.done}
	b.calls.Put(c)
	return res, err
}

// wait waits for the answer to c, queued or sent, or for ctx to end.
func (b *Batcher[Req, Res]) wait(ctx context.Context, c *call[Req, Res]) (Res, error) {
	var zero Res
	select {
	case <-c.done:
		return b.reuse(c)
	case <-ctx.Done():
	}
	b.mu.Lock()
	select {
	case <-c.done: // answered while we took the lock
		b.mu.Unlock()
		return b.reuse(c)
	default:
	}
	c.left = true
	if c.batch == nil {
		b.remove(c)
	} else if c.batch.waiting--; c.batch.waiting == 0 {
		c.batch.cancel()
	}
	b.mu.Unlock()
	return zero, ctx.Err()
}

func (b *Batcher[Req, Res]) sendOne(ctx context.Context, req Req) (Res, error) {
	var res [1]Res
	reqs := [1]Req{req}
	err := b.send(ctx, reqs[:], res[:])
	return res[0], err
}

// landed takes a lone call sent on its caller's goroutine out of flight
// and starts the next batch, if calls are queued.
func (b *Batcher[Req, Res]) landed() {
	b.mu.Lock()
	b.inflight--
	b.count(-1, 0)
	b.next() // unlocks
}

// remove takes a queued call out of the queue. b.mu is held.
func (b *Batcher[Req, Res]) remove(c *call[Req, Res]) {
	for i, q := range b.queue {
		if q == c {
			copy(b.queue[i:], b.queue[i+1:])
			b.queue[len(b.queue)-1] = nil
			b.queue = b.queue[:len(b.queue)-1]
			b.count(0, -1)
			b.shrink()
			return
		}
	}
}

// shrink lets go of the queue's array once the queue is empty, if a burst
// of calls made it much larger than a batch: it would otherwise be kept
// as long as the Batcher. b.mu is held.
func (b *Batcher[Req, Res]) shrink() {
	if len(b.queue) == 0 && cap(b.queue) > 4*b.opts.MaxBatch {
		b.queue = nil
	}
}

// next starts the next batch in the background if calls are queued and a
// slot is free. b.mu is held; next unlocks it.
func (b *Batcher[Req, Res]) next() {
	if len(b.queue) == 0 || b.inflight >= b.opts.MaxInFlight || (b.inflight > 0 && !b.overlaps()) {
		b.mu.Unlock()
		return
	}
	calls, bt, ctx := b.take()
	if calls == nil {
		b.mu.Unlock()
		return
	}
	b.inflight++
	b.mu.Unlock()
	go b.run(calls, bt, ctx, false)
}

// overlaps reports whether the queued calls may go beside a batch in
// flight: always, unless Options.Overlap asks for that many first, or
// Options.Share for a fair share of the calls. b.mu is held.
func (b *Batcher[Req, Res]) overlaps() bool {
	switch {
	case b.opts.Overlap > 0:
		return len(b.queue) >= b.opts.Overlap
	case b.opts.Share:
		return int64(len(b.queue))*int64(b.opts.MaxInFlight) >= b.share.sent.Load()+b.share.queued.Load()
	}
	return true
}

// alone reports whether a call that finds batches in flight, a slot free
// and nobody queued goes at once: always, unless Options.Overlap asks for
// a batch, or Options.Share for a fair share of the calls. b.mu is held.
func (b *Batcher[Req, Res]) alone() bool {
	switch {
	case b.opts.Overlap > 0:
		return false
	case b.opts.Share:
		return b.share.sent.Load()+b.share.queued.Load()+1 <= int64(b.opts.MaxInFlight)
	}
	return true
}

// goOn reports whether a batch that has just been answered sends the
// queued calls next, in its slot: when calls are queued, and, if other
// batches are in flight, when they may go beside them (otherwise one of
// those sends them when it is answered). b.mu is held.
func (b *Batcher[Req, Res]) goOn() bool {
	return len(b.queue) > 0 && (b.inflight == 1 || b.overlaps())
}

// take removes up to MaxBatch calls from the head of the queue and marks
// them sent. A call whose context has ended, its caller not yet gone (it
// waits for b.mu), is not sent: it is answered with its context's error,
// as it would be had its caller taken the lock first. take returns no
// calls, and no batch, when every queued call's context has ended. b.mu
// is held.
func (b *Batcher[Req, Res]) take() ([]*call[Req, Res], *batch, context.Context) {
	n := min(len(b.queue), b.opts.MaxBatch)
	calls := make([]*call[Req, Res], 0, n)
	i := 0
	for ; i < len(b.queue) && len(calls) < n; i++ {
		c := b.queue[i]
		if err := c.ctx.Err(); err != nil {
			c.err = err
			signal(c)
			continue
		}
		calls = append(calls, c)
	}
	rest := copy(b.queue, b.queue[i:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	b.shrink()
	b.count(len(calls), -i)
	if len(calls) == 0 {
		return nil, nil, nil
	}
	bt, ctx := b.start(calls)
	return calls, bt, ctx
}

// start marks calls sent together and returns their batch and its
// context: a call sent alone, its caller's own (see SendFunc). b.mu is
// held.
func (b *Batcher[Req, Res]) start(calls []*call[Req, Res]) (*batch, context.Context) {
	if len(calls) == 1 {
		// It ends when its caller leaves, with nothing to cancel.
		c := calls[0]
		c.own = batch{waiting: 1, cancel: noCancel}
		c.batch = &c.own
		return c.batch, c.ctx
	}
	ctx := context.WithoutCancel(calls[0].ctx)
	var latest time.Time
	for _, c := range calls {
		dl, ok := c.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	if !latest.IsZero() {
		ctx = deadlineCtx{ctx, latest}
	}
	bt := &batch{waiting: len(calls), cancel: cancel}
	for _, c := range calls {
		c.batch = bt
	}
	return bt, ctx
}

// deadlineCtx is a batch's context: it reports the latest of its callers'
// deadlines, for a send that bounds its reads by it, but ends only when
// the batch is canceled, once every caller has left, each when its own
// context ended. A deadline may be of another clock than the wall's (a
// test's mock.WithTimeout): a context.WithDeadline would end at once for
// one the wall clock is past, and fail the batch, though none of its
// callers' contexts had ended. It reads no time off the wall clock; a
// send reads its deadline by the rule of internal/deadline, as any other
// (one the wall clock is past while the batch goes on is Unmet).
type deadlineCtx struct {
	context.Context
	deadline time.Time
}

func (c deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// detach sends a lone call in the background: on the Batcher's worker
// if it is idle, else on a goroutine of its own. b.mu is held.
//
// The worker is a goroutine that lives as long as the Batcher, or until
// Close: handing a call to a parked goroutine costs less than starting
// one, whose stack grows again through the client's calls. It holds
// nothing but its channel while idle, so a Batcher no longer used is
// collected, and closes the channel then, which ends the worker.
func (b *Batcher[Req, Res]) detach(c *call[Req, Res]) {
	if b.worker == nil && !b.closed {
		b.worker = make(chan *call[Req, Res], 1)
		go work(b.worker)
		b.cleanup = runtime.AddCleanup(b, func(ch chan *call[Req, Res]) { close(ch) }, b.worker)
	}
	if b.busy || b.worker == nil { // a lone call with MaxInFlight above 1, or coalescing off; or after Close
		go b.runOne(c, false)
		return
	}
	b.busy = true
	c.b = b
	b.worker <- c // never blocks: the worker took the last one
}

// Close ends the Batcher's worker (Options.Detach): at once if it is
// idle, else once it has sent what it is sending. The Batcher stays
// usable: a detached lone call then goes on a goroutine of its own, which
// ends with its send. Call it when the destination is closed, so that no
// goroutine of the Batcher's outlives it. It is idempotent.
func (b *Batcher[Req, Res]) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if !b.busy {
		b.stopWorker()
	}
}

// stopWorker ends the worker, idle, if there is one. b.mu is held.
func (b *Batcher[Req, Res]) stopWorker() {
	if b.worker != nil {
		b.cleanup.Stop()
		close(b.worker)
		b.worker = nil
	}
}

// idle marks the worker idle, having sent its last batch, or, after Close,
// ends it; a goroutine of a lone call's own (not the worker) changes
// nothing. b.mu is held.
func (b *Batcher[Req, Res]) idle(worker bool) {
	if !worker {
		return
	}
	b.busy = false
	if b.closed {
		b.stopWorker()
	}
}

// work sends the lone calls handed to it, until its channel is closed.
func work[Req, Res any](calls <-chan *call[Req, Res]) {
	for c := range calls {
		c.b.runOne(c, true)
	}
}

// runOne sends a detached lone call in the background, then, as run
// does, the batches of the calls that arrived meanwhile.
func (b *Batcher[Req, Res]) runOne(c *call[Req, Res], worker bool) {
	var res [1]Res
	sent := false
	defer func() {
		if !sent { // send called runtime.Goexit: see sendBackground
			b.retire(worker)
			var zero Res
			if calls, bt, ctx := b.answerOne(c, zero, ErrGoexit, false); calls != nil {
				go b.run(calls, bt, ctx, false)
			}
		}
	}()
	err := b.sendBackground(c.ctx, []Req{c.req}, res[:])
	sent = true
	if calls, bt, ctx := b.answerOne(c, res[0], err, worker); calls != nil {
		b.run(calls, bt, ctx, worker)
	}
}

// answerOne answers the detached lone call c, sent, with res and err,
// and returns the batch to send next in its slot, if any (see after).
func (b *Batcher[Req, Res]) answerOne(c *call[Req, Res], res Res, err error, worker bool) ([]*call[Req, Res], *batch, context.Context) {
	c.res, c.err = res, err
	// Out of flight before the caller wakes, so that its next call, if
	// it makes one at once, goes at once too.
	b.mu.Lock()
	b.count(-1, 0)
	calls, bt, ctx := b.after(worker)
	b.mu.Unlock()
	signal(c)
	return calls, bt, ctx
}

// run sends batches in the background, one after another, while calls
// keep arriving; on the worker, it frees the worker at the end.
func (b *Batcher[Req, Res]) run(calls []*call[Req, Res], bt *batch, ctx context.Context, worker bool) {
	for calls != nil {
		calls, bt, ctx = b.sendBatch(calls, bt, ctx, worker)
	}
}

// sendBatch sends calls, a batch, in the background, answers them, and
// returns the batch to send next in its slot, if any (see after).
func (b *Batcher[Req, Res]) sendBatch(calls []*call[Req, Res], bt *batch, ctx context.Context, worker bool) ([]*call[Req, Res], *batch, context.Context) {
	reqs := make([]Req, len(calls))
	res := make([]Res, len(calls))
	for i, c := range calls {
		reqs[i] = c.req
	}
	sent := false
	defer func() {
		if !sent { // send called runtime.Goexit: see sendBackground
			b.retire(worker)
			clear(res)
			if calls, bt, ctx := b.answer(calls, bt, res, ErrGoexit, false); calls != nil {
				go b.run(calls, bt, ctx, false)
			}
		}
	}()
	err := b.sendBackground(ctx, reqs, res)
	sent = true
	return b.answer(calls, bt, res, err, worker)
}

// answer answers the calls of bt, sent, with res and err, and returns the
// batch to send next in its slot, if any (see after).
func (b *Batcher[Req, Res]) answer(calls []*call[Req, Res], bt *batch, res []Res, err error, worker bool) ([]*call[Req, Res], *batch, context.Context) {
	bt.cancel()
	for i, c := range calls {
		c.res, c.err = res[i], err
		signal(c)
	}
	b.mu.Lock()
	b.count(-len(calls), 0)
	next, nbt, nctx := b.after(worker)
	b.mu.Unlock()
	return next, nbt, nctx
}

// after returns the batch to send next in the slot of a batch in the
// background just answered: the queued calls, if they go on in it (see
// goOn). Else it takes the slot out of flight and, on the worker, frees
// the worker. b.mu is held.
func (b *Batcher[Req, Res]) after(worker bool) ([]*call[Req, Res], *batch, context.Context) {
	if b.goOn() {
		if calls, bt, ctx := b.take(); calls != nil {
			return calls, bt, ctx
		}
	}
	b.inflight--
	b.idle(worker)
	return nil, nil, nil
}

// retire lets go of the worker, if worker says this goroutine is it, as
// runtime.Goexit ends it: the next detached call starts another (see
// sendBackground).
func (b *Batcher[Req, Res]) retire(worker bool) {
	if !worker {
		return
	}
	b.mu.Lock()
	b.busy = false
	b.stopWorker()
	b.mu.Unlock()
}

// PanicError is the error of every call of a batch whose send panicked in
// the background (a batch of queued calls, or a detached lone call): no
// caller could recover the panic there, and the process would end.
type PanicError struct {
	Value any    // the value the send panicked with
	Stack []byte // the stack of the send's goroutine when it panicked
}

// Error says that the send panicked, and with what.
func (e *PanicError) Error() string {
	return fmt.Sprintf("a batch's send panicked: %v", e.Value)
}

// Unwrap returns the value the send panicked with, if it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// ErrGoexit is the error of every call of a batch whose send called
// runtime.Goexit in the background (see the package doc), and of
// Detached when its fn does: it did not return, and what it did is
// unknown.
var ErrGoexit = errors.New("the send called runtime.Goexit (t.FailNow does) and did not return: return an error from it instead")

// sendBackground sends a batch in the background: a panic in send fails
// the batch with a *PanicError, and its results are zero.
//
// It returns, unless send calls runtime.Goexit, which ends the goroutine
// whatever the calls deferred on it do. So a goroutine that sends a batch
// in the background defers, before it calls sendBackground, what then
// answers the batch with ErrGoexit and starts another goroutine for the
// batches that go on in its slot; the worker, if it is the one, is gone,
// and the Batcher's next detached call starts another. The batch's
// callers would otherwise wait for an answer forever, and its slot stay
// in flight.
func (b *Batcher[Req, Res]) sendBackground(ctx context.Context, reqs []Req, res []Res) (err error) {
	defer func() {
		if v := recover(); v != nil {
			clear(res)
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return b.send(ctx, reqs, res)
}

// Group keeps one Batcher per destination, made on first use, and drops
// those of destinations no longer called: when a new destination comes
// (the destinations are a Cluster's masters, say, and one took another's
// place), and after every DropEvery calls besides (a Ring's shard that
// left, with none in its place), every Batcher without a call since the
// last such time, and nothing queued or in flight, goes. So the Group
// holds the destinations called lately, not every one it was ever given:
// a destination no longer called keeps its Batcher for at most
// 2×DropEvery calls of the Group's others. With
// Options.Share, its Batchers share their slots fairly among all of the
// Group's calls: a destination that has a fair share of them gets a
// second slot, and one of several equally busy destinations keeps to one.
type Group[K comparable, Req, Res any] struct {
	send  func(ctx context.Context, dest K, reqs []Req, res []Res) error
	opts  Options
	share *tally // nil without Share

	mu       sync.Mutex
	batchers map[K]*Batcher[Req, Res]
	closed   bool // Close was called: the Batchers made since are closed
	calls    int  // calls of Do since the last drop
}

// DropEvery is how many calls of a Group's Do pass, at most, between two
// drops of its Batchers no longer called (see Group).
const DropEvery = 1024

// NewGroup returns a Group whose batches to dest are sent by send.
func NewGroup[K comparable, Req, Res any](send func(ctx context.Context, dest K, reqs []Req, res []Res) error, opts Options) *Group[K, Req, Res] {
	g := &Group[K, Req, Res]{send: send, opts: opts, batchers: make(map[K]*Batcher[Req, Res])}
	if opts.Share {
		g.share = new(tally)
	}
	return g
}

// Do sends req to dest, alone or with other calls to dest, as
// Batcher.Do does.
func (g *Group[K, Req, Res]) Do(ctx context.Context, dest K, req Req) (Res, error) {
	g.mu.Lock()
	b, ok := g.batchers[dest]
	if ok {
		b.used = true // kept by the drop below
	}
	if g.calls++; !ok || g.calls >= DropEvery {
		g.drop()
	}
	if !ok {
		b = newBatcher(func(ctx context.Context, reqs []Req, res []Res) error {
			return g.send(ctx, dest, reqs, res)
		}, g.opts, g.share)
		b.closed = g.closed // b is not shared yet
		g.batchers[dest] = b
	}
	b.used = true
	g.mu.Unlock()
	return b.Do(ctx, req)
}

// Len returns how many Batchers the Group keeps: one per destination
// called lately.
func (g *Group[K, Req, Res]) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.batchers)
}

// Close closes the Group's Batchers (Batcher.Close), and every one it
// makes after, so that no worker of the Group's outlives the destinations.
// The Group stays usable. It is idempotent.
func (g *Group[K, Req, Res]) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for _, b := range g.batchers {
		b.Close()
	}
}

// drop removes the Batchers without a call since the last drop, and none
// queued or in flight, and marks the others unused. g.mu is held. It
// closes those it removes (Batcher.Close), whose workers end at once. A
// caller that took a Batcher dropped since sends through it still: it
// works alone, as the Group's new one for its destination does, its
// detached calls each on a goroutine of their own.
func (g *Group[K, Req, Res]) drop() {
	g.calls = 0
	for dest, b := range g.batchers {
		if b.used {
			b.used = false
			continue
		}
		b.mu.Lock()
		idle := b.inflight == 0 && len(b.queue) == 0
		if idle {
			// Closed, so that its worker ends now, not once the Batcher
			// is collected: a caller may hold it still, and Close no
			// longer reaches it.
			b.closed = true
			b.stopWorker() // idle: not busy
		}
		b.mu.Unlock()
		if idle {
			delete(g.batchers, dest)
		}
	}
}
