package testserver

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DropPostgresTable drops a test's pgstore table, unqualified, and every
// function whose name is the table's followed by an underscore (those
// pgstore.New creates: <table>_apply, <table>_one and the others), whatever
// their arguments, so that no list of them here can fall behind the
// schema's.
func DropPostgresTable(ctx context.Context, pool *pgxpool.Pool, table string) error {
	rows, err := pool.Query(ctx, "SELECT oid::regprocedure::text FROM pg_proc"+
		" WHERE starts_with(proname, $1) AND pg_function_is_visible(oid)", table+"_")
	if err != nil {
		return err
	}
	fns, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	for _, fn := range fns {
		_, e := pool.Exec(ctx, "DROP FUNCTION IF EXISTS "+fn)
		err = errors.Join(err, e)
	}
	return err
}
