package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// otherRole creates a role of the test's own, which may not log in, and a
// schema it owns, both dropped at cleanup, and returns their names: the
// role of another team, say, that may create objects in a schema of the
// store's connections' search_path and nowhere else.
func otherRole(t *testing.T, def *pgxpool.Pool) (role, schema string) {
	ctx := context.Background()
	n := time.Now().UnixNano()
	role, schema = fmt.Sprintf("ratelimit_test_other_%d", n), fmt.Sprintf("ratelimit_test_other_%d", n)
	_, err := def.Exec(ctx, "CREATE ROLE "+role+" NOLOGIN; CREATE SCHEMA "+schema+" AUTHORIZATION "+role)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = def.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE; DROP ROLE "+role) })
	return role, schema
}

// asRole runs sql on def as role, in one transaction.
func asRole(t *testing.T, def *pgxpool.Pool, role, sql string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginTxFunc(ctx, def, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql)
		return err
	}))
}

// shadowsSQL makes, in schema, an object of PostgreSQL's names for each
// call that pg_catalog has no exact match for, over the types the store's
// SQL uses: operators of two operand types (+, <, =, || and the others),
// on scalars and, compared, on arrays of one type (pg_catalog's are of
// anyarray); functions of one argument (unnest, cardinality, ceil, floor,
// length) and array_fill; the aggregates array_agg and count. PostgreSQL
// takes such an object over pg_catalog's, which needs a cast or is
// polymorphic, even when pg_catalog comes first along search_path. Each
// fails when run, saying which it is and as what user it ran.
const shadowsSQL = `DO $do$
DECLARE
	scalars text[] := ARRAY['smallint', 'integer', 'bigint', 'numeric', 'real', 'double precision', 'text', 'bytea',
		'boolean', 'oid', 'name', 'tid', 'regclass', 'regprocedure'];
	sch CONSTANT text := current_schema();
	l text; r text; o text; t text; f text; n integer := 0;
	-- body returns the body of a function that fails as the object what.
	body CONSTANT text := $b$ LANGUAGE plpgsql AS $f$BEGIN RAISE EXCEPTION 'shadowed: %s ran as %%', current_user; END$f$$b$;
BEGIN
	-- PostgreSQL's own for the block's own expressions, as it makes
	-- shadows in sch, the first schema of the path.
	PERFORM set_config('search_path', 'pg_catalog, pg_temp', true);
	FOREACH l IN ARRAY scalars || (SELECT array_agg(s || '[]') FROM unnest(scalars) s) LOOP
		FOREACH r IN ARRAY scalars || (SELECT array_agg(s || '[]') FROM unnest(scalars) s) LOOP
			CONTINUE WHEN (l LIKE '%[]' OR r LIKE '%[]') AND l <> r;
			n := n + 1;
			EXECUTE format('CREATE FUNCTION %I.cmp_%s(%s, %s) RETURNS boolean', sch, n, l, r) ||
				format(body, format('an operator on (%s, %s)', l, r));
			EXECUTE format('CREATE FUNCTION %I.op_%s(%s, %s) RETURNS %s', sch, n, l, r, l) ||
				format(body, format('an operator on (%s, %s)', l, r));
			FOREACH o IN ARRAY ARRAY['<', '>', '<=', '>=', '=', '<>', '+', '-', '*', '/', '%', '||', '&'] LOOP
				CONTINUE WHEN l LIKE '%[]' AND o NOT IN ('=', '<>');
				CONTINUE WHEN to_regoperator(format('pg_catalog.%s(%s, %s)', o, l, r)) IS NOT NULL;
				EXECUTE format('CREATE OPERATOR %I.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %I.%s_%s)', sch, o, l, r,
					sch, CASE WHEN o IN ('<', '>', '<=', '>=', '=', '<>') THEN 'cmp' ELSE 'op' END, n);
			END LOOP;
		END LOOP;
	END LOOP;
	FOREACH t IN ARRAY scalars LOOP
		n := n + 1;
		FOREACH f IN ARRAY ARRAY['unnest', 'cardinality'] LOOP
			CONTINUE WHEN to_regprocedure(format('pg_catalog.%s(%s[])', f, t)) IS NOT NULL;
			EXECUTE format('CREATE FUNCTION %I.%I(%s[]) RETURNS %s', sch, f, t,
				CASE f WHEN 'unnest' THEN 'SETOF ' || t ELSE 'integer' END) || format(body, format('%s(%s[])', f, t));
		END LOOP;
		FOREACH f IN ARRAY ARRAY['ceil', 'floor', 'length'] LOOP
			CONTINUE WHEN to_regprocedure(format('pg_catalog.%s(%s)', f, t)) IS NOT NULL;
			EXECUTE format('CREATE FUNCTION %I.%I(%s) RETURNS %s', sch, f, t,
				CASE f WHEN 'length' THEN 'integer' ELSE t END) || format(body, format('%s(%s)', f, t));
		END LOOP;
		IF to_regprocedure(format('pg_catalog.array_fill(%s, integer[])', t)) IS NULL THEN
			EXECUTE format('CREATE FUNCTION %I.array_fill(%s, integer[]) RETURNS %s[]', sch, t, t) ||
				format(body, format('array_fill(%s, integer[])', t));
		END IF;
		IF to_regprocedure(format('pg_catalog.array_agg(%s)', t)) IS NULL THEN
			EXECUTE format('CREATE FUNCTION %I.agg_%s(%s[], %s) RETURNS %s[]', sch, n, t, t, t) ||
				format(body, format('array_agg(%s)', t));
			EXECUTE format('CREATE AGGREGATE %I.array_agg(%s) (SFUNC = %I.agg_%s, STYPE = %s[])', sch, t, sch, n, t);
		END IF;
		IF to_regprocedure(format('pg_catalog.count(%s)', t)) IS NULL THEN
			EXECUTE format('CREATE FUNCTION %I.cnt_%s(bigint, %s) RETURNS bigint', sch, n, t) ||
				format(body, format('count(%s)', t));
			EXECUTE format('CREATE AGGREGATE %I.count(%s) (SFUNC = %I.cnt_%s, STYPE = bigint, INITCOND = ''0'')', sch, t, sch, n);
		END IF;
	END LOOP;
END
$do$`

