// Package pgstore is a ratelimit.Store on PostgreSQL (pgx v5), for a fleet
// of processes that already shares a database.
//
// Each Apply is one statement: a PL/pgSQL function, installed with the
// schema, reads the op's records, runs the transition (a port of
// ratelimit.Evaluate) and writes them, in the statement's transaction. It
// locks the records one at a time in one fixed order, so no interleaving
// of calls can deadlock. Records whose bucket is full again are removed by
// DeleteExpired.
package pgstore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
)

//go:embed schema.sql
var schemaSQL string

// DefaultTable is the table that holds the records unless WithTable names
// another.
const DefaultTable = "ratelimit"

// schemaLock is the advisory lock key under which New installs the schema,
// so that processes starting together do not race on the DDL.
const schemaLock = 0x7261_7465_6c69_6d74 // "ratelimt"

// Store is a ratelimit.Store on PostgreSQL, safe for concurrent use. Build
// it with New.
type Store struct {
	pool       *pgxpool.Pool
	serverTime bool

	applySQL, loadSQL, deleteSQL, expiredSQL string
}

var (
	_ ratelimit.Store      = (*Store)(nil)
	_ ratelimit.TimeSource = (*Store)(nil)
)

// Option configures a Store in New.
type Option func(*options)

type options struct {
	table      string
	serverTime bool
}

// WithTable sets the table that holds the records (default DefaultTable).
// A dot separates a schema: "limits.records". The function that applies
// ops is named after the table, with the suffix "_apply". Names are quoted,
// so any characters are safe.
func WithTable(name string) Option { return func(o *options) { o.table = name } }

// WithServerTime makes the store judge every call at the database
// server's time (clock_timestamp()) instead of the Limiter's clock. Choose
// it when the processes of a fleet have clocks that disagree by more than
// the precision the limits need: the server is then the one clock. Tests
// that drive the Limiter's clock by hand cannot use it.
func WithServerTime() Option { return func(o *options) { o.serverTime = true } }

// New returns a store on pool, creating its table and function if they do
// not exist (safe to run from several processes at once). The store does
// not own the pool; close it yourself.
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	o := options{table: DefaultTable}
	for _, f := range opts {
		f(&o)
	}
	if pool == nil {
		return nil, errors.New("pgstore: New needs a pool: pass pgxpool.New(ctx, url)")
	}
	if o.table == "" || strings.HasPrefix(o.table, ".") || strings.HasSuffix(o.table, ".") {
		return nil, fmt.Errorf("pgstore: table name %q is empty or has an empty part: write \"table\" or \"schema.table\"", o.table)
	}
	parts := strings.SplitN(o.table, ".", 2)
	last := len(parts) - 1
	ident := func(suffix string) string {
		id := append(pgx.Identifier(nil), parts...)
		id[last] += suffix
		return id.Sanitize()
	}
	table := ident("")
	s := &Store{
		pool:       pool,
		serverTime: o.serverTime,
		applySQL: "SELECT ok, retry, remaining, charged0, charged1 FROM " + ident("_apply") +
			"($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
		loadSQL:    "SELECT id, value, ts FROM " + table + " WHERE id = ANY($1) AND value IS NOT NULL",
		deleteSQL:  "DELETE FROM " + table + " WHERE id = ANY($1)",
		expiredSQL: "DELETE FROM " + table + " WHERE expires <= $1",
	}
	schema := strings.NewReplacer(
		"{{table}}", table,
		"{{index}}", pgx.Identifier{parts[last] + "_expires_idx"}.Sanitize(),
		"{{apply}}", ident("_apply"),
	).Replace(schemaSQL)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(schemaLock)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schema)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: create table %s and its function: %w", table, err)
	}
	return s, nil
}

// OwnClock implements ratelimit.TimeSource: it reports whether the store
// was built WithServerTime.
func (s *Store) OwnClock() bool { return s.serverTime }

// Now implements ratelimit.TimeSource: the server's time in Unix ms.
func (s *Store) Now(ctx context.Context) (int64, error) {
	var ms int64
	err := s.pool.QueryRow(ctx, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&ms)
	if err != nil {
		return 0, fmt.Errorf("pgstore: time: %w", err)
	}
	return ms, nil
}

// recordID returns the primary key of a record: the SHA-256 digest of
// ratelimit.RecordID.AppendKey, an encoding no two records share. A
// digest keeps index entries small whatever the key's length.
func recordID(id ratelimit.RecordID) []byte {
	sum := sha256.Sum256(id.AppendKey(make([]byte, 0, 2*binary.MaxVarintLen64+len(id.Name)+len(id.Key))))
	return sum[:]
}

