package pgstore

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
)

// A batch of plain ops on one limit (sharedBatch: limits or checks of one
// item on one token bucket each, judged at the Limiter's clock, without
// reservation or settlement, all of one limit and one count, no record
// twice) goes as one upsert (upsertSQL) rather than a call of _apply. It
// is the lone upsert of lone.go for many records at once: it reads the
// records in the statement's snapshot, and inserts or updates, in
// ascending id order (the order _apply locks in, so that neither can wait
// on the other in a cycle), those whose call the record read would grant;
// the update computes the transition on the row as locked, and writes only
// if the call is still granted there. A refusal on the record read writes
// and locks nothing. The Go transition decides each op on the record read
// when nothing was written, and follows from the state written otherwise.
// An op that the record read would grant but the newer row refused is
// decided again by _apply.

// manyBuf holds the arrays of a batch's upsert.
type manyBuf struct {
	order  []*request
	redo   []*request
	ids    [][]byte
	names  [][]byte
	keys   [][]byte
	shards []int32
	now    []int64
	fresh  []float64
	ex     []int64
	write  []bool
	wrote  []bool
	v      []*float64
	ts     []*int64
}

var manyBufs = sync.Pool{New: func() any { return new(manyBuf) }}

// upsertSQL returns the statement of a batch of plain ops on token
// buckets that share one limit and one count (see sharedBatch): one
// INSERT … ON CONFLICT DO UPDATE of the batch's records in ascending id
// order, each op's the lone upsert's (lone.go). The time of an op reaches
// the DO UPDATE as its record's fresh time, excluded.ts: a token bucket's
// fresh record is stamped with the call's time.
//
// Parameters, one element per op in ascending order of id: $1 id, $2 name,
// $3 key, $4 shard, $5 now, $6 the record's state if it is missing and
// the op writes it, $7 its FullAt, $8 whether the op may write (a limit
// that a missing record would grant); then the count, rate, period and
// capacity, $9 to $12; with wait, $13 the lock_timeout.
//
// The unnest of several arrays is left without its schema: PostgreSQL
// makes it pg_catalog.unnest of each (a call named with the schema would
// find no function of eight arguments). See lone.go on names.
//
// It returns, per op: whether it wrote, and the record's value and ts, as
// written or else as read in the statement's snapshot. The read goes
// through the function <table>_read (schema.sql), whose plan reaches the
// records through the primary key: a plain SELECT here, planned while the
// table was small, would scan the whole table at every batch once it has
// grown.
func upsertSQL(table, read string, wait bool) string {
	x := transition{now: "excluded.ts", count: "$9" + tFloat8, rate: "$10" + tFloat8, period: "$11::bigint", capa: "$12" + tFloat8}
	set, where := x.set()
	g := x
	g.now = "u.now"
	sva, _ := g.va("s.value", "s.ts")
	lock := ""
	if wait { // bound the lock wait before the first lock
		lock = " AND (SELECT pg_catalog.set_config('lock_timeout', $13" + tText + ", true)) IS NOT NULL"
	}
	var b strings.Builder
	b.WriteString("WITH s AS (SELECT id, value, ts FROM " + read + "($1::pg_catalog.bytea[])), ")
	b.WriteString("w AS (INSERT INTO " + table + " AS c (id, name, key, shard, value, ts, expires)")
	b.WriteString(" SELECT u.id, u.name, u.key, u.shard, u.fv, u.now, u.fex")
	b.WriteString(" FROM unnest($1::pg_catalog.bytea[], $2::pg_catalog.bytea[], $3::pg_catalog.bytea[], $4::integer[], $5::bigint[], $6::pg_catalog.float8[], $7::bigint[], $8::boolean[])")
	b.WriteString(" AS u(id, name, key, shard, now, fv, fex, w) LEFT JOIN s ON " + op("s.id", "=", "u.id"))
	b.WriteString(" WHERE u.w AND (s.value IS NULL OR (" + sound("s.value", "s.ts") + " AND " + g.ok(sva) + "))" + lock + " ORDER BY u.id")
	b.WriteString(" ON CONFLICT (id) DO UPDATE SET " + set + " WHERE " + where)
	b.WriteString(" RETURNING c.id, c.value, c.ts) ")
	b.WriteString("SELECT pg_catalog.array_agg(w.id IS NOT NULL ORDER BY q.id), pg_catalog.array_agg(coalesce(w.value, s.value) ORDER BY q.id),")
	b.WriteString(" pg_catalog.array_agg(coalesce(w.ts, s.ts) ORDER BY q.id)")
	b.WriteString(" FROM pg_catalog.unnest($1::pg_catalog.bytea[]) AS q(id) LEFT JOIN s ON " + op("s.id", "=", "q.id") + " LEFT JOIN w ON " + op("w.id", "=", "q.id"))
	return b.String()
}

