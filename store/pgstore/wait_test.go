package pgstore_test

import (
	"context"
	"crypto/sha256"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// These tests hold rows or the table in a transaction of their own, as a
// stalled or slow client of the database would, and check what calls do
// meanwhile.

var tenPerHour = driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: 3_600_000, Capacity: 10}

func limitOp(key string, count float64) *driver.Op {
	return &driver.Op{Now: t0.UnixMilli(), Items: []driver.Item{{Name: "l", Key: key, Count: count,
		Shards: []driver.Shard{{Index: 0, Params: tenPerHour}}}}}
}

func rowID(key string) []byte {
	sum := sha256.Sum256(driver.RecordID{Name: "l", Key: key}.AppendKey(nil))
	return sum[:]
}

// waitForLockWaiters waits until n statements on table wait for a lock.
func waitForLockWaiters(t *testing.T, pool *pgxpool.Pool, table string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting int
		err := pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "+
			"AND datname = current_database() AND position($1 in query) > 0", table).Scan(&waiting)
		require.NoError(t, err)
		return waiting == n
	}, 20*time.Second, 5*time.Millisecond, "%d statements waiting for a lock on %s", n, table)
}

type applied struct {
	out []driver.Decision
	err error
}

func applyAsync(ctx context.Context, s ratelimit.Store, op *driver.Op) <-chan applied {
	ch := make(chan applied, 1)
	go func() {
		out := make([]driver.Decision, len(op.Items))
		err := s.Apply(ctx, op, out)
		ch <- applied{out, err}
	}()
	return ch
}

// storeWithRecord makes a store, with opts, on a table of its own that
// holds the record of key "k", one token spent.
func storeWithRecord(t *testing.T, opts ...pgstore.Option) (*pgxpool.Pool, string, *pgstore.Store) {
	t.Helper()
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	table := uniqueTable(t, pool)
	s, err := pgstore.New(ctx, pool, append([]pgstore.Option{pgstore.WithTable(table)}, opts...)...)
	require.NoError(t, err)
	require.NoError(t, s.Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1)))
	return pool, table, s
}

// requireRefusedAfterSpend has another transaction spend every token of
// the record of "k" while a call of 5 tokens waits for its row, and checks
// that the call, decided on what that transaction left, is refused.
func requireRefusedAfterSpend(t *testing.T, pool *pgxpool.Pool, table string, s *pgstore.Store) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "UPDATE "+pgx.Identifier{table}.Sanitize()+" SET value = 0 WHERE id = $1", rowID("k"))
	require.NoError(t, err)

	call := applyAsync(ctx, s, limitOp("k", 5))
	waitForLockWaiters(t, pool, table, 1) // its write waits for the row
	require.NoError(t, tx.Commit(ctx))
	a := receive(t, call)
	require.NoError(t, a.err)
	require.False(t, a.out[0].OK, "granted 5 tokens of a record left with 0")
	require.Equal(t, 0.0, a.out[0].Remaining)
}

// rowHeld makes a store, with opts, on a table of its own that holds the
// record of key "k", and holds that record's row in a transaction, which
// it rolls back when the test ends (or the test does, earlier).
func rowHeld(t *testing.T, opts ...pgstore.Option) (*pgxpool.Pool, string, *pgstore.Store, pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	pool, table, s := storeWithRecord(t, opts...)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{table}.Sanitize()+" WHERE id = $1 FOR UPDATE", rowID("k"))
	require.NoError(t, err)
	return pool, table, s, tx
}

// receive waits for a call that must return by itself: the test releases
// what stalls it only afterwards.
func receive(t *testing.T, ch <-chan applied) applied {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("the call did not return while the server stalled it")
		return applied{}
	}
}

// A call returns when its context ends, though the row it writes is held
// by another transaction; its statement gives up on the server soon after,
// rather than keep a connection and wait for as long as the row is held.
func TestDeadlineWithRowHeld(t *testing.T) {
	ctx := context.Background()
	pool, table, s, tx := rowHeld(t)

	callCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	a := receive(t, applyAsync(callCtx, s, limitOp("k", 1)))
	require.ErrorIs(t, a.err, context.DeadlineExceeded)
	waitForLockWaiters(t, pool, table, 0) // the statement gave up on the server too

	require.NoError(t, tx.Rollback(ctx))
	got := make([]driver.Record, 1)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: "k"}}, got))
	require.Equal(t, 9.0, got[0].State.Remaining, "the call that gave up was not charged")
}