// The store's functions name PostgreSQL's functions, operators and types
// without their schema, as do its plain statements and the checks of New
// and of the schema's SQL. A session finds them along its search_path,
// pg_catalog first unless the path lists it after another schema; but
// even so, an object of another schema of the path that takes the
// arguments' types exactly is chosen over pg_catalog's that needs a cast
// (float8 < integer, integer || text) or is polymorphic (unnest(anyarray),
// array_agg(anynonarray), count("any")). A role that may create objects in
// such a schema could so run its own code as the store's user, at every
// call: the functions' bodies, the lone upsert, the batch upsert, and New's
// checks, which the schema's SQL runs too (as the role that installs it)
// were all taken over. Now the functions, New and the schema's SQL run
// under the search_path pg_catalog, pg_temp, and the plain statements name
// the functions they call with pg_catalog and give each operator operands
// of one type, which pg_catalog's takes exactly.
func TestBuiltinsShadowedAlongSearchPath(t *testing.T) {
	ctx := context.Background()
	def := newPool(t, testserver.PostgresURL(t), nil)
	home := testSchema(t, def)
	role, other := otherRole(t, def)
	asRole(t, def, role, shadowsSQL)
	// pg_catalog, not listed, is searched first.
	pool := pathPool(t, pgx.Identifier{other}.Sanitize()+", "+pgx.Identifier{home}.Sanitize(), nil)
	_, err := pool.Exec(ctx, "SELECT 1.5::float8 < 2")
	require.ErrorContains(t, err, "shadowed: an operator on (double precision, integer) ran as postgres", "the shadows are there")

	name := fmt.Sprintf("ratelimit_test_%d", time.Now().UnixNano())
	table := home + "." + name
	_, err = pgstore.New(ctx, def, pgstore.WithTable(table)) // installed on a clean path
	require.NoError(t, err)
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithoutDDL(), pgstore.WithMaxBatch(1))
	require.NoError(t, err, "New reads the schema")
	serverTime, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithoutDDL(), pgstore.WithServerTime())
	require.NoError(t, err)

	bucket := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 3_600_000, Capacity: 10}
	op := func(mode driver.Mode, key string, count float64, shards ...int) *driver.Op {
		it := driver.Item{Name: "l", Key: key, Count: count, At: t0.UnixMilli()}
		for _, sh := range shards {
			it.Shards = append(it.Shards, driver.Shard{Index: sh, Params: bucket})
		}
		return &driver.Op{Mode: mode, Now: t0.UnixMilli(), Items: []driver.Item{it}}
	}
	apply := func(s *pgstore.Store, ctx context.Context, op *driver.Op, what string) driver.Decision {
		t.Helper()
		out := make([]driver.Decision, 1)
		require.NoError(t, s.Apply(ctx, op, out), what)
		return out[0]
	}
	batch := func(what string, ops ...*driver.Op) []driver.Decision {
		t.Helper()
		outs := make([][]driver.Decision, len(ops))
		for i := range outs {
			outs[i] = make([]driver.Decision, 1)
		}
		require.NoError(t, s.ApplyBatch(ctx, ops, outs), what)
		got := make([]driver.Decision, len(ops))
		for i, o := range outs {
			got[i] = o[0]
		}
		return got
	}
	deadline, cancel := context.WithTimeout(ctx, time.Minute) // the statements that bound their lock wait
	defer cancel()

	// Lone calls: the fresh upsert, the full one, a read (a check, a
	// refusal), each with and without a bound on its lock wait; and _one.
	for _, c := range []context.Context{ctx, deadline} {
		key := fmt.Sprint("lone-", c == deadline)
		require.Equal(t, 7.0, apply(s, c, op(driver.ModeLimit, key, 3, 0), "the fresh upsert").Remaining)
		require.Equal(t, 5.0, apply(s, c, op(driver.ModeLimit, key, 2, 0), "the lone upsert").Remaining)
		require.True(t, apply(s, c, op(driver.ModeCheck, key, 5, 0), "the read").OK)
		require.False(t, apply(s, c, op(driver.ModeLimit, key, 6, 0), "the lone upsert").OK)
		require.Equal(t, 6.0, apply(serverTime, c, op(driver.ModeLimit, "server-"+key, 4, 0), "_one").Remaining)
	}
	// The batch upsert, and _apply with _split and _pwait: a call refused
	// on both shards, a refund.
	got := batch("the batch upsert", op(driver.ModeLimit, "a", 4, 0), op(driver.ModeLimit, "b", 4, 0))
	require.Equal(t, []float64{6, 6}, []float64{got[0].Remaining, got[1].Remaining})
	got = batch("_apply", op(driver.ModeLimit, "pair", 25, 0, 1), op(driver.ModeLimit, "pair", 15, 0, 1), op(driver.ModeRefund, "a", 2, 0))
	require.False(t, got[0].OK)
	require.Positive(t, got[0].RetryAfter)
	require.True(t, got[1].OK)
	require.Equal(t, 8.0, got[2].Remaining)
	_, err = serverTime.Now(ctx)
	require.NoError(t, err, "the server's time")

	recs := make([]driver.Record, 2)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: "a"}, {Name: "l", Key: "b"}}, recs), "_read")
	require.Equal(t, []float64{8, 6}, []float64{recs[0].State.Remaining, recs[1].State.Remaining})
	require.NoError(t, s.Delete(ctx, []driver.RecordID{{Name: "l", Key: "a"}}), "_del")
	n, err := s.DeleteExpired(ctx, time.Now().Add(1000*time.Hour)) // past every record's
	require.NoError(t, err, "_sweep")
	require.Positive(t, n)

	// Installs on the shadowed path: New's, of a schema marked as another
	// build's, and the SQL of Schema; then New resolving a name without
	// its schema there.
	_, err = def.Exec(ctx, "COMMENT ON TABLE "+pgx.Identifier{home, name}.Sanitize()+" IS 'ratelimit pgstore schema 2 000000000000'")
	require.NoError(t, err)
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(table))
	require.NoError(t, err, "New installs")
	sql, err := pgstore.Schema(table)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, sql)
	require.NoError(t, err, "the SQL of Schema")
	_, err = pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithoutDDL())
	require.NoError(t, err, "New resolves the name")
}

