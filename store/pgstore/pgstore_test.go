package pgstore_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

var t0 = time.UnixMilli(1_700_000_000_000)

func newMock(at time.Time) *clock.Mock {
	m := clock.NewMock()
	m.Set(at)
	return m
}

// newPool returns a pool on the local test database, with tracer if not
// nil, closed at cleanup.
func newPool(t testing.TB, url string, tracer pgx.QueryTracer) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tracer
	cfg.MaxConns = 70
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// uniqueTable returns a table name of its own for one test, dropped (with
// its function) at cleanup.
func uniqueTable(t testing.TB, pool *pgxpool.Pool) string {
	name := fmt.Sprintf("ratelimit_test_%d", time.Now().UnixNano())
	t.Cleanup(func() { dropTable(pool, name) })
	return name
}

// newTableStore returns a pool, a table of the test's own (see uniqueTable)
// and a Store on it.
func newTableStore(t testing.TB) (*pgxpool.Pool, string, *pgstore.Store) {
	pool := newPool(t, testserver.PostgresURL(t), nil)
	table := uniqueTable(t, pool)
	s, err := pgstore.New(context.Background(), pool, pgstore.WithTable(table))
	require.NoError(t, err)
	return pool, table, s
}

// dropTable drops a test's table and the functions named after it.
func dropTable(pool *pgxpool.Pool, name string) {
	testserver.DropPostgresTable(context.Background(), pool, name)
}

// The arguments of the function that decides a single op.
const oneArgs = "(bytea, bytea, bytea, integer, integer, float8, bigint, float8, float8, bigint, bigint, float8, integer, integer)"

func newStore(t testing.TB, pool *pgxpool.Pool, opts ...pgstore.Option) *pgstore.Store {
	opts = append([]pgstore.Option{pgstore.WithTable(uniqueTable(t, pool))}, opts...)
	s, err := pgstore.New(context.Background(), pool, opts...)
	require.NoError(t, err)
	return s
}

func TestConformance(t *testing.T) {
	pool := newPool(t, testserver.PostgresURL(t), nil)
	require.True(t, pgstore.Direct(newStore(t, pool)))
	runConformance(t, pool, storetest.DifferentialRuns(20, 120))
}

// runConformance runs the suite on stores on pool, each on a table of its
// own, which the suite may spoil (storetest.SpoilRecord).
func runConformance(t *testing.T, pool *pgxpool.Pool, opts ...storetest.Option) {
	var tables sync.Map // *pgstore.Store: its table
	spoiler := storetest.SpoilRecord(func(t *testing.T, s ratelimit.Store, id driver.RecordID) {
		table, ok := tables.Load(s)
		require.True(t, ok, "a store of the suite")
		spoil(t, pool, s.(*pgstore.Store), table.(string), id)
	})
	storetest.Run(t, func(t *testing.T) ratelimit.Store {
		table := uniqueTable(t, pool)
		s, err := pgstore.New(context.Background(), pool, pgstore.WithTable(table))
		require.NoError(t, err)
		tables.Store(s, table)
		return s
	}, append(opts, spoiler)...)
}

// spoil writes NaN, which no release writes, as the value of the record
// id of s, on table, for the suite (storetest.SpoilRecord).
func spoil(t *testing.T, pool *pgxpool.Pool, s *pgstore.Store, table string, id driver.RecordID) {
	t.Helper()
	ctx := context.Background()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
	op := &driver.Op{Mode: driver.ModeLimit, Now: t0.UnixMilli(),
		Items: []driver.Item{{Name: id.Name, Key: id.Key, Count: 1, Shards: []driver.Shard{{Index: int(id.Shard), Params: p}}}}}
	require.NoError(t, s.Apply(ctx, op, make([]driver.Decision, 1)))
	key := sha256.Sum256(id.AppendKey(nil))
	tag, err := pool.Exec(ctx, "UPDATE "+pgx.Identifier{"public", table}.Sanitize()+" SET value = 'NaN' WHERE id = $1", key[:])
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "the record's row")
}

// TestConformanceExecModes runs the suite on pools that do not prepare
// and cache statements (as behind a connection pooler), on which a lone
// call's statement goes through pgx's generic path rather than straight
// to the connection (wire.go).
func TestConformanceExecModes(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
			require.NoError(t, err)
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			require.False(t, pgstore.Direct(newStore(t, pool)))
			runConformance(t, pool, storetest.DifferentialRuns(10, 80))
		})
	}
}

