package pgstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// TestBatchUpsert runs batches that go as one upsert (limits and checks
// of one limit on distinct keys) from three stores, as from three
// processes, on the same records at once, some of them placeholders and
// some missing: the records are inserted, read and updated under every
// interleaving the server picks. The clock stands still, so that no token
// is granted back: each key must grant exactly its capacity, each grant
// seeing a different number of tokens left, and keep what is left.
func TestBatchUpsert(t *testing.T) {
	ctx := context.Background()
	url := testserver.PostgresURL(t)
	tr := &tracer{}
	table := uniqueTable(t, newPool(t, url, nil))
	stores := make([]*pgstore.Store, 3)
	for i := range stores {
		var err error
		stores[i], err = pgstore.New(ctx, newPool(t, url, tr), pgstore.WithTable(table))
		require.NoError(t, err)
	}
	const (
		keys     = 24
		capacity = 5
	)
	p := driver.Params{Kind: driver.TokenBucket, Rate: 1, Period: 1000, Capacity: capacity}
	now := t0.UnixMilli()
	op := func(mode driver.Mode, key int, count float64) *driver.Op {
		return &driver.Op{Mode: mode, Now: now, Items: []driver.Item{{Name: "u", Key: fmt.Sprint("k", key), Count: count,
			Shards: []driver.Shard{{Params: p}}}}}
	}
	// Placeholders for a third of the keys: a batch with a key twice goes
	// to the batch function, which locks a missing record by inserting a
	// placeholder, and a count above the capacity writes nothing.
	for k := 0; k < keys; k += 3 {
		ops := []*driver.Op{op(driver.ModeLimit, k, 2*capacity), op(driver.ModeLimit, k, 2*capacity)}
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		require.NoError(t, stores[0].ApplyBatch(ctx, ops, outs))
		require.False(t, outs[0][0].OK || outs[1][0].OK)
	}

	var (
		mu       sync.Mutex
		attempts [keys]int
		left     [keys][]float64 // the tokens left that each grant saw
		wg       sync.WaitGroup
	)
	errs := make(chan error, 12)
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			store := stores[g%len(stores)]
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for range 25 {
				picked := rng.Perm(keys)[:6]
				ops := make([]*driver.Op, len(picked))
				outs := make([][]driver.Decision, len(picked))
				for i, k := range picked {
					mode := driver.ModeLimit
					if i == 5 {
						mode = driver.ModeCheck
					}
					ops[i], outs[i] = op(mode, k, 1), make([]driver.Decision, 1)
				}
				actx, cancel := ctx, context.CancelFunc(func() {})
				if g%2 == 1 { // a deadline: the statement bounds its lock wait
					actx, cancel = context.WithTimeout(ctx, time.Minute)
				}
				err := store.ApplyBatch(actx, ops, outs)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for i, k := range picked {
					if ops[i].Mode != driver.ModeLimit {
						continue
					}
					attempts[k]++
					if d := outs[i][0]; d.OK {
						left[k] = append(left[k], d.Remaining)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	upserts := 0
	for _, sql := range tr.sql {
		if strings.Contains(sql, "ON CONFLICT") && strings.Contains(sql, "unnest") {
			upserts++
		}
	}
	require.NotZero(t, upserts, "no batch went as one upsert")

	ids := make([]driver.RecordID, keys)
	for k := range ids {
		ids[k] = driver.RecordID{Name: "u", Key: fmt.Sprint("k", k)}
	}
	recs := make([]driver.Record, keys)
	require.NoError(t, stores[0].Load(ctx, ids, recs))
	for k := range keys {
		granted := min(attempts[k], capacity)
		want := make([]float64, granted)
		for i := range want {
			want[i] = float64(capacity - 1 - i)
		}
		got := slices.Clone(left[k])
		slices.Sort(got)
		slices.Reverse(got)
		require.Equal(t, want, got, "key %d: the tokens left seen by its grants, of %d calls", k, attempts[k])
		if attempts[k] > 0 {
			require.True(t, recs[k].Found, "key %d", k)
			require.Equal(t, float64(capacity-granted), recs[k].State.Remaining, "key %d", k)
		}
	}
}

// TestBatchUpsertDifferential drives batches that go as one upsert
// (limits and checks of one token bucket with one count, on distinct
// keys, some new, at nows a few ms apart and out of order) and requires
// the answers and the records of the Go transition applying the same ops
// one after another, bit for bit.
func TestBatchUpsertDifferential(t *testing.T) {
	ctx := context.Background()
	tr := &tracer{}
	pool := newPool(t, testserver.PostgresURL(t), tr)
	maxPeriod := ratelimit.MaxPeriod.Milliseconds()
	params := []driver.Params{
		{Kind: driver.TokenBucket, Rate: 10, Period: 1000, Capacity: 10},
		{Kind: driver.TokenBucket, Rate: 3, Period: 7, Capacity: 2.5},
		{Kind: driver.TokenBucket, Rate: 0.1, Period: 60_000, Capacity: 1},
		{Kind: driver.TokenBucket, Rate: ratelimit.MaxTokens, Period: 1, Capacity: ratelimit.MaxTokens},
		{Kind: driver.TokenBucket, Rate: 1e-9, Period: maxPeriod, Capacity: 1},
		{Kind: driver.TokenBucket, Rate: 1e-9, Period: 1, Capacity: 1e-9},
	}
	counts := []float64{1, 1, 0.5, 3, 0, ratelimit.MinCount, 2.5}
	for seed := range 8 {
		store, model := newStore(t, pool), storetest.NewModel()
		rng := rand.New(rand.NewPCG(uint64(seed), 0x5e7))
		p := params[seed%len(params)]
		now := t0.UnixMilli()
		keys := 40
		for step := range 30 {
			now += rng.Int64N(3 * p.Period / 2)
			count := counts[rng.IntN(len(counts))]
			picked := rng.Perm(keys)[:2+rng.IntN(12)]
			ops := make([]*driver.Op, len(picked))
			got := make([][]driver.Decision, len(picked))
			want := make([][]driver.Decision, len(picked))
			for i, k := range picked {
				mode := driver.ModeLimit
				if rng.IntN(5) == 0 {
					mode = driver.ModeCheck
				}
				ops[i] = &driver.Op{Mode: mode, Now: now + rng.Int64N(7) - 3, Items: []driver.Item{{Name: "d", Key: fmt.Sprint("k", k),
					Count: count, Shards: []driver.Shard{{Params: p}}}}}
				got[i], want[i] = make([]driver.Decision, 1), make([]driver.Decision, 1)
				require.NoError(t, model.Apply(ctx, ops[i], want[i]))
			}
			require.NoError(t, store.ApplyBatch(ctx, ops, got))
			for i := range ops {
				require.Equal(t, want[i], got[i], "seed %d step %d op %d", seed, step, i)
			}
			ids := make([]driver.RecordID, keys)
			for k := range ids {
				ids[k] = driver.RecordID{Name: "d", Key: fmt.Sprint("k", k)}
			}
			gotRecs, wantRecs := make([]driver.Record, keys), make([]driver.Record, keys)
			require.NoError(t, store.Load(ctx, ids, gotRecs))
			require.NoError(t, model.Load(ctx, ids, wantRecs))
			require.Equal(t, wantRecs, gotRecs, "seed %d step %d", seed, step)
		}
	}
	upserts := 0
	for _, sql := range tr.sql {
		if strings.Contains(sql, "ON CONFLICT") && strings.Contains(sql, "unnest") {
			upserts++
		}
	}
	require.NotZero(t, upserts, "no batch went as one upsert")
}

// TestManyStatementsKeepToTheIndex prepares the statements that reach
// many records by id (the batch upsert's, Load's, Delete's and a step of
// DeleteExpired's) while their table holds a few hundred rows, with
// generic plans as a connection keeps them after a few executions, and
// requires that, once the table has grown, they reach its rows through the
// primary key: plain statements planned at that size scanned the whole
// table at every call.
func TestManyStatementsKeepToTheIndex(t *testing.T) {
	ctx := context.Background()
	pool, table, s := newTableStore(t)
	upsert, load, del, sweep := pgstore.ManyStatements(s)
	quoted := pgx.Identifier{table}.Sanitize()
	_, err := pool.Exec(ctx, "ALTER TABLE "+quoted+" SET (autovacuum_enabled = false)") // no ANALYZE to replan
	require.NoError(t, err)
	fill := func(from, to int) {
		_, err := pool.Exec(ctx, "INSERT INTO "+quoted+" (id, name, key, shard, value, ts, expires)"+
			" SELECT sha256(('r' || i)::bytea), 'l', 'k', 0, 1, 0, 0 FROM generate_series($1::int, $2::int) i", from, to)
		require.NoError(t, err)
	}
	fill(1, 300)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	now := t0.UnixMilli()
	ids := [][]byte{rowID("j"), rowID("k")}
	statements := []struct {
		name string
		run  func(tx pgx.Tx) error
	}{
		{"the batch upsert", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, upsert, ids, [][]byte{[]byte("l"), []byte("l")}, [][]byte{[]byte("j"), []byte("k")}, []int32{0, 0},
				[]int64{now, now}, []float64{9, 9}, []int64{now + 360_000, now + 360_000}, []bool{true, true},
				1.0, 10.0, int64(3_600_000), 10.0)
			return err
		}},
		{"Load", func(tx pgx.Tx) error { _, err := tx.Exec(ctx, load, ids); return err }},
		{"Delete", func(tx pgx.Tx) error { _, err := tx.Exec(ctx, del, ids); return err }},
		{"a step of DeleteExpired", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sweep, []byte{}, 100, int64(-1)) // a chunk of 100, nothing expired
			return err
		}},
	}
	// Planned and cached at 300 rows.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	for _, st := range statements {
		require.NoError(t, st.run(tx), st.name)
	}
	require.NoError(t, tx.Rollback(ctx))

	fill(301, 5000)
	for _, st := range statements {
		t.Run(st.name, func(t *testing.T) {
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			scans := func() (seq, idx int64) {
				t.Helper()
				require.NoError(t, tx.QueryRow(ctx, "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables WHERE relid = $1::regclass",
					quoted).Scan(&seq, &idx))
				return seq, idx
			}
			seq0, idx0 := scans()
			require.NoError(t, st.run(tx))
			seq, idx := scans()
			require.Equal(t, seq0, seq, "sequential scans of the table")
			require.Greater(t, idx, idx0, "index scans of the table")
		})
	}
}

