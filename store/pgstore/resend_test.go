package pgstore_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// resendBatch is a store on a table of its own, on a pool configured by
// conf (if not nil), and a batch of fixed-window limits on keys, one of them "bad",
// whose row holds what no release writes: the function _apply fails the
// batch whole on it, and its ops go again one by one.
type resendBatch struct {
	pool *pgxpool.Pool
	s    *pgstore.Store
	ops  []*driver.Op
	outs [][]driver.Decision
}

func newResendBatch(t *testing.T, conf func(*pgxpool.Config), keys ...string) *resendBatch {
	t.Helper()
	ctx := context.Background()
	table := uniqueTable(t, newPool(t, testserver.PostgresURL(t), nil))
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	if conf != nil {
		conf(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(table))
	require.NoError(t, err)
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
	now := time.Now().UnixMilli()
	op := func(key string) *driver.Op {
		return &driver.Op{Mode: driver.ModeLimit, Now: now, Items: []driver.Item{{Name: "l", Key: key, Count: 1, At: now, Shards: []driver.Shard{{Params: p}}}}}
	}
	require.NoError(t, s.Apply(ctx, op("bad"), make([]driver.Decision, 1)))
	id := sha256.Sum256(driver.RecordID{Name: "l", Key: "bad"}.AppendKey(nil))
	_, err = pool.Exec(ctx, "UPDATE "+pgx.Identifier{"public", table}.Sanitize()+" SET value = 'NaN' WHERE id = $1", id[:])
	require.NoError(t, err)
	b := &resendBatch{pool: pool, s: s}
	for _, k := range keys {
		b.ops = append(b.ops, op(k))
		b.outs = append(b.outs, make([]driver.Decision, 1))
	}
	return b
}

// remaining returns what the record of key holds (10, a full window, if
// it is missing).
func (b *resendBatch) remaining(t *testing.T, key string) float64 {
	t.Helper()
	recs := make([]driver.Record, 1)
	require.NoError(t, b.s.Load(context.Background(), []driver.RecordID{{Name: "l", Key: key}}, recs))
	if !recs[0].Found {
		return 10
	}
	return recs[0].State.Remaining
}

// When the server goes down while a batch's ops go again one by one, the
// first op sent again meets it, and the others fail at once, unsent, with
// its error: each of them waited for a connection of its own, and against
// a server that does not answer a batch of n ops took n connect timeouts.
// None of them was decided: each is an *OpError.
func TestResendStopsWhenServerDown(t *testing.T) {
	errDown := errors.New("the server is down")
	var down atomic.Bool
	var connects atomic.Int32
	b := newResendBatch(t, func(cfg *pgxpool.Config) {
		cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
			if down.Load() {
				connects.Add(1)
				return errDown
			}
			return nil
		}
	}, "a", "b", "c", "bad", "d")
	pgstore.SetHooks(b.s, pgstore.Hooks{Resend: func() {
		down.Store(true)
		b.pool.Reset() // the pooled connections go: a new one is dialed
	}})
	err := b.s.ApplyBatch(context.Background(), b.ops, b.outs)
	require.Equal(t, []int{0, 1, 2, 3, 4}, storetest.FailedOps(t, err), "none was decided (err: %v)", err)
	require.ErrorIs(t, err, errDown)
	require.EqualValues(t, 1, connects.Load(), "connections tried after the server went down")
	down.Store(false)
	for _, k := range []string{"a", "b", "c", "d"} {
		require.Equal(t, 10.0, b.remaining(t, k), "%s: charged nothing", k)
	}
}

// A context that ends at the first op sent again sends none: each op
// fails, undecided (an *OpError), with the context's error.
func TestResendStopsWhenContextEnds(t *testing.T) {
	var sent atomic.Int32
	b := newResendBatch(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = countQueries{&sent}
	}, "a", "bad", "b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pgstore.SetHooks(b.s, pgstore.Hooks{Resend: func() { cancel(); sent.Store(0) }})
	err := b.s.ApplyBatch(ctx, b.ops, b.outs)
	require.Equal(t, []int{0, 1, 2}, storetest.FailedOps(t, err), "none was decided (err: %v)", err)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, "pgstore: ")
	require.Zero(t, sent.Load(), "statements sent after the context ended")
}