func TestMultiProcess(t *testing.T) {
	storetest.MultiProcess(t, func(t *testing.T) ratelimit.Store {
		s, err := pgstore.New(context.Background(), newPool(t, testserver.PostgresURL(t), nil),
			pgstore.WithTable("ratelimit_test_multiprocess"))
		require.NoError(t, err)
		return s
	}, 4)
}

// tracer counts the statements sent.
type tracer struct {
	n   atomic.Int64
	sql []string
	mu  sync.Mutex
}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.n.Add(1)
	tr.mu.Lock()
	tr.sql = append(tr.sql, d.SQL)
	tr.mu.Unlock()
	return ctx
}

func (tr *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestOneStatementPerCall(t *testing.T) {
	ctx := context.Background()
	tr := &tracer{}
	pool := newPool(t, testserver.PostgresURL(t), tr)
	lim, err := ratelimit.New(newStore(t, pool), ratelimit.Limits{
		"one":   {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute},
		"two":   {Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Minute},
		"shard": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute, Shards: 8},
	}, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	calls := []func() error{
		func() error { _, err := lim.Limit(ctx, "one", "k"); return err },
		func() error { _, err := lim.Limit(ctx, "one", "k"); return err },
		func() error { _, err := lim.Check(ctx, "one", "k"); return err },
		func() error { _, err := lim.Limit(ctx, "shard", "k", ratelimit.Count(20)); return err },
		func() error { _, err := lim.LimitAll(ctx, "k", []string{"one", "two", "shard"}); return err },
	}
	for i, call := range calls {
		tr.n.Store(0)
		tr.sql = nil
		require.NoError(t, call())
		require.Equal(t, int64(1), tr.n.Load(), "call %d sent %q", i, tr.sql)
	}
}

// TestApplyBatchEmpty: ApplyBatch of no ops decides nothing and sends
// nothing, as that many (zero) calls of Apply would.
func TestApplyBatchEmpty(t *testing.T) {
	ctx := context.Background()
	tr := &tracer{}
	s := newStore(t, newPool(t, testserver.PostgresURL(t), tr))
	tr.n.Store(0)
	require.NoError(t, s.ApplyBatch(ctx, nil, nil))
	require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{}, [][]driver.Decision{}))
	require.Zero(t, tr.n.Load(), "statements sent for no ops")
}

// TestFreshEncoderSendsEmptyArrays: the arrays of an encoder fresh from
// its pool are empty, not nil, which pgx would send as NULL: the function
// _apply takes the cardinality of each, which NULL fails (SQLSTATE 22004).
func TestFreshEncoderSendsEmptyArrays(t *testing.T) {
	_, _, s := newTableStore(t)
	require.NoError(t, pgstore.ApplyNoneFresh(context.Background(), s))
}

