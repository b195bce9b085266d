package pgstore

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
)

// A lone call (one limit or check of one item on one record, judged at the
// Limiter's clock) goes as one plain statement rather than a call of the
// function _one, which costs the server about twice the CPU of an upsert:
// a PL/pgSQL call pays for its frame and prepares each expression anew in
// every transaction.
//
// A check, a call of no tokens, or one that a full bucket would refuse
// writes nothing: it reads the record (readSQL) and runs the Go transition
// on it. Any other limit runs, unless the fresh upsert below decides it
// first, an upsert (loneSQL) that
//
//   - reads the record in the statement's snapshot, and decides on it:
//     a refusal writes nothing and locks nothing, so that its transaction
//     commits without waiting for the disk;
//   - otherwise inserts the record's next state, or, when the record
//     exists, updates it under its row lock with the transition computed
//     on the row as locked (READ COMMITTED's ON CONFLICT DO UPDATE sees
//     the newest version), only if the call is still OK on it.
//
// It returns the written state, if any, first, then the record as read.
// The decision is the Go transition's on the record read when nothing was
// written, and follows from the written state otherwise; when the record
// read would grant the call but the newer row refused it, the call is
// decided again by _one. The SQL of the transition is that of _one,
// expression for expression, so that it stays equal to Go to the last bit.
//
// A plain INSERT ... ON CONFLICT has no plan to choose: it reaches the row
// through the primary key's index whatever the table's statistics.
//
// The plain statements (these, the batch upsert of many.go, the read)
// run under the connection's search_path, where the functions run under
// their own (schema.sql). So they name the functions they call with
// pg_catalog, and give every operator operands of one type, of which
// pg_catalog has the operator: a function or an operator of another
// schema of the path that takes the arguments' types more exactly than
// pg_catalog's (float8 + integer, unnest(bytea[]) against
// unnest(anyarray)) would be chosen over it, even with pg_catalog searched
// first. greatest, least and coalesce are SQL's own, not functions. A
// bare operator or type name would still be that of the first schema of
// search_path that has one: a search_path that lists pg_catalog after a
// schema that others may create objects in would expose these statements.
// So they name every operator with pg_catalog too (op, and no BETWEEN,
// whose operators are bare), and every type but those that SQL's keywords
// name (bigint, integer, boolean), which are pg_catalog's whatever the
// path (TestOperatorsOfASchemaBeforePgCatalog).

// loneKind indexes the upsert's variants: the kind of limit, whether the
// call reserves (with or without a bound on the debt), and whether the
// statement bounds its lock wait.
type loneKind struct {
	fixed   bool
	reserve int // 0 none, 1 bounded debt, 2 unbounded debt
	wait    bool
}

func (k loneKind) index() int {
	i := k.reserve * 4
	if k.fixed {
		i += 2
	}
	if k.wait {
		i++
	}
	return i
}

// The parameters of a lone upsert.
const (
	pID      = "$1" + tBytea
	pName    = "$2" + tBytea
	pKey     = "$3" + tBytea
	pShard   = "$4::integer"
	pNow     = "$5::bigint"
	pCount   = "$6" + tFloat8
	pRate    = "$7" + tFloat8
	pPeriod  = "$8::bigint"
	pCap     = "$9" + tFloat8
	pFreshV  = "$10" + tFloat8
	pFreshTS = "$11::bigint"
	pFreshEx = "$12::bigint"
	pMaxR    = "$13" + tFloat8 // a bounded reservation's
)

// Casts to the types of PostgreSQL whose names are not SQL keywords.
const (
	tFloat8 = "::pg_catalog.float8"
	tBytea  = "::pg_catalog.bytea"
	tText   = "::pg_catalog.text"
)

// op returns a o b, parenthesized, with PostgreSQL's operator o: the
// operator of pg_catalog whatever search_path, where a bare one is that of
// the first schema of the path that has one of its name and operand
// types. (OPERATOR() takes the precedence of any other operator, hence
// the parentheses.)
func op(a, o, b string) string { return "(" + a + " OPERATOR(pg_catalog." + o + ") " + b + ")" }

// transition writes out, in SQL, the transition of a limit of one record
// as _one computes it, operation for operation, on operands given as SQL
// expressions: the call's time and count, and its limit's rate, period
// and capacity (and max reserved, for a bounded reservation).
type transition struct {
	fixed                                bool
	reserve                              int // as loneKind's
	now, count, rate, period, capa, maxr string
}

