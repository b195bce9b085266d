package pgstore

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
)

// A batch of plain ops (plainBatch: limits or checks of one item on one
// record each, judged at the Limiter's clock, without reservation or
// settlement, no record twice, limits of one kind) goes as one set-based
// statement (manySQL) rather than a call of _apply. It locks the batch's
// records in ascending id order, the order _apply locks in, so that
// neither can wait on the other in a cycle; computes each granted limit's
// next state in SQL expressions, those of _one and of the lone upsert; and
// writes it. It returns the records as locked, and the Go transition
// decides each op on its record, as the SQL did for the writes. An op
// whose record the statement locked but could not read (inserted by
// another transaction after the statement began) is decided again by
// _apply.

// manyBuf holds the arrays of a set-based statement.
type manyBuf struct {
	order  []*request
	redo   []*request
	ids    [][]byte
	names  [][]byte
	keys   [][]byte
	shards []int32
	now    []int64
	count  []float64
	rate   []float64
	period []int64
	capa   []float64
	fv     []*float64
	fts    []*int64
	fex    []*int64
	write  []bool
	fresh  []driver.State
	ex     []int64
	got    []int32
	v      []*float64
	ts     []*int64
}

var manyBufs = sync.Pool{New: func() any { return new(manyBuf) }}

// plainBatch reports whether reqs can go as one set-based statement, and
// whether their limits are fixed windows.
func plainBatch(reqs []*request) (ok, fixed bool) {
	for i, r := range reqs {
		if !r.single() || r.flags&(flagReserve|flagServerTime) != 0 {
			return false, false
		}
		f := r.items[0].recs[0].params.Kind == driver.FixedWindow
		if i == 0 {
			fixed = f
		} else if f != fixed {
			return false, false
		}
	}
	return true, fixed
}

// sendMany decides a plain batch with one set-based statement, and
// reports whether it could: not if a record appears twice. Ops it could
// not decide go to _apply.
func (s *Store) sendMany(ctx context.Context, reqs []*request, fixed bool) (bool, error) {
	b := manyBufs.Get().(*manyBuf)
	defer manyBufs.Put(b)
	defer func() { clear(b.order); clear(b.redo); clear(b.ids); clear(b.names); clear(b.keys) }()
	b.order = append(b.order[:0], reqs...)
	slices.SortFunc(b.order, func(x, y *request) int {
		return bytes.Compare(x.items[0].recs[0].id[:], y.items[0].recs[0].id[:])
	})
	for i := 1; i < len(b.order); i++ {
		if b.order[i-1].items[0].recs[0].id == b.order[i].items[0].recs[0].id {
			return false, nil // a record twice: decided in turn by _apply
		}
	}
	n := len(b.order)
	b.ids, b.names, b.keys, b.shards = b.ids[:0], b.names[:0], b.keys[:0], b.shards[:0]
	b.now, b.count, b.rate, b.period, b.capa = b.now[:0], b.count[:0], b.rate[:0], b.period[:0], b.capa[:0]
	b.fv, b.fts, b.fex, b.write = b.fv[:0], b.fts[:0], b.fex[:0], b.write[:0]
	b.fresh = slices.Grow(b.fresh[:0], n)[:n]
	b.ex = slices.Grow(b.ex[:0], n)[:n]
	for i, r := range b.order {
		it := &r.items[0]
		rec := &it.recs[0]
		p := &rec.params
		b.ids = append(b.ids, rec.id[:])
		b.names = append(b.names, []byte(rec.name))
		b.keys = append(b.keys, []byte(rec.key))
		b.shards = append(b.shards, rec.shard)
		b.now = append(b.now, r.now)
		b.count = append(b.count, it.count)
		b.rate = append(b.rate, p.Rate)
		b.period = append(b.period, p.Period)
		b.capa = append(b.capa, p.Capacity)
		limit := driver.Mode(r.flags&3) == driver.ModeLimit
		b.write = append(b.write, limit)
		// The record's next state if it is missing.
		var fd driver.Decision
		b.fresh[i] = ratelimit.TransitionInto(&fd, p, driver.State{}, false, r.now, it.count, false)
		if limit && fd.OK && it.count > 0 {
			b.ex[i] = ratelimit.FullAt(*p, b.fresh[i])
			b.fv, b.fts, b.fex = append(b.fv, &b.fresh[i].Remaining), append(b.fts, &b.fresh[i].TS), append(b.fex, &b.ex[i])
		} else {
			b.fv, b.fts, b.fex = append(b.fv, nil), append(b.fts, nil), append(b.fex, nil)
		}
	}
	k := 0
	if fixed {
		k = 2
	}
	args := []any{b.ids, b.names, b.keys, b.shards, b.now, b.count, b.rate, b.period, b.capa, b.fv, b.fts, b.fex, b.write}
	if wait := lockWait(ctx); wait > 0 {
		k++
		args = append(args, strconv.Itoa(int(wait))+"ms")
	}
	if err := s.pool.QueryRow(ctx, s.manySQL[k], args...).Scan(&b.got, &b.v, &b.ts); err != nil {
		return true, err
	}
	if len(b.got) != n || len(b.v) != n || len(b.ts) != n {
		return true, fmt.Errorf("the statement answered %d records for %d", len(b.got), n)
	}
	b.redo = b.redo[:0]
	for i, r := range b.order {
		it := &r.items[0]
		switch b.got[i] {
		case 1: // inserted: the record was missing
			decideRead(&r.out[0], &it.recs[0].params, nil, nil, r.now, it.count, false)
		case 2:
			decideRead(&r.out[0], &it.recs[0].params, b.v[i], b.ts[i], r.now, it.count, false)
		default:
			b.redo = append(b.redo, r)
		}
	}
	if len(b.redo) > 0 {
		return true, s.sendApply(ctx, b.redo)
	}
	return true, nil
}