// A statement's lock wait is a little longer than its call's context
// leaves, and saturates at lock_timeout's largest value for a deadline
// however far: left + left/8 must not overflow time.Duration.
func TestLockWaitOfADeadline(t *testing.T) {
	ctx := context.Background()
	require.Zero(t, pgstore.LockWait(ctx), "no deadline, no bound")
	for _, c := range []struct {
		timeout  time.Duration
		min, max int32
	}{
		{time.Second, 1100, 1175},
		{-time.Hour, 1, 1},
		{time.Duration(math.MinInt64), 1, 1},
		{30 * 24 * time.Hour, math.MaxInt32, math.MaxInt32},
		{100 * 365 * 24 * time.Hour, math.MaxInt32, math.MaxInt32},
		{time.Duration(math.MaxInt64), math.MaxInt32, math.MaxInt32},
	} {
		callCtx, cancel := context.WithTimeout(ctx, c.timeout)
		got := pgstore.LockWait(callCtx)
		cancel()
		require.True(t, got >= c.min && got <= c.max, "timeout %v: lock wait %d ms, want [%d, %d]", c.timeout, got, c.min, c.max)
	}

	// A deadline of a mock clock that the wall clock is past, of a context
	// that has not ended, bounds nothing: no lock wait, rather than 1 ms.
	mock := newMock(t0) // years before the wall clock
	callCtx, cancel := mock.WithTimeout(ctx, time.Minute)
	require.Zero(t, pgstore.LockWait(callCtx), "a mock's deadline, not reached")
	mock.Add(time.Minute)
	require.Error(t, callCtx.Err())
	require.Equal(t, int32(1), pgstore.LockWait(callCtx), "a mock's deadline, reached")
	cancel()
}

// A call whose context carries the deadline of a mock clock (a test's
// mock.WithTimeout, or the Limiter's own check of the store on its clock)
// that the wall clock is past, though the context has not ended, waits for
// a held row until it is free, as without a deadline. The store read the
// deadline off the wall clock, set a lock_timeout of 1 ms, and the call
// failed (SQLSTATE 55P03) at once.
func TestMockDeadlineWithRowHeld(t *testing.T) {
	mock := newMock(t0) // years before the wall clock
	callCtx, cancel := mock.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitsForHeldRow(t, callCtx, "its context has not ended")
	require.NoError(t, callCtx.Err())
}

// A call whose deadline is centuries away (context.WithTimeout(ctx,
// math.MaxInt64), a common "no timeout") waits for a held row as long as
// it is held, rather than give up at once.
func TestFarDeadlineWithRowHeld(t *testing.T) {
	callCtx, cancel := context.WithTimeout(context.Background(), math.MaxInt64)
	defer cancel()
	waitsForHeldRow(t, callCtx, "its deadline is centuries away")
}

// waitsForHeldRow checks that a call made with callCtx on a row another
// transaction holds waits for the row, as the server says, and is granted
// once the row is free; why is why it must not give up.
func waitsForHeldRow(t *testing.T, callCtx context.Context, why string) {
	t.Helper()
	ctx := context.Background()
	pool, table, s, tx := rowHeld(t)
	call := applyAsync(callCtx, s, limitOp("k", 1))
	var early *applied
	require.Eventually(t, func() bool {
		select {
		case a := <-call:
			early = &a
			return true
		default:
		}
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "+
			"AND datname = current_database() AND position($1 in query) > 0", table).Scan(&waiting))
		return waiting == 1
	}, 20*time.Second, 2*time.Millisecond, "the call neither waits for the row nor returns")
	if early != nil {
		require.NoError(t, early.err, "the call gave up on the row while "+why)
		t.Fatal("the call returned while the row was held")
	}
	require.NoError(t, tx.Rollback(ctx))
	a := receive(t, call)
	require.NoError(t, a.err)
	require.True(t, a.out[0].OK)
}

// A call queued behind a stalled statement leaves when its context ends,
// and is never sent.
func TestDeadlineWhileQueued(t *testing.T) {
	ctx := context.Background()
	pool, table, s, tx := rowHeld(t, pgstore.WithMaxInFlight(1))

	inFlight := applyAsync(ctx, s, limitOp("k", 1)) // no deadline: waits for the row
	waitForLockWaiters(t, pool, table, 1)
	callCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	a := receive(t, applyAsync(callCtx, s, limitOp("other", 1)))
	require.ErrorIs(t, a.err, context.DeadlineExceeded)

	require.NoError(t, tx.Commit(ctx))
	a = receive(t, inFlight)
	require.NoError(t, a.err)
	require.True(t, a.out[0].OK)
	got := make([]driver.Record, 2)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: "k"}, {Name: "l", Key: "other"}}, got))
	require.Equal(t, 8.0, got[0].State.Remaining)
	require.False(t, got[1].Found, "the queued call was never sent")
}

// A lone call reads its record without a lock and writes it only if it is
// unchanged. Here another transaction spends the tokens between the read
// and the write: the call must decide again on what is there, and refuse.
func TestLoneCallDecidesAgainOnAChangedRecord(t *testing.T) {
	// The call reads 9 tokens (the update is not committed), then its
	// write waits for the row.
	pool, table, s := storeWithRecord(t)
	requireRefusedAfterSpend(t, pool, table, s)
}

