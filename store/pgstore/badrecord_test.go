package pgstore_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// TestRecordNoReleaseWrites: a row whose record no release writes (a value
// of NaN or an infinity, a ts NULL or beyond any op's: driver.CheckState)
// fails every call on it, on every path (the lone upserts, a read, the
// batch upsert, the function _apply on either shard, _one), and Load,
// with ErrBadRecord, the row and what to do, and is left as it is; an op
// batched with it is decided. The store decided on them: a NaN value read
// as a full bucket in SQL (PostgreSQL orders NaN above every number) and
// as no number in Go, so that a lone limit was granted and wrote over it
// while a check refused; +Inf read as a full bucket, and a ts of 2^60 kept
// the bucket at what it held for millions of years.
func TestRecordNoReleaseWrites(t *testing.T) {
	ctx := context.Background()
	pool, table, s := newTableStore(t)
	own, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithServerTime())
	require.NoError(t, err)
	// The table as New names it, with the schema it resolved the name to.
	ident := pgx.Identifier{"public", table}.Sanitize()
	now := time.Now().UnixMilli() // the server's clock too, for own
	fw := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: time.Hour.Milliseconds(), Capacity: 10}
	tb := driver.Params{Kind: driver.TokenBucket, Rate: 10, Period: time.Hour.Milliseconds(), Capacity: 10}
	op := func(mode driver.Mode, key string, p driver.Params, count float64, f ...func(*driver.Op)) *driver.Op {
		o := &driver.Op{Mode: mode, Now: now, Items: []driver.Item{{Name: "l", Key: key, Count: count, At: now,
			Shards: []driver.Shard{{Params: p}}}}}
		for _, f := range f {
			f(o)
		}
		return o
	}
	reserve := func(o *driver.Op) { o.Reserve = true }
	pair := func(o *driver.Op) {
		o.Items[0].Shards = []driver.Shard{{Index: 1, Params: o.Items[0].Shards[0].Params}, {Index: 0, Params: o.Items[0].Shards[0].Params}}
	}
	for _, bad := range []struct {
		name  string
		value float64
		ts    *int64
	}{
		{"NaN tokens", math.NaN(), &now},
		{"+Inf tokens", math.Inf(1), &now},
		{"-Inf tokens", math.Inf(-1), &now},
		{"a NULL ts", 5, nil},
		{"a ts 2^60 ms away", 5, ptr(int64(1) << 60)},
		{"a ts 2^60 ms before 1970", 5, ptr(-int64(1) << 60)},
		{"a ts past MaxTime", 5, ptr(driver.MaxTime + 1)},
		{"a ts before MinRecordTime", 5, ptr(driver.MinRecordTime - 1)},
	} {
		for _, p := range []driver.Params{fw, tb} {
			key := fmt.Sprintf("%s %v", bad.name, p.Kind)
			id := sha256.Sum256(driver.RecordID{Name: "l", Key: key}.AppendKey(nil))
			out := make([]driver.Decision, 1)
			require.NoError(t, s.Apply(ctx, op(driver.ModeLimit, key, p, 1), out))
			tag, err := pool.Exec(ctx, "UPDATE "+ident+" SET value = $1, ts = $2 WHERE id = $3", bad.value, bad.ts, id[:])
			require.NoError(t, err)
			require.EqualValues(t, 1, tag.RowsAffected())
			isBad := func(err error, how string) {
				t.Helper()
				require.ErrorIs(t, err, driver.ErrBadRecord, "%s: %s", key, how)
				require.ErrorIs(t, err, pgstore.ErrBadRecord, "%s: %s", key, how)
				require.ErrorContains(t, err, fmt.Sprintf("%x", id), "%s: %s: names the row", key, how)
				require.ErrorContains(t, err, "DELETE FROM "+ident, "%s: %s: says what to do", key, how)
			}
			pgstore.ClearHints(s) // the fresh upsert first
			isBad(s.Apply(ctx, op(driver.ModeLimit, key, p, 1), out), "a lone limit, fresh upsert first")
			isBad(s.Apply(ctx, op(driver.ModeLimit, key, p, 1), out), "a lone limit")
			isBad(s.Apply(ctx, op(driver.ModeLimit, key, p, 1, reserve), out), "a lone reservation")
			isBad(s.Apply(ctx, op(driver.ModeCheck, key, p, 1), out), "a lone check")
			isBad(s.Apply(ctx, op(driver.ModeLimit, key, p, 100), out), "a lone limit a full bucket refuses")
			isBad(own.Apply(ctx, op(driver.ModeLimit, key, p, 1), out), "at the server's clock (_one)")
			isBad(s.Apply(ctx, op(driver.ModeRefund, key, p, 1), out), "a refund (_apply)")
			isBad(s.Apply(ctx, op(driver.ModeLimit, key, p, 1, pair), out), "on the second shard (_apply)")
			for _, mode := range []driver.Mode{driver.ModeLimit, driver.ModeCheck} {
				outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
				err := s.ApplyBatch(ctx, []*driver.Op{op(mode, "good "+key, p, 1), op(mode, key, p, 1)}, outs)
				isBad(err, fmt.Sprintf("batched, mode %d", mode))
				require.Equal(t, []int{1}, storetest.FailedOps(t, err), key)
				require.True(t, outs[0][0].OK, "%s: the other op is decided", key)
			}
			// A batch of one op, on each path: the op fails on its own too.
			for how, one := range map[string]struct {
				s  *pgstore.Store
				op *driver.Op
			}{
				"a lone limit":          {s, op(driver.ModeLimit, key, p, 1)},
				"a lone check":          {s, op(driver.ModeCheck, key, p, 1)},
				"a refund":              {s, op(driver.ModeRefund, key, p, 1)},
				"on two shards":         {s, op(driver.ModeLimit, key, p, 1, pair)},
				"at the server's clock": {own, op(driver.ModeLimit, key, p, 1)},
			} {
				err := one.s.ApplyBatch(ctx, []*driver.Op{one.op}, [][]driver.Decision{make([]driver.Decision, 1)})
				isBad(err, "a batch of one op, "+how)
				require.Equal(t, []int{0}, storetest.FailedOps(t, err), "%s: a batch of one op, %s", key, how)
			}
			isBad(s.Load(ctx, []driver.RecordID{{Name: "l", Key: "good"}, {Name: "l", Key: key}}, make([]driver.Record, 2)), "loaded")

			var v float64
			var ts *int64
			require.NoError(t, pool.QueryRow(ctx, "SELECT value, ts FROM "+ident+" WHERE id = $1", id[:]).Scan(&v, &ts))
			require.Equal(t, math.Float64bits(bad.value), math.Float64bits(v), "%s: left as it is", key)
			require.Equal(t, bad.ts, ts, "%s: left as it is", key)
		}
	}

	// At the bounds, and any finite number of tokens: read alike.
	for i, st := range []driver.State{
		{Remaining: -1e300, TS: now},
		{Remaining: 1e300, TS: now},
		{Remaining: 5, TS: driver.MaxTime},
		{Remaining: 5, TS: driver.MinRecordTime},
	} {
		key := fmt.Sprint("sound ", i)
		id := sha256.Sum256(driver.RecordID{Name: "l", Key: key}.AppendKey(nil))
		out := make([]driver.Decision, 1)
		require.NoError(t, s.Apply(ctx, op(driver.ModeLimit, key, fw, 1), out))
		_, err := pool.Exec(ctx, "UPDATE "+ident+" SET value = $1, ts = $2 WHERE id = $3", st.Remaining, st.TS, id[:])
		require.NoError(t, err)
		recs := make([]driver.Record, 1)
		require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: key}}, recs), "%+v", st)
		require.Equal(t, driver.Record{State: st, Found: true}, recs[0])
		require.NoError(t, s.Apply(ctx, op(driver.ModeCheck, key, fw, 1), out), "%+v", st)
		require.NoError(t, s.Apply(ctx, op(driver.ModeRefund, key, fw, 1), out), "%+v", st)
	}
}

func ptr[T any](v T) *T { return &v }
