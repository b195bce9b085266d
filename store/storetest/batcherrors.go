package storetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// testBatchErrors checks that the error of an ApplyBatch that failed
// lets its caller tell which ops took no effect (docs/stores.md,
// "Errors"): whenever it holds a *driver.OpError, it is the join of one
// for each op left out (FailedOps), and of nothing else, however the store
// wraps what it adds (the caller's context, a closed store); those ops,
// and only those, were not decided. It checks that on a store closed, given
// a context done before the call (canceled, past its deadline) and one
// that ends at each point where the store looks at it during the call,
// and, given SpoilRecord, with an op of the batch failing on its own; and
// that errors.Is matches the context's error or driver.ErrClosed.
func testBatchErrors(t *testing.T, newStore NewStore, su suite) {
	now := epoch.UnixMilli()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	const n = 4
	const bad = 1 // the op on a spoiled record, with SpoilRecord

	t.Run("DoneBefore", func(t *testing.T) {
		s := newStore(t)
		past, cancelPast := context.WithDeadline(context.Background(), time.Now().Add(-time.Hour))
		defer cancelPast()
		canceled, cancel := context.WithCancel(context.Background())
		cancel()
		for _, ctx := range []context.Context{canceled, past} {
			b := newFreshBatch("before-"+ctx.Err().Error(), n, now, p)
			err := s.(driver.BatchApplier).ApplyBatch(ctx, b.ops, b.outs)
			require.ErrorIs(t, err, ctx.Err(), "ApplyBatch given a context done before the call")
			b.requireOutcome(t, s, err, "a context done before the call ("+ctx.Err().Error()+")")
			require.Empty(t, b.decided(t, s), "a context done before the call: no op may have taken effect (err: %v)", err)
		}
	})

	// endings runs ApplyBatch of a fresh batch (with its op bad on a
	// spoiled record, if spoiled) on s with a context that ends at the
	// k-th time the store asks it (Err or Done), for k = 1, 2, … until the
	// call asks it fewer times: at each point where the store looks at it,
	// between its ops among them.
	endings := func(t *testing.T, s ratelimit.Store, spoiled bool) {
		for _, cause := range []error{context.Canceled, context.DeadlineExceeded} {
			for k := 1; ; k++ {
				require.Less(t, k, 10_000, "the store asked its context more often than the suite tries")
				ctx := newEndingContext(k, cause)
				b := newFreshBatch(fmt.Sprintf("ends-%v-%d", cause, k), n, now, p)
				if spoiled {
					b.spoil(t, s, su.spoil, bad)
				}
				err := s.(driver.BatchApplier).ApplyBatch(ctx, b.ops, b.outs)
				what := fmt.Sprintf("a context ending (%v) at the %d-th time the store asks it", cause, k)
				ctx.stop()
				b.requireOutcome(t, s, err, what)
				if !ctx.ended() {
					if spoiled {
						require.Equal(t, []int{bad}, FailedOps(t, err), "%s, which it did not: the op on the spoiled record fails alone", what)
						require.ErrorIs(t, err, driver.ErrBadRecord, what)
					} else {
						require.NoError(t, err, "%s, which it did not", what)
					}
					break
				}
				if err != nil && !(spoiled && errors.Is(err, driver.ErrBadRecord)) {
					require.ErrorIs(t, err, cause, what)
				}
			}
		}
	}
	t.Run("ContextEnds", func(t *testing.T) { endings(t, newStore(t), false) })

	if su.spoil != nil {
		t.Run("OpFails", func(t *testing.T) {
			s := newStore(t)
			b := newFreshBatch("spoiled", n, now, p)
			b.spoil(t, s, su.spoil, bad)
			err := s.(driver.BatchApplier).ApplyBatch(context.Background(), b.ops, b.outs)
			require.ErrorIs(t, err, driver.ErrBadRecord, "a batch with an op on a spoiled record")
			b.requireOutcome(t, s, err, "a batch with an op on a spoiled record")
			require.Equal(t, []int{bad}, FailedOps(t, err), "the op on the spoiled record fails alone (err: %v)", err)
		})
		t.Run("OpFailsContextEnds", func(t *testing.T) { endings(t, newStore(t), true) })
	}

	if !closes(newStore(t)) {
		return
	}
	t.Run("Closed", func(t *testing.T) {
		s := newStore(t)
		b := newFreshBatch("closed", n, now, p)
		require.NoError(t, s.(io.Closer).Close())
		err := s.(driver.BatchApplier).ApplyBatch(context.Background(), b.ops, b.outs)
		requireWrapped(t, err, driver.ErrClosed, "ApplyBatch after Close")
		if failed := listedOps(t, err, "ApplyBatch after Close"); failed != nil {
			require.Equal(t, b.all(), failed, "ApplyBatch after Close decides no op (err: %v)", err)
		}
	})
}

// freshBatch is a batch of ops, each a limit of 1 on a record of its own
// that no call wrote before: the record is found after the call exactly
// when the op was decided.
type freshBatch struct {
	ids  []driver.RecordID
	ops  []*driver.Op
	outs [][]driver.Decision
	bad  int // the op on a spoiled record, or -1
}