// TestNoDeadlock runs calls that lock overlapping records in every order
// at once: LimitAll over several limits of one key, in shuffled orders,
// and a sharded limit. PostgreSQL would abort a deadlocked call with
// SQLSTATE 40P01, which would surface as an error here.
func TestNoDeadlock(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	names := []string{"a", "b", "c", "d"}
	limits := ratelimit.Limits{"s": {Kind: ratelimit.TokenBucket, Rate: 1e9, Period: time.Second, Shards: 3}}
	for _, n := range names {
		limits[n] = ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1e9, Period: time.Second}
	}
	s := newStore(t, pool)
	lim, err := ratelimit.New(s, limits, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := range 40 {
				order := append([]string(nil), names...)
				rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
				key := fmt.Sprint("k", i%3)
				var err error
				if g%4 == 0 {
					_, err = lim.Limit(ctx, "s", key)
				} else {
					_, err = lim.LimitAll(ctx, key, order[:2+rng.IntN(3)])
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, pgstore.Retried(s), "statements sent again after a deadlock")
}

// TestIsolationLevels: on a database or role whose default isolation is
// REPEATABLE READ or SERIALIZABLE, concurrent calls on a hot key fail with
// serialization failures (SQLSTATE 40001), which the store's statements,
// written for READ COMMITTED, would return: each is sent again, once in a
// READ COMMITTED transaction, and every call is decided once, exactly.
func TestIsolationLevels(t *testing.T) {
	bucket := driver.Params{Kind: driver.TokenBucket, Rate: 1, Period: 3_600_000, Capacity: 1e9}
	one := func(name string) driver.Item { // of the hot key
		return driver.Item{Name: name, Key: "hot", Count: 1, Shards: []driver.Shard{{Index: 0, Params: bucket}}}
	}
	for _, iso := range []string{"repeatable read", "serializable"} {
		for _, c := range []struct {
			name   string
			opts   []pgstore.Option
			viaPgx bool // not straight to the connection (wire.go)
		}{
			{"lone", []pgstore.Option{pgstore.WithMaxBatch(1)}, false},
			{"lone through pgx", []pgstore.Option{pgstore.WithMaxBatch(1)}, true},
			{"batched", nil, false},
			{"server time", []pgstore.Option{pgstore.WithMaxBatch(1), pgstore.WithServerTime()}, false},
		} {
			t.Run(iso+"/"+c.name, func(t *testing.T) {
				ctx := context.Background()
				cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
				require.NoError(t, err)
				cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
				if c.viaPgx {
					cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
				}
				cfg.MaxConns = 20
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				require.NoError(t, err)
				t.Cleanup(pool.Close)
				var got string
				require.NoError(t, pool.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got))
				require.Equal(t, iso, got)
				table := uniqueTable(t, pool)
				// Four stores on one table, as four processes of a fleet.
				var stores [4]*pgstore.Store
				for i := range stores {
					stores[i], err = pgstore.New(ctx, pool, append([]pgstore.Option{pgstore.WithTable(table)}, c.opts...)...)
					require.NoError(t, err)
					require.Equal(t, !c.viaPgx, pgstore.Direct(stores[i]))
				}
				const goroutines, calls = 16, 20
				var (
					wg   sync.WaitGroup
					mu   sync.Mutex
					errs []error
				)
				for g := range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range calls {
							// One item on the hot key (a lone statement), or
							// two (the function _apply).
							op := &driver.Op{Mode: driver.ModeLimit, Now: t0.UnixMilli(), Items: []driver.Item{one("n")}}
							if i%2 == 1 {
								op.Items = append(op.Items, one("w"))
							}
							out := make([]driver.Decision, len(op.Items))
							err := stores[g%len(stores)].Apply(ctx, op, out)
							if err == nil && (!out[0].OK || !out[len(out)-1].OK) {
								err = fmt.Errorf("call %d of %d refused: %+v", i, g, out)
							}
							if err != nil {
								mu.Lock()
								errs = append(errs, err)
								mu.Unlock()
							}
						}
					}()
				}
				wg.Wait()
				if len(errs) > 0 {
					t.Fatalf("%d of %d calls failed, first: %v", len(errs), goroutines*calls, errs[0])
				}
				var retried int64
				for _, s := range stores {
					retried += pgstore.Retried(s)
				}
				t.Logf("%d statements sent again", retried)
				recs := make([]driver.Record, 2)
				require.NoError(t, stores[0].Load(ctx, []driver.RecordID{{Name: "n", Key: "hot"}, {Name: "w", Key: "hot"}}, recs))
				// Every call charged its token once (a refill of a token an
				// hour adds nothing close to one at the server's time).
				require.InDelta(t, 1e9-goroutines*calls, recs[0].State.Remaining, 0.01, "the limit of every call")
				require.InDelta(t, 1e9-goroutines*calls/2, recs[1].State.Remaining, 0.01, "the limit of every other call")
			})
		}
	}
}