// An op of a batch upsert that the record read would grant, but the row
// as locked refused, goes again through _apply; should that fail, only the
// ops sent again fail, and the ops that the upsert decided and wrote keep
// their decisions. Before, the batch failed whole: the callers of ops
// whose tokens were taken heard of a failure (a Limiter then answers by
// its failure policy, and its breaker counts it), as if nothing had been
// charged.
func TestBatchUpsertKeepsWhatItWroteWhenTheRedoFails(t *testing.T) {
	ctx := context.Background()
	pool, table, s := newTableStore(t)
	bucket := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 3_600_000, Capacity: 10}
	op := func(key string) *driver.Op {
		return &driver.Op{Now: t0.UnixMilli(), Items: []driver.Item{{Name: "l", Key: key, Count: 1,
			Shards: []driver.Shard{{Params: bucket}}}}}
	}
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, op("raced"), out))
	require.Equal(t, 9.0, out[0].Remaining)

	// A transaction drains the record and holds its row, and takes _apply
	// away, so that the op sent again fails.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "UPDATE "+pgx.Identifier{table}.Sanitize()+" SET value = 0 WHERE id = $1", rowID("raced"))
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "DO $$DECLARE f regprocedure; BEGIN "+
		"SELECT p.oid INTO f FROM pg_proc p WHERE p.proname = "+quoteLiteral(table+"_apply")+" AND p.pronamespace = 'public'::regnamespace; "+
		"EXECUTE format('ALTER FUNCTION %s RENAME TO %I', f, "+quoteLiteral(table+"_gone")+"); END$$")
	require.NoError(t, err)

	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	done := make(chan error, 1)
	go func() { done <- s.ApplyBatch(ctx, []*driver.Op{op("raced"), op("other")}, outs) }()
	waitForLockWaiters(t, pool, table, 1)
	require.NoError(t, tx.Commit(ctx))

	err = <-done
	require.Equal(t, []int{0}, storetest.FailedOps(t, err), "the op sent again fails, alone")
	require.True(t, outs[1][0].OK, "the op the upsert wrote keeps its decision")
	require.Equal(t, 9.0, outs[1][0].Remaining)
	recs := make([]driver.Record, 2)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: "raced"}, {Name: "l", Key: "other"}}, recs))
	require.Equal(t, 0.0, recs[0].State.Remaining)
	require.Equal(t, 9.0, recs[1].State.Remaining)
}
