package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/driver"
)

// A lone call's statement (the read, the upsert, the fresh upsert) goes
// with its parameters encoded here, in binary, straight to the
// connection (pgconn), when the pool prepares and caches statements
// (pgx.QueryExecModeCacheStatement, its default). pgx's generic path boxes
// each argument in an interface (each float64 and int64 an allocation),
// inspects it by reflection and looks up its encoding in three maps: for
// the fresh upsert's eleven parameters, about half the instructions that
// the client spends on a call beyond a bare upsert's. Under any other
// mode (a pool behind a connection pooler may forbid named statements)
// the statement goes through pgx as any other. A pool's QueryTracer sees
// the statement either way, with its arguments.

// stmt is a statement of a lone call and the name it is prepared under on
// a connection: a digest of its SQL, so that stores on other tables of
// one pool do not share a name.
type stmt struct {
	name, sql string
}

func newStmt(sql string) stmt {
	sum := sha256.Sum256([]byte(sql))
	return stmt{name: "ratelimit_" + hex.EncodeToString(sum[:12]), sql: sql}
}

// Kinds of a parameter, by its SQL type.
const (
	argBytea   = iota // b, or s as bytes
	argInteger        // i as int32
	argBigint         // i
	argFloat8         // f
	argText           // s
)

type arg struct {
	kind int8
	i    int64
	f    float64
	s    string
	b    []byte
}

// args are a statement's parameters, in the order of its placeholders.
// With a wait (its ctx set), the last is the statement's lock wait
// (text), set anew at each try (rewait).
type args struct {
	n    int
	v    [14]arg
	wait waits
}

// rewait sets the lock wait parameter, if the statement has one, to the
// next try's.
func (a *args) rewait() {
	if a.wait.ctx == nil {
		return
	}
	if ms, changed := a.wait.next(); changed {
		a.v[a.n-1].s = waitText(ms)
	}
}

func (a *args) bytea(b []byte)   { a.v[a.n] = arg{kind: argBytea, b: b}; a.n++ }
func (a *args) byteaS(s string)  { a.v[a.n] = arg{kind: argBytea, s: s}; a.n++ }
func (a *args) integer(i int32)  { a.v[a.n] = arg{kind: argInteger, i: int64(i)}; a.n++ }
func (a *args) bigint(i int64)   { a.v[a.n] = arg{kind: argBigint, i: i}; a.n++ }
func (a *args) float8(f float64) { a.v[a.n] = arg{kind: argFloat8, f: f}; a.n++ }
func (a *args) text(s string)    { a.v[a.n] = arg{kind: argText, s: s}; a.n++ }
func (a *args) list() []arg      { return a.v[:a.n] }

// limitAndFresh appends the parameters that the lone and the fresh
// upserts share, in their order: the limit's rate, period and capacity,
// then the record's fresh next state, its time and when it is full again.
func (a *args) limitAndFresh(p *driver.Params, fs driver.State, fullAt int64) {
	a.float8(p.Rate)
	a.bigint(p.Period)
	a.float8(p.Capacity)
	a.float8(fs.Remaining)
	a.bigint(fs.TS)
	a.bigint(fullAt)
}

// isBytesOfString reports a bytea parameter given as a string.
func (x *arg) isBytesOfString() bool { return x.kind == argBytea && x.b == nil }

// boxed returns the parameters as pgx takes them.
func (a *args) boxed() []any {
	out := make([]any, a.n)
	for i, x := range a.list() {
		switch x.kind {
		case argBytea:
			if x.isBytesOfString() {
				out[i] = []byte(x.s) // never nil: a nil key would be NULL
			} else {
				out[i] = x.b
			}
		case argInteger:
			out[i] = int32(x.i)
		case argBigint:
			out[i] = x.i
		case argFloat8:
			out[i] = x.f
		case argText:
			out[i] = x.s
		}
	}
	return out
}

// row is the first row a statement returned, of at most three columns of
// float8, bigint or boolean.
type row struct {
	found bool // a row came
	null  [3]bool
	bits  [3]uint64 // a float8's bits, a bigint, a boolean as 0 or 1
}

// wire holds the binary parameters of a statement on its way.
type wire struct {
	buf    []byte
	ends   []int
	params [][]byte
}

var wires = sync.Pool{New: func() any { return &wire{buf: make([]byte, 0, 256)} }}

// binary: one format code, for every parameter and every column.
var binaryFormat = []int16{pgx.BinaryFormatCode}

func (w *wire) encode(a *args) {
	w.buf, w.ends, w.params = w.buf[:0], w.ends[:0], w.params[:0]
	for i := range a.list() {
		x := &a.v[i]
		switch x.kind {
		case argBytea:
			if x.isBytesOfString() {
				w.buf = append(w.buf, x.s...)
			} else {
				w.buf = append(w.buf, x.b...)
			}
		case argInteger:
			w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(int32(x.i)))
		case argBigint:
			w.buf = binary.BigEndian.AppendUint64(w.buf, uint64(x.i))
		case argFloat8:
			w.buf = binary.BigEndian.AppendUint64(w.buf, math.Float64bits(x.f))
		case argText:
			w.buf = append(w.buf, x.s...)
		}
		w.ends = append(w.ends, len(w.buf))
	}
	start := 0
	for _, end := range w.ends {
		// Never nil, even empty (a nil parameter is NULL): buf is not.
		w.params = append(w.params, w.buf[start:end:end])
		start = end
	}
}

