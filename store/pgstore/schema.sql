-- The schema of pgstore (github.com/ratelimit-go/ratelimit/store/pgstore),
-- version 2: the table of records, a function that decides a batch of ops
-- over them in one statement, one that decides a single op, and those that
-- read, delete and sweep records. The script is idempotent and upgrades a
-- table of version 1. pgstore.New runs it unless given WithoutDDL;
-- `ratelimit schema` prints it.
--
-- The arithmetic follows state.go operation for operation (multiply
-- before dividing, left to right, every step rounded to float8), so that
-- the functions give the Go functions' results to the last bit; the
-- differential tests of store/storetest check that they do. Its constants
-- (the noise, the retry bound, the kind and mode codes, the pair's tries)
-- are package driver's, written in by pgstore (names.schema) so that the
-- port cannot drift from Go. state.go's wait, until a call of cnt that may
-- leave a debt of allow is granted on a record stored as (bv, bts), whose
-- state at now is (v, ts), is written once, as a placeholder target :=
-- wait(kind, period, rate, capacity, bv, bts, v, ts, cnt, allow) in double
-- braces, which pgstore writes out as the statements that compute it where
-- it stands (with the function's variables wj, wk and noise).
--
-- The functions are named after the table, with a suffix; these comments
-- call them by their suffix (_apply, _one, ...), and pgstore writes the
-- names into the SQL only as quoted identifiers and string literals, never
-- into a comment, which a line break in a name would end.

-- What PostgreSQL provides (functions, operators, types) is named here
-- without its schema, as in any query, and a session finds it along its
-- search_path: pg_catalog first unless search_path lists it after another
-- schema, and even then an object of another schema where it takes the
-- arguments' types exactly and pg_catalog's does not (a polymorphic
-- function such as unnest(anyarray), an operator of operands of two
-- types, float8 < integer). A role that may create objects in a schema of
-- the path could so run its own code as the session's user, or change a
-- decision. So the functions run with the search_path pg_catalog,
-- pg_temp (pg_temp, listed last, comes after pg_catalog for relations and
-- types too; the store's own table and functions are named with their
-- schema; a trigger on the table that they fire runs under it too), and
-- so does the rest of the script, from its first statement, until the
-- end of its transaction. All but _split, which names nothing
-- of the store's and is called by _apply and _pwait alone: it runs
-- under their search_path, as a setting of its own would cost each of its
-- many calls. For a table named without its schema, the script runs under
-- the session's search_path, and the functions, whose bodies name the
-- table and each other without their schema too, are set at the end to
-- pg_catalog, the schema they are made in, and pg_temp. (_pwait has a
-- setting of its own for that: should it run the body of the other name,
-- installed while _apply runs, it finds _split all the same.)
{{pin_script}}

-- The script runs under the advisory lock that pgstore.New takes to
-- install it, so that installs do not race on the DDL: two processes that
-- start together, or a migration beside them. It is held to the end of the
-- transaction: apply the script in one (psql --single-transaction, as
-- migration tools apply a migration). The statement records, in a setting
-- of the transaction's own, which transaction took it (pgstore.go's
-- lockTaken), for the checks below (lockHeld), and starts the count of the
-- statements that ran (stepZero).
--
-- Every statement after this one is a block that first checks that the
-- one before it ran to its end in this transaction, and counts itself,
-- in a setting of the transaction's own: a placeholder step in double
-- braces, which pgstore numbers and writes out (pgstore.go's stepCheck).
-- It reads the count only in the transaction that took the lock
-- (lockHeld): a session may hold a value of the setting of its own.
-- A statement that fails leaves the count as it was, even where the
-- client goes on after it in the same transaction: psql's
-- ON_ERROR_ROLLBACK without ON_ERROR_STOP runs each statement under a
-- savepoint and rolls back to it, which undoes its set_config too, and
-- a tool may do the same. Then every statement after it fails (SQLSTATE
-- RLSTP) and changes nothing: no function is replaced past a check that
-- refused it, and the table is not marked as installed. So the table and
-- the functions are made in blocks too, at the start of a line, as the
-- statements they are.
SELECT pg_catalog.pg_advisory_xact_lock({{lock}}), {{lock_taken}}, {{step_zero}};

-- Run outside one transaction (psql without --single-transaction, a tool
-- that sends it statement by statement), each statement would commit on
-- its own: the lock above would be gone already, the table's lock and its
-- bound below would end with their statement, and a statement that failed
-- halfway would leave the rest to run, and the table to be marked as
-- installed over what it did not install. So the script stops here
-- unless this statement's transaction took the lock above: it warns
-- (SQLSTATE RLTXN), saying to run it in one transaction, and ends its own
-- session (pg_terminate_backend, SQLSTATE 57P01), so that no statement
-- after this one runs on it, and no setting of its outlives it in a
-- pool's connection. Should the session not end, it fails (RLTXN): so
-- too where the role may not end it (42501, which it catches: a
-- superuser's session after SET ROLE to the schema's owner). That
-- the session holds the lock is not enough: one that holds it at session
-- level (pg_advisory_lock, which a client of a pooler may have taken on
-- the pooler's session and left) would still run the statements a
-- transaction each.
DO {{q}}
BEGIN
	IF NOT {{lock_held}} THEN
		RAISE WARNING USING ERRCODE = 'RLTXN',
			MESSAGE = 'the schema script of a ratelimit store must run in one transaction, and it runs a transaction per statement: '
				'it stopped here, and changed nothing; it ends this session, so that the statements after this one change nothing either',
			HINT = 'apply it in one transaction: psql --single-transaction (-1) -v ON_ERROR_STOP=1, or as migration tools apply a migration';
		BEGIN
			PERFORM pg_catalog.pg_terminate_backend(pg_catalog.pg_backend_pid());
			PERFORM pg_catalog.pg_sleep(10);
		EXCEPTION WHEN insufficient_privilege THEN
			NULL; -- a role that may not end the session: fail below
		END;
		RAISE EXCEPTION USING ERRCODE = 'RLTXN',
			MESSAGE = 'the schema script of a ratelimit store must run in one transaction, and it runs a transaction per statement: '
				'it stopped here, and changed nothing, but could not end this session: the statements after this one would run without its lock',
			HINT = 'apply it in one transaction: psql --single-transaction (-1) -v ON_ERROR_STOP=1, or as migration tools apply a migration';
	END IF;
	{{step}}
END
{{q}};

-- A table name without a schema is the table of that name in
-- current_schema(), where CREATE TABLE makes it, and the functions are
-- made there too. A name that finds a relation in another schema along
-- search_path (a later schema of the path, a temporary table), or a
-- search_path of which no schema exists, is refused first (SQLSTATE
-- RLSCH): the script would check one relation and make another. The
-- expression that place is set to says why (pgstore.go's pathCheck); for
-- a name with a schema, it is NULL. pgstore.New names the schema always.
--
-- Then a relation of the table's name that is not a table of this store, of
-- any version (a table of the application's with other columns, a view),
-- is refused, and left as it is: the script neither takes it over
-- nor changes it. The expression that why is set to says what keeps it
-- from being one (pgstore.go's tableCheck, written in by pgstore): the
-- columns below, with id the primary key.
--
-- Then a function that bears the name of one of the store's (the table's
-- name and a suffix, whatever its arguments) and is not the store's is
-- refused, and left as it is: the script would replace it, or make the
-- store's beside it. The expression that fns is set to names such
-- functions (pgstore.go's funcCheck): a function is the store's when its
-- comment is the mark that this script writes at the end on each of its
-- functions, or, for those of earlier releases, which have no mark, when
-- it is PL/pgSQL, has the arguments of one of theirs, and either is
-- version 1's _apply or was made with the version 2 mark of the table
-- and reads that table.
DO {{q}}
DECLARE
	place text := {{path_check}};
	why text;
	fns text;
BEGIN
	{{step}}
	IF place IS NOT NULL THEN
		RAISE EXCEPTION USING ERRCODE = 'RLSCH', DETAIL = place,
			MESSAGE = pg_catalog.format('table %s: %s', {{table_literal}}, place),
			HINT = 'name the table''s schema (pgstore.WithTable("schema.table"), ratelimit schema --table schema.table)';
	END IF;
	why := {{table_check}};
	IF why IS NOT NULL THEN
		RAISE EXCEPTION USING ERRCODE = 'RLTBL', DETAIL = why,
			MESSAGE = pg_catalog.format('%s exists and is not the table of a ratelimit store: it %s', {{table_literal}}, why),
			HINT = 'give the store a table of its own (pgstore.WithTable, ratelimit schema --table), or drop or rename that relation if nothing needs it';
	END IF;
	fns := {{function_check}};
	IF fns IS NOT NULL THEN
		RAISE EXCEPTION USING ERRCODE = 'RLFUN', DETAIL = fns,
			MESSAGE = pg_catalog.format('%s: not a ratelimit store''s, yet named as the store of table %s names its functions', fns, {{table_literal}}),
			HINT = 'give the store a table of another name (pgstore.WithTable, ratelimit schema --table), or drop or rename those functions if nothing needs them';
	END IF;
END
{{q}};

-- Changing the table below (its fillfactor, its comment) takes its SHARE
-- UPDATE EXCLUSIVE lock, which a transaction that holds the table in that
-- mode or a stronger one keeps from it: a VACUUM, an ANALYZE, a CREATE
-- INDEX, another migration's ALTER TABLE, a LOCK TABLE. The store's calls,
-- and transactions that only read or write the table, do not conflict with
-- it, nor queue behind the wait; but the script, which holds the install
-- lock, waited for as long as that transaction lasted, and so did every
-- pgstore.New that had a schema to install. So it takes the table's lock
-- here, once, waiting at most {{install_wait}} ms (the session's
-- lock_timeout, if it sets one), longer than the deadlock_timeout after
-- which PostgreSQL cancels an autovacuum that stands in the way; then it
-- fails (SQLSTATE 55P03), naming the sessions that hold the table, and
-- those that asked for it first and wait (a migration's ALTER TABLE behind
-- a long report that reads the table), ahead of which the install cannot
-- take it, with the sessions they wait for. The session's lock_timeout is
-- as it was for the rest of the transaction.
DO {{q}}
DECLARE
	was text := pg_catalog.current_setting('lock_timeout');
	holders text;
	queued text;
BEGIN
	{{step}}
	IF pg_catalog.to_regclass({{table_literal}}) IS NULL THEN
		RETURN;
	END IF;
	IF was OPERATOR(pg_catalog.=) '0' THEN
		PERFORM pg_catalog.set_config('lock_timeout', '{{install_wait}}ms', true);
	END IF;
	BEGIN
		LOCK TABLE {{table}} IN SHARE UPDATE EXCLUSIVE MODE;
	EXCEPTION WHEN lock_not_available THEN
		-- A request that waits, in a mode that conflicts with the
		-- install's, keeps it waiting too: PostgreSQL grants the table in
		-- the order asked, a request behind one it conflicts with waits.
		SELECT pg_catalog.string_agg(pg_catalog.format('pid %s (%s)', l.pid, l.mode), ', ' ORDER BY l.pid) FILTER (WHERE l.granted),
			pg_catalog.string_agg(pg_catalog.format('pid %s (%s, waiting%s)', l.pid, l.mode,
				(SELECT pg_catalog.format(' for pid %s', pg_catalog.string_agg(b.pid::pg_catalog.text, ', pid ' ORDER BY b.pid))
					FROM pg_catalog.unnest(pg_catalog.pg_blocking_pids(l.pid)) b (pid)
					HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 0)), ', ' ORDER BY l.pid) FILTER (WHERE NOT l.granted)
			INTO holders, queued
			FROM pg_catalog.pg_locks l
			WHERE l.locktype OPERATOR(pg_catalog.=) 'relation'
			AND l.relation OPERATOR(pg_catalog.=) pg_catalog.to_regclass({{table_literal}})::pg_catalog.oid
			AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
			AND l.mode::pg_catalog.text OPERATOR(pg_catalog.=) ANY (ARRAY['ShareUpdateExclusiveLock', 'ShareLock',
				'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock']::pg_catalog.text[]);
		IF holders IS NULL AND queued IS NULL THEN
			holders := 'a transaction that has ended since';
		END IF;
		RAISE EXCEPTION USING ERRCODE = 'lock_not_available',
			MESSAGE = pg_catalog.format('table %s: another transaction held it for more than %s (lock_timeout), '
				'in a mode that keeps the store''s schema from being installed', {{table_literal}}, pg_catalog.current_setting('lock_timeout')),
			DETAIL = pg_catalog.concat_ws('; ', 'held by ' OPERATOR(pg_catalog.||) holders,
				'asked for first by ' OPERATOR(pg_catalog.||) queued),
			HINT = 'a VACUUM, ANALYZE, CREATE INDEX or migration, most likely (pg_stat_activity shows what those sessions run): '
				'install again once it has ended, or end it (pg_cancel_backend)';
	END;
	PERFORM pg_catalog.set_config('lock_timeout', was, true);
END
{{q}};

DO {{q}}
BEGIN
	{{step}}
CREATE TABLE IF NOT EXISTS {{table}} (
	id      bytea PRIMARY KEY, -- SHA-256 of the record's (name, key, shard)
	name    bytea NOT NULL,
	key     bytea NOT NULL,
	shard   integer NOT NULL,
	value   double precision,  -- NULL: a placeholder, which reads as missing
	ts      bigint,
	expires bigint NOT NULL    -- Unix ms from which the bucket is full again
) WITH (fillfactor = 70);

ALTER TABLE {{table}} SET (fillfactor = 70);
END
{{q}};

-- _split is state.go's split: the values two refreshed shards (a, b)
-- would hold after a call of cnt, the tokens charged to each, and whether
-- the call is OK. Each shard's limit is kind, rate, period, capacity, max
-- reserved.
DO {{qd}}
BEGIN
	{{step}}
CREATE OR REPLACE FUNCTION {{split}}(
	ka bigint, rta float8, pa bigint, ca float8, ma float8,
	kb bigint, rtb float8, pb bigint, cb float8, mb float8,
	sva float8, sta bigint, svb float8, stb bigint, now bigint, cnt float8, reserve boolean,
	OUT na float8, OUT nb float8, OUT c0 float8, OUT c1 float8, OUT ok boolean
) LANGUAGE plpgsql IMMUTABLE
AS {{q}}
DECLARE
	noise CONSTANT float8 := {{noise}};
	va float8; vb float8; x float8; wa float8; wb float8; wj float8; wk float8;
BEGIN
	va := sva - cnt;
	IF va < 0 AND va > -noise THEN va := 0; END IF;
	vb := svb - cnt;
	IF vb < 0 AND vb > -noise THEN vb := 0; END IF;
	IF va >= 0 OR vb >= 0 THEN
		IF va >= vb THEN
			na := va; nb := svb; c0 := cnt; c1 := 0;
		ELSE
			na := sva; nb := vb; c0 := 0; c1 := cnt;
		END IF;
		ok := true;
		RETURN;
	END IF;
	-- Neither alone: both down to one level x, or the other alone.
	na := sva; nb := svb;
	x := (sva + svb - cnt) / 2;
	IF x < 0 AND x > -noise THEN x := 0; END IF;
	IF x <= sva AND x <= svb THEN
		na := x; nb := x;
	ELSIF sva >= svb THEN
		na := va;
	ELSE
		nb := vb;
	END IF;
	IF na >= 0 AND nb >= 0 THEN
		c0 := sva - na; c1 := svb - nb; ok := true;
		RETURN;
	END IF;
	c0 := 0; c1 := 0; ok := false;
	IF NOT reserve THEN
		RETURN;
	END IF;
	-- A reservation's debt on one shard, the one whose debt is granted first.
	IF ma = 0 OR va + ma > -noise THEN
		IF NOT (mb = 0 OR vb + mb > -noise) THEN
			na := va; nb := svb; c0 := cnt; ok := true;
			RETURN;
		END IF;
		{{wa := wait(ka, pa, rta, ca, va, sta, va, sta, 0, 0)}}
		{{wb := wait(kb, pb, rtb, cb, vb, stb, vb, stb, 0, 0)}}
		IF wa <= wb THEN
			na := va; nb := svb; c0 := cnt; ok := true;
			RETURN;
		END IF;
	END IF;
	IF mb = 0 OR vb + mb > -noise THEN
		na := sva; nb := vb; c1 := cnt; ok := true;
		RETURN;
	END IF;
	-- Only a count no shard could owe alone is spread as debt over both.
	IF (cnt > ca + ma OR cnt > cb + mb) AND (ma = 0 OR na + ma > -noise) AND (mb = 0 OR nb + mb > -noise) THEN
		c0 := sva - na; c1 := svb - nb; ok := true;
	END IF;
END
{{q}};
END
{{qd}};

-- _pwait is state.go's pairWait (with sumWait and searchBack): the least
-- wait, in ms, after which a call refused on two shards would succeed on
-- them. The shards come as their limit, phase and record as stored (found,
-- value, ts), then refreshed to now (value, ts). Each call of okat(t) is
-- written out, by pgstore.go's okAt, as the statements that set ok to
-- whether split grants the call at t.
DO {{qd}}
BEGIN
	{{step}}
CREATE OR REPLACE FUNCTION {{pwait}}(
	ka bigint, rta float8, pa bigint, ca float8, ma float8, pha bigint, fa boolean, va0 float8, ta0 bigint,
	kb bigint, rtb float8, pb bigint, cb float8, mb float8, phb bigint, fb boolean, vb0 float8, tb0 bigint,
	sva float8, sta bigint, svb float8, stb bigint, now bigint, cnt float8, reserve boolean
) RETURNS float8 LANGUAGE plpgsql IMMUTABLE
{{pin}}
AS {{q}}
DECLARE
	noise    CONSTANT float8 := {{noise}};
	maxretry CONSTANT float8 := {{max_retry}};
	tries    CONSTANT integer := {{pair_tries}};
	best float8 := maxretry;
	est float8; need float8; t bigint; e integer; i integer; ok boolean;
	s integer; kk bigint[]; rt float8[]; pp bigint[]; cc float8[]; ph bigint[];
	fnd boolean[]; v0 float8[]; t0 bigint[]; lv float8[]; lt bigint[];
	k bigint; off bigint; short float8; r float8; f1 bigint; f2 bigint; first bigint; second bigint;
	j float8; x float8; y float8; at float8; fulla float8; fullb float8;
	al float8; wj float8; wk float8;
	known boolean := false; -- whether the call succeeds at now + best
	lo bigint; hi bigint; d bigint;
BEGIN
	kk := ARRAY[ka, kb]; rt := ARRAY[rta, rtb]; pp := ARRAY[pa, pb]; cc := ARRAY[ca, cb]; ph := ARRAY[pha, phb];
	fnd := ARRAY[fa, fb]; v0 := ARRAY[va0, vb0]; t0 := ARRAY[ta0, tb0];
	lv := ARRAY[0, 0]::float8[]; lt := ARRAY[0, 0]::bigint[];
	FOR e IN 1 .. 3 LOOP
		-- The estimates: shard a alone, shard b alone, both together.
		est := NULL;
		IF e < 3 THEN
			al := 0;
			IF reserve THEN al := CASE e WHEN 1 THEN ma ELSE mb END; END IF;
			IF (cc[e] - cnt) + al > -noise THEN -- it grants the call when full
				x := CASE e WHEN 1 THEN sva ELSE svb END;
				y := CASE e WHEN 1 THEN sta ELSE stb END;
				IF fnd[e] THEN
					{{est := wait(kk[e], pp[e], rt[e], cc[e], v0[e], t0[e], x, y::bigint, cnt, al)}}
				ELSE
					{{est := wait(kk[e], pp[e], rt[e], cc[e], x, y::bigint, x, y::bigint, cnt, al)}}
				END IF;
			END IF;
		ELSE
			need := cnt;
			IF reserve AND (cnt > ca + ma OR cnt > cb + mb) THEN need := need - 2 * least(ma, mb); END IF;
			IF need <= ca + cb THEN
				short := need - sva - svb;
				IF short <= 0 THEN
					est := 0;
				ELSIF ka = {{fixed}} THEN
					r := greatest(rta, rtb);
					f1 := sta + pa; f2 := stb + pb;
					first := f1; second := f2;
					IF f2 < f1 THEN first := f2; second := f1; END IF;
					j := greatest(ceil(short / r - noise), 1);
					at := second::float8 + pa::float8 * (j / 2 - 1);
					IF j - 2 * floor(j / 2) = 1 THEN at := first::float8 + pa::float8 * ((j - 1) / 2); END IF;
					x := ceil(j / 2); y := floor(j / 2);
					IF f2 < f1 THEN x := floor(j / 2); y := ceil(j / 2); END IF;
					IF sva + rta * x > ca THEN
						x := ceil((need - ca - svb) / rtb - noise);
						IF x >= 1 THEN at := greatest(at, f2::float8 + pb::float8 * (x - 1)); END IF;
					ELSIF svb + rtb * y > cb THEN
						x := ceil((need - cb - sva) / rta - noise);
						IF x >= 1 THEN at := greatest(at, f1::float8 + pa::float8 * (x - 1)); END IF;
					END IF;
					est := at - now::float8;
				ELSE
					at := (greatest(sta, stb) - now)::float8 + short * pa::float8 / (rta + rtb);
					fulla := (sta - now)::float8 + (ca - sva) * pa::float8 / rta;
					fullb := (stb - now)::float8 + (cb - svb) * pb::float8 / rtb;
					IF fulla < at THEN
						at := greatest(at, (stb - now)::float8 + (need - ca - svb) * pb::float8 / rtb);
					ELSIF fullb < at THEN
						at := greatest(at, (sta - now)::float8 + (need - cb - sva) * pa::float8 / rta);
					END IF;
					est := greatest(floor(at), 0);
				END IF;
			END IF;
		END IF;
		CONTINUE WHEN est IS NULL OR NOT (est < best);
		-- Try the candidate times from the estimate on.
		t := now + ceil(est)::bigint;
		FOR i IN 1 .. tries LOOP
			EXIT WHEN NOT ((t - now)::float8 < best);
			{{ok := okat(t)}}
			IF ok THEN
				best := (t - now)::float8;
				known := true;
				EXIT;
			END IF;
			-- The next time a shard gains tokens.
			IF ka = {{fixed}} THEN
				off := (t - pha) % pa;
				IF off < 0 THEN off := off + pa; END IF;
				k := t - off + pa;
				off := (t - phb) % pb;
				IF off < 0 THEN off := off + pb; END IF;
				t := least(k, t - off + pb);
			ELSE
				t := t + 1;
			END IF;
		END LOOP;
	END LOOP;
	-- searchBack: the first ms in (now, now + best] at which the call
	-- succeeds, stepping back doubling from now + best (from a time
	-- found), then halving. None found, best is maxretry: the whole range
	-- to it is bisected, should the call succeed by then.
	d := 1;
	IF NOT known THEN
		t := now + maxretry::bigint;
		{{ok := okat(t)}}
		known := ok; d := 0;
	END IF;
	IF known THEN
		lo := now; hi := now + best::bigint;
		WHILE hi - lo > 1 LOOP
			t := hi - d;
			IF d = 0 OR t <= lo THEN
				d := 0; t := lo + (hi - lo) / 2;
			END IF;
			{{ok := okat(t)}}
			IF ok THEN
				hi := t; d := d * 2;
			ELSE
				lo := t; d := 0;
			END IF;
		END LOOP;
		best := (hi - now)::float8;
	END IF;
	RETURN best;
END
{{q}};
END
{{qd}};

-- _apply decides a batch of ops, one after another, in arrival order,
-- exactly as that many calls deciding one op each would.
--
-- Ops, items, records and limits arrive as flat arrays:
--   p_ops     3 per op: flags (mode: 0 limit, 1 check, 2 refund; +4 reserve;
--             +8 the server's clock), the time in Unix ms, its item count
--   p_counts  2 per item: the tokens asked, and for a refund the time (Unix
--             ms) they were charged
--   p_refs    4 per item: record and limit of its first shard, record and
--             limit of its second (0, 0: none); 1-based
--   p_id, p_name, p_key, p_shard
--             1 per record, each record once: its primary key, name, key and
--             shard; first the p_nlock records that an op may write (a limit
--             or a refund), in ascending order of id, then those only checked
--   p_pint    3 per limit: kind (1 fixed window, 2 token bucket), period, phase
--   p_pflt    3 per limit: rate, capacity, max reserved
--   p_wait    how long, in ms, the caller waits for the answer (0: no
--             bound): the longest the function waits for a lock, so that
--             it gives up, and releases its locks, soon after its caller
--   p_fresh   whether records are likely missing (the last batch found
--             some): then lock them with the insert at once
--   p_marks   3 per op: for a refund that settles (driver.Settlement), the
--             record of its mark (1-based, among those it may write), the
--             settlement's kind (1 cancel, 2 use) and the time until which
--             the mark is kept (less the grace); 0, 0, 0 otherwise. A mark
--             is a row of the table whose id is the settlement's 16 bytes
--             (no record's, a SHA-256, is that short), value its kind, ts
--             and expires its time, key its settler (16 bytes; empty for
--             none, as releases that kept no settler write every mark):
--             DeleteExpired drops it as a record. The mark's p_key is the
--             settler of the ops of the call that settle its ID, which
--             pgstore sends in one call only if they share it. An op
--             that finds its mark does nothing; one that finds a value
--             other than 1 or 2 there fails the call (SQLSTATE RLBMK,
--             DETAIL the row's id in hex), which pgstore reports as
--             ErrBadRecord. Then, in a call that holds a refund, 1 per
--             item: for a refund, when the job of the charge may run
--             (Unix ms; driver.Item.Run), 0 otherwise. They follow the
--             marks, which earlier releases read alone, so that the
--             function keeps its arguments across releases: a call of an
--             earlier release sends none, and its refunds are judged
--             against the time of the charge.
-- A record read that no release writes (a value NaN or infinite, a ts
-- NULL or beyond the times of any op: driver.CheckState) fails the call
-- (SQLSTATE RLBAD, DETAIL the row's id in hex), which pgstore reports as
-- ErrBadRecord.
--
-- It returns, per item of every op in order: ok, retry (ms; for an op
-- that found its settlement's mark, minus the mark's kind, and minus 4
-- more when the mark names the op's settler, not none), and in num
-- 5 per item: remaining, charged to the first shard, to the second, the
-- time the op was judged at, the first record's time after the op
-- (ratelimit.Decision); and in fresh whether a record was missing.
--
-- Locks: the records an op may write are locked first, all at once, in
-- ascending id order, so that every batch (and every process) takes its
-- locks in one global order and no cycle of waits can form. When they all
-- exist, one SELECT ... FOR NO KEY UPDATE locks and reads them. When one
-- is missing, that statement's locks are undone (it runs in a
-- subtransaction: locking the others and then inserting the missing one
-- would break the order) and an INSERT of placeholders takes them all in
-- order, inserted or existing alike: its ON CONFLICT locks the rows that
-- exist (a row is locked even when the DO UPDATE's WHERE skips it). After
-- a batch that found a record missing, the next (p_fresh) goes to the
-- INSERT at once. Records only checked are read without locks.
-- An earlier build's, of other arguments, goes: found in the schema where
-- the functions are made (the table's, or current_schema()), whatever
-- search_path.
DO {{q}}
DECLARE
	f regprocedure := pg_catalog.to_regprocedure(pg_catalog.format('%I.%I(bigint[], float8[], integer[], bytea[], bytea[], bytea[], integer[], integer, bigint[], float8[], integer, boolean)',
		{{fn_schema}}, {{apply_name}}));
BEGIN
	{{step}}
	IF f IS NOT NULL THEN
		EXECUTE 'DROP FUNCTION ' OPERATOR(pg_catalog.||) f::pg_catalog.text;
	END IF;
END
{{q}};
DO {{qd}}
BEGIN
	{{step}}
CREATE OR REPLACE FUNCTION {{apply}}(
	p_ops bigint[], p_counts float8[], p_refs integer[],
	p_id bytea[], p_name bytea[], p_key bytea[], p_shard integer[], p_nlock integer,
	p_pint bigint[], p_pflt float8[], p_wait integer, p_fresh boolean, p_marks bigint[],
	OUT ok boolean[], OUT retry bigint[], OUT num float8[], OUT fresh boolean
) LANGUAGE plpgsql VOLATILE
{{pin}}
-- Plans made once per connection, whatever the batch, and that reach the
-- records through the primary key (or their row's address) even while the
-- table is small, so that they stay cheap as it grows.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS {{q}}
DECLARE
	noise    CONSTANT float8 := 1e-9;
	maxretry CONSTANT float8 := {{max_retry}};  -- ratelimit.MaxRetryAfter
	never    CONSTANT bigint := {{never}};      -- ratelimit.Never
	nops     integer := cardinality(p_ops) / 3;
	nitems   integer := cardinality(p_counts) / 2;
	-- Whether p_marks carries the items' job times (see above): calls of
	-- earlier releases send none.
	runs     boolean := nitems > 0 AND cardinality(p_marks) >= 3 * nops + nitems;
	nrec     integer := cardinality(p_id);
	-- Per record, the state as the batch has left it: found, value, ts;
	-- whether to write it, with which limit's params, and its expires.
	sf boolean[]; sv float8[]; sts bigint[]; tids tid[]; got_ids bytea[];
	cf boolean[]; cv float8[]; cts bigint[];
	dirty boolean[]; wpar integer[]; sexp bigint[];
	-- Per item of the current op, the state to write to its shards if the
	-- op is OK: value, ts, write.
	nva float8[]; nta bigint[]; wa boolean[];
	nvb float8[]; ntb bigint[]; wb boolean[];
	srv bigint;
	now bigint; flags bigint; mode bigint; reserve boolean; n integer; it integer := 0;
	all_ok boolean; ok_ boolean;
	i integer; j integer; o integer; r integer; q integer;
	cnt float8; rt float8; rem float8; c0 float8; c1 float8;
	ra integer; qa integer; rb integer; qb integer;
	ka bigint; pa bigint; pha bigint; rta float8; ca float8; ma float8;
	kb bigint; pb bigint; phb bigint; rtb float8; cb float8; mb float8;
	fa boolean; sva float8; sta bigint; svb float8; stb bigint;
	k bigint; off bigint; va float8; vb float8; na float8; nb float8; x float8;
	da float8; db float8; w float8; wv float8; back float8; wj float8; wk float8;
	bv float8; bt bigint;
	short float8; kk float8; dt float8; fullat bigint;
	mk integer; found bigint; mown bigint;
	run bigint; tnow bigint; tw float8; queued boolean;
	-- Whether every record read is one a release writes (see below).
	lsound boolean := true; csound boolean := true; bid bytea; bv0 float8; bt0 bigint;
BEGIN
	IF p_wait > 0 THEN
		PERFORM set_config('lock_timeout', p_wait || 'ms', true);
	END IF;
	fresh := false;
	ok := array_fill(false, ARRAY[nitems]);
	retry := array_fill(0::bigint, ARRAY[nitems]);
	num := array_fill(0::float8, ARRAY[5 * nitems]);
	dirty := array_fill(false, ARRAY[nrec]);
	wpar := array_fill(0, ARRAY[nrec]);
	IF nops > 0 AND p_ops[1] & 8 <> 0 THEN -- the store's own clock: one now for the batch
		srv := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
	END IF;

	-- Lock and read the records an op may write. The rows come in id
	-- order, that of p_id[1:p_nlock]. A record is found if it has a value:
	-- a placeholder reads as missing; one past its expires is found too,
	-- full again by its own refresh, as the Go transition sees it. The
	-- rows' addresses (ctid) stay valid until the update below: the rows
	-- are locked, and nothing else in this function writes them. Whether
	-- every record is sound, one that a release writes (driver.CheckState:
	-- a finite value, NaN - NaN and Infinity - Infinity being NaN, and a
	-- ts within the times of any op), is read with them; a settlement's
	-- mark (a 16-byte id) is read as one below.
	IF p_nlock > 0 THEN
		IF NOT p_fresh THEN
			BEGIN
				-- The aggregates take the rows in the order the subquery
				-- locked them; the ids they return prove it, and that none
				-- is missing.
				SELECT array_agg(x.id), array_agg(x.value IS NOT NULL),
					array_agg(coalesce(x.value, 0)), array_agg(coalesce(x.ts, 0)), array_agg(x.ctid),
					bool_and(x.value IS NULL OR length(x.id) = 16
						OR coalesce(x.value - x.value = 0 AND x.ts BETWEEN {{min_ts}} AND {{max_ts}}, false))
					INTO got_ids, sf, sv, sts, tids, lsound
					FROM (SELECT t.id, t.value, t.ts, t.ctid FROM {{table}} t
						WHERE t.id = ANY (p_id[1:p_nlock]) ORDER BY t.id FOR NO KEY UPDATE) x;
				IF got_ids IS DISTINCT FROM p_id[1:p_nlock] THEN
					RAISE SQLSTATE 'RLMIS';
				END IF;
			EXCEPTION WHEN SQLSTATE 'RLMIS' THEN
				fresh := true;
			END;
		END IF;
		IF p_fresh OR fresh THEN
			INSERT INTO {{table}} AS t (id, name, key, shard, value, ts, expires)
				SELECT u.id, u.name, u.key, u.shard, NULL, NULL, 0
				FROM unnest(p_id[1:p_nlock], p_name[1:p_nlock], p_key[1:p_nlock], p_shard[1:p_nlock])
					AS u(id, name, key, shard)
				ORDER BY u.id
				ON CONFLICT (id) DO UPDATE SET shard = EXCLUDED.shard WHERE false;
			GET DIAGNOSTICS n = ROW_COUNT; -- the rows inserted
			fresh := fresh OR n > 0;
			-- A new statement, a new snapshot: it sees every row, locked.
			SELECT array_agg(x.id), array_agg(x.value IS NOT NULL),
				array_agg(coalesce(x.value, 0)), array_agg(coalesce(x.ts, 0)), array_agg(x.ctid),
				bool_and(x.value IS NULL OR length(x.id) = 16
					OR coalesce(x.value - x.value = 0 AND x.ts BETWEEN {{min_ts}} AND {{max_ts}}, false))
				INTO got_ids, sf, sv, sts, tids, lsound
				FROM (SELECT t.id, t.value, t.ts, t.ctid FROM {{table}} t
					WHERE t.id = ANY (p_id[1:p_nlock]) ORDER BY t.id) x;
			IF got_ids IS DISTINCT FROM p_id[1:p_nlock] THEN
				RAISE 'pgstore: records locked but not read in order: % of %', got_ids, p_id[1:p_nlock];
			END IF;
		END IF;
	END IF;
	-- Read the records only checked, without locks.
	IF nrec > p_nlock THEN
		SELECT array_agg(t.value IS NOT NULL ORDER BY u.o),
			array_agg(coalesce(t.value, 0) ORDER BY u.o), array_agg(coalesce(t.ts, 0) ORDER BY u.o),
			bool_and(t.value IS NULL OR coalesce(t.value - t.value = 0 AND t.ts BETWEEN {{min_ts}} AND {{max_ts}}, false))
			INTO cf, cv, cts, csound
			FROM unnest(p_id[p_nlock + 1:nrec]) WITH ORDINALITY AS u(id, o)
			LEFT JOIN LATERAL (SELECT r.value, r.ts FROM {{table}} r WHERE r.id = u.id LIMIT 1) t ON true;
		sf := coalesce(sf, '{}') || cf; sv := coalesce(sv, '{}') || cv; sts := coalesce(sts, '{}') || cts;
	END IF;
	-- A record that no release writes fails the batch, rather than be
	-- decided on: NaN reads here as more than any number (a full bucket),
	-- and as no number in Go. Which one is looked up only then.
	IF NOT (lsound AND csound) THEN
		SELECT t.id, t.value, t.ts INTO bid, bv0, bt0 FROM {{table}} t
			WHERE t.id = ANY (p_id) AND length(t.id) <> 16 AND t.value IS NOT NULL
				AND NOT coalesce(t.value - t.value = 0 AND t.ts BETWEEN {{min_ts}} AND {{max_ts}}, false)
			ORDER BY t.id LIMIT 1;
		RAISE SQLSTATE 'RLBAD' USING DETAIL = coalesce(encode(bid, 'hex'), ''),
			MESSAGE = format('the record %s holds value %s, ts %s', coalesce(encode(bid, 'hex'), '(changed since)'),
				bv0, coalesce(bt0::text, 'NULL'));
	END IF;

	FOR o IN 0 .. nops - 1 LOOP
		flags := p_ops[3 * o + 1];
		now := coalesce(srv, p_ops[3 * o + 2]);
		n := p_ops[3 * o + 3];
		IF n = 1 AND p_refs[4 * it + 3] = 0 AND flags & 3 <> 2 THEN
			-- The common op, one item on one record, a limit or a check:
			-- decided and kept here with as few steps as can be.
			it := it + 1;
			r := p_refs[4 * it - 3]; q := p_refs[4 * it - 2];
			cnt := p_counts[2 * it - 1];
			ka := p_pint[3 * q - 2]; pa := p_pint[3 * q - 1];
			rta := p_pflt[3 * q - 2]; ca := p_pflt[3 * q - 1];
			IF NOT sf[r] THEN
				sva := ca;
				IF ka = {{fixed}} THEN
					off := (now - p_pint[3 * q]) % pa;
					IF off < 0 THEN off := off + pa; END IF;
					sta := now - off;
				ELSE
					sta := now;
				END IF;
			ELSIF ka = {{fixed}} THEN
				sva := sv[r]; sta := sts[r];
				k := (greatest(now, sta) - sta) / pa;
				IF k > 0 THEN
					sva := sva + rta * k::float8;
					sta := sta + k * pa;
				END IF;
				sva := least(sva, ca);
			ELSE
				sta := greatest(now, sts[r]);
				sva := least(sv[r] + (sta - sts[r])::float8 * rta / pa::float8, ca);
			END IF;
			va := sva - cnt;
			IF va < 0 AND va > -noise THEN va := 0; END IF;
			num[5 * it - 1] := now; num[5 * it] := sta;
			IF va >= 0 THEN
				ok[it] := true;
				num[5 * it - 4] := va; num[5 * it - 3] := cnt;
				IF flags & 4 <> 0 THEN -- a reservation waits for its record's time
					rt := ceil((sta - now)::float8);
					IF NOT (rt > 0) THEN rt := 0; END IF;
					retry[it] := rt::bigint;
				END IF;
			ELSE
				reserve := flags & 4 <> 0;
				ma := p_pflt[3 * q];
				IF reserve AND (ma = 0 OR va + ma > -noise) THEN
					ok[it] := true;
					{{rt := wait(ka, pa, rta, ca, va, sta, va, sta, 0, 0)}}
					num[5 * it - 4] := va; num[5 * it - 3] := cnt;
				ELSE
					da := 0;
					IF reserve THEN da := ma; END IF;
					bv := sva; bt := sta;
					IF sf[r] THEN bv := sv[r]; bt := sts[r]; END IF;
					{{rt := wait(ka, pa, rta, ca, bv, bt, sva, sta, cnt, da)}}
					num[5 * it - 4] := sva;
				END IF;
				rt := ceil(rt);
				IF rt = 'NaN'::float8 OR NOT (rt > 0) THEN rt := 0;
				ELSIF rt >= maxretry THEN rt := maxretry; END IF;
				retry[it] := rt::bigint;
			END IF;
			IF ok[it] AND cnt > 0 AND flags & 3 = 0 THEN
				sf[r] := true; sv[r] := va; sts[r] := sta;
				dirty[r] := true; wpar[r] := q;
			END IF;
			CONTINUE;
		END IF;

		IF nva IS NULL THEN
			nva := array_fill(0::float8, ARRAY[nitems]); nta := array_fill(0::bigint, ARRAY[nitems]); wa := array_fill(false, ARRAY[nitems]);
			nvb := array_fill(0::float8, ARRAY[nitems]); ntb := array_fill(0::bigint, ARRAY[nitems]); wb := array_fill(false, ARRAY[nitems]);
		END IF;
		mode := flags & 3;
		reserve := flags & 4 <> 0;
		all_ok := true;
		-- A settlement: its mark, and the kind found there (0: none). A
		-- mark of another kind than a cancel or a use fails the batch:
		-- its token may have been settled already.
		mk := p_marks[3 * o + 1]::integer;
		found := 0; mown := 0;
		IF mk > 0 AND sf[mk] THEN
			IF sv[mk] = 1 OR sv[mk] = 2 THEN
				found := sv[mk]::bigint;
				-- The op's own settler's mark: written by an op of this
				-- call (all of one settler), or kept with its key.
				IF length(p_key[mk]) = 16 AND (dirty[mk]
					OR EXISTS (SELECT FROM {{table}} t WHERE t.id = p_id[mk] AND t.key = p_key[mk])) THEN
					mown := 4;
				END IF;
			ELSE
				RAISE SQLSTATE 'RLBMK' USING DETAIL = encode(p_id[mk], 'hex'),
					MESSAGE = format('the mark of the settlement %s holds %s, which is no mark of a cancel (1) or a use (2)',
						encode(p_id[mk], 'hex'), sv[mk]);
			END IF;
		END IF;
		FOR i IN it + 1 .. it + n LOOP
			IF found > 0 THEN
				-- Settled before: nothing done.
				ok[i] := false; retry[i] := -found - mown; num[5 * i - 1] := now;
				wa[i] := false; wb[i] := false;
				all_ok := false;
				CONTINUE;
			END IF;
			cnt := p_counts[2 * i - 1];
			ra := p_refs[4 * i - 3]; qa := p_refs[4 * i - 2];
			rb := p_refs[4 * i - 1]; qb := p_refs[4 * i];
			ka := p_pint[3 * qa - 2]; pa := p_pint[3 * qa - 1]; pha := p_pint[3 * qa];
			rta := p_pflt[3 * qa - 2]; ca := p_pflt[3 * qa - 1]; ma := p_pflt[3 * qa];
			-- Load shard a as the transition sees it: refreshed if found,
			-- fresh if missing.
			fa := sf[ra];
			IF NOT fa THEN
				sva := ca;
				IF ka = {{fixed}} THEN
					off := (now - pha) % pa;
					IF off < 0 THEN off := off + pa; END IF;
					sta := now - off;
				ELSE
					sta := now;
				END IF;
			ELSIF ka = {{fixed}} THEN
				sva := sv[ra]; sta := sts[ra];
				k := (greatest(now, sta) - sta) / pa;
				IF k > 0 THEN
					sva := sva + rta * k::float8;
					sta := sta + k * pa;
				END IF;
				sva := least(sva, ca);
			ELSE
				sta := greatest(now, sts[ra]);
				sva := least(sv[ra] + (sta - sts[ra])::float8 * rta / pa::float8, ca);
			END IF;
			ok_ := false; rt := 0; rem := 0; c0 := 0; c1 := 0;
			wa[i] := false; wb[i] := false;
			IF mode = {{mode_refund}} THEN
				-- Refund: the count less what the record was granted since
				-- it was charged, capped at capacity; nothing while the
				-- record owes tokens granted after the job's time (run, at
				-- least the charge's), which reservations made after the
				-- charge stand behind (state.go's queued). The debt's tail
				-- is timed from the record as stored, at its own time, as
				-- the reservation that left it was timed.
				ok_ := true;
				rem := sva;
				run := p_counts[2 * i]::bigint;
				IF runs THEN run := greatest(run, p_marks[3 * nops + i]); END IF;
				queued := false;
				IF fa AND sva <= -noise THEN
					tnow := now; now := sts[ra];
					{{tw := wait(ka, pa, rta, ca, sv[ra], sts[ra], sv[ra], sts[ra], 0, 0)}}
					now := tnow;
					tw := ceil(tw);
					IF tw = 'NaN'::float8 OR NOT (tw > 0) THEN tw := 0;
					ELSIF tw >= maxretry THEN tw := maxretry; END IF;
					queued := sts[ra] + tw::bigint > run;
				END IF;
				IF fa AND NOT queued THEN
					IF sta <= p_counts[2 * i]::bigint THEN
						back := cnt;
					ELSIF ka = {{fixed}} THEN
						back := cnt - rta * ((sta - p_counts[2 * i]::bigint + pa - 1) / pa)::float8;
					ELSE
						back := cnt - (sta - p_counts[2 * i]::bigint)::float8 * rta / pa::float8;
					END IF;
					IF back < 0 AND back > -noise THEN back := 0; END IF;
					IF back > 0 AND least(sva + back, ca) > sva THEN
						nva[i] := least(sva + back, ca); nta[i] := sta; wa[i] := true;
						c0 := sva - nva[i];
						rem := nva[i];
					END IF;
				END IF;
			ELSIF rb = 0 THEN
				va := sva - cnt;
				IF va < 0 AND va > -noise THEN va := 0; END IF;
				IF va >= 0 THEN
					ok_ := true;
					IF reserve THEN rt := (sta - now)::float8; END IF;
				ELSIF reserve AND (ma = 0 OR va + ma > -noise) THEN
					ok_ := true;
					{{rt := wait(ka, pa, rta, ca, va, sta, va, sta, 0, 0)}}
				ELSE
					da := 0;
					IF reserve THEN da := ma; END IF;
					bv := sva; bt := sta;
					IF fa THEN bv := sv[ra]; bt := sts[ra]; END IF;
					{{rt := wait(ka, pa, rta, ca, bv, bt, sva, sta, cnt, da)}}
					rem := sva;
				END IF;
				IF ok_ THEN
					rem := va; c0 := cnt;
					nva[i] := va; nta[i] := sta; wa[i] := cnt > 0;
				END IF;
			ELSE
				-- Two shards (power of two choices), as state.go's pair.
				kb := p_pint[3 * qb - 2]; pb := p_pint[3 * qb - 1]; phb := p_pint[3 * qb];
				rtb := p_pflt[3 * qb - 2]; cb := p_pflt[3 * qb - 1]; mb := p_pflt[3 * qb];
				IF NOT sf[rb] THEN
					svb := cb;
					IF kb = {{fixed}} THEN
						off := (now - phb) % pb;
						IF off < 0 THEN off := off + pb; END IF;
						stb := now - off;
					ELSE
						stb := now;
					END IF;
				ELSIF kb = {{fixed}} THEN
					svb := sv[rb]; stb := sts[rb];
					k := (greatest(now, stb) - stb) / pb;
					IF k > 0 THEN
						svb := svb + rtb * k::float8;
						stb := stb + k * pb;
					END IF;
					svb := least(svb, cb);
				ELSE
					stb := greatest(now, sts[rb]);
					svb := least(sv[rb] + (stb - sts[rb])::float8 * rtb / pb::float8, cb);
				END IF;
				nva[i] := sva; nta[i] := sta; nvb[i] := svb; ntb[i] := stb;
				SELECT z.na, z.nb, z.c0, z.c1, z.ok INTO na, nb, c0, c1, ok_
					FROM {{split}}(ka, rta, pa, ca, ma, kb, rtb, pb, cb, mb, sva, sta, svb, stb, now, cnt, reserve) z;
				IF NOT ok_ THEN
					rt := {{pwait}}(ka, rta, pa, ca, ma, pha, sf[ra], sv[ra], sts[ra],
						kb, rtb, pb, cb, mb, phb, sf[rb], sv[rb], sts[rb], sva, sta, svb, stb, now, cnt, reserve);
					rem := sva + svb;
				ELSE
					-- A reservation runs once the tokens it took from each
					-- shard were granted: debts, or a lagging caller's wait
					-- for the record's time.
					rt := 0;
					IF c0 > 0 THEN
						IF na < 0 THEN
							{{wv := wait(ka, pa, rta, ca, na, sta, na, sta, 0, 0)}}
							rt := greatest(rt, wv);
						ELSIF reserve THEN
							rt := greatest(rt, (sta - now)::float8);
						END IF;
					END IF;
					IF c1 > 0 THEN
						IF nb < 0 THEN
							{{wv := wait(kb, pb, rtb, cb, nb, stb, nb, stb, 0, 0)}}
							rt := greatest(rt, wv);
						ELSIF reserve THEN
							rt := greatest(rt, (stb - now)::float8);
						END IF;
					END IF;
					-- A reservation of 0 charged neither shard: its job
					-- waits for the debt before it, on the shard where it
					-- comes first (state.go's zeroWait of each).
					IF cnt = 0 AND reserve THEN
						va := sva;
						IF va < 0 AND va > -noise THEN va := 0; END IF;
						IF va >= 0 THEN
							da := (sta - now)::float8;
						ELSIF ma = 0 OR va + ma > -noise THEN
							{{da := wait(ka, pa, rta, ca, va, sta, va, sta, 0, 0)}}
						ELSE
							da := 'Infinity'::float8;
						END IF;
						vb := svb;
						IF vb < 0 AND vb > -noise THEN vb := 0; END IF;
						IF vb >= 0 THEN
							db := (stb - now)::float8;
						ELSIF mb = 0 OR vb + mb > -noise THEN
							{{db := wait(kb, pb, rtb, cb, vb, stb, vb, stb, 0, 0)}}
						ELSE
							db := 'Infinity'::float8;
						END IF;
						rt := least(da, db);
					END IF;
					rem := na + nb;
					nva[i] := na; wa[i] := c0 > 0;
					nvb[i] := nb; wb[i] := c1 > 0;
				END IF;
			END IF;
			-- Retry-after: rounded up to whole ms, within [0, MaxRetryAfter].
			rt := ceil(rt);
			IF rt = 'NaN'::float8 OR NOT (rt > 0) THEN rt := 0;
			ELSIF rt >= maxretry THEN rt := maxretry; END IF;
			ok[i] := ok_;
			retry[i] := rt::bigint;
			num[5 * i - 4] := rem; num[5 * i - 3] := c0; num[5 * i - 2] := c1;
			num[5 * i - 1] := now; num[5 * i] := sta;
			all_ok := all_ok AND ok_;
		END LOOP;
		-- Keep the marked states: every one of a refund, or of a limit
		-- whose items are all OK; a check keeps nothing.
		IF mode = {{mode_refund}} OR (mode = {{mode_limit}} AND all_ok) THEN
			FOR i IN it + 1 .. it + n LOOP
				IF wa[i] THEN
					r := p_refs[4 * i - 3];
					sf[r] := true; sv[r] := nva[i]; sts[r] := nta[i];
					dirty[r] := true; wpar[r] := p_refs[4 * i - 2];
				END IF;
				IF wb[i] THEN
					r := p_refs[4 * i - 1];
					sf[r] := true; sv[r] := nvb[i]; sts[r] := ntb[i];
					dirty[r] := true; wpar[r] := p_refs[4 * i];
				END IF;
			END LOOP;
		END IF;
		IF mk > 0 AND found = 0 THEN
			sf[mk] := true; sv[mk] := p_marks[3 * o + 2]::float8; sts[mk] := p_marks[3 * o + 3];
			dirty[mk] := true; wpar[mk] := 0;
		END IF;
		it := it + n;
	END LOOP;

	-- Write each changed record once, with its FullAt: the first ms at
	-- which its bucket is full again.
	IF true = ANY (dirty) THEN
		sexp := array_fill(0::bigint, ARRAY[nrec]);
		FOR r IN 1 .. nrec LOOP
			CONTINUE WHEN NOT dirty[r];
			q := wpar[r];
			IF q = 0 THEN -- a mark: kept until its time
				sexp[r] := sts[r];
				CONTINUE;
			END IF;
			ka := p_pint[3 * q - 2]; pa := p_pint[3 * q - 1];
			rta := p_pflt[3 * q - 2]; ca := p_pflt[3 * q - 1];
			IF sv[r] >= ca THEN
				fullat := sts[r];
			ELSE
				fullat := never;
				short := ca - sv[r];
				IF ka = {{fixed}} THEN
					kk := ceil(short / rta);
					FOR j IN 1 .. 3 LOOP
						IF sv[r] + rta * kk >= ca THEN
							IF pa::float8 * kk < {{never_span}}::float8 THEN
								fullat := sts[r] + (pa::float8 * kk)::bigint;
							END IF;
							EXIT;
						END IF;
						kk := kk + 1;
					END LOOP;
				ELSE
					dt := ceil(short * pa::float8 / rta);
					FOR j IN 1 .. 3 LOOP
						IF sv[r] + dt * rta / pa::float8 >= ca THEN
							IF dt < {{never_span}}::float8 THEN
								fullat := sts[r] + dt::bigint;
							END IF;
							EXIT;
						END IF;
						dt := dt + 1;
					END LOOP;
				END IF;
			END IF;
			sexp[r] := fullat;
		END LOOP;
		-- Only records an op may write are dirty: the first p_nlock. The
		-- rows are found by address.
		UPDATE {{table}} AS t SET value = u.value, ts = u.ts, expires = u.expires
			FROM unnest(tids, sv[1:p_nlock], sts[1:p_nlock], sexp[1:p_nlock], dirty[1:p_nlock]) AS u(tid, value, ts, expires, dirty)
			WHERE u.dirty AND t.ctid = u.tid;
	END IF;
END
{{q}};
END
{{qd}};

-- _one decides one op of one item on one record, a limit or a check:
-- the case of every call that finds no other in flight, which the batch
-- function above would decide at twice the cost (it prepares more
-- expressions, each anew in every transaction, and runs more statements).
--
-- It reads the record without a lock, decides, and writes only if the
-- record is still as read: an UPDATE of the row read whose value and ts
-- are unchanged, or an INSERT that finds no row. A decision that writes
-- nothing holds at the read (a refused call commits nothing, so it waits
-- for no disk). If the write finds the record changed, the function locks
-- it (inserting a placeholder if missing), reads it again and decides
-- again. It waits for at most one row and holds no other, so it cannot
-- take part in a deadlock.
-- Version 2 of this release's development returned fewer columns: a
-- function's result cannot change in place, so that one, by its
-- parameters, is dropped first. A function that has those below is
-- replaced in place, keeping its OID: a session that calls it, or holds a
-- plan that names it, while the script runs again, goes on calling it,
-- where a function dropped and made anew fails such a call ("cache lookup
-- failed for function"). One of any other results, another release's,
-- which its processes call, is left: CREATE OR REPLACE fails on it
-- (SQLSTATE 42P13), and the script with it.
DO {{q}}
DECLARE
	f regprocedure := pg_catalog.to_regprocedure(pg_catalog.format('%I.%I(bytea, bytea, bytea, integer, integer, float8, bigint, float8, float8, bigint, bigint, float8, integer, integer)',
		{{fn_schema}}, {{one_name}}));
BEGIN
	{{step}}
	IF pg_catalog.pg_get_function_arguments(f::pg_catalog.oid) OPERATOR(pg_catalog.=) 'p_id bytea, p_name bytea, p_key bytea, p_shard integer, '
		'p_kind integer, p_rate double precision, p_period bigint, p_cap double precision, p_maxr double precision, p_phase bigint, '
		'p_now bigint, p_count double precision, p_flags integer, p_wait integer, '
		'OUT ok boolean, OUT retry bigint, OUT remaining double precision, OUT charged double precision' THEN
		EXECUTE 'DROP FUNCTION ' OPERATOR(pg_catalog.||) f::pg_catalog.text;
	END IF;
END
{{q}};
DO {{qd}}
BEGIN
	{{step}}
CREATE OR REPLACE FUNCTION {{one}}(
	p_id bytea, p_name bytea, p_key bytea, p_shard integer,
	p_kind integer, p_rate float8, p_period bigint, p_cap float8, p_maxr float8, p_phase bigint,
	p_now bigint, p_count float8, p_flags integer, p_wait integer,
	OUT ok boolean, OUT retry bigint, OUT remaining float8, OUT charged float8, OUT at bigint, OUT ts bigint
) LANGUAGE plpgsql VOLATILE
{{pin}}
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS {{q}}
DECLARE
	noise    CONSTANT float8 := 1e-9;
	maxretry CONSTANT float8 := {{max_retry}};  -- ratelimit.MaxRetryAfter
	never    CONSTANT bigint := {{never}};      -- ratelimit.Never
	now      bigint := p_now;
	reserve  boolean := p_flags & 4 <> 0;
	ov float8; ots bigint; tid tid; present boolean;
	sv float8; sts bigint; k bigint; off bigint; va float8; rt float8; d float8; wj float8; wk float8;
	short float8; kk float8; dt float8; fullat bigint; j integer;
BEGIN
	IF p_wait > 0 THEN
		PERFORM set_config('lock_timeout', p_wait || 'ms', true);
	END IF;
	IF p_flags & 8 <> 0 THEN
		now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
	END IF;
	SELECT t.value, t.ts, t.ctid INTO ov, ots, tid FROM {{table}} t WHERE t.id = p_id;
	present := FOUND;
	LOOP
		-- A record that no release writes fails the call, as in _apply.
		IF ov IS NOT NULL AND NOT coalesce(ov - ov = 0 AND ots BETWEEN {{min_ts}} AND {{max_ts}}, false) THEN
			RAISE SQLSTATE 'RLBAD' USING DETAIL = encode(p_id, 'hex'),
				MESSAGE = format('the record %s holds value %s, ts %s', encode(p_id, 'hex'), ov, coalesce(ots::text, 'NULL'));
		END IF;
		-- Load the record as the transition sees it: refreshed if found,
		-- fresh if missing (a placeholder, with no value, reads as missing).
		IF ov IS NULL THEN
			sv := p_cap;
			IF p_kind = {{fixed}} THEN
				off := (now - p_phase) % p_period;
				IF off < 0 THEN off := off + p_period; END IF;
				sts := now - off;
			ELSE
				sts := now;
			END IF;
		ELSIF p_kind = {{fixed}} THEN
			sv := ov; sts := ots;
			k := (greatest(now, sts) - sts) / p_period;
			IF k > 0 THEN
				sv := sv + p_rate * k::float8;
				sts := sts + k * p_period;
			END IF;
			sv := least(sv, p_cap);
		ELSE
			sts := greatest(now, ots);
			sv := least(ov + (sts - ots)::float8 * p_rate / p_period::float8, p_cap);
		END IF;
		va := sv - p_count;
		IF va < 0 AND va > -noise THEN va := 0; END IF;
		rt := 0;
		at := now; ts := sts;
		IF va >= 0 THEN
			ok := true;
			IF reserve THEN rt := (sts - now)::float8; END IF; -- a reservation waits for its record's time
		ELSIF reserve AND (p_maxr = 0 OR va + p_maxr > -noise) THEN
			ok := true;
			{{rt := wait(p_kind, p_period, p_rate, p_cap, va, sts, va, sts, 0, 0)}}
		ELSE
			ok := false;
			d := 0;
			IF reserve THEN d := p_maxr; END IF;
			IF ov IS NULL THEN
				{{rt := wait(p_kind, p_period, p_rate, p_cap, sv, sts, sv, sts, p_count, d)}}
			ELSE
				{{rt := wait(p_kind, p_period, p_rate, p_cap, ov, ots, sv, sts, p_count, d)}}
			END IF;
		END IF;
		rt := ceil(rt);
		IF rt = 'NaN'::float8 OR NOT (rt > 0) THEN rt := 0;
		ELSIF rt >= maxretry THEN rt := maxretry; END IF;
		retry := rt::bigint;
		IF ok THEN
			remaining := va; charged := p_count;
		ELSE
			remaining := sv; charged := 0;
		END IF;
		-- Only a limit that is OK and takes tokens writes.
		EXIT WHEN NOT ok OR p_count <= 0 OR p_flags & 3 <> 0;

		IF va >= p_cap THEN
			fullat := sts;
		ELSE
			fullat := never;
			short := p_cap - va;
			IF p_kind = {{fixed}} THEN
				kk := ceil(short / p_rate);
				FOR j IN 1 .. 3 LOOP
					IF va + p_rate * kk >= p_cap THEN
						IF p_period::float8 * kk < {{never_span}}::float8 THEN
							fullat := sts + (p_period::float8 * kk)::bigint;
						END IF;
						EXIT;
					END IF;
					kk := kk + 1;
				END LOOP;
			ELSE
				dt := ceil(short * p_period::float8 / p_rate);
				FOR j IN 1 .. 3 LOOP
					IF va + dt * p_rate / p_period::float8 >= p_cap THEN
						IF dt < {{never_span}}::float8 THEN
							fullat := sts + dt::bigint;
						END IF;
						EXIT;
					END IF;
					dt := dt + 1;
				END LOOP;
			END IF;
		END IF;
		IF present THEN
			UPDATE {{table}} AS t SET value = va, ts = sts, expires = fullat
				WHERE t.ctid = tid AND t.value IS NOT DISTINCT FROM ov AND t.ts IS NOT DISTINCT FROM ots;
		ELSE
			INSERT INTO {{table}} (id, name, key, shard, value, ts, expires)
				VALUES (p_id, p_name, p_key, p_shard, va, sts, fullat)
				ON CONFLICT (id) DO NOTHING;
		END IF;
		EXIT WHEN FOUND;
		-- The record changed since it was read: lock it, read it again
		-- (a new statement sees it as locked) and decide again.
		INSERT INTO {{table}} AS t (id, name, key, shard, value, ts, expires)
			VALUES (p_id, p_name, p_key, p_shard, NULL, NULL, 0)
			ON CONFLICT (id) DO UPDATE SET shard = EXCLUDED.shard WHERE false;
		SELECT t.value, t.ts, t.ctid INTO ov, ots, tid FROM {{table}} t WHERE t.id = p_id;
		present := true;
	END LOOP;
END
{{q}};
END
{{qd}};

-- _read reads the records of p_id, in the calling statement's snapshot
-- (it is STABLE): the read of the batch upsert (store/pgstore/many.go) and
-- of Load. A plain SELECT … WHERE id = ANY(…) prepared while the table
-- holds a few hundred rows gets a sequential scan as its generic plan, and
-- the connection keeps that plan while the table grows; this function's
-- plan reaches the records through the primary key whatever the table's
-- size, as those of the functions above do.
DO {{qd}}
BEGIN
	{{step}}
CREATE OR REPLACE FUNCTION {{read}}(p_id bytea[])
RETURNS TABLE (id bytea, value float8, ts bigint)
LANGUAGE plpgsql STABLE ROWS 10
{{pin}}
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS {{q}}
BEGIN
	RETURN QUERY SELECT t.id, t.value, t.ts FROM {{table}} t WHERE t.id = ANY (p_id);
END
{{q}};
END
{{qd}};

-- _del deletes the records of p_id (Store.Delete), locking them first in
-- id order, the order in which the functions above lock, so that it cannot
-- wait on a batch in a cycle. A function, planned as the others are: a
-- plain statement planned while the table was small kept a sequential scan
-- of it.
DO {{qd}}
BEGIN
	{{step}}
CREATE OR REPLACE FUNCTION {{del}}(p_id bytea[]) RETURNS void
LANGUAGE plpgsql VOLATILE
{{pin}}
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS {{q}}
BEGIN
	DELETE FROM {{table}} WHERE id IN (
		SELECT t.id FROM {{table}} t WHERE t.id = ANY (p_id) ORDER BY t.id FOR UPDATE);
END
{{q}};
END
{{qd}};

-- _sweep is one step of Store.DeleteExpired: of the chunk of at most
-- p_n records after p_after in id order, it deletes those expired at
-- p_cutoff and not locked by a call in flight (skipping them, it never
-- waits for a call, so it cannot deadlock with one; a record skipped goes
-- at the next sweep), and returns the chunk's last id, its size, and how
-- many records and settlement marks went: a placeholder (a NULL value, left
-- by an op refused on records it had locked) goes too, uncounted, as it
-- was never a record. A function for the same reason as _del: a plain
-- statement planned on a small table read the whole table at every chunk.
DO {{qd}}
BEGIN
	{{step}}
CREATE OR REPLACE FUNCTION {{sweep}}(p_after bytea, p_n integer, p_cutoff bigint,
	OUT last bytea, OUT scanned bigint, OUT gone bigint)
LANGUAGE plpgsql VOLATILE
{{pin}}
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS {{q}}
BEGIN
	WITH c AS (SELECT t.id FROM {{table}} t WHERE t.id > p_after ORDER BY t.id LIMIT p_n),
	l AS (SELECT t.id FROM {{table}} t WHERE t.id IN (SELECT c.id FROM c) AND t.expires <= p_cutoff
		FOR UPDATE SKIP LOCKED),
	d AS (DELETE FROM {{table}} t WHERE t.id IN (SELECT l.id FROM l) AND t.expires <= p_cutoff RETURNING t.value)
	SELECT (SELECT c.id FROM c ORDER BY c.id DESC LIMIT 1), (SELECT count(*) FROM c), (SELECT count(d.value) FROM d)
	INTO last, scanned, gone;
END
{{q}};
END
{{qd}};

-- Only the primary key is indexed, so that an update, which changes
-- value, ts and expires, is a HOT update: written beside the old row on
-- its page (kept with room to spare by the fillfactor), with no index entry
-- to add. Version 1 indexed expires; DeleteExpired walks the primary key
-- instead. Its index is dropped only if it is an index of this table: an
-- index of that name on another table is the application's.
--
-- DROP INDEX locks the table against every access until the transaction
-- ends, and while it waits for that lock (for a long transaction that
-- reads the table), every call on the table queues behind it. So it comes
-- last, and waits at most {{drop_wait}} ms (less if lock_timeout is
-- lower): if the table is still held then, the index is left, with a
-- warning, for the next run (pgstore.New runs the script again while the
-- index is there).
DO {{q}}
DECLARE
	was text := pg_catalog.current_setting('lock_timeout');
	ms bigint := (SELECT s.setting::bigint FROM pg_catalog.pg_settings s WHERE s.name OPERATOR(pg_catalog.=) 'lock_timeout');
BEGIN
	{{step}}
	IF EXISTS (SELECT FROM pg_catalog.pg_index WHERE indexrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass({{old_index_literal}})::pg_catalog.oid
		AND indrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass({{table_literal}})::pg_catalog.oid) THEN
		IF NOT (ms OPERATOR(pg_catalog.>=) 1 AND ms OPERATOR(pg_catalog.<=) {{drop_wait}}) THEN
			PERFORM pg_catalog.set_config('lock_timeout', '{{drop_wait}}ms', true);
		END IF;
		BEGIN
			DROP INDEX {{old_index}};
		EXCEPTION WHEN lock_not_available THEN
			RAISE WARNING USING MESSAGE = pg_catalog.format('index %s, made by version 1 of the store, left in place: '
				'a transaction held table %s for more than %s', {{old_index_literal}}, {{table_literal}}, pg_catalog.current_setting('lock_timeout')),
				HINT = 'it keeps updates from being HOT; run the script again, or let pgstore.New drop it, once no long transaction reads the table';
		END;
		PERFORM pg_catalog.set_config('lock_timeout', was, true);
	END IF;
END
{{q}};

-- For a table named without its schema, the functions (all but
-- _split) run with pg_catalog, the schema they are made in
-- (current_schema(), where the table is too), and pg_temp as their
-- search_path. The list below names them as the statements above do; it
-- is empty for a table named with its schema, whose functions were made
-- with theirs.
DO {{q}}
DECLARE
	f text;
BEGIN
	{{step}}
	FOREACH f IN ARRAY {{bare_functions}}::text[] LOOP
		EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, pg_catalog.current_schema());
	END LOOP;
END
{{q}};

-- Each function is marked as the store's (funcCheck above), and the
-- table with the schema's version, last. Through a pooler that hands out
-- its sessions a transaction at a time (PgBouncer's transaction mode), the
-- statements after the guard above may run on other sessions, each in a
-- transaction of its own and without the lock, where the guard does not
-- reach them. So the table is marked only in the transaction that took the
-- lock (lockHeld); in another, the statement fails (SQLSTATE RLTXN) and
-- leaves the table's mark as it was: a table is never marked as installed
-- by a script whose statements did not all run in that transaction, and
-- pgstore.New installs the schema again, under the lock (WithoutDDL
-- refuses it). There, as after any statement that failed, the statements
-- before it have failed already (RLSTP), and changed nothing.
DO {{q}}
BEGIN
	{{step}}
{{mark_functions}}
END
{{q}};
DO {{q}}
BEGIN
	IF NOT {{lock_held}} THEN
		RAISE EXCEPTION USING ERRCODE = 'RLTXN',
			MESSAGE = 'the schema script of a ratelimit store must run in one transaction, and this statement runs in another than the one that took its lock: '
				'it leaves the table''s mark as it was, and the schema is not installed until the script runs in one transaction or pgstore.New installs it',
			HINT = 'apply it in one transaction: psql --single-transaction (-1) -v ON_ERROR_STOP=1, or as migration tools apply a migration';
	END IF;
	{{step}}
	COMMENT ON TABLE {{table}} IS 'ratelimit pgstore schema 2';
END
{{q}};