// TestSerializationFailureGivesUp: a statement that fails on concurrent
// transactions however often it is sent (here a trigger raises SQLSTATE
// 40001 at every write) is sent again SerialRetries times, then its error
// is returned, wrapped; it wrote nothing. Each of the store's statements
// that write: the lone ones, directly and through pgx, the functions, the
// batch upsert, and Delete.
func TestSerializationFailureGivesUp(t *testing.T) {
	ctx := context.Background()
	direct := newPool(t, testserver.PostgresURL(t), nil)
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	viaPgx, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(viaPgx.Close)

	table := uniqueTable(t, direct)
	s, err := pgstore.New(ctx, direct, pgstore.WithTable(table), pgstore.WithMaxBatch(1))
	require.NoError(t, err)
	require.NoError(t, s.Apply(ctx, limitOp("old", 1), make([]driver.Decision, 1)))
	// Counts the writes tried, outside of the transactions that fail;
	// named with its schema, as the trigger runs under the search_path of
	// the function that fires it, pg_catalog, pg_temp.
	tries := pgx.Identifier{"public", table + "_tries"}.Sanitize()
	fail := pgx.Identifier{table + "_fail"}.Sanitize()
	_, err = direct.Exec(ctx, "CREATE SEQUENCE "+tries+" OWNED BY "+pgx.Identifier{table, "id"}.Sanitize()+";"+
		"CREATE FUNCTION "+fail+"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"+
		" PERFORM nextval("+quoteLiteral(tries)+"); RAISE 'no serialization' USING ERRCODE = '40001'; END $$;"+
		"CREATE TRIGGER fail BEFORE INSERT OR UPDATE OR DELETE ON "+pgx.Identifier{table}.Sanitize()+
		" FOR EACH ROW EXECUTE FUNCTION "+fail+"()")
	require.NoError(t, err)
	count := func() (n int64) {
		require.NoError(t, direct.QueryRow(ctx, "SELECT coalesce((SELECT last_value FROM "+tries+" WHERE is_called), 0)").Scan(&n))
		return n
	}

	stores := map[string]*pgstore.Store{"direct": s}
	stores["pgx"], err = pgstore.New(ctx, viaPgx, pgstore.WithTable(table), pgstore.WithMaxBatch(1))
	require.NoError(t, err)
	require.False(t, pgstore.Direct(stores["pgx"]))
	stores["server time"], err = pgstore.New(ctx, direct, pgstore.WithTable(table), pgstore.WithMaxBatch(1), pgstore.WithServerTime())
	require.NoError(t, err)
	two := limitOp("a", 1) // two limits of one key
	two.Items = append(two.Items, two.Items[0])
	two.Items[1].Name = "m"
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"lone, direct", func() error { return stores["direct"].Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1)) }},
		{"lone, through pgx", func() error { return stores["pgx"].Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1)) }},
		{"lone, on the old record", func() error { return stores["direct"].Apply(ctx, limitOp("old", 1), make([]driver.Decision, 1)) }},
		{"_one", func() error { return stores["server time"].Apply(ctx, limitOp("k", 1), make([]driver.Decision, 1)) }},
		{"_apply", func() error { return s.Apply(ctx, two, make([]driver.Decision, 2)) }},
		{"batch upsert", func() error {
			return s.ApplyBatch(ctx, []*driver.Op{limitOp("a", 1), limitOp("b", 1)}, [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)})
		}},
		{"delete", func() error { return s.Delete(ctx, []driver.RecordID{{Name: "l", Key: "old"}}) }},
	} {
		before, retried := count(), pgstore.Retried(s)+pgstore.Retried(stores["pgx"])+pgstore.Retried(stores["server time"])
		err := c.call()
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe, c.name)
		require.Equal(t, "40001", pe.Code, c.name)
		require.ErrorContains(t, err, "READ COMMITTED", c.name)
		require.Equal(t, int64(1+pgstore.SerialRetries), count()-before, "%s: writes tried", c.name)
		require.Equal(t, int64(pgstore.SerialRetries), pgstore.Retried(s)+pgstore.Retried(stores["pgx"])+pgstore.Retried(stores["server time"])-retried, c.name)
	}
	var rows int
	require.NoError(t, direct.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&rows))
	require.Equal(t, 1, rows, "only the old record, as it was")
	recs := make([]driver.Record, 1)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: "old"}}, recs))
	require.Equal(t, 9.0, recs[0].State.Remaining)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func TestServerTime(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	s := newStore(t, pool, pgstore.WithServerTime())
	require.True(t, s.OwnClock())
	server, err := s.Now(ctx)
	require.NoError(t, err)
	require.InDelta(t, time.Now().UnixMilli(), server, float64(time.Hour.Milliseconds()), "the local server's clock")

	// The Limiter's clock is a year off; the server's decides.
	lim, err := ratelimit.New(s, ratelimit.Limits{"tb": {Kind: ratelimit.TokenBucket, Rate: 1, Period: 24 * time.Hour, Capacity: 2}},
		ratelimit.WithClock(newMock(time.Now().AddDate(-1, 0, 0))))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "tb", "k", ratelimit.Count(2))
	require.NoError(t, err)
	require.True(t, res.OK)
	st, err := lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.True(t, st.Shards[0].Stored)
	require.InDelta(t, 0, st.Remaining, 0.01, "judged at the server's time, not a year earlier")

	// A batch too, one now for all its ops.
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 86_400_000, Capacity: 2}
	yearAgo := time.Now().AddDate(-1, 0, 0).UnixMilli()
	var ops []*driver.Op
	var outs [][]driver.Decision
	for range 3 {
		ops = append(ops, &driver.Op{Now: yearAgo, Items: []driver.Item{{Name: "tb", Key: "batch", Count: 1,
			Shards: []driver.Shard{{Params: p}}}}})
		outs = append(outs, make([]driver.Decision, 1))
	}
	require.NoError(t, s.ApplyBatch(ctx, ops, outs))
	require.True(t, outs[0][0].OK)
	require.True(t, outs[1][0].OK)
	require.False(t, outs[2][0].OK)
	got := make([]driver.Record, 1)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "tb", Key: "batch"}}, got))
	require.InDelta(t, time.Now().UnixMilli(), got[0].State.TS, float64(time.Hour.Milliseconds()), "written at the server's time")
}

