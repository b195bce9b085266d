-- Version 1 of schema.sql, as the previous release installed it: kept to
-- test that New upgrades its tables.
--
-- The schema of pgstore: one table of records and one function that runs
-- ratelimit.Evaluate over them in one statement. {{table}}, {{index}} and
-- {{apply}} are replaced by quoted identifiers before this runs.
--
-- The arithmetic follows state.go operation for operation (multiply
-- before dividing, left to right, every step rounded to float8), so that
-- the function gives the Go function's results to the last bit; the
-- differential tests of store/storetest check that it does.

CREATE TABLE IF NOT EXISTS {{table}} (
	id      bytea PRIMARY KEY, -- SHA-256 of the record's (name, key, shard)
	name    bytea NOT NULL,
	key     bytea NOT NULL,
	shard   integer NOT NULL,
	value   double precision,  -- NULL: a placeholder, which reads as missing
	ts      bigint,
	expires bigint NOT NULL    -- Unix ms from which the bucket is full again
);

CREATE INDEX IF NOT EXISTS {{index}} ON {{table}} (expires);

CREATE OR REPLACE FUNCTION {{apply}}(
	p_mode integer,        -- 0 limit, 1 check, 2 refund
	p_now bigint,          -- Unix ms; NULL: the server's clock
	p_reserve boolean,
	p_count float8[],      -- per item
	p_nshards integer[],   -- per item: 1 or 2
	p_id bytea[],          -- per record, in the order of Op.AppendRecordIDs
	p_name bytea[],
	p_key bytea[],
	p_shard integer[],
	p_kind integer[],      -- 1 fixed window, 2 token bucket
	p_rate float8[],
	p_period bigint[],
	p_capacity float8[],
	p_maxr float8[],
	p_phase bigint[]
) RETURNS TABLE (ok boolean, retry bigint, remaining float8, charged0 float8, charged1 float8)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
	noise    CONSTANT float8 := 1e-9;
	maxretry CONSTANT float8 := 9223372036854;       -- ratelimit.MaxRetryAfter
	never    CONSTANT bigint := 9223372036854775807; -- ratelimit.Never
	now      bigint := p_now;
	nrec     integer := coalesce(array_length(p_id, 1), 0);
	nitem    integer := coalesce(array_length(p_count, 1), 0);
	fnd      boolean[] := array_fill(false, ARRAY[greatest(nrec, 1)]);
	val      float8[] := array_fill(0::float8, ARRAY[greatest(nrec, 1)]);
	tss      bigint[] := array_fill(0::bigint, ARRAY[greatest(nrec, 1)]);
	nval     float8[] := array_fill(0::float8, ARRAY[greatest(nrec, 1)]);
	nts      bigint[] := array_fill(0::bigint, ARRAY[greatest(nrec, 1)]);
	wr       boolean[] := array_fill(false, ARRAY[greatest(nrec, 1)]);
	o_ok     boolean[] := '{}';
	o_retry  bigint[] := '{}';
	o_rem    float8[] := '{}';
	o_c0     float8[] := '{}';
	o_c1     float8[] := '{}';
	rec      record;
	r        integer;
	i        integer;
	j        integer;
	n        integer;
	cnt      float8;
	ok_      boolean;
	all_ok   boolean := true;
	-- per shard, a and b
	ka integer; ra float8; pa bigint; ca float8; ma float8; pha bigint;
	kb integer; rb float8; pb bigint; cb float8; mb float8; phb bigint;
	sva float8; sta bigint; svb float8; stb bigint;
	va float8; vb float8; na float8; nb float8; x float8;
	da float8; db float8; w float8; wb float8;
	t bigint; k bigint; off bigint; rem float8; c0 float8; c1 float8; rt float8;
	short float8; kk float8; dt float8; fullat bigint;
