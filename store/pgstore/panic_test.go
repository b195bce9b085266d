package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/coalesce"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// panicTracer holds the statement of the key "first" until hold is
// closed, and, once armed, panics at the start of a statement of the key
// "b", as a pool's QueryTracer, the caller's code, may; or, with goexit,
// calls runtime.Goexit there (t.FailNow in a test's tracer does).
type panicTracer struct {
	held   chan struct{} // closed when the statement of "first" is held
	hold   chan struct{}
	armed  atomic.Bool
	goexit bool
}

// hasKey reports whether args, a statement's, carry key: as a parameter
// of a lone statement or in an array of a batch's.
func hasKey(args []any, key string) bool {
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			if string(v) == key {
				return true
			}
		case [][]byte:
			for _, b := range v {
				if bytes.Equal(b, []byte(key)) {
					return true
				}
			}
		}
	}
	return false
}

func (tr *panicTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if hasKey(d.Args, "first") {
		select {
		case <-tr.held:
		default:
			close(tr.held)
		}
		<-tr.hold
	}
	if tr.armed.Load() && hasKey(d.Args, "b") {
		if tr.goexit {
			runtime.Goexit()
		}
		panic("the tracer panicked")
	}
	return ctx
}

func (tr *panicTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A batch sent in the background whose send panics fails with a
// *coalesce.PanicError only the calls it had not answered: a call whose
// statement committed before the panic gets its decision, and one that
// failed on its own its error. Every call of the batch got the
// PanicError, so that a call decided and charged read as failed.
//
// A call on "first" holds the batcher's one slot while calls on "a",
// "bad" (a record no release writes) and "b" queue, in that order; they
// go together, in the background. The batch fails on "bad", so its ops go
// again one by one: "a" is decided, "bad" fails with ErrBadRecord, and
// the pool's tracer panics as "b" goes.
func TestPanicAfterCommitKeepsAnswers(t *testing.T) {
	errs, b := sendThenFail(t, false)
	var pe *coalesce.PanicError
	require.True(t, errors.As(errs[3], &pe), "b: %v", errs[3])
	require.Equal(t, "the tracer panicked", pe.Value)
	require.Equal(t, 10.0, b.remaining(t, "b"), "b was not sent")
}

// So too when the send calls runtime.Goexit in the background: the calls
// it had answered keep their answers, and only those it had not get
// coalesce.ErrGoexit. Every call of the batch got ErrGoexit, also "a",
// decided and charged.
func TestGoexitAfterCommitKeepsAnswers(t *testing.T) {
	errs, b := sendThenFail(t, true)
	require.ErrorIs(t, errs[3], coalesce.ErrGoexit, "b")
	require.Equal(t, 10.0, b.remaining(t, "b"), "b was not sent")
}

// sendThenFail sends the batch of TestPanicAfterCommitKeepsAnswers, whose
// tracer panics, or with goexit calls runtime.Goexit, as "b" goes; it
// checks the answers of the calls before "b", and returns the calls'
// errors.
func sendThenFail(t *testing.T, goexit bool) ([]error, *resendBatch) {
	tr := &panicTracer{held: make(chan struct{}), hold: make(chan struct{}), goexit: goexit}
	b := newResendBatch(t, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = tr }, "first", "a", "bad", "b")
	pgstore.SetHooks(b.s, pgstore.Hooks{Resend: func() { tr.armed.Store(true) }})
	ctx := context.Background()
	errs := make([]error, len(b.ops))
	done := make([]chan struct{}, len(b.ops))
	for i := range b.ops {
		done[i] = make(chan struct{})
		go func() {
			defer close(done[i])
			errs[i] = b.s.Apply(ctx, b.ops[i], b.outs[i])
		}()
		if i == 0 {
			<-tr.held
			continue
		}
		require.Eventually(t, func() bool { return pgstore.Queued(b.s) == i }, 15*time.Second, time.Millisecond, "call %d queued", i)
	}
	close(tr.hold)
	for _, d := range done {
		<-d
	}
	require.NoError(t, errs[0], "first")
	require.NoError(t, errs[1], "a: decided before the panic")
	require.True(t, b.outs[1][0].OK)
	require.Equal(t, 9.0, b.outs[1][0].Remaining)
	require.Equal(t, 9.0, b.remaining(t, "a"), "a was charged")
	require.ErrorIs(t, errs[2], driver.ErrBadRecord, "bad")
	return errs, b
}
