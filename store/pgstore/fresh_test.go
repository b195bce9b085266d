package pgstore_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
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

// freshTracer counts the fresh upserts of lone calls (see lone.go) that
// wrote and those that did not.
type freshTracer struct {
	mu           sync.Mutex
	wrote, spare int
	lone         int // full lone upserts
}

type freshKey struct{}

func (tr *freshTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, freshKey{}, d.SQL)
}

func (tr *freshTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(freshKey{}).(string)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	switch {
	case d.Err != nil:
	case strings.HasPrefix(sql, "INSERT") && strings.Contains(sql, "excluded.expires WHERE c.value IS NULL OR ("):
		if d.CommandTag.RowsAffected() == 1 {
			tr.wrote++
		} else {
			tr.spare++
		}
	case strings.HasPrefix(sql, "WITH s AS") && !strings.Contains(sql, "unnest"):
		tr.lone++
	}
}

// counts returns and resets the counts.
func (tr *freshTracer) counts() (wrote, spare, lone int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	wrote, spare, lone = tr.wrote, tr.spare, tr.lone
	tr.wrote, tr.spare, tr.lone = 0, 0, 0
	return
}

// TestFreshUpsertDifferential writes a record in a state, or a
// placeholder, or none, then sends a lone limit on it with the fresh
// upsert first, and requires the decision and the record of the Go
// transition on that state, bit for bit. The states lie around full
// again: exactly full, a hair short, beyond the capacity (a limit lowered
// since), in debt, with a time ahead of the call's (a clock that lags), a
// fixed window on another phase; the limit of the call is drawn anew each
// time, so that the record was mostly written under another rate,
// capacity or phase. The hint is cleared before every call, so that every
// call tries the fresh upsert first: both its outcomes must occur.
func TestFreshUpsertDifferential(t *testing.T) {
	ctx := context.Background()
	tr, pool, s, ident := freshStore(t)
	var err error
	write := "INSERT INTO " + ident + " AS c (id, name, key, shard, value, ts, expires) VALUES ($1, $2, $3, 0, $4, $5, $6) " +
		"ON CONFLICT (id) DO UPDATE SET value = excluded.value, ts = excluded.ts, expires = excluded.expires"

	maxPeriod := ratelimit.MaxPeriod.Milliseconds()
	params := []driver.Params{
		{Kind: driver.TokenBucket, Rate: 100, Period: 1000, Capacity: 100},
		{Kind: driver.TokenBucket, Rate: 3, Period: 7, Capacity: 2.5},
		{Kind: driver.TokenBucket, Rate: 0.1, Period: 60_000, Capacity: 1, MaxReserved: 2},
		{Kind: driver.TokenBucket, Rate: ratelimit.MaxTokens, Period: 1, Capacity: ratelimit.MaxTokens},
		{Kind: driver.TokenBucket, Rate: 1e-9, Period: maxPeriod, Capacity: 1},
		{Kind: driver.TokenBucket, Rate: 1e-9, Period: 1, Capacity: 1e-9},
		{Kind: driver.FixedWindow, Rate: 10, Period: 1000, Capacity: 10},
		{Kind: driver.FixedWindow, Rate: 10, Period: 1000, Capacity: 10, Phase: 250},
		{Kind: driver.FixedWindow, Rate: 3, Period: 7, Capacity: 5, Phase: 3},
		{Kind: driver.FixedWindow, Rate: 1e-9, Period: maxPeriod, Capacity: 1},
		{Kind: driver.FixedWindow, Rate: ratelimit.MaxTokens, Period: 1, Capacity: ratelimit.MaxTokens},
	}
	counts := []float64{1, 0.5, ratelimit.MinCount, 2.5, 7}
	rng := rand.New(rand.NewPCG(10, 0xf5e5))
	var wrote, spare int
	for step := range 600 {
		key := fmt.Sprint("k", step%12)
		p := params[rng.IntN(len(params))]
		count := counts[rng.IntN(len(counts))]
		reserve := rng.IntN(4) == 0
		now := t0.UnixMilli() + rng.Int64N(10*p.Period+1)

		// The record: missing, a placeholder, or a state near full again
		// at now.
		id := sha256.Sum256(driver.RecordID{Name: "f", Key: key}.AppendKey(nil))
		var (
			st    driver.State
			found bool
			shape = rng.IntN(9)
		)
		expires := []int64{0, driver.Never, now}[rng.IntN(3)]
		switch shape {
		case 0: // missing
			_, err = pool.Exec(ctx, "DELETE FROM "+ident+" WHERE id = $1", id[:])
		case 1: // a placeholder
			_, err = pool.Exec(ctx, write, id[:], []byte("f"), []byte(key), nil, nil, expires)
		default:
			found = true
			capa := p.Capacity * []float64{1, 1, 1, 2, 0.5}[rng.IntN(5)] // written under another capacity
			back := []int64{0, 1, p.Period, 10 * p.Period, -1, -p.Period}[rng.IntN(6)]
			if back > 0 {
				back = rng.Int64N(back + 1)
			}
			st = driver.State{TS: now - back}
			switch rng.IntN(5) {
			case 0:
				st.Remaining = capa
			case 1:
				st.Remaining = math.Nextafter(capa, 0)
			case 2:
				st.Remaining = capa - count
			case 3:
				st.Remaining = -count
			default:
				st.Remaining = rng.Float64() * capa
			}
			if p.Kind == driver.FixedWindow && rng.IntN(2) == 0 {
				st.TS -= rng.Int64N(p.Period) // off the phase's grid
			}
			_, err = pool.Exec(ctx, write, id[:], []byte("f"), []byte(key), st.Remaining, st.TS, expires)
		}
		require.NoError(t, err)

		var want driver.Decision
		next := ratelimit.TransitionInto(&want, &p, st, found, now, count, reserve)
		want.Now, want.TS = now, next.TS
		if !(want.OK && count > 0) {
			next = st
		} else {
			found = true
		}

		pgstore.ClearHints(s)
		op := &driver.Op{Mode: driver.ModeLimit, Now: now, Reserve: reserve,
			Items: []driver.Item{{Name: "f", Key: key, Count: count, Shards: []driver.Shard{{Params: p}}}}}
		got := make([]driver.Decision, 1)
		require.NoError(t, s.Apply(ctx, op, got))
		where := fmt.Sprintf("step %d: %+v, count %v, reserve %v, record %+v (shape %d) at %d", step, p, count, reserve, st, shape, now)
		require.Equal(t, want, got[0], where)
		require.Equal(t, math.Float64bits(want.Remaining), math.Float64bits(got[0].Remaining), where)

		recs := make([]driver.Record, 1)
		require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "f", Key: key}}, recs))
		require.Equal(t, found, recs[0].Found, where)
		if found {
			require.Equal(t, next.TS, recs[0].State.TS, where)
			require.Equal(t, math.Float64bits(next.Remaining), math.Float64bits(recs[0].State.Remaining), where)
		}
		w, sp, _ := tr.counts()
		wrote += w
		spare += sp
	}
	require.NotZero(t, wrote, "no fresh upsert wrote")
	require.NotZero(t, spare, "every fresh upsert wrote")
	t.Logf("fresh upserts: %d wrote, %d did not", wrote, spare)
}