// A batch locks its records before it reads them: it decides on what the
// transaction that held them left.
func TestBatchDecidesOnLockedRecords(t *testing.T) {
	ctx := context.Background()
	pool, table, s := newTableStore(t)
	for _, k := range []string{"k", "k2"} { // both exist: the batch locks and reads in one statement
		require.NoError(t, s.Apply(ctx, limitOp(k, 1), make([]driver.Decision, 1)))
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "UPDATE "+pgx.Identifier{table}.Sanitize()+" SET value = 4 WHERE id = $1", rowID("k"))
	require.NoError(t, err)

	ops := []*driver.Op{limitOp("k", 3), limitOp("k", 3), limitOp("k2", 1)}
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1), make([]driver.Decision, 1)}
	done := make(chan error, 1)
	go func() { done <- s.ApplyBatch(ctx, ops, outs) }()
	waitForLockWaiters(t, pool, table, 1)
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the batch did not return")
	}
	require.True(t, outs[0][0].OK)
	require.Equal(t, 1.0, outs[0][0].Remaining, "decided on the 4 tokens committed, not the 9 read before")
	require.False(t, outs[1][0].OK)
	require.True(t, outs[2][0].OK)
}

// DeleteExpired walks the table in small transactions and skips the rows
// that calls in flight hold: it never waits for them.
func TestDeleteExpiredInChunksSkipsHeldRows(t *testing.T) {
	defer pgstore.SetExpiredChunk(4)()
	ctx := context.Background()
	pool, table, s := newTableStore(t)
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q"}
	for _, k := range keys {
		require.NoError(t, s.Apply(ctx, limitOp(k, 1), make([]driver.Decision, 1)))
	}
	later := t0.Add(2 * time.Hour)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{table}.Sanitize()+" WHERE id = $1 FOR UPDATE", rowID("h"))
	require.NoError(t, err)

	n, err := s.DeleteExpired(ctx, t0.Add(30*time.Minute))
	require.NoError(t, err)
	require.Zero(t, n, "none is full again yet")
	n, err = s.DeleteExpired(ctx, later)
	require.NoError(t, err)
	require.Equal(t, len(keys)-1, n, "every record but the one held")

	require.NoError(t, tx.Rollback(ctx))
	n, err = s.DeleteExpired(ctx, later)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	var left int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&left))
	require.Zero(t, left)
}

// pgx asks the server to cancel the statement of a call whose context has
// ended, but a request that does not get through (the network is what
// failed) would leave it waiting for the row for as long as it is held.
// The statements therefore bound their own lock waits by the caller's
// deadline (a little after it): each is run here as the store runs it with
// a deadline 200 ms away, but from a context that never ends, on a row
// another transaction holds.
func TestLockWaitEndsOnTheServer(t *testing.T) {
	now := t0.UnixMilli()
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, pool *pgxpool.Pool, table string) error
	}{
		{"the function of a lone call", func(ctx context.Context, pool *pgxpool.Pool, table string) error {
			_, err := pool.Exec(ctx, "SELECT * FROM "+pgx.Identifier{table + "_one"}.Sanitize()+
				"($1, 'l', 'k', 0, 1, 10, 3600000, 10, 0, 0, $2, 1, 0, 200)", rowID("k"), now)
			return err
		}},
		{"the plain statement of a lone call", func(ctx context.Context, pool *pgxpool.Pool, table string) error {
			_, err := pool.Exec(ctx, pgstore.LoneSQL(pgx.Identifier{table}.Sanitize(), true, 0, true),
				rowID("k"), []byte("l"), []byte("k"), int32(0), now, 1.0, 10.0, int64(3_600_000), 10.0, 9.0, now, now+360_000, "200ms")
			return err
		}},
		{"the fresh statement of a lone call", func(ctx context.Context, pool *pgxpool.Pool, table string) error {
			_, err := pool.Exec(ctx, pgstore.FreshSQL(pgx.Identifier{table}.Sanitize(), true, true),
				rowID("k"), []byte("l"), []byte("k"), int32(0), now, 10.0, int64(3_600_000), 10.0, 9.0, now, now+360_000, "200ms")
			return err
		}},
		{"the batch upsert", func(ctx context.Context, pool *pgxpool.Pool, table string) error {
			_, err := pool.Exec(ctx, pgstore.UpsertSQL(pgx.Identifier{table}.Sanitize(), pgx.Identifier{table + "_read"}.Sanitize(), true),
				[][]byte{rowID("j"), rowID("k")}, [][]byte{[]byte("l"), []byte("l")}, [][]byte{[]byte("j"), []byte("k")}, []int32{0, 0},
				[]int64{now, now}, []float64{9, 9}, []int64{now + 360_000, now + 360_000}, []bool{true, true},
				1.0, 10.0, int64(3_600_000), 10.0, "200ms")
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, table, _, _ := rowHeld(t)
			err := tc.run(context.Background(), pool, table)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "55P03", pgErr.Code, "lock_not_available: %v", err)
		})
	}
}