// The function _one decides a lone call judged at the server's clock, or
// decided again after a race, which the conformance suite's differential
// tests do not reach: run here with the op's own time (flags without +8)
// on the records its earlier calls left, it is the Go transition to the
// last bit. Rates, debts and counts are in tenths, whose shortfalls carry
// float noise, or rates are a few times the noise per step, and steps of
// whole periods land the waits on whole windows and milliseconds.
func TestOneFunctionDifferential(t *testing.T) {
	ctx := context.Background()
	pool, table, s := newTableStore(t)
	one := pgx.Identifier{table + "_one"}.Sanitize()
	rng := rand.New(rand.NewPCG(5, 9))
	rates := []float64{0.1, 0.3, 0.7, 1.3, 2.5}
	for i := range 60 {
		rate := rates[rng.IntN(len(rates))]
		p := driver.Params{Kind: ratelimit.FixedWindow, Rate: rate, Period: []int64{7, 1000}[rng.IntN(2)],
			Capacity: rate * []float64{1, 1.5, 3}[rng.IntN(3)]}
		if i%3 == 2 { // a few times the noise per step: waits land on the noise
			p.Rate, p.Period = []float64{1e-6, 3e-9}[rng.IntN(2)], []int64{1, 7, 1000}[rng.IntN(3)]
			p.Capacity = float64(1+rng.IntN(5)) / 10
		}
		if i%2 == 1 {
			p.Kind = ratelimit.TokenBucket
		} else {
			p.Phase = rng.Int64N(p.Period)
		}
		if rng.IntN(3) > 0 {
			p.MaxReserved = float64(1+rng.IntN(int(p.Capacity*10)+1)) / 10
		}
		key := fmt.Sprintf("one%d", i)
		now := t0.UnixMilli()
		for step := range 15 {
			if rng.IntN(2) == 0 {
				now += p.Period
			} else {
				now += rng.Int64N(p.Period + 1)
			}
			reserve, check := rng.IntN(3) == 0, rng.IntN(5) == 0
			reach := p.Capacity
			if reserve {
				reach += p.MaxReserved
			}
			count := min(float64(rng.IntN(int(reach*10)+1))/10, reach)
			recs := make([]driver.Record, 1)
			require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: key}}, recs))
			var want driver.Decision
			next := ratelimit.TransitionInto(&want, &p, recs[0].State, recs[0].Found, now, count, reserve)
			flags := int32(0)
			if check {
				flags |= 1
			}
			if reserve {
				flags |= 4
			}
			var (
				ok            bool
				retry, at, ts int64
				rem, charged  float64
			)
			require.NoError(t, pool.QueryRow(ctx, "SELECT * FROM "+one+"($1, 'l', $2, 0, $3, $4, $5, $6, $7, $8, $9, $10, $11, 0)",
				rowID(key), []byte(key), int32(p.Kind), p.Rate, p.Period, p.Capacity, p.MaxReserved, p.Phase, now, count, flags).
				Scan(&ok, &retry, &rem, &charged, &at, &ts))
			where := fmt.Sprintf("limit %d step %d: %+v record %+v now %d count %v reserve %v check %v",
				i, step, p, recs[0], now, count, reserve, check)
			require.Equal(t, want.OK, ok, where)
			require.Equal(t, want.RetryAfter, retry, where)
			require.Equal(t, math.Float64bits(want.Remaining), math.Float64bits(rem), "%s: remaining %v, want %v", where, rem, want.Remaining)
			require.Equal(t, math.Float64bits(want.Charged[0]), math.Float64bits(charged), where)
			require.Equal(t, next.TS, ts, where)
		}
	}
}