// An op sent again alone whose answer is lost, its context ending while
// its statement ran, may have been decided and charged: it is not an
// *OpError, which says that its op was left undecided, but the batch's
// error, matching the context's, saying so. The ops after it are not sent.
// It was an *OpError, as though it had charged nothing.
func TestResendLostAnswer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var state atomic.Int32 // loseArmed: the next Bind's answer is read, and lost, ending ctx
	b := newResendBatch(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1 // the batch's connection, whose statement is prepared, sends the ops again
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &losingConn{Conn: c, state: &state, pass: new(atomic.Int32), lost: cancel}, nil
		}
	}, "a", "bad", "b")
	pgstore.SetHooks(b.s, pgstore.Hooks{Resend: func() { state.Store(loseArmed) }})
	err := b.s.ApplyBatch(ctx, b.ops, b.outs)
	require.Equal(t, int32(loseDone), state.Load(), "the answer of the first op sent again was lost")
	require.ErrorIs(t, err, context.Canceled)
	var oe *driver.OpError
	require.False(t, errors.As(err, &oe), "%v: an *OpError says that its op was left undecided", err)
	require.ErrorContains(t, err, "pgstore: apply: op 0 of the batch: the op may have been decided and charged, its answer lost")
	require.Equal(t, 9.0, b.remaining(t, "a"), "the op whose answer was lost was charged")
	require.Equal(t, 10.0, b.remaining(t, "b"), "the op after it was not sent")
}

// The states of a losingConn.
const (
	loseOff = iota
	loseArmed
	loseWritten
	loseDone
)

// losingConn, once armed, lets pass as many statements as pass holds
// (Binds: executions of a prepared statement), then reads the whole
// answer to the next one it sends, up to the server's ReadyForQuery,
// after the statement's commit, and then ends the context (lost) and
// answers a timeout, as the connection does when the context of the
// statement in flight ends.
type losingConn struct {
	net.Conn
	state *atomic.Int32
	pass  *atomic.Int32
	lost  func()
}

func (c *losingConn) Write(p []byte) (int, error) {
	if len(p) > 0 && p[0] == 'B' && c.state.Load() == loseArmed && c.pass.Add(-1) < 0 {
		c.state.Store(loseWritten)
	}
	return c.Conn.Write(p)
}

func (c *losingConn) Read(p []byte) (int, error) {
	if c.state.Load() != loseWritten {
		return c.Conn.Read(p)
	}
	var got []byte
	for {
		n, err := c.Conn.Read(p)
		got = append(got, p[:n]...)
		if err != nil {
			return 0, err
		}
		if k := len(got) - 6; k >= 0 && got[k] == 'Z' && string(got[k+1:k+5]) == "\x00\x00\x00\x05" {
			break
		}
	}
	c.state.Store(loseDone)
	c.lost()
	return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
}

// countQueries is a pgx tracer that counts the statements sent.
type countQueries struct{ n *atomic.Int32 }

