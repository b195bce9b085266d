package pgstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// shadowOperators returns the SQL that makes, in schema (quoted), an
// operator of every name and operand types that the store's plain
// statements could use, and a domain of every type name they could cast
// to, each failing with "shadowed" where it is used.
func shadowOperators(schema string) string {
	var b strings.Builder
	types := []string{"float8", "int8", "int4", "bytea", "text", "bool"}
	for _, ty := range types {
		for _, ret := range slices.Compact([]string{ty, "bool"}) {
			fmt.Fprintf(&b, "CREATE FUNCTION %s.shadow_%s_%s(pg_catalog.%s, pg_catalog.%s) RETURNS pg_catalog.%s LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'shadowed operator'; END$$;\n",
				schema, ty, ret, ty, ty, ret)
		}
		fmt.Fprintf(&b, "CREATE FUNCTION %s.shadow_neg_%s(pg_catalog.%s) RETURNS pg_catalog.%s LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'shadowed operator'; END$$;\n",
			schema, ty, ty, ty)
		for _, op := range []string{"=", "<>", "<", ">", "<=", ">="} {
			fmt.Fprintf(&b, "CREATE OPERATOR %s.%s (LEFTARG = pg_catalog.%s, RIGHTARG = pg_catalog.%s, FUNCTION = %s.shadow_%s_bool);\n",
				schema, op, ty, ty, schema, ty)
		}
		if ty == "float8" || ty == "int8" || ty == "int4" {
			for _, op := range []string{"+", "-", "*", "/"} {
				fmt.Fprintf(&b, "CREATE OPERATOR %s.%s (LEFTARG = pg_catalog.%s, RIGHTARG = pg_catalog.%s, FUNCTION = %s.shadow_%s_%s);\n",
					schema, op, ty, ty, schema, ty, ty)
			}
			fmt.Fprintf(&b, "CREATE OPERATOR %s.- (RIGHTARG = pg_catalog.%s, FUNCTION = %s.shadow_neg_%s);\n", schema, ty, schema, ty)
		}
	}
	for _, ty := range []string{"float8", "bytea", "text"} {
		fmt.Fprintf(&b, "CREATE DOMAIN %s.%s AS pg_catalog.%s CHECK (VALUE IS NULL);\n", schema, ty, ty)
	}
	return b.String()
}

// The store's plain statements (the lone upserts and read, the batch
// upsert, the calls of its functions) name every operator and type with
// pg_catalog: on a connection whose search_path lists pg_catalog after a
// schema that holds operators of the same names and operand types, and
// domains of the types' names, they use PostgreSQL's own. Before, they
// named them bare, and a statement took the first schema's: a schema that
// others may create objects in, listed before pg_catalog, exposed every
// call of the store.
func TestOperatorsOfASchemaBeforePgCatalog(t *testing.T) {
	ctx := context.Background()
	admin, first, home, name := tableBesideASchema(t)
	table := home + "." + name
	_, err := admin.Exec(ctx, shadowOperators(pgx.Identifier{first}.Sanitize()))
	require.NoError(t, err)
	pool := pathPool(t, pgx.Identifier{first}.Sanitize()+", pg_catalog, "+pgx.Identifier{home}.Sanitize(), nil)
	// The shadows are there: a bare operator finds them.
	_, err = pool.Exec(ctx, "SELECT 1::pg_catalog.float8 + 2::pg_catalog.float8")
	require.ErrorContains(t, err, "shadowed operator")

	bucket := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 3_600_000, Capacity: 10}
	window := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: 3_600_000, Capacity: 10}
	op := func(p driver.Params, key string, count float64, shards ...int) *driver.Op {
		it := driver.Item{Name: "l", Key: key, Count: count}
		for _, sh := range shards {
			it.Shards = append(it.Shards, driver.Shard{Index: sh, Params: p})
		}
		return &driver.Op{Now: t0.UnixMilli(), Items: []driver.Item{it}}
	}
	for _, deadline := range []bool{false, true} {
		for _, serverTime := range []bool{false, true} {
			what := fmt.Sprintf("deadline %v, server time %v", deadline, serverTime)
			cctx, cancel := context.WithCancel(ctx)
			if deadline {
				cctx, cancel = context.WithTimeout(ctx, time.Hour)
			}
			opts := []pgstore.Option{pgstore.WithTable(table), pgstore.WithoutDDL(), pgstore.WithMaxBatch(1)}
			if serverTime {
				opts = append(opts, pgstore.WithServerTime())
			}
			s, err := pgstore.New(ctx, pool, opts...)
			require.NoError(t, err, what)
			key := func(k string) string { return fmt.Sprintf("%s-%v-%v", k, deadline, serverTime) }
			out := make([]driver.Decision, 1)
			for _, p := range []driver.Params{bucket, window} {
				key := func(k string) string { return fmt.Sprintf("%s-%v", key(k), p.Kind) }
				for i, count := range []float64{3, 3, 20} { // fresh, full upsert, refused
					require.NoError(t, s.Apply(cctx, op(p, key("lone"), count, 0), out), "%s: %v, call %d", what, p.Kind, i)
					require.Equal(t, i < 2, out[0].OK, "%s: %v, call %d", what, p.Kind, i)
				}
				check := op(p, key("lone"), 1, 0)
				check.Mode = driver.ModeCheck
				require.NoError(t, s.Apply(cctx, check, out), what)
				require.True(t, out[0].OK, what)
				for _, maxr := range []float64{0, 5} {
					q := p
					q.MaxReserved = maxr
					res := op(q, key(fmt.Sprint("reserve", maxr)), 12, 0)
					res.Reserve = true
					require.NoError(t, s.Apply(cctx, res, out), "%s: reserve, max %v", what, maxr)
					require.True(t, out[0].OK, "%s: reserve, max %v", what, maxr)
				}
			}
			outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
			require.NoError(t, s.ApplyBatch(cctx, []*driver.Op{op(bucket, key("a"), 2, 0), op(bucket, key("b"), 2, 0)}, outs), what)
			require.True(t, outs[0][0].OK && outs[1][0].OK, what)
			require.NoError(t, s.ApplyBatch(cctx, []*driver.Op{op(bucket, key("pair"), 25, 0, 1), op(bucket, key("pair"), 1, 0, 1)}, outs), what)
			require.False(t, outs[0][0].OK, what)
			require.True(t, outs[1][0].OK, what)
			recs := make([]driver.Record, 2)
			require.NoError(t, s.Load(cctx, []driver.RecordID{{Name: "l", Key: key("a")}, {Name: "l", Key: key("b")}}, recs), what)
			require.True(t, recs[0].Found && recs[1].Found, what)
			require.NoError(t, s.Delete(cctx, []driver.RecordID{{Name: "l", Key: key("a")}}), what)
			if serverTime {
				_, err := s.Now(cctx)
				require.NoError(t, err, what)
			}
			cancel()
		}
	}
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithoutDDL())
	require.NoError(t, err)
	_, err = s.DeleteExpired(ctx, time.Now().Add(1000*time.Hour)) // past every record's, at either clock
	require.NoError(t, err)
	var left int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{home, name}.Sanitize()).Scan(&left))
	require.Zero(t, left)
}