// Apply implements ratelimit.Store: one statement.
func (s *Store) Apply(ctx context.Context, op *ratelimit.Op, out []ratelimit.Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	nrec := op.NumRecords()
	var (
		counts   = make([]float64, len(op.Items))
		nshards  = make([]int32, len(op.Items))
		ids      = make([][]byte, 0, nrec)
		names    = make([][]byte, 0, nrec)
		keys     = make([][]byte, 0, nrec)
		shards   = make([]int32, 0, nrec)
		kinds    = make([]int32, 0, nrec)
		rates    = make([]float64, 0, nrec)
		periods  = make([]int64, 0, nrec)
		capacity = make([]float64, 0, nrec)
		maxr     = make([]float64, 0, nrec)
		phases   = make([]int64, 0, nrec)
	)
	for i := range op.Items {
		it := &op.Items[i]
		counts[i], nshards[i] = it.Count, int32(len(it.Shards))
		for _, sh := range it.Shards {
			p := sh.Params
			ids = append(ids, recordID(ratelimit.RecordID{Name: it.Name, Key: it.Key, Shard: sh.Index}))
			names, keys, shards = append(names, []byte(it.Name)), append(keys, []byte(it.Key)), append(shards, int32(sh.Index))
			kinds, rates, periods = append(kinds, int32(p.Kind)), append(rates, p.Rate), append(periods, p.Period)
			capacity, maxr, phases = append(capacity, p.Capacity), append(maxr, p.MaxReserved), append(phases, p.Phase)
		}
	}
	var now *int64
	if !s.serverTime {
		now = &op.Now
	}
	rows, err := s.pool.Query(ctx, s.applySQL, int32(op.Mode), now, op.Reserve, counts, nshards,
		ids, names, keys, shards, kinds, rates, periods, capacity, maxr, phases)
	if err != nil {
		return fmt.Errorf("pgstore: apply: %w", err)
	}
	defer rows.Close()
	i := 0
	for rows.Next() {
		if i >= len(out) {
			return fmt.Errorf("pgstore: apply: the function returned more than %d rows: is another version installed?", len(out))
		}
		var d ratelimit.Decision
		if err := rows.Scan(&d.OK, &d.RetryAfter, &d.Remaining, &d.Charged[0], &d.Charged[1]); err != nil {
			return fmt.Errorf("pgstore: apply: %w", err)
		}
		out[i] = d
		i++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgstore: apply: %w", err)
	}
	if i != len(out) {
		return fmt.Errorf("pgstore: apply: the function returned %d rows for %d items", i, len(out))
	}
	return nil
}

// Load implements ratelimit.Store: one statement.
func (s *Store) Load(ctx context.Context, ids []ratelimit.RecordID, out []ratelimit.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	keys := make([][]byte, len(ids))
	index := make(map[string]int, len(ids))
	for i, id := range ids {
		keys[i] = recordID(id)
		index[string(keys[i])] = i
		out[i] = ratelimit.Record{}
	}
	rows, err := s.pool.Query(ctx, s.loadSQL, keys)
	if err != nil {
		return fmt.Errorf("pgstore: load: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id []byte
			st ratelimit.State
		)
		if err := rows.Scan(&id, &st.Value, &st.TS); err != nil {
			return fmt.Errorf("pgstore: load: %w", err)
		}
		if i, ok := index[string(id)]; ok {
			out[i] = ratelimit.Record{State: st, Found: true}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgstore: load: %w", err)
	}
	return nil
}

// Delete implements ratelimit.Store: one statement.
func (s *Store) Delete(ctx context.Context, ids []ratelimit.RecordID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	keys := make([][]byte, len(ids))
	for i, id := range ids {
		keys[i] = recordID(id)
	}
	if _, err := s.pool.Exec(ctx, s.deleteSQL, keys); err != nil {
		return fmt.Errorf("pgstore: delete: %w", err)
	}
	return nil
}

// DeleteExpired removes the records whose bucket has been full again for
// ratelimit.ExpiryGrace (a minute) at now (and placeholders left by
// refused calls), and returns how many it removed. The grace keeps exact
// the calls in flight, judged at a now read a moment before. Such records read as a full bucket whether kept or not;
// removing them keeps the table proportional to the keys active recently.
// It uses the index on expires: call it periodically, say every minute,
// from one process or several.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, s.expiredSQL, now.UnixMilli()-ratelimit.ExpiryGrace)
	if err != nil {
		return 0, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	return tag.RowsAffected(), nil
}
