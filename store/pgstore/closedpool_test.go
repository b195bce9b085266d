package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// A store whose pool was closed fails every call with an error matching
// driver.ErrClosed, beside pgx's, that names the store and says what to
// do: as boltstore does when its database was closed, and redisstore when
// its client was. The caller closed what the store needs; no server is
// down.
func TestClosedPool(t *testing.T) {
	ctx := context.Background()
	table := uniqueTable(t, newPool(t, testserver.PostgresURL(t), nil))
	pool := newPool(t, testserver.PostgresURL(t), nil)
	s, err := pgstore.New(ctx, pool, pgstore.WithTable(table))
	require.NoError(t, err)
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
	now := time.Now().UnixMilli()
	op := func(m driver.Mode) *driver.Op {
		return &driver.Op{Mode: m, Now: now, Items: []driver.Item{{Name: "l", Key: "k", Count: 1, At: now, Shards: []driver.Shard{{Params: p}}}}}
	}
	require.NoError(t, s.Apply(ctx, op(driver.ModeLimit), make([]driver.Decision, 1)))
	pool.Close()
	for name, call := range map[string]func() error{
		"Apply":          func() error { return s.Apply(ctx, op(driver.ModeLimit), make([]driver.Decision, 1)) },
		"Apply, a check": func() error { return s.Apply(ctx, op(driver.ModeCheck), make([]driver.Decision, 1)) },
		"ApplyBatch": func() error {
			return s.ApplyBatch(ctx, []*driver.Op{op(driver.ModeLimit), op(driver.ModeLimit)}, [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)})
		},
		"Load":   func() error { return s.Load(ctx, []driver.RecordID{{Name: "l", Key: "k"}}, make([]driver.Record, 1)) },
		"Delete": func() error { return s.Delete(ctx, []driver.RecordID{{Name: "l", Key: "k"}}) },
		"DeleteExpired": func() error {
			_, err := s.DeleteExpired(ctx, time.UnixMilli(now))
			return err
		},
		"Now": func() error {
			_, err := s.Now(ctx)
			return err
		},
	} {
		err := call()
		require.ErrorIs(t, err, driver.ErrClosed, name)
		require.ErrorContains(t, err, "pgstore: ", name)
		require.ErrorContains(t, err, "close the pool after the store's last call", "%s: says what to do", name)
	}
}

// A batch that fails on one op's record goes again op by op; a pool
// closed before those sends fails the ops with an error matching
// driver.ErrClosed, as the batch's own send does: the ops' errors were
// pgx's alone, and read as the server's failure.
func TestClosedPoolBetweenResends(t *testing.T) {
	b := newResendBatch(t, nil, "good", "bad")
	resent := false
	pgstore.SetHooks(b.s, pgstore.Hooks{Resend: func() { resent = true; b.pool.Close() }})
	err := b.s.ApplyBatch(context.Background(), b.ops, b.outs)
	require.True(t, resent, "the batch went again op by op")
	require.ErrorIs(t, err, driver.ErrClosed)
	require.ErrorContains(t, err, "close the pool after the store's last call", "says what to do")
	require.Equal(t, []int{0, 1}, storetest.FailedOps(t, err))
}

// New on a closed pool fails with an error matching driver.ErrClosed,
// beside pgx's, that says to pass an open pool: whether its first
// statement is the search for the table's schema (a name without one) or
// the read of the schema. It failed with puddle's "closed pool" alone,
// which read as the server's failure.
func TestNewClosedPool(t *testing.T) {
	cleanup := newPool(t, testserver.PostgresURL(t), nil)
	pool := newPool(t, testserver.PostgresURL(t), nil)
	pool.Close()
	for name, table := range map[string]string{
		"without a schema": uniqueTable(t, cleanup),
		"with a schema":    "public." + uniqueTable(t, cleanup),
	} {
		for _, noDDL := range []bool{false, true} {
			opts := []pgstore.Option{pgstore.WithTable(table)}
			if noDDL {
				opts = append(opts, pgstore.WithoutDDL())
			}
			s, err := pgstore.New(context.Background(), pool, opts...)
			require.Nil(t, s, name)
			require.ErrorIs(t, err, driver.ErrClosed, "%s (WithoutDDL %v)", name, noDDL)
			require.ErrorContains(t, err, "pgstore: ", name)
			require.ErrorContains(t, err, "pass New an open pool", "%s: says what to do", name)
		}
	}
}