// refresh returns the record (v0, t0) refreshed to now as state.go's
// refresh computes it: the tokens before the cap at capacity, and the
// refreshed time.
func (x transition) refresh(v0, t0 string) (v, ts string) {
	if x.fixed {
		n := op(op("greatest("+x.now+", "+t0+")", "-", t0), "/", x.period)
		return "CASE WHEN " + op(n, ">", "0::bigint") + " THEN " + op(v0, "+", op(x.rate, "*", n+tFloat8)) + " ELSE " + v0 + " END",
			op(t0, "+", op(n, "*", x.period))
	}
	return op(v0, "+", op(op(op("greatest("+x.now+", "+t0+")", "-", t0)+tFloat8, "*", x.rate), "/", x.period+tFloat8)),
		"greatest(" + x.now + ", " + t0 + ")"
}

// va returns the tokens left after the call on the record (v0, t0),
// refreshed to now, before the noise is cut; ts the refreshed time.
func (x transition) va(v0, t0 string) (va, ts string) {
	v, ts := x.refresh(v0, t0)
	return op("least("+v+", "+x.capa+")", "-", x.count), ts
}

// ok: whether the call is granted on a record left with va.
func (x transition) ok(va string) string {
	switch x.reserve {
	case 1:
		return "(" + op(va, ">", sqlNegNoise) + " OR " + op(op(va, "+", x.maxr), ">", sqlNegNoise) + ")"
	case 2:
		return "true"
	}
	return op(va, ">", sqlNegNoise)
}

// fullAt returns FullAt of the state (n.v, n.t), with f.dt the first try,
// and that first try.
func (x transition) fullAt() (fullAt, first string) {
	never := strconv.FormatInt(driver.Never, 10) + "::bigint"
	span := strconv.FormatInt(driver.Never-driver.MaxTime, 10) + tFloat8
	fullAt = "CASE WHEN " + op("n.v", ">=", x.capa) + " THEN n.t"
	if x.fixed {
		first = "pg_catalog.ceil(" + op(op(x.capa, "-", "n.v"), "/", x.rate) + ")"
		for i := range 3 {
			kk := op("f.dt", "+", strconv.Itoa(i)+tFloat8)
			fullAt += " WHEN " + op(op("n.v", "+", op(x.rate, "*", kk)), ">=", x.capa) +
				" THEN CASE WHEN " + op(op(x.period+tFloat8, "*", kk), "<", span) +
				" THEN " + op("n.t", "+", op(x.period+tFloat8, "*", kk)+"::bigint") + " ELSE " + never + " END"
		}
	} else {
		first = "pg_catalog.ceil(" + op(op(op(x.capa, "-", "n.v"), "*", x.period+tFloat8), "/", x.rate) + ")"
		for i := range 3 {
			dt := op("f.dt", "+", strconv.Itoa(i)+tFloat8)
			fullAt += " WHEN " + op(op("n.v", "+", op(op(dt, "*", x.rate), "/", x.period+tFloat8)), ">=", x.capa) +
				" THEN CASE WHEN " + op(dt, "<", span) + " THEN " + op("n.t", "+", dt+"::bigint") + " ELSE " + never + " END"
		}
	}
	return fullAt + " ELSE " + never + " END", first
}

// sound returns the SQL of whether the record (v, ts), not a placeholder,
// is one that a release writes (driver.CheckState): v finite (NaN − NaN
// and Infinity − Infinity are NaN), ts within the times of any op (NULL
// reads as not). Where it is false, a statement writes nothing, and the
// Go side, reading the record, fails the call (checkRow).
func sound(v, ts string) string {
	return "(" + op(op(v, "-", v), "=", "0"+tFloat8) + " AND " + op(ts, ">=", "("+sqlMinTS+")") + " AND " + op(ts, "<=", sqlMaxTS) + ")"
}