// WithMaxBatch and WithMaxInFlight below 1 are refused, as boltstore and
// redisstore refuse a WithMaxBatch below 1, rather than taken silently for
// a default (WithMaxInFlight(0) was one statement in flight, not the
// default of two).
func TestCoalescingOptionsBelowOne(t *testing.T) {
	pool := newPool(t, testserver.PostgresURL(t), nil)
	for _, o := range []struct {
		name string
		opt  pgstore.Option
	}{
		{"WithMaxBatch(0)", pgstore.WithMaxBatch(0)},
		{"WithMaxBatch(-1)", pgstore.WithMaxBatch(-1)},
		{"WithMaxInFlight(0)", pgstore.WithMaxInFlight(0)},
		{"WithMaxInFlight(-1)", pgstore.WithMaxInFlight(-1)},
	} {
		_, err := pgstore.New(context.Background(), pool, pgstore.WithTable(uniqueTable(t, pool)), o.opt)
		require.ErrorContains(t, err, "at least 1", o.name)
		require.ErrorContains(t, err, o.name)
	}
}

func TestOddTableNames(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	name := fmt.Sprintf(`weird "name"; it's; drop table x; %d`, time.Now().UnixNano())
	t.Cleanup(func() { dropTable(pool, name) })
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err, "New is idempotent")

	// The table's name reaches every statement quoted: calls and sweeps
	// work on it (DeleteExpired itself is part of the conformance suite).
	mock := newMock(t0)
	lim, err := ratelimit.New(s, ratelimit.Limits{
		"tb": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "tb", "k", ratelimit.Count(10))
	require.NoError(t, err)
	grace := time.Duration(driver.ExpiryGrace) * time.Millisecond
	n, err := s.DeleteExpired(ctx, mock.Now().Add(time.Minute+grace))
	require.NoError(t, err)
	require.Equal(t, 1, n)

	_, err = pgstore.New(ctx, pool, pgstore.WithTable("schema."))
	require.Error(t, err)
	_, err = pgstore.New(ctx, nil)
	require.Error(t, err)
}

// TestLoadDuplicateIDs: an id given to Load more than once is reported
// at every one of its positions, not only at its last.
func TestLoadDuplicateIDs(t *testing.T) {
	ctx := context.Background()
	_, _, s := newTableStore(t)
	for _, key := range []string{"a", "b"} {
		out := make([]driver.Decision, 1)
		require.NoError(t, s.Apply(ctx, limitOp(key, 1), out))
		require.True(t, out[0].OK)
	}
	a, b, none := driver.RecordID{Name: "l", Key: "a"}, driver.RecordID{Name: "l", Key: "b"}, driver.RecordID{Name: "l", Key: "none"}
	got := make([]driver.Record, 6)
	require.NoError(t, s.Load(ctx, []driver.RecordID{a, b, a, none, b, a}, got))
	for i, want := range []int{0, 1, 0, 3, 1, 0} {
		require.Equal(t, got[want], got[i], "position %d", i)
	}
	require.True(t, got[0].Found)
	require.Equal(t, 9.0, got[0].State.Remaining)
	require.True(t, got[1].Found)
	require.False(t, got[3].Found)
}