// A search_path that lists pg_catalog after another schema finds an
// object of that schema first even where pg_catalog's takes the same
// arguments: an operator float8 - float8 made there took the place of
// PostgreSQL's in the functions' bodies, and a call that no bucket could
// grant was granted. The functions run under their own search_path now.
// (The plain statements of a lone call at the Limiter's clock, and of the
// batch upsert, run under the connection's, and name every operator and
// type with pg_catalog: TestOperatorsOfASchemaBeforePgCatalog.)
func TestBuiltinsShadowedBeforePgCatalog(t *testing.T) {
	ctx := context.Background()
	def := newPool(t, testserver.PostgresURL(t), nil)
	home := testSchema(t, def)
	role, other := otherRole(t, def)
	// a - b is a: a call takes nothing, and is granted whatever it asks.
	asRole(t, def, role, "CREATE FUNCTION "+other+".minus(float8, float8) RETURNS float8 LANGUAGE sql IMMUTABLE AS 'SELECT $1'; "+
		"CREATE OPERATOR "+other+".- (LEFTARG = float8, RIGHTARG = float8, FUNCTION = "+other+".minus)")
	pool := pathPool(t, pgx.Identifier{other}.Sanitize()+", pg_catalog, "+pgx.Identifier{home}.Sanitize(), nil)
	var v float64
	require.NoError(t, pool.QueryRow(ctx, "SELECT 10::float8 - 25::float8").Scan(&v))
	require.Equal(t, 10.0, v, "the shadow is there")

	name := fmt.Sprintf("ratelimit_test_%d", time.Now().UnixNano())
	_, err := pgstore.New(ctx, def, pgstore.WithTable(home+"."+name))
	require.NoError(t, err)
	// New resolves the name along the shadowed path, and installs there.
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(name), pgstore.WithServerTime())
	require.NoError(t, err)
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, &driver.Op{Items: []driver.Item{hourlyItem("lone", 25, 0)}}, out)) // _one
	require.False(t, out[0].OK, "25 tokens of a bucket of 10")
	require.NoError(t, s.Apply(ctx, &driver.Op{Items: []driver.Item{hourlyItem("lone", 3, 0)}}, out))
	require.True(t, out[0].OK)
	require.Equal(t, 7.0, out[0].Remaining)
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{ // _apply
		{Items: []driver.Item{hourlyItem("pair", 25, 0, 1)}},
		{Items: []driver.Item{hourlyItem("lone", 4, 0)}},
	}, outs))
	require.False(t, outs[0][0].OK, "25 tokens of two shards of 10")
	require.True(t, outs[1][0].OK)
	require.InDelta(t, 3, outs[1][0].Remaining, 1e-2) // refilled a little at the server's clock
	recs := make([]driver.Record, 1)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: "lone"}}, recs))
	require.InDelta(t, 3, recs[0].State.Remaining, 1e-2)
}