// set returns the SET of an ON CONFLICT DO UPDATE on the row c that writes
// the state after the call computed by x on it, or excluded's state (the
// record's fresh one) if c is a placeholder; and the WHERE that lets only
// a granted call on a sound record write.
func (x transition) set() (set, where string) {
	cva, cts := x.va("c.value", "c.ts")
	fullAt, first := x.fullAt()
	set = "(value, ts, expires) = (SELECT " +
		"CASE WHEN c.value IS NULL THEN excluded.value ELSE n.v END, " +
		"CASE WHEN c.value IS NULL THEN excluded.ts ELSE n.t END, " +
		"CASE WHEN c.value IS NULL THEN excluded.expires ELSE " + fullAt + " END" +
		" FROM (SELECT CASE WHEN " + op("r.va", "<", "0"+tFloat8) + " AND " + op("r.va", ">", sqlNegNoise) + " THEN 0" + tFloat8 + " ELSE r.va END AS v, r.t" +
		" FROM (SELECT " + cva + " AS va, " + cts + " AS t OFFSET 0) r OFFSET 0) n," +
		" LATERAL (SELECT " + first + " AS dt OFFSET 0) f)"
	return set, "c.value IS NULL OR (" + sound("c.value", "c.ts") + " AND " + x.ok(cva) + ")"
}

// sqlNegNoise is -driver.Noise as SQL: a literal, where a minus before
// the cast would be an operator.
var sqlNegNoise = "'" + strconv.FormatFloat(-driver.Noise, 'g', -1, 64) + "'" + tFloat8

// loneSQL returns the upsert of a lone limit of kind k on table.
func loneSQL(table string, k loneKind) string {
	x := transition{fixed: k.fixed, reserve: k.reserve, now: pNow, count: pCount, rate: pRate, period: pPeriod, capa: pCap, maxr: pMaxR}
	set, where := x.set()
	sva, _ := x.va("s.value", "s.ts")
	gate := "s.value IS NULL OR (" + sound("s.value", "s.ts") + " AND " + x.ok(sva) + ")"
	if k.wait {
		n := 13 // the last parameter
		if k.reserve == 1 {
			n++
		}
		gate = "(" + gate + ") AND pg_catalog.set_config('lock_timeout', $" + strconv.Itoa(n) + tText + ", true) IS NOT NULL"
	}
	var b strings.Builder
	b.WriteString("WITH s AS (SELECT value, ts FROM " + table + " WHERE " + op("id", "=", pID) + "), ")
	b.WriteString("w AS (INSERT INTO " + table + " AS c (id, name, key, shard, value, ts, expires) ")
	b.WriteString("SELECT " + pID + ", " + pName + ", " + pKey + ", " + pShard + ", " + pFreshV + ", " + pFreshTS + ", " + pFreshEx)
	b.WriteString(" FROM (SELECT) o LEFT JOIN s ON true WHERE " + gate)
	b.WriteString(" ON CONFLICT (id) DO UPDATE SET " + set)
	b.WriteString(" WHERE " + where)
	b.WriteString(" RETURNING value, ts) ")
	b.WriteString("SELECT value, ts, true FROM w UNION ALL SELECT value, ts, false FROM s")
	return b.String()
}

// The fresh upsert of a lone limit writes the record's fresh next state,
// computed in Go, and decides nothing in SQL: it writes only where the
// record, refreshed to now under the call's limit, is what a missing
// record is (state.go's fresh), so that the transition on it is the
// transition on a missing record, which Go has computed. That is a
// placeholder, or a record whose refreshed time is the fresh one and
// whose tokens, before the cap, reach the capacity: the refresh then caps
// them to exactly the capacity. For a token bucket that is a record not
// ahead of now and full again; for a fixed window, one whose windows start
// where the limit's phase puts them now, full again. The refresh is
// transition's, so that the test is Go's to the last bit; the expires
// written is not read, since limits may change between calls.
//
// Its SET is three columns of excluded, where the full upsert's computes
// the transition: the server prepares its expressions anew at every
// execution, and they are most of the statement's cost above a bare
// upsert. A record that is not full writes nothing (its row was locked
// and is left as it was) and the call goes as the full upsert. Most
// records of a limit on many keys are full again when called; the Store's
// hint (fullHint) sends a record that it last saw short of tokens to the
// full upsert first.

// The parameters of a fresh upsert: a lone upsert's but the count (and
// the max reserved), renumbered; $12 the lock_timeout, with wait.
const (
	fNow     = "$5::bigint"
	fRate    = "$6" + tFloat8
	fPeriod  = "$7::bigint"
	fCap     = "$8" + tFloat8
	fFreshV  = "$9" + tFloat8
	fFreshTS = "$10::bigint"
	fFreshEx = "$11::bigint"
)

