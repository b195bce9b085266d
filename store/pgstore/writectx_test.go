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

// nthEndingConn ends the context of the message it is about to write
// once left, shared by the pool's connections, counts down to zero on a
// message of type msg ('B', a Bind: an execution of a prepared statement;
// 'C', a Close: a deallocation), and waits until pgx has set the
// connection's deadline past: the write then fails with a timeout, as it
// does when a context ends while its statement is written.
type nthEndingConn struct {
	net.Conn
	msg      byte
	left     *atomic.Int32
	end      *atomic.Pointer[func()]
	deadline chan struct{}
}

func (c *nthEndingConn) Write(p []byte) (int, error) {
	if len(p) > 0 && p[0] == c.msg && c.left.Add(-1) == 0 {
		(*c.end.Load())()
		<-c.deadline
	}
	return c.Conn.Write(p)
}

// endingDial dials the connections of a pool as nthEndingConns of msg,
// left and end.
func endingDial(msg byte, left *atomic.Int32, end *atomic.Pointer[func()]) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &nthEndingConn{Conn: c, msg: msg, left: left, end: end, deadline: make(chan struct{}, 1)}, nil
	}
}

// SetDeadline sets the deadline, then lets a write waiting for it go on.
func (c *nthEndingConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	if !t.IsZero() {
		select {
		case c.deadline <- struct{}{}:
		default:
		}
	}
	return err
}

// endings are the ways a test ends a context: canceled, or past its
// deadline on a mock clock. Each returns the context, what ends it, and
// the error it then matches.
func endings(t *testing.T) map[string]func() (context.Context, func(), error) {
	return map[string]func() (context.Context, func(), error){
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
	var left atomic.Int32
	var end atomic.Pointer[func()]
	b := newResendBatch(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		cfg.ConnConfig.DialFunc = endingDial('B', &left, &end)
	}, "a", "bad", "b")
	// The ending contexts: canceled, or past its deadline on a mock clock.
	ends := endings(t)
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
				left.Store(1)
				err := call(ctx)
				require.LessOrEqual(t, left.Load(), int32(0), "the context ended as the statement was written")
				require.ErrorIs(t, err, want)
				require.ErrorContains(t, err, "pgstore: ")
			})
		}

		// A batch sent again op by op, the first op's write ending ctx.
		require.Error(t, b.s.ApplyBatch(context.Background(), b.ops, b.outs), "%s: its statements prepared", how)
		ctx, endCtx, want := newCtx()
		end.Store(&endCtx)
		pgstore.SetHooks(b.s, pgstore.Hooks{Resend: func() { left.Store(1) }})
		err := b.s.ApplyBatch(ctx, b.ops, b.outs)
		pgstore.SetHooks(b.s, pgstore.Hooks{})
		require.LessOrEqual(t, left.Load(), int32(0), "%s: the context ended as the first op sent again was written", how)
		require.ErrorIs(t, err, want, how)
		require.Equal(t, []int{0, 1, 2}, storetest.FailedOps(t, err), "%s: none was decided (err: %v)", how, err)
		for i, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			require.ErrorIs(t, e, want, "%s: op %d, left out as ctx ended", how, i)
		}
	}
}
