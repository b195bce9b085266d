package pgstore_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// The expires a record is written with is ratelimit.FullAt of its state,
// to the millisecond: DeleteExpired relies on it, and no differential
// test reads it.
func TestExpiresIsFullAt(t *testing.T) {
	ctx := context.Background()
	pool, name, s := newTableStore(t)
	rng := rand.New(rand.NewPCG(1, 2))
	rates := []float64{1, 2.5, 0.1, 7, 1000, 1.0 / 3, 1e9}
	periods := []int64{1, 7, 1000, 60_000, 3_600_000, 86_400_000}
	names := []string{"a", "b", "c", "d", "e", "f"}
	params := map[string]driver.Params{}
	for _, n := range names {
		p := driver.Params{Kind: ratelimit.FixedWindow, Rate: rates[rng.IntN(len(rates))], Period: periods[rng.IntN(len(periods))]}
		if rng.IntN(2) == 0 {
			p.Kind = ratelimit.TokenBucket
		}
		p.Capacity = p.Rate * (0.5 + rng.Float64()*3)
		p.Phase = rng.Int64N(p.Period)
		params[n] = p
	}
	now := t0.UnixMilli()
	op := func() *driver.Op {
		n := names[rng.IntN(len(names))]
		p := params[n]
		op := &driver.Op{Now: now, Reserve: rng.IntN(3) == 0,
			Items: []driver.Item{{Name: n, Key: []string{"k1", "k2", "k3"}[rng.IntN(3)], Count: rng.Float64() * p.Capacity,
				Shards: []driver.Shard{{Index: 0, Params: p}}}}}
		if rng.IntN(5) == 0 {
			op.Mode = driver.ModeRefund
		}
		return op
	}
	for range 300 {
		now += rng.Int64N(5000)
		if rng.IntN(2) == 0 { // a lone call
			o := op()
			require.NoError(t, s.Apply(ctx, o, make([]driver.Decision, 1)))
			continue
		}
		var ops []*driver.Op
		var outs [][]driver.Decision
		for range 1 + rng.IntN(10) {
			ops = append(ops, op())
			outs = append(outs, make([]driver.Decision, 1))
		}
		require.NoError(t, s.ApplyBatch(ctx, ops, outs))
	}

	table := pgx.Identifier{name}.Sanitize()
	rows, err := pool.Query(ctx, "SELECT name, value, ts, expires FROM "+table+" WHERE value IS NOT NULL")
	require.NoError(t, err)
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			name    []byte
			st      driver.State
			expires int64
		)
		require.NoError(t, rows.Scan(&name, &st.Remaining, &st.TS, &expires))
		require.Equal(t, ratelimit.FullAt(params[string(name)], st), expires, "%s %+v", name, st)
		n++
	}
	require.NoError(t, rows.Err())
	require.Greater(t, n, 10)
}