// freshSQL returns the fresh upsert of a lone limit on table, on a fixed
// window or a token bucket, bounding its lock wait with wait.
func freshSQL(table string, fixed, wait bool) string {
	x := transition{fixed: fixed, now: fNow, rate: fRate, period: fPeriod, capa: fCap}
	v, ts := x.refresh("c.value", "c.ts")
	var b strings.Builder
	b.WriteString("INSERT INTO " + table + " AS c (id, name, key, shard, value, ts, expires) ")
	if wait {
		b.WriteString("SELECT " + pID + ", " + pName + ", " + pKey + ", " + pShard + ", " + fFreshV + ", " + fFreshTS + ", " + fFreshEx +
			" WHERE pg_catalog.set_config('lock_timeout', $12" + tText + ", true) IS NOT NULL")
	} else {
		b.WriteString("VALUES (" + pID + ", " + pName + ", " + pKey + ", " + pShard + ", " + fFreshV + ", " + fFreshTS + ", " + fFreshEx + ")")
	}
	b.WriteString(" ON CONFLICT (id) DO UPDATE SET value = excluded.value, ts = excluded.ts, expires = excluded.expires")
	b.WriteString(" WHERE c.value IS NULL OR (" + sound("c.value", "c.ts") + " AND " + op(ts, "=", fFreshTS) + " AND " + op(v, ">=", fCap) + ")")
	return b.String()
}

// freshIndex indexes the fresh upserts' variants: a fixed window's or a
// token bucket's, bounding its lock wait or not.
func freshIndex(fixed, wait bool) int {
	i := 0
	if fixed {
		i = 2
	}
	if wait {
		i++
	}
	return i
}

// hintSlots is how many records' hints a Store keeps.
const hintSlots = 1024

// fullHint is where the hint of a record is kept: FullAt of the last
// state of it that the store wrote or read, under the limit of that call;
// 0 for none. Records share slots, so a hint may be another record's: it
// only chooses which statement goes first, never a decision.
func (s *Store) fullHint(id *[32]byte) *atomic.Int64 {
	return &s.hints[(uint(id[0])|uint(id[1])<<8)%hintSlots]
}

// errRaced reports that a lone upsert found its record changed since it
// read it, and did not write: the call is decided again.
var errRaced = errors.New("pgstore: the record changed under a lone call")

// sendLone decides a single request (see single) judged at the Limiter's
// clock with a plain statement; see the comment above loneKind.
// The function _one, sent after a lone upsert that raced, bounds its lock
// wait as a statement sent after it (waits.then).
func (s *Store) sendLone(ctx context.Context, r *request) error {
	var w waits
	err := s.lone(ctx, r, &w)
	if errors.Is(err, errRaced) {
		return s.sendOne(ctx, r, w.then())
	}
	return err
}

// lone sends r's plain statements, and leaves in w the lock wait of the
// last it sent that bounds one.
func (s *Store) lone(ctx context.Context, r *request, w *waits) error {
	it := &r.items[0]
	rec := &it.recs[0]
	p := &rec.params
	mode := driver.Mode(r.flags & 3)
	reserve := r.flags&flagReserve != 0
	d := &r.out[0]

	// The record's next state if it is missing.
	var fd driver.Decision
	fs := ratelimit.TransitionInto(&fd, p, driver.State{}, false, r.now, it.count, reserve)
	var (
		a   args
		row row
	)
	if mode == driver.ModeCheck || it.count <= 0 || !fd.OK {
		// Nothing to write: a full bucket would refuse it.
		a.bytea(rec.id[:])
		if _, err := s.run(ctx, &s.readSQL, &a, &row); err != nil {
			return err
		}
		st, found, err := s.readState(rec.id[:], &row)
		if err != nil {
			return err
		}
		s.noteRead(s.fullHint(&rec.id), p, st, found)
		decideRead(d, p, st, found, r.now, it.count, reserve)
		return nil
	}
	k := loneKind{fixed: p.Kind == driver.FixedWindow}
	if reserve {
		k.reserve = 2
		if p.MaxReserved != 0 {
			k.reserve = 1
		}
	}
	*w = newWaits(ctx)
	k.wait = w.ms > 0
	fex := ratelimit.FullAt(*p, fs)
	hint := s.fullHint(&rec.id)
	a.bytea(rec.id[:])
	a.byteaS(rec.name)
	a.byteaS(rec.key)
	a.integer(rec.shard)
	a.bigint(r.now)
	if hint.Load() <= r.now {
		// Probably full again: the fresh upsert, whose decision is the
		// transition on a missing record, fd, if it writes.
		f := a // the first five parameters are the lone upsert's
		f.limitAndFresh(p, fs, fex)
		if k.wait {
			f.text(waitText(w.ms))
			f.wait = *w
		}
		tag, err := s.run(ctx, &s.freshSQL[freshIndex(k.fixed, k.wait)], &f, nil)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			*d = fd
			d.Now, d.TS = r.now, fs.TS
			hint.Store(fex)
			return nil
		}
	}
	a.float8(it.count)
	a.limitAndFresh(p, fs, fex)
	if k.reserve == 1 {
		a.float8(p.MaxReserved)
	}
	// The upsert's lock wait is the time left now, after the fresh upsert
	// if it went first, bounded if that one's was.
	*w = w.then()
	k.wait = w.ms > 0
	if k.wait {
		a.text(waitText(w.ms))
		a.wait = *w
	}
	if _, err := s.run(ctx, &s.loneSQL[k.index()], &a, &row); err != nil {
		return err
	}
	if row.found && row.bits[2] != 0 { // written
		if row.null[0] || row.null[1] {
			return errColumns
		}
		v, ts := math.Float64frombits(row.bits[0]), int64(row.bits[1])
		decideWritten(d, p, v, ts, r.now, it.count, reserve)
		hint.Store(ratelimit.FullAt(*p, driver.State{Remaining: v, TS: ts}))
		return nil
	}
	st, found, err := s.readState(rec.id[:], &row)
	if err != nil {
		return err // a record no release writes, which the upsert left as it was
	}
	s.noteRead(hint, p, st, found)
	if decideRead(d, p, st, found, r.now, it.count, reserve) {
		return errRaced // the record read grants it: a newer row did not
	}
	return nil
}