BEGIN
	IF now IS NULL THEN
		now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
	END IF;

	-- Read the records. Limit and refund lock them one at a time in one
	-- order, by id, so that no two calls can wait on each other in a
	-- cycle; a missing record is first inserted as a placeholder (a lock
	-- on its id from then on) by a limit, which may write it. Check reads
	-- without locks.
	FOR rec IN SELECT u.id, u.ord FROM unnest(p_id) WITH ORDINALITY AS u(id, ord) ORDER BY u.id LOOP
		r := rec.ord;
		IF p_mode = 1 THEN
			SELECT t_.value, t_.ts, t_.expires INTO sva, sta, fullat FROM {{table}} t_ WHERE t_.id = rec.id;
		ELSE
			SELECT t_.value, t_.ts, t_.expires INTO sva, sta, fullat FROM {{table}} t_ WHERE t_.id = rec.id FOR UPDATE;
			IF NOT FOUND AND p_mode = 0 THEN
				INSERT INTO {{table}} (id, name, key, shard, value, ts, expires)
					VALUES (rec.id, p_name[r], p_key[r], p_shard[r], NULL, NULL, 0)
					ON CONFLICT (id) DO NOTHING;
				SELECT t_.value, t_.ts, t_.expires INTO sva, sta, fullat FROM {{table}} t_ WHERE t_.id = rec.id FOR UPDATE;
			END IF;
		END IF;
		IF FOUND AND sva IS NOT NULL AND fullat > now THEN
			fnd[r] := true;
			val[r] := sva;
			tss[r] := sta;
		END IF;
	END LOOP;

	-- Load each record as the transition sees it: refreshed if found,
	-- fresh if missing.
	FOR r IN 1..nrec LOOP
		t := greatest(now, tss[r]);
		IF NOT fnd[r] THEN
			nval[r] := p_capacity[r];
			IF p_kind[r] = 1 THEN
				off := (now - p_phase[r]) % p_period[r];
				IF off < 0 THEN off := off + p_period[r]; END IF;
				nts[r] := now - off;
			ELSE
				nts[r] := now;
			END IF;
		ELSIF p_kind[r] = 1 THEN
			k := (t - tss[r]) / p_period[r];
			nval[r] := val[r];
			nts[r] := tss[r];
			IF k > 0 THEN
				nval[r] := least(val[r] + p_rate[r] * k::float8, p_capacity[r]);
				nts[r] := tss[r] + k * p_period[r];
			END IF;
		ELSE
			nval[r] := least(val[r] + (t - tss[r])::float8 * p_rate[r] / p_period[r]::float8, p_capacity[r]);
			nts[r] := t;
		END IF;
	END LOOP;

	r := 1;
	FOR i IN 1..nitem LOOP
		cnt := p_count[i];
		n := p_nshards[i];
		ka := p_kind[r]; ra := p_rate[r]; pa := p_period[r]; ca := p_capacity[r]; ma := p_maxr[r];
		sva := nval[r]; sta := nts[r];
		ok_ := false; rt := 0; rem := 0; c0 := 0; c1 := 0;
		IF p_mode = 2 THEN
			-- Refund: hand tokens back, capped at capacity.
			ok_ := true;
			IF fnd[r] THEN
				nval[r] := least(sva + cnt, ca);
				wr[r] := true;
				rem := nval[r];
			ELSE
				rem := ca;
			END IF;
		ELSIF n = 1 THEN
			va := sva - cnt;
			IF va < 0 AND va > -noise THEN va := 0; END IF;
			IF va >= 0 THEN
				ok_ := true;
			ELSIF p_reserve AND (ma = 0 OR -va <= ma) THEN
				ok_ := true;
				IF ka = 1 THEN w := pa::float8 * ceil(-va / ra) + (sta - now)::float8;
				ELSE w := (greatest(now, sta) - now)::float8 + -va * pa::float8 / ra; END IF;
				rt := w;
			ELSE
				da := -va;
				IF p_reserve THEN da := da - ma; END IF;
				IF ka = 1 THEN w := pa::float8 * ceil(da / ra) + (sta - now)::float8;
				ELSE w := (greatest(now, sta) - now)::float8 + da * pa::float8 / ra; END IF;
				rt := w;
				rem := sva;
			END IF;
			IF ok_ THEN
				rem := va;
				c0 := cnt;
				nval[r] := va;
				wr[r] := cnt > 0;
			END IF;
		ELSE
			-- Two shards (power of two choices), as state.go's pair.
			kb := p_kind[r + 1]; rb := p_rate[r + 1]; pb := p_period[r + 1]; cb := p_capacity[r + 1]; mb := p_maxr[r + 1];
			svb := nval[r + 1]; stb := nts[r + 1];
			va := sva - cnt;
			IF va < 0 AND va > -noise THEN va := 0; END IF;
			vb := svb - cnt;
			IF vb < 0 AND vb > -noise THEN vb := 0; END IF;
			IF va >= 0 OR vb >= 0 THEN
				ok_ := true;
				IF va >= vb THEN
					nval[r] := va; wr[r] := cnt > 0; c0 := cnt;
					rem := va + svb;
				ELSE
					nval[r + 1] := vb; wr[r + 1] := cnt > 0; c1 := cnt;
					rem := sva + vb;
				END IF;
			ELSE
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
				ok_ := na >= 0 AND nb >= 0;
				IF NOT ok_ AND p_reserve THEN
					ok_ := (ma = 0 OR -na <= ma) AND (mb = 0 OR -nb <= mb);
				END IF;
				IF NOT ok_ THEN
					da := cnt - sva; db := cnt - svb;
					IF p_reserve THEN da := da - ma; db := db - mb; END IF;
					IF ka = 1 THEN w := pa::float8 * ceil(da / ra) + (sta - now)::float8;
					ELSE w := (greatest(now, sta) - now)::float8 + da * pa::float8 / ra; END IF;
					IF kb = 1 THEN wb := pb::float8 * ceil(db / rb) + (stb - now)::float8;
					ELSE wb := (greatest(now, stb) - now)::float8 + db * pb::float8 / rb; END IF;
					rt := greatest(w, wb);
					rem := sva + svb;
				ELSE
					c0 := sva - na; c1 := svb - nb;
					w := 0;
					IF na < 0 THEN
						IF ka = 1 THEN w := pa::float8 * ceil(-na / ra) + (sta - now)::float8;
						ELSE w := (greatest(now, sta) - now)::float8 + -na * pa::float8 / ra; END IF;
					END IF;
					IF nb < 0 THEN
						IF kb = 1 THEN wb := pb::float8 * ceil(-nb / rb) + (stb - now)::float8;
						ELSE wb := (greatest(now, stb) - now)::float8 + -nb * pb::float8 / rb; END IF;
						w := greatest(w, wb);
					END IF;
					rt := w;
					rem := na + nb;
					nval[r] := na; wr[r] := c0 > 0;
					nval[r + 1] := nb; wr[r + 1] := c1 > 0;
				END IF;
			END IF;
		END IF;
		-- Retry-after: rounded up to whole ms, within [0, MaxRetryAfter].
		rt := ceil(rt);
		IF rt = 'NaN'::float8 OR NOT (rt > 0) THEN rt := 0;
		ELSIF rt >= maxretry THEN rt := maxretry; END IF;
		o_ok := o_ok || ok_;
		o_retry := o_retry || rt::bigint;
		o_rem := o_rem || rem;
		o_c0 := o_c0 || c0;
		o_c1 := o_c1 || c1;
		all_ok := all_ok AND ok_;
		r := r + n;
	END LOOP;

	-- Write: every marked record of a refund, or of a limit whose items
	-- are all OK; a check writes nothing.
	IF p_mode = 2 OR (p_mode = 0 AND all_ok) THEN
		FOR r IN 1..nrec LOOP
			CONTINUE WHEN NOT wr[r];
			-- FullAt: the first ms at which the bucket is full again.
			IF nval[r] >= p_capacity[r] THEN
				fullat := nts[r];
			ELSE
				fullat := never;
				short := p_capacity[r] - nval[r];
				IF p_kind[r] = 1 THEN
					kk := ceil(short / p_rate[r]);
					FOR j IN 1..3 LOOP
						IF nval[r] + p_rate[r] * kk >= p_capacity[r] THEN
							IF p_period[r]::float8 * kk < (never - nts[r])::float8 THEN
								fullat := nts[r] + (p_period[r]::float8 * kk)::bigint;
							END IF;
							EXIT;
						END IF;
						kk := kk + 1;
					END LOOP;
				ELSE
					dt := ceil(short * p_period[r]::float8 / p_rate[r]);
					FOR j IN 1..3 LOOP
						IF nval[r] + dt * p_rate[r] / p_period[r]::float8 >= p_capacity[r] THEN
							IF dt < (never - nts[r])::float8 THEN
								fullat := nts[r] + dt::bigint;
							END IF;
							EXIT;
						END IF;
						dt := dt + 1;
					END LOOP;
				END IF;
			END IF;
			UPDATE {{table}} SET value = nval[r], ts = nts[r], expires = fullat WHERE id = p_id[r];
		END LOOP;
	END IF;

	RETURN QUERY SELECT * FROM unnest(o_ok, o_retry, o_rem, o_c0, o_c1);
END
$fn$;
