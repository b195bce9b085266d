package pgstore_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// endingConn, once armed, ends the context of the statement it is about
// to write (end; a Bind: an execution of a prepared statement) and waits
// until pgx has seen it, which sets a deadline past on the connection:
// the write then fails with a timeout, as it does when a context ends
// while its statement is written.
type endingConn struct {
	net.Conn
	armed    *atomic.Bool
	end      *atomic.Pointer[func()]
	deadline chan struct{}
}

func (c *endingConn) Write(p []byte) (int, error) {
	if len(p) > 0 && p[0] == 'B' && c.armed.CompareAndSwap(true, false) {
		(*c.end.Load())()
		<-c.deadline
	}
	return c.Conn.Write(p)
}

// SetDeadline sets the deadline, then lets a write waiting for it go on:
// signaled before, the write could go out ahead of the deadline.
func (c *endingConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	if !t.IsZero() {
		select {
		case c.deadline <- struct{}{}:
		default:
		}
	}
	return err
}

// A call whose context ends while its statement is written fails with an
// error that matches the context's: pgx answers the connection's timeout
// alone ("write failed: ... i/o timeout"), which a caller, and the
// Limiter, read as the server's failure. So for every method that sends
// a statement: Apply (a lone op), ApplyBatch, Load, Delete, DeleteExpired
// and Now. A batch whose ops go again one by
// one (one failed on its record) and whose context ends as the first is
// written leaves each op out, undecided: an *driver.OpError matching the
// context's error, all of them joined (storetest.FailedOps).
func TestContextEndsWhileWriting(t *testing.T) {
	var armed atomic.Bool
	var end atomic.Pointer[func()]
	b := newResendBatch(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &endingConn{Conn: c, armed: &armed, end: &end, deadline: make(chan struct{}, 1)}, nil
		}
	}, "a", "bad", "b")
	// The ending contexts: canceled, or past its deadline on a mock clock.
	ends := map[string]func() (context.Context, func(), error){
		"canceled": func() (context.Context, func(), error) {
			ctx, cancel := context.WithCancel(context.Background())
			return ctx, cancel, context.Canceled
		},
		"deadline": func() (context.Context, func(), error) {
			mock := clock.NewMock()
			ctx, cancel := mock.WithTimeout(context.Background(), time.Second)
			t.Cleanup(cancel)
			return ctx, func() { mock.Add(time.Second) }, context.DeadlineExceeded
		},
	}
	calls := map[string]func(ctx context.Context) error{
		"Apply": func(ctx context.Context) error {
			return b.s.Apply(ctx, b.ops[0], make([]driver.Decision, 1))
		},
		"ApplyBatch": func(ctx context.Context) error {
			return b.s.ApplyBatch(ctx, []*driver.Op{b.ops[0], b.ops[2]}, b.outs[:2])
		},
		"Load": func(ctx context.Context) error {
			return b.s.Load(ctx, []driver.RecordID{{Name: "l", Key: "a"}}, make([]driver.Record, 1))
		},
		"Delete": func(ctx context.Context) error {
			return b.s.Delete(ctx, []driver.RecordID{{Name: "l", Key: "none"}})
		},
		"DeleteExpired": func(ctx context.Context) error {
			_, err := b.s.DeleteExpired(ctx, time.Now())
			return err
		},
		"Now": func(ctx context.Context) error {
			_, err := b.s.Now(ctx)
			return err
		},
	}
	for how, newCtx := range ends {
		for name, call := range calls {
			t.Run(how+"/"+name, func(t *testing.T) {
				require.NoError(t, call(context.Background()), "its statements prepared")
				ctx, endCtx, want := newCtx()
				end.Store(&endCtx)
				armed.Store(true)
				err := call(ctx)
				require.False(t, armed.Load(), "the context ended as the statement was written")
				require.ErrorIs(t, err, want)
				require.ErrorContains(t, err, "pgstore: ")
			})
		}

		// A batch sent again op by op, the first op's write ending ctx.
		require.Error(t, b.s.ApplyBatch(context.Background(), b.ops, b.outs), "%s: its statements prepared", how)
		ctx, endCtx, want := newCtx()
		end.Store(&endCtx)
		pgstore.SetHooks(b.s, pgstore.Hooks{Resend: func() { armed.Store(true) }})
		err := b.s.ApplyBatch(ctx, b.ops, b.outs)
		pgstore.SetHooks(b.s, pgstore.Hooks{})
		require.False(t, armed.Load(), "%s: the context ended as the first op sent again was written", how)
		require.ErrorIs(t, err, want, how)
		require.Equal(t, []int{0, 1, 2}, storetest.FailedOps(t, err), "%s: none was decided (err: %v)", how, err)
		for i, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			require.ErrorIs(t, e, want, "%s: op %d, left out as ctx ended", how, i)
		}
	}
}