// waitText is a lock wait of ms milliseconds as lock_timeout takes it.
func waitText(ms int32) string { return strconv.Itoa(int(ms)) + "ms" }

// readState returns the record id read as row (value, ts): found false if
// none, or a placeholder (no value); an error matching ErrBadRecord if it
// is one that no release writes (checkRow).
func (s *Store) readState(id []byte, row *row) (st driver.State, found bool, err error) {
	if !row.found || row.null[0] {
		return driver.State{}, false, nil
	}
	st = driver.State{Remaining: math.Float64frombits(row.bits[0]), TS: int64(row.bits[1])}
	if row.null[1] || driver.CheckState(st) != nil {
		ts := &st.TS
		if row.null[1] {
			ts = nil
		}
		return driver.State{}, false, s.checkRow(id, st.Remaining, ts)
	}
	return st, true, nil
}

// noteRead keeps in hint FullAt of the record read, st if found.
func (s *Store) noteRead(hint *atomic.Int64, p *driver.Params, st driver.State, found bool) {
	if !found {
		hint.Store(0)
		return
	}
	hint.Store(ratelimit.FullAt(*p, st))
}

// decideRead decides a call on the record read, st if found (not
// missing, nor a placeholder), and reports whether the decision writes.
func decideRead(d *driver.Decision, p *driver.Params, st driver.State, found bool, now int64, count float64, reserve bool) bool {
	next := ratelimit.TransitionInto(d, p, st, found, now, count, reserve)
	d.Now, d.TS = now, next.TS
	return d.OK && count > 0
}

// decideWritten is the decision of a call that left its record with v
// tokens at ts: granted, v remaining, and for a reservation the wait until
// its tokens are granted (state.go's settle).
func decideWritten(d *driver.Decision, p *driver.Params, v float64, ts, now int64, count float64, reserve bool) {
	*d = driver.Decision{OK: true, Remaining: v, Charged: [2]float64{count, 0}, Now: now, TS: ts}
	if !reserve {
		return
	}
	if v >= 0 {
		d.RetryAfter = retryMillis(float64(ts - now))
		return
	}
	// The wait until the debt is granted (state.go's wait): that of a call
	// of no tokens, refused on the written record, which the refresh to
	// now leaves as it is (its time is now's, or later, or the start of
	// now's window).
	var w driver.Decision
	ratelimit.TransitionInto(&w, p, driver.State{Remaining: v, TS: ts}, true, now, 0, false)
	d.RetryAfter = w.RetryAfter
}

// retryMillis is state.go's: a wait rounded up to whole milliseconds,
// within [0, MaxRetryAfter].
func retryMillis(w float64) int64 {
	w = math.Ceil(w)
	switch {
	case !(w > 0):
		return 0
	case w >= float64(driver.MaxRetryAfter):
		return driver.MaxRetryAfter
	}
	return int64(w)
}