// A role that may create objects in the store's schema could make, after
// New, functions of the names of _apply and _one that take text: the
// store's calls of them passed their arguments untyped, and PostgreSQL
// takes text, where it can, for an argument of unknown type, so that the
// store's statements named those (and failed: pgx cannot send a number as
// text). New refuses such functions, made before it
// (ErrNotStoreFunction). The calls type their arguments now.
func TestOverloadsOfTheStoresFunctions(t *testing.T) {
	ctx := context.Background()
	def := newPool(t, testserver.PostgresURL(t), nil)
	home := testSchema(t, def)
	role, _ := otherRole(t, def)
	_, err := def.Exec(ctx, "GRANT USAGE, CREATE ON SCHEMA "+pgx.Identifier{home}.Sanitize()+" TO "+role)
	require.NoError(t, err)
	name := fmt.Sprintf("ratelimit_test_%d", time.Now().UnixNano())
	s, err := pgstore.New(ctx, def, pgstore.WithTable(home+"."+name))
	require.NoError(t, err)
	serverTime, err := pgstore.New(ctx, def, pgstore.WithTable(home+"."+name), pgstore.WithServerTime())
	require.NoError(t, err)

	texts := func(n int) string { return strings.Repeat("text, ", n) }
	body := " LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'shadowed: %', current_user; END$$; "
	asRole(t, def, role,
		"CREATE FUNCTION "+pgx.Identifier{home, name + "_apply"}.Sanitize()+"("+texts(13)+
			"OUT ok boolean[], OUT retry bigint[], OUT num float8[], OUT fresh boolean)"+body+
			"CREATE FUNCTION "+pgx.Identifier{home, name + "_one"}.Sanitize()+"("+texts(14)+
			"OUT ok boolean, OUT retry bigint, OUT remaining float8, OUT charged float8, OUT at bigint, OUT ts bigint)"+body)

	out := make([]driver.Decision, 1)
	require.NoError(t, serverTime.Apply(ctx, &driver.Op{Items: []driver.Item{hourlyItem("k", 3, 0)}}, out), "_one")
	require.Equal(t, 7.0, out[0].Remaining)
	outs := [][]driver.Decision{make([]driver.Decision, 1)}
	require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{{Now: t0.UnixMilli(), Items: []driver.Item{hourlyItem("pair", 4, 0, 1)}}}, outs), "_apply")
	require.True(t, outs[0][0].OK)
}