func (c countQueries) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (countQueries) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A batch of limits on one token bucket goes as one upsert, which sends
// again, to the function _apply, an op that the record read would grant
// but the row, changed since by a concurrent transaction, refused. When
// the answer of that statement is lost, its context ending while it ran,
// the op may have been decided: the batch's error says so, not an
// *OpError, which says that its op was left undecided. It was one.
func TestRedoLostAnswer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var state, pass atomic.Int32
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	cfg.MaxConns = 1 // the store's one connection sends the upsert, then the redo
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &losingConn{Conn: c, state: &state, pass: &pass, lost: cancel}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	other := newPool(t, testserver.PostgresURL(t), nil)
	table := uniqueTable(t, other)
	s, err := pgstore.New(context.Background(), pool, pgstore.WithTable(table))
	require.NoError(t, err)
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
	now := time.Now().UnixMilli()
	op := func(key string) *driver.Op {
		return &driver.Op{Mode: driver.ModeLimit, Now: now, Items: []driver.Item{{Name: "l", Key: key, Count: 1, At: now, Shards: []driver.Shard{{Params: p}}}}}
	}
	require.NoError(t, s.Apply(context.Background(), op("x"), make([]driver.Decision, 1)))
	c, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	pid := c.Conn().PgConn().PID()
	c.Release()

	// A concurrent transaction empties x's bucket, and holds its row.
	tx, err := other.Begin(context.Background())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	id := sha256.Sum256(driver.RecordID{Name: "l", Key: "x"}.AppendKey(nil))
	_, err = tx.Exec(context.Background(), "UPDATE "+pgx.Identifier{"public", table}.Sanitize()+" SET value = 0 WHERE id = $1", id[:])
	require.NoError(t, err)

	pass.Store(1) // the upsert's answer is read; the redo's is lost
	state.Store(loseArmed)
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	done := make(chan error, 1)
	go func() { done <- s.ApplyBatch(ctx, []*driver.Op{op("x"), op("y")}, outs) }()
	require.Eventually(t, func() bool {
		var waiting bool
		err := other.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)", pid).Scan(&waiting)
		return err == nil && waiting
	}, 15*time.Second, 10*time.Millisecond, "the upsert does not wait for x's row")
	require.NoError(t, tx.Commit(context.Background()))
	err = <-done

	require.Equal(t, int32(loseDone), state.Load(), "the answer of the op sent again was lost")
	require.ErrorIs(t, err, context.Canceled)
	var oe *driver.OpError
	require.False(t, errors.As(err, &oe), "%v: an *OpError says that its op was left undecided", err)
	require.ErrorContains(t, err, "pgstore: apply: op 0 of the batch: the op may have been decided and charged, its answer lost")
	require.True(t, outs[1][0].OK, "y was decided by the upsert")
}

// An op of a batch upsert sent again to the function _apply, which fails
// it on its own, its row changed since the upsert read it into one that
// no release writes, is an *OpError matching ErrBadRecord, as beside
// others: the function's ERROR rolled its statement back. It was read as
// an answer lost, the batch's error saying that the op may have been
// charged.
func TestRedoBadRecord(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	table := uniqueTable(t, pool)
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(table))
	require.NoError(t, err)
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
	now := time.Now().UnixMilli()
	op := func(key string) *driver.Op {
		return &driver.Op{Mode: driver.ModeLimit, Now: now, Items: []driver.Item{{Name: "l", Key: key, Count: 1, At: now, Shards: []driver.Shard{{Params: p}}}}}
	}
	require.NoError(t, s.Apply(ctx, op("x"), make([]driver.Decision, 1)))

	// A concurrent transaction writes into x's row what no release
	// writes, and holds the row while the upsert reads the record as it
	// was.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "UPDATE "+pgx.Identifier{"public", table}.Sanitize()+" SET value = 'NaN' WHERE id = $1", rowID("x"))
	require.NoError(t, err)
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	done := make(chan error, 1)
	go func() { done <- s.ApplyBatch(ctx, []*driver.Op{op("x"), op("y")}, outs) }()
	waitForLockWaiters(t, pool, table, 1)
	require.NoError(t, tx.Commit(ctx))
	err = <-done

	require.ErrorIs(t, err, pgstore.ErrBadRecord)
	require.NotContains(t, err.Error(), "may have been decided and charged")
	require.Equal(t, []int{0}, storetest.FailedOps(t, err), "x failed on its own (err: %v)", err)
	require.True(t, outs[1][0].OK, "y was decided by the upsert")
}