// sharedBatch reports whether reqs are what upsertSQL decides: limits or
// checks of one item on one record each, judged at the Limiter's clock,
// without reservation or settlement, on token buckets of one limit, with
// one count.
func sharedBatch(reqs []*request) bool {
	it0 := &reqs[0].items[0]
	p0 := &it0.recs[0].params
	if p0.Kind != driver.TokenBucket {
		return false
	}
	for _, r := range reqs {
		it := &r.items[0]
		if !r.single() || r.flags&(flagReserve|flagServerTime) != 0 || it.count != it0.count || it.recs[0].params != *p0 {
			return false
		}
	}
	return true
}

// sendUpsert decides a batch that sharedBatch accepts with one upsert
// (upsertSQL), and reports whether it could: not if a record appears
// twice, which _apply decides in turn.
func (s *Store) sendUpsert(ctx context.Context, reqs []*request) (bool, error) {
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
	it0 := &b.order[0].items[0]
	p := &it0.recs[0].params
	b.ids, b.names, b.keys, b.shards = b.ids[:0], b.names[:0], b.keys[:0], b.shards[:0]
	b.now, b.fresh, b.ex, b.write = b.now[:0], b.fresh[:0], b.ex[:0], b.write[:0]
	for _, r := range b.order {
		rec := &r.items[0].recs[0]
		b.ids = append(b.ids, rec.id[:])
		b.names = append(b.names, []byte(rec.name))
		b.keys = append(b.keys, []byte(rec.key))
		b.shards = append(b.shards, rec.shard)
		b.now = append(b.now, r.now)
		// The record's next state if it is missing: the tokens left are
		// the same for every op, its time the op's.
		var fd driver.Decision
		fs := ratelimit.TransitionInto(&fd, p, driver.State{}, false, r.now, it0.count, false)
		b.fresh = append(b.fresh, fs.Remaining)
		b.ex = append(b.ex, ratelimit.FullAt(*p, fs))
		b.write = append(b.write, driver.Mode(r.flags&3) == driver.ModeLimit && fd.OK && it0.count > 0)
	}
	args := []any{b.ids, b.names, b.keys, b.shards, b.now, b.fresh, b.ex, b.write, it0.count, p.Rate, p.Period, p.Capacity}
	k := 0
	w := newWaits(ctx)
	if w.ms > 0 {
		k = 1
		args = append(args, waitText(w.ms))
	}
	err := s.serial(ctx, s.pool, func(q querier) error {
		if wait, changed := w.next(); changed {
			args[len(args)-1] = waitText(wait) // a retry's: the time left now
		}
		return q.QueryRow(ctx, s.upsertSQL[k], args...).Scan(&b.wrote, &b.v, &b.ts)
	})
	if err != nil {
		return true, err
	}
	if len(b.wrote) != n || len(b.v) != n || len(b.ts) != n {
		return true, fmt.Errorf("the statement answered %d records for %d", len(b.wrote), n)
	}
	b.redo = b.redo[:0]
	for i, r := range b.order {
		it := &r.items[0]
		d := &r.out[0]
		if b.wrote[i] {
			decideWritten(d, p, *b.v[i], *b.ts[i], r.now, it.count, false)
			r.answered = true
			continue
		}
		st, found := ptrState(b.v[i], b.ts[i])
		if b.v[i] != nil {
			if err := s.checkRow(b.ids[i], *b.v[i], b.ts[i]); err != nil {
				r.err = err // a record no release writes, which the upsert left as it was
				r.answered = true
				continue
			}
		}
		if decideRead(d, p, st, found, r.now, it.count, false) && driver.Mode(r.flags&3) == driver.ModeLimit {
			b.redo = append(b.redo, r) // the record read grants it: a newer row did not
			continue
		}
		r.answered = true
	}
	// The upsert has committed what it wrote: should the ops sent again
	// fail, they alone fail, and the others keep their decisions; lost if
	// their statement may have run. So too should sending them panic: the
	// others are answered (see request.answered).
	if len(b.redo) > 0 {
		if err := s.sendApply(ctx, b.redo); err != nil {
			for _, r := range b.redo {
				r.failed(err)
			}
		}
	}
	return true, nil
}

// ptrState is the state read as v and ts: found false if either is nil.
func ptrState(v *float64, ts *int64) (st driver.State, found bool) {
	if v == nil || ts == nil {
		return driver.State{}, false
	}
	return driver.State{Remaining: *v, TS: *ts}, true
}