// manySQL returns the set-based statement of a batch of plain ops (see
// plainBatch) on table, of limits of one kind.
//
// Parameters, one element per op, in ascending order of id:
//
//	$1 id, $2 name, $3 key, $4 shard, $5 now, $6 count, $7 rate,
//	$8 period, $9 capacity, $10, $11, $12 the record's state and FullAt
//	if it is missing and the op writes it (NULL: the op does not write a
//	missing record), $13 whether the op is a limit; with wait, $14 the
//	lock_timeout
//
// An INSERT of the batch's records in ascending id order locks them all in
// that order, as _apply does: it inserts a missing record with its next
// state (or a placeholder if the op writes nothing), and its ON CONFLICT
// locks a record that exists. The records that existed are then read as
// locked (the newest version) and the granted limits' next states written.
// It returns, per op in id order: 1 if it inserted the record, 2 if it read
// it, 0 if neither (a record inserted by another transaction after this
// statement's snapshot: locked, but not visible to it), and the value and
// ts of each record read.
func manySQL(table string, fixed, wait bool) string {
	noise := strconv.FormatFloat(driver.Noise, 'g', -1, 64) + "::float8"
	never := strconv.FormatInt(driver.Never, 10) + "::bigint"
	span := strconv.FormatInt(driver.Never-driver.MaxTime, 10) + "::float8"
	const (
		now    = "u.now"
		count  = "u.cnt"
		rate   = "u.rate"
		period = "u.period"
		capa   = "u.cap"
	)
	var va, ts string
	if fixed {
		n := "((greatest(" + now + ", u.t0) - u.t0) / " + period + ")"
		va = "(least(CASE WHEN " + n + " > 0 THEN u.v0 + " + rate + " * " + n + "::float8 ELSE u.v0 END, " + capa + ") - " + count + ")"
		ts = "(u.t0 + " + n + " * " + period + ")"
	} else {
		va = "(least(u.v0 + (greatest(" + now + ", u.t0) - u.t0)::float8 * " + rate + " / " + period + "::float8, " + capa + ") - " + count + ")"
		ts = "greatest(" + now + ", u.t0)"
	}
	var fullAt, first string
	if fixed {
		first = "ceil((n.cap - n.v) / n.rate)"
		fullAt = "CASE WHEN n.v >= n.cap THEN n.t"
		for i := range 3 {
			kk := "(f.dt + " + strconv.Itoa(i) + ")"
			fullAt += " WHEN n.v + n.rate * " + kk + " >= n.cap" +
				" THEN CASE WHEN n.period::float8 * " + kk + " < " + span +
				" THEN n.t + (n.period::float8 * " + kk + ")::bigint ELSE " + never + " END"
		}
	} else {
		first = "ceil((n.cap - n.v) * n.period::float8 / n.rate)"
		fullAt = "CASE WHEN n.v >= n.cap THEN n.t"
		for i := range 3 {
			dt := "(f.dt + " + strconv.Itoa(i) + ")"
			fullAt += " WHEN n.v + " + dt + " * n.rate / n.period::float8 >= n.cap" +
				" THEN CASE WHEN " + dt + " < " + span + " THEN n.t + " + dt + "::bigint ELSE " + never + " END"
		}
	}
	fullAt += " ELSE " + never + " END"

	var b strings.Builder
	lock := ""
	if wait { // bound the lock wait before the first lock
		lock = " WHERE (SELECT set_config('lock_timeout', $14::text, true)) IS NOT NULL"
	}
	b.WriteString("WITH i AS (INSERT INTO " + table + " AS t (id, name, key, shard, value, ts, expires)")
	b.WriteString(" SELECT f.id, f.name, f.key, f.shard, f.fv, f.fts, coalesce(f.fex, 0) FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::integer[], $10::float8[], $11::bigint[], $12::bigint[])")
	b.WriteString(" AS f(id, name, key, shard, fv, fts, fex)" + lock + " ORDER BY f.id")
	b.WriteString(" ON CONFLICT (id) DO UPDATE SET shard = excluded.shard WHERE false RETURNING t.id), ")
	b.WriteString("l AS (SELECT t.id, t.value, t.ts FROM " + table + " t WHERE t.id = ANY ($1::bytea[]) AND (SELECT count(*) FROM i) >= 0 ORDER BY t.id FOR NO KEY UPDATE), ")
	b.WriteString("u AS (SELECT u.*, l.value AS v0, l.ts AS t0 FROM unnest($1::bytea[], $5::bigint[], $6::float8[], $7::float8[], $8::bigint[], $9::float8[], $10::float8[], $11::bigint[], $12::bigint[], $13::boolean[])")
	b.WriteString(" AS u(id, now, cnt, rate, period, cap, fv, fts, fex, w) JOIN l ON l.id = u.id), ")
	b.WriteString("r AS (SELECT u.id, u.rate, u.period, u.cap, " + va + " AS va, " + ts + " AS t FROM u WHERE u.w AND u.cnt > 0 AND u.v0 IS NOT NULL OFFSET 0), ")
	b.WriteString("n AS (SELECT r.id, r.rate, r.period, r.cap, CASE WHEN r.va < 0 AND r.va > -" + noise + " THEN 0::float8 ELSE r.va END AS v, r.t FROM r WHERE r.va > -" + noise + " OFFSET 0), ")
	b.WriteString("x AS (SELECT n.id, n.v, n.t, " + fullAt + " AS ex FROM n, LATERAL (SELECT " + first + " AS dt OFFSET 0) f")
	b.WriteString(" UNION ALL SELECT u.id, u.fv, u.fts, u.fex FROM u WHERE u.w AND u.v0 IS NULL AND u.fv IS NOT NULL), ")
	b.WriteString("w AS (UPDATE " + table + " t SET value = x.v, ts = x.t, expires = x.ex FROM x WHERE t.id = x.id) ")
	b.WriteString("SELECT array_agg(CASE WHEN l.id IS NOT NULL THEN 2 WHEN i.id IS NOT NULL THEN 1 ELSE 0 END ORDER BY q.id),")
	b.WriteString(" array_agg(l.value ORDER BY q.id), array_agg(l.ts ORDER BY q.id)")
	b.WriteString(" FROM unnest($1::bytea[]) AS q(id) LEFT JOIN l ON l.id = q.id LEFT JOIN i ON i.id = q.id")
	return b.String()
}
