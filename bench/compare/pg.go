package compare

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
)

// The contenders on PostgreSQL. No peer in the comparison has a
// PostgreSQL store; the bare upsert is the floor.
var pgContenders = []Contender{
	{
		Name: "ratelimit pgstore", Code: "lib", Role: Library, Bound: libraryBound,
		New: func(_ context.Context, e *env, l Limit) (Taker, error) { return newLibrary(e.pgStore, l) },
	},
	{
		Name: "bare upsert", Code: "bare", Role: Bare, Bound: counterBound,
		New: func(_ context.Context, e *env, l Limit) (Taker, error) {
			return &bareUpsert{pool: e.pg, sql: e.upsertSQL, limit: int64(l.Rate), period: l.Period.Milliseconds()}, nil
		},
	},
}

// pgSetup makes the run's schema, holding the library's table (and its
// function) and the bare counter's table, so that one DROP SCHEMA removes
// everything the run made.
func pgSetup(ctx context.Context, e *env) error {
	schema := pgx.Identifier{e.pgSchema}.Sanitize()
	if _, err := e.pg.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	table := pgx.Identifier{e.pgSchema, "bare"}.Sanitize()
	if _, err := e.pg.Exec(ctx, "CREATE TABLE "+table+" (key text PRIMARY KEY, win bigint NOT NULL, n bigint NOT NULL)"); err != nil {
		return err
	}
	// One statement: count the call in the key's current window, or start
	// a new window. A call whose window is older than the stored one (its
	// time was read before another call's) counts in the stored window,
	// so a window never restarts.
	e.upsertSQL = "INSERT INTO " + table + " AS c (key, win, n) VALUES ($1, $2, 1) " +
		"ON CONFLICT (key) DO UPDATE SET n = CASE WHEN c.win >= excluded.win THEN c.n + 1 ELSE 1 END, " +
		"win = GREATEST(c.win, excluded.win) RETURNING n"
	var err error
	e.pgStore, err = pgstore.New(ctx, e.pg, pgstore.WithTable(e.pgSchema+".ratelimit"))
	return err
}

func pgCleanup(ctx context.Context, e *env) error {
	_, err := e.pg.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{e.pgSchema}.Sanitize()+" CASCADE")
	return err
}

// bareUpsert counts each key's calls in fixed windows on the epoch's grid
// of this machine's clock, and grants a call when its window has counted
// at most limit: one statement per call.
type bareUpsert struct {
	pool          *pgxpool.Pool
	sql           string
	limit, period int64
}

func (b *bareUpsert) Take(ctx context.Context, key string) (bool, error) {
	var n int64
	err := b.pool.QueryRow(ctx, b.sql, key, time.Now().UnixMilli()/b.period).Scan(&n)
	return err == nil && n <= b.limit, err
}
