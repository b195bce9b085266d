package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The ways a caller's context ends: before the call, or while its
// statement waits for the table, which another transaction holds.
var contextEnds = []struct {
	name    string
	waiting bool // the context ends while the statement waits
	ctx     func() (context.Context, context.CancelFunc)
	want    error
}{
	{"canceled before", false, func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx, cancel
	}, context.Canceled},
	{"expired before", false, func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), -time.Second)
	}, context.DeadlineExceeded},
	{"canceled while waiting", true, func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		return ctx, cancel
	}, context.Canceled},
	{"expired while waiting", true, func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 100*time.Millisecond)
	}, context.DeadlineExceeded},
}

// Every call of the store whose caller's context ends fails with an error
// that matches the context's (errors.Is), so that a Limiter counts the
// caller's deadline as the caller's, not as the store's failure: a lone
// call of each kind (a read, a fresh upsert, an upsert, the function of a
// call judged at the server's clock), a batch (the batch upsert and the
// function), Load, Delete, DeleteExpired, and New while another process
// installs the schema.
func TestContextEndsEveryCall(t *testing.T) {
	pool, table, s := storeWithRecord(t)
	_, serverTable, serverTime := storeWithRecord(t, pgstore.WithServerTime())
	check := func() *driver.Op {
		op := limitOp("k", 1)
		op.Mode = driver.ModeCheck
		return op
	}
	two := func() [][]driver.Decision {
		return [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	}
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"a lone check", func(ctx context.Context) error { return s.Apply(ctx, check(), make([]driver.Decision, 1)) }},
		{"a lone call on a new record", func(ctx context.Context) error {
			return s.Apply(ctx, limitOp("new", 1), make([]driver.Decision, 1))
		}},
		{"a lone call", func(ctx context.Context) error { return s.Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1)) }},
		{"a lone call at the server's clock", func(ctx context.Context) error {
			return serverTime.Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1))
		}},
		{"a batch upsert", func(ctx context.Context) error {
			return s.ApplyBatch(ctx, []*driver.Op{limitOp("k", 1), limitOp("k2", 1)}, two())
		}},
		{"a batch of the function", func(ctx context.Context) error {
			return s.ApplyBatch(ctx, []*driver.Op{limitOp("k", 1), limitOp("k", 1)}, two())
		}},
		{"Load", func(ctx context.Context) error {
			return s.Load(ctx, []driver.RecordID{{Name: "l", Key: "k"}}, make([]driver.Record, 1))
		}},
		{"Delete", func(ctx context.Context) error { return s.Delete(ctx, []driver.RecordID{{Name: "l", Key: "gone"}}) }},
		{"DeleteExpired", func(ctx context.Context) error {
			_, err := s.DeleteExpired(ctx, t0.Add(3*time.Hour))
			return err
		}},
		{"New installing the schema", func(ctx context.Context) error {
			_, err := pgstore.New(ctx, pool, pgstore.WithTable(uniqueTable(t, pool)))
			return err
		}},
	}
	for _, end := range contextEnds {
		for _, c := range calls {
			release := func() {}
			if end.waiting {
				release = holdTables(t, pool, table, serverTable)
			}
			callCtx, cancel := end.ctx()
			err := c.call(callCtx)
			cancel()
			release()
			assert.ErrorIs(t, err, end.want, "%s, context %s", c.name, end.name)
		}
	}
}

// holdTables locks the tables in a transaction of its own, and New's
// schema lock, until release is called: every statement of a store on
// them waits, and so does New where it would install a schema.
func holdTables(t *testing.T, pool *pgxpool.Pool, tables ...string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	for _, table := range tables {
		_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)
	}
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", pgstore.SchemaLock)
	require.NoError(t, err)
	return func() { require.NoError(t, tx.Rollback(ctx)) }
}

// New returns when its context ends on a PostgreSQL server that accepts
// connections and never answers, with the context's error.
func TestContextEndsNewOnASilentServer(t *testing.T) {
	addr, _ := testserver.Silent(t)
	pool, err := pgxpool.New(context.Background(), "postgres://app@"+addr+"/test?sslmode=disable")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	for _, end := range contextEnds {
		ctx, cancel := end.ctx()
		start := time.Now()
		_, err := pgstore.New(ctx, pool)
		took := time.Since(start)
		cancel()
		assert.ErrorIs(t, err, end.want, "context %s", end.name)
		assert.Less(t, took, time.Second, "context %s: New returned after %v", end.name, took)
	}
}