// TestTableNamesWithPlaceholders: a table name that holds a placeholder
// of the schema's script, or a dollar-quote tag, is a name as any other:
// {{q}} in it is not read as the tag that ends a function's body.
func TestTableNamesWithPlaceholders(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	for _, odd := range []string{"{{q}}", "$fn${{q}}{{table}}", "{{q}}$fn$$fn0$"} {
		name := fmt.Sprintf("rl%s%d", odd, time.Now().UnixNano())
		t.Cleanup(func() { dropTable(pool, name) })
		s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
		require.NoError(t, err, "%q", name)
		// Two items: the function _apply, installed with the schema.
		op := &driver.Op{Now: t0.UnixMilli(), Items: []driver.Item{
			{Name: "l", Key: "a", Count: 1, Shards: []driver.Shard{{Index: 0, Params: tenPerHour}}},
			{Name: "m", Key: "a", Count: 2, Shards: []driver.Shard{{Index: 0, Params: tenPerHour}}},
		}}
		out := make([]driver.Decision, 2)
		require.NoError(t, s.Apply(ctx, op, out), "%q", name)
		require.True(t, out[0].OK && out[1].OK)
		got := make([]driver.Record, 2)
		require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: "a"}, {Name: "m", Key: "a"}}, got))
		require.Equal(t, []float64{9, 8}, []float64{got[0].State.Remaining, got[1].State.Remaining}, "%q", name)
	}
}

// onePool returns a pool of the test server of one connection, closed
// when the test ends.
func onePool(t *testing.T) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testserver.PostgresURL(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestStatementsDeallocatedBehindTheConnection drops a connection's
// prepared statements behind pgx's back, as a connection pooler's
// DEALLOCATE ALL or DISCARD ALL does: a lone call's statement that the
// server no longer holds is prepared again, and the call decided.
func TestStatementsDeallocatedBehindTheConnection(t *testing.T) {
	ctx := context.Background()
	pool := onePool(t) // every call on the one connection
	s := newStore(t, pool)
	require.True(t, pgstore.Direct(s))
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}})
	require.NoError(t, err)
	for i := range 4 {
		res, err := lim.Limit(ctx, "l", "k")
		require.NoError(t, err, "call %d", i)
		require.True(t, res.OK, "call %d", i)
		res, err = lim.Check(ctx, "l", "k")
		require.NoError(t, err, "check %d", i)
		require.Less(t, res.Remaining, float64(10-i), "check %d: the call %d was charged", i, i)

		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		_, err = c.Conn().PgConn().Exec(ctx, "DEALLOCATE ALL").ReadAll()
		c.Release()
		require.NoError(t, err)
	}
}

// TestDropTableLeavesNothing requires a test's cleanup to drop its table
// and every function New created for it: each test makes a table of its
// own, and what the cleanup leaves stays in the database.
func TestDropTableLeavesNothing(t *testing.T) {
	ctx := context.Background()
	pool, table, _ := newTableStore(t)
	left := func() (n int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_proc WHERE starts_with(proname, $1)", table+"_").Scan(&n))
		return n
	}
	require.NotZero(t, left(), "New made no function")
	dropTable(pool, table)
	require.Zero(t, left(), "functions left behind")
	var gone bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NULL", pgx.Identifier{table}.Sanitize()).Scan(&gone))
	require.True(t, gone, "table left behind")
}

