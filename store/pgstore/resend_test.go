package pgstore_test

import (
	"context"
	"crypto/sha256"
	"errors"
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
// conf, and a batch of fixed-window limits on keys, one of them "bad",
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
	conf(cfg)
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

// countQueries is a pgx tracer that counts the statements sent.
type countQueries struct{ n *atomic.Int32 }

func (c countQueries) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (countQueries) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