// errColumns reports a row whose columns are not what the statement's
// reader expects.
var errColumns = errors.New("pgstore: a statement returned unexpected columns")

// run sends st with a on a connection of the pool, reads its first row, if
// any, into r (nil: none expected), and returns its command tag. A
// statement that fails on a concurrent transaction is sent again (serial).
func (s *Store) run(ctx context.Context, st *stmt, a *args, r *row) (tag pgconn.CommandTag, err error) {
	if !s.direct {
		err = s.serial(ctx, s.pool, func(q querier) error {
			var err error
			a.rewait()
			tag, err = s.runPgx(ctx, q, st, a, r)
			return err
		})
		return tag, err
	}
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer c.Release()
	conn := c.Conn()
	if s.tracer != nil {
		ctx = s.tracer.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: st.sql, Args: a.boxed()})
	}
	a.rewait()
	tag, err = s.runFresh(ctx, conn, st, a, r, false)
	if retryable(err) {
		err = s.again(ctx, conn, err, func(querier) error { // on conn, in a transaction
			var err error
			a.rewait()
			tag, err = s.runFresh(ctx, conn, st, a, r, true)
			return err
		})
	}
	if s.tracer != nil {
		s.tracer.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{CommandTag: tag, Err: err})
	}
	return tag, err
}

// runFresh is runOn, again once if the server no longer holds the
// statement as the connection prepared it; r is written anew. In a
// transaction (inTx), which that error aborted, the statement is not sent
// again, but its error returned, the statement forgotten: again sends it
// in a transaction of its own.
func (s *Store) runFresh(ctx context.Context, conn *pgx.Conn, st *stmt, a *args, r *row, inTx bool) (pgconn.CommandTag, error) {
	if r != nil {
		*r = row{}
	}
	tag, err := s.runOn(ctx, conn, st, a, r)
	if !stale(err) {
		return tag, err
	}
	// The server no longer has the statement as the connection prepared
	// it (deallocated, or the table changed under it), and ran nothing:
	// forget it (Deallocate's Close message goes through in an aborted
	// transaction too), and prepare it again, once.
	if r != nil {
		*r = row{}
	}
	if derr := conn.Deallocate(ctx, st.name); derr != nil {
		return tag, derr
	}
	if inTx {
		return tag, err
	}
	return s.runOn(ctx, conn, st, a, r)
}

func (s *Store) runOn(ctx context.Context, conn *pgx.Conn, st *stmt, a *args, r *row) (pgconn.CommandTag, error) {
	sd, err := conn.Prepare(ctx, st.name, st.sql)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if len(sd.ParamOIDs) != a.n {
		return pgconn.CommandTag{}, fmt.Errorf("pgstore: statement %s takes %d parameters, not %d", st.name, len(sd.ParamOIDs), a.n)
	}
	w := wires.Get().(*wire)
	defer wires.Put(w)
	w.encode(a)
	rr := conn.PgConn().ExecPrepared(ctx, sd.Name, w.params, binaryFormat, binaryFormat)
	var bad bool
	for rr.NextRow() {
		if r == nil || r.found {
			continue
		}
		vals := rr.Values()
		if len(vals) > len(r.bits) {
			bad = true
			continue
		}
		r.found = true
		for i, v := range vals {
			switch len(v) {
			case 8:
				r.bits[i] = binary.BigEndian.Uint64(v)
			case 1:
				r.bits[i] = uint64(v[0])
			default:
				if v != nil {
					bad = true
				}
				r.null[i] = true
			}
		}
	}
	tag, err := rr.Close()
	if err == nil && bad {
		err = errColumns
	}
	return tag, err
}

// stale reports an error of a prepared statement that the server does
// not hold as prepared: deallocated behind the connection's back (say by
// DISCARD ALL), or whose result's type changed with its table. The
// statement did not run.
func stale(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "26000" || (pe.Code == "0A000" && strings.Contains(pe.Message, "cached plan")))
}

// runPgx is one try of run through pgx's generic path, on q.
func (s *Store) runPgx(ctx context.Context, q querier, st *stmt, a *args, r *row) (pgconn.CommandTag, error) {
	if r == nil {
		return q.Exec(ctx, st.sql, a.boxed()...)
	}
	*r = row{}
	rows, err := q.Query(ctx, st.sql, a.boxed()...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer rows.Close()
	if rows.Next() {
		var (
			v  *float64
			ts *int64
			ok *bool
		)
		dst := []any{&v, &ts, &ok}
		if len(rows.FieldDescriptions()) > len(dst) {
			return pgconn.CommandTag{}, errColumns
		}
		if err := rows.Scan(dst[:len(rows.FieldDescriptions())]...); err != nil {
			return pgconn.CommandTag{}, err
		}
		r.found = true
		r.null = [3]bool{v == nil, ts == nil, ok == nil}
		if v != nil {
			r.bits[0] = math.Float64bits(*v)
		}
		if ts != nil {
			r.bits[1] = uint64(*ts)
		}
		if ok != nil && *ok {
			r.bits[2] = 1
		}
	}
	rows.Close()
	return rows.CommandTag(), rows.Err()
}

// directPool reports whether the pool's connections prepare and cache
// statements, so that a lone call's may be sent as one of them, and
// returns its tracer.
func directPool(pool *pgxpool.Pool) (bool, pgx.QueryTracer) {
	cfg := pool.Config().ConnConfig
	return cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement, cfg.Tracer
}