// hourlyItem is an item of limit "l", a token bucket of 10 an hour, of
// key and count, on the shards given.
func hourlyItem(key string, count float64, shards ...int) driver.Item {
	bucket := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 3_600_000, Capacity: 10}
	it := driver.Item{Name: "l", Key: key, Count: count}
	for _, sh := range shards {
		it.Shards = append(it.Shards, driver.Shard{Index: sh, Params: bucket})
	}
	return it
}

// The SQL of Schema for a table name without its schema runs under the
// session's search_path, which resolves the name: its checks of the
// catalog, and its statements that drop earlier builds' functions and
// version 1's index, named PostgreSQL's functions and operators without
// their schema, and ran, as the role that installs the schema, an operator
// oid = regclass that another role made in a later schema of the path
// (pg_catalog's needs a cast). They name them with pg_catalog now.
func TestSchemaWithoutASchemaOnAShadowedPath(t *testing.T) {
	ctx := context.Background()
	def := newPool(t, testserver.PostgresURL(t), nil)
	home := testSchema(t, def)
	role, other := otherRole(t, def)
	asRole(t, def, role, shadowsSQL)
	pool := pathPool(t, pgx.Identifier{home}.Sanitize()+", "+pgx.Identifier{other}.Sanitize(), nil)

	name := fmt.Sprintf("ratelimit_test_%d", time.Now().UnixNano())
	sql, err := pgstore.Schema(name)
	require.NoError(t, err)
	install := func(what string) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sql)
			return err
		}), what)
	}
	install("a fresh install")
	// Again over another build's mark, with version 1's index made again.
	_, err = def.Exec(ctx, "COMMENT ON TABLE "+pgx.Identifier{home, name}.Sanitize()+" IS 'ratelimit pgstore schema 2 000000000000'; "+
		"CREATE INDEX "+pgx.Identifier{name + "_expires_idx"}.Sanitize()+" ON "+pgx.Identifier{home, name}.Sanitize()+" (expires)")
	require.NoError(t, err)
	install("an upgrade")
	var n int
	require.NoError(t, def.QueryRow(ctx, "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = $2", home, name+"_expires_idx").Scan(&n))
	require.Zero(t, n, "version 1's index is dropped")

	_, err = pgstore.New(ctx, pool, pgstore.WithTable(home+"."+name), pgstore.WithoutDDL())
	require.ErrorIs(t, err, pgstore.ErrSchema, "its functions name the table without its schema")
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(name))
	require.NoError(t, err)
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, &driver.Op{Now: t0.UnixMilli(), Items: []driver.Item{hourlyItem("k", 3, 0)}}, out))
	require.Equal(t, 7.0, out[0].Remaining)
}