func newFreshBatch(name string, n int, now int64, p driver.Params) *freshBatch {
	b := &freshBatch{bad: -1}
	for i := range n {
		key := fmt.Sprint("op", i)
		b.ids = append(b.ids, driver.RecordID{Name: name, Key: key})
		b.ops = append(b.ops, &driver.Op{Mode: driver.ModeLimit, Now: now, Items: []driver.Item{itemOf(name, key, 1, p)}})
		b.outs = append(b.outs, make([]driver.Decision, 1))
	}
	return b
}

// spoil makes op i of b fail on its own: it spoils its record.
func (b *freshBatch) spoil(t *testing.T, s ratelimit.Store, spoil func(*testing.T, ratelimit.Store, driver.RecordID), i int) {
	t.Helper()
	spoil(t, s, b.ids[i])
	b.bad = i
}

// all returns the indexes of every op of b.
func (b *freshBatch) all() []int {
	all := make([]int, len(b.ops))
	for i := range all {
		all[i] = i
	}
	return all
}

// decided returns the indexes of the ops of b that took effect, but its
// op on a spoiled record, which takes none (and its record cannot be
// read).
func (b *freshBatch) decided(t *testing.T, s ratelimit.Store) []int {
	t.Helper()
	var decided []int
	recs := make([]driver.Record, 1)
	for i, id := range b.ids {
		if i == b.bad {
			continue
		}
		require.NoError(t, s.Load(context.Background(), []driver.RecordID{id}, recs))
		if recs[0].Found {
			decided = append(decided, i)
		}
	}
	return decided
}

// requireOutcome checks err, the error of ApplyBatch of b on s: nil, every
// op decided and its out filled; one that holds a *driver.OpError, the
// join of one for each op not decided, the others decided and their outs
// filled (an op on a spoiled record is never decided); any other error
// holds none (any op may or may not have taken
// effect).
func (b *freshBatch) requireOutcome(t *testing.T, s ratelimit.Store, err error, what string) {
	t.Helper()
	failed := listedOps(t, err, what)
	if err != nil && failed == nil {
		return
	}
	if b.bad >= 0 {
		require.Error(t, err, "%s: the op on a spoiled record cannot be decided", what)
		require.Contains(t, failed, b.bad, "%s: the op on a spoiled record is left out (err: %v)", what, err)
	}
	var want []int
	for i, out := range b.outs {
		if i != b.bad && !slicesContain(failed, i) {
			want = append(want, i)
			require.True(t, out[0].OK, "%s: op %d, decided, has its out filled (err: %v)", what, i, err)
		}
	}
	require.Equal(t, want, b.decided(t, s), "%s: the ops decided are those the error does not list (err: %v)", what, err)
}

func slicesContain(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// listedOps returns the indexes of the ops that err, the error of an
// ApplyBatch, lists as left out, or nil if it holds no *driver.OpError.
// It fails t if err holds one anywhere but in a join at its top, of
// *driver.OpErrors alone, where a caller finds them (FailedOps): a store
// that wraps such a join, to say more, hides which ops failed.
func listedOps(t helperT, err error, what string) []int {
	t.Helper()
	held := opErrorsIn(err)
	if len(held) == 0 {
		return nil
	}
	joined, ok := err.(interface{ Unwrap() []error })
	require.True(t, ok, "%s: the error holds *driver.OpErrors for ops %v but is no join of them: "+
		"wrap each op's error, not the join, so that a caller can list the ops that failed (err: %v)", what, held, err)
	var listed []int
	for _, e := range joined.Unwrap() {
		oe, ok := e.(*driver.OpError)
		require.True(t, ok, "%s: the join of the ops' errors holds %T %q beside them: "+
			"wrap each op's error, not the join (err: %v)", what, e, e, err)
		listed = append(listed, oe.Index)
	}
	require.Equal(t, held, listed, "%s: the *driver.OpErrors the error holds are those its join lists (err: %v)", what, err)
	return listed
}

// helperT is what listedOps needs of a *testing.T, for its own tests.
type helperT interface {
	require.TestingT
	Helper()
}

// opErrorsIn returns the indexes of the *driver.OpErrors in err's tree,
// but those within one.
func opErrorsIn(err error) []int {
	var oe *driver.OpError
	if errors.As(err, &oe) && err == error(oe) {
		return []int{oe.Index}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return opErrorsIn(u.Unwrap())
	case interface{ Unwrap() []error }:
		var idx []int
		for _, e := range u.Unwrap() {
			idx = append(idx, opErrorsIn(e)...)
		}
		return idx
	}
	return nil
}

// endingContext is a context that ends, with cause, at the at-th time it
// is asked whether it has (Err or Done): its caller ends it at a point
// where it looks.
type endingContext struct {
	context.Context // Background, for Value
	cause           error

	mu    sync.Mutex
	asked int
	at    int
	done  chan struct{}
	err   error
}

func newEndingContext(at int, cause error) *endingContext {
	return &endingContext{Context: context.Background(), cause: cause, at: at, done: make(chan struct{})}
}

// ask counts a question and ends c at the at-th.
func (c *endingContext) ask() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked++
	if c.asked == c.at && c.err == nil {
		c.err = c.cause
		close(c.done)
	}
}

// stop makes c count no more questions (a store's goroutines may ask it
// after the call), so that ended says whether it ended during the call.
func (c *endingContext) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = 0
}

func (c *endingContext) ended() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}

func (c *endingContext) Deadline() (time.Time, bool) { return time.Time{}, false }

func (c *endingContext) Done() <-chan struct{} {
	c.ask()
	return c.done
}

func (c *endingContext) Err() error {
	c.ask()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