// freshStore returns a store on a table of its own, its pool, the tracer
// that counts its statements, and the table's quoted name.
func freshStore(t *testing.T) (*freshTracer, *pgxpool.Pool, *pgstore.Store, string) {
	tr := &freshTracer{}
	pool := newPool(t, testserver.PostgresURL(t), tr)
	table := uniqueTable(t, pool)
	s, err := pgstore.New(context.Background(), pool, pgstore.WithTable(table))
	require.NoError(t, err)
	return tr, pool, s, pgx.Identifier{table}.Sanitize()
}

// The named cases of the fresh upsert: which statements each call sends,
// and what it decides.
func TestFreshUpsertCases(t *testing.T) {
	ctx := context.Background()
	tr, pool, s, ident := freshStore(t)
	var err error
	p := driver.Params{Kind: driver.TokenBucket, Rate: 10, Period: 1000, Capacity: 10}
	now := t0.UnixMilli()
	call := func(key string, p driver.Params, now int64, count float64) driver.Decision {
		t.Helper()
		out := make([]driver.Decision, 1)
		require.NoError(t, s.Apply(ctx, &driver.Op{Mode: driver.ModeLimit, Now: now,
			Items: []driver.Item{{Name: "c", Key: key, Count: count, Shards: []driver.Shard{{Params: p}}}}}, out))
		return out[0]
	}
	type sent struct{ wrote, spare, lone int }
	counts := func() sent {
		w, sp, l := tr.counts()
		return sent{w, sp, l}
	}

	// A new record: the fresh upsert inserts it.
	d := call("a", p, now, 1)
	require.Equal(t, 9.0, d.Remaining)
	require.Equal(t, sent{wrote: 1}, counts())
	// Short of tokens: the hint sends the full upsert first.
	d = call("a", p, now+1, 1)
	require.Equal(t, 8.0+0.01, d.Remaining)
	require.Equal(t, sent{lone: 1}, counts())
	// Full again (FullAt passed): the fresh upsert alone.
	d = call("a", p, now+1_000, 1)
	require.Equal(t, 9.0, d.Remaining)
	require.Equal(t, sent{wrote: 1}, counts())
	// Not full, though the hint says so: the fresh upsert writes nothing,
	// the full one decides.
	pgstore.ClearHints(s)
	d = call("a", p, now+1_001, 1)
	require.Equal(t, 8.0+0.01, d.Remaining)
	require.Equal(t, sent{spare: 1, lone: 1}, counts())
	// Refused, as a hot key mostly is: the full upsert, twice.
	for range 2 {
		d = call("a", p, now+1_001, 9)
		require.False(t, d.OK)
		require.Equal(t, sent{lone: 1}, counts())
	}

	// The limit lowered since: a record of 10 tokens is full under a
	// capacity of 5 at once, and the call takes from 5.
	lower := driver.Params{Kind: driver.TokenBucket, Rate: 10, Period: 1000, Capacity: 5}
	call("b", p, now, 0.5) // 9.5 left
	d = call("b", lower, now+100, 1)
	require.Equal(t, 4.0, d.Remaining)
	require.Equal(t, sent{wrote: 2}, counts())
	// The rate lowered since: 9 tokens at now, which 10 a second would
	// refill in 100 ms, but 1 a second does not.
	slow := driver.Params{Kind: driver.TokenBucket, Rate: 1, Period: 1000, Capacity: 10}
	call("c", p, now, 1)
	pgstore.ClearHints(s)
	d = call("c", slow, now+100, 1)
	require.Equal(t, 9.0+0.1-1, d.Remaining)
	require.Equal(t, sent{wrote: 1, spare: 1, lone: 1}, counts())

	// A placeholder reads as missing: the fresh upsert writes over it.
	id := sha256.Sum256(driver.RecordID{Name: "c", Key: "d"}.AppendKey(nil))
	_, err = pool.Exec(ctx, "INSERT INTO "+ident+" (id, name, key, shard, value, ts, expires) VALUES ($1, 'c', 'd', 0, NULL, NULL, 0)", id[:])
	require.NoError(t, err)
	d = call("d", p, now, 1)
	require.True(t, d.OK)
	require.Equal(t, 9.0, d.Remaining)
	require.Equal(t, sent{wrote: 1}, counts())

	// A full record whose time is ahead of the call's (a clock that
	// lags): the refresh keeps its time, which the fresh record's is not,
	// so the full upsert decides, at the record's time.
	call("e", p, now+5_000, 0.5)
	pgstore.ClearHints(s)
	_, err = pool.Exec(ctx, "UPDATE "+ident+" SET value = 10, expires = 0 WHERE name = 'c' AND key = 'e'")
	require.NoError(t, err)
	d = call("e", p, now, 1)
	require.Equal(t, driver.Decision{OK: true, Remaining: 9, Charged: [2]float64{1, 0}, Now: now, TS: now + 5_000}, d)
	require.Equal(t, sent{wrote: 1, spare: 1, lone: 1}, counts())

	// A fixed window: full again on the phase's grid, the fresh upsert;
	// full on another grid (the phase changed), the full upsert, which
	// keeps the record's grid.
	fw := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: 1000, Capacity: 10}
	call("f", fw, now+250, 1)
	d = call("f", fw, now+1_250, 1)
	require.Equal(t, driver.Decision{OK: true, Remaining: 9, Charged: [2]float64{1, 0}, Now: now + 1_250, TS: now + 1_000}, d)
	require.Equal(t, sent{wrote: 2}, counts())
	shifted := fw
	shifted.Phase = 100
	d = call("f", shifted, now+2_250, 1)
	require.Equal(t, driver.Decision{OK: true, Remaining: 9, Charged: [2]float64{1, 0}, Now: now + 2_250, TS: now + 2_000}, d)
	require.Equal(t, sent{spare: 1, lone: 1}, counts())
}

// The fresh upsert decides on the row as locked: here another transaction
// spends the tokens of a full record while the call waits for its row.
func TestFreshUpsertOnALockedRow(t *testing.T) {
	ctx := context.Background()
	pool, table, s := storeWithRecord(t)
	pgstore.ClearHints(s) // full again, as far as the store knows
	requireRefusedAfterSpend(t, pool, table, s)

	// Within a deadline, the same, and the call gives up on a row held.
	_, err := pool.Exec(ctx, "UPDATE "+pgx.Identifier{table}.Sanitize()+" SET value = 10 WHERE id = $1", rowID("k"))
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{table}.Sanitize()+" WHERE id = $1 FOR UPDATE", rowID("k"))
	require.NoError(t, err)
	pgstore.ClearHints(s)
	callCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	a := receive(t, applyAsync(callCtx, s, limitOp("k", 1)))
	require.ErrorIs(t, a.err, context.DeadlineExceeded)
	waitForLockWaiters(t, pool, table, 0)
}