// TestStatementDroppedBetweenTries: a statement that failed on a
// concurrent transaction (40001) and that the server no longer holds as
// prepared when it is sent again (here the failing write itself runs
// DEALLOCATE ALL, which no rollback undoes, as a pooler's DISCARD ALL or a
// change of the table could between the tries) is prepared afresh and
// decided. Its try in READ COMMITTED failed on the missing statement,
// which aborted the transaction: the lone call prepared it again there,
// and got "current transaction is aborted" (25P02), which hid the real
// error; the others returned that error ("prepared statement does not
// exist"). Each of the store's statements that write and that pgx
// prepares: the lone ones, sent directly, the functions, the batch upsert.
func TestStatementDroppedBetweenTries(t *testing.T) {
	ctx := context.Background()
	pool := onePool(t) // every try on the one connection
	table := fmt.Sprintf("ratelimit_test_storemisc_%d", time.Now().UnixNano())
	t.Cleanup(func() { dropTable(pool, table) })
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithMaxBatch(1))
	require.NoError(t, err)
	require.True(t, pgstore.Direct(s))
	serverTime, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithMaxBatch(1), pgstore.WithServerTime())
	require.NoError(t, err)

	// Once armed, the next write fails with 40001, and drops the session's
	// prepared statements first; the writes after it go through. (The
	// sequence is named with its schema: see TestSerializationFailureGivesUp.)
	tries := pgx.Identifier{"public", table + "_tries"}.Sanitize()
	fail := pgx.Identifier{table + "_fail"}.Sanitize()
	_, err = pool.Exec(ctx, "CREATE SEQUENCE "+tries+" OWNED BY "+pgx.Identifier{table, "id"}.Sanitize()+";"+
		"SELECT setval("+quoteLiteral(tries)+", 1);"+
		"CREATE FUNCTION "+fail+"() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"+
		" IF nextval("+quoteLiteral(tries)+") = 1 THEN"+
		"  DEALLOCATE ALL; RAISE 'no serialization' USING ERRCODE = '40001';"+
		" END IF; RETURN NEW; END $$;"+
		"CREATE TRIGGER fail BEFORE INSERT OR UPDATE ON "+pgx.Identifier{table}.Sanitize()+
		" FOR EACH ROW EXECUTE FUNCTION "+fail+"()")
	require.NoError(t, err)
	two := func(key string) *driver.Op {
		op := limitOp(key+"a", 1) // two limits of one key
		op.Items = append(op.Items, op.Items[0])
		op.Items[1].Name = "m"
		return op
	}
	for _, c := range []struct {
		name string
		call func(key string) (remaining float64, err error)
	}{
		{"lone, direct", func(key string) (float64, error) {
			out := make([]driver.Decision, 1)
			err := s.Apply(ctx, limitOp(key, 1), out)
			return out[0].Remaining, err
		}},
		{"_one", func(key string) (float64, error) {
			out := make([]driver.Decision, 1)
			err := serverTime.Apply(ctx, limitOp(key, 1), out)
			return out[0].Remaining, err
		}},
		{"_apply", func(key string) (float64, error) {
			out := make([]driver.Decision, 2)
			err := s.Apply(ctx, two(key), out)
			return out[1].Remaining, err
		}},
		{"batch upsert", func(key string) (float64, error) {
			outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
			err := s.ApplyBatch(ctx, []*driver.Op{limitOp(key+"a", 1), limitOp(key+"b", 1)}, outs)
			return outs[1][0].Remaining, err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := strings.ReplaceAll(c.name, " ", "-")
			rem, err := c.call(key) // prepared on the connection
			require.NoError(t, err)
			require.Equal(t, 9.0, rem)
			_, err = pool.Exec(ctx, "ALTER SEQUENCE "+tries+" RESTART")
			require.NoError(t, err)

			retried := pgstore.Retried(s) + pgstore.Retried(serverTime)
			rem, err = c.call(key)
			require.NoError(t, err, "sent again, with the statement prepared afresh")
			require.Equal(t, 8.0, rem, "charged once")
			require.Equal(t, int64(1), pgstore.Retried(s)+pgstore.Retried(serverTime)-retried, "sent again after the serialization failure")
			rem, err = c.call(key)
			require.NoError(t, err)
			require.Equal(t, 7.0, rem, "charged once before")
		})
	}
}

// TestLoadOfRowsOfShortIDs: Load keeps only the rows of the ids it asked
// for, and a row of an id shorter than a record's (32 bytes, or NULL),
// which the table's _read returns once something replaced it after New,
// is none of them. Before, Load converted the id to the array of its
// index before it checked the length, and panicked on it.
func TestLoadOfRowsOfShortIDs(t *testing.T) {
	ctx := context.Background()
	pool, table, s := newTableStore(t)
	read := pgx.Identifier{table + "_read"}.Sanitize()
	for _, id := range []string{`'\x01'::bytea`, `NULL::bytea`} {
		_, err := pool.Exec(ctx, "CREATE OR REPLACE FUNCTION "+read+`(p_id bytea[]) RETURNS TABLE (id bytea, value float8, ts bigint)
			LANGUAGE plpgsql STABLE AS $$BEGIN RETURN QUERY SELECT `+id+`, 1::float8, 1700000000000::bigint; END$$`)
		require.NoError(t, err)
		out := make([]driver.Record, 1)
		require.NotPanics(t, func() { err = s.Load(ctx, []driver.RecordID{{Name: "l", Key: "k"}}, out) }, id)
		require.NoError(t, err, id)
		require.Equal(t, driver.Record{}, out[0], "the row of %s is no record asked for", id)
	}
}
