package storetest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// testChangedLimits changes a live Limiter's limits (SetLimits) and checks
// that the records meet the new config at their next call: a lowered
// capacity cuts the tokens held, a raised one lets them grow, a changed
// rate refills at the new rate, for a token bucket and a fixed window.
func testChangedLimits(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	mock := newMock(epoch)
	tb := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}
	fw := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Start: time.UnixMilli(0)}
	lim, err := ratelimit.New(newStore(t), ratelimit.Limits{"tb": tb, "fw": fw}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	take := func(name string, count float64) ratelimit.Result {
		t.Helper()
		res, err := lim.Limit(ctx, name, "k", ratelimit.Count(count))
		require.NoError(t, err)
		return res
	}
	remaining := func(name string) float64 {
		t.Helper()
		st, err := lim.Value(ctx, name, "k")
		require.NoError(t, err)
		return st.Remaining
	}

	// t0: take 2 of 10 from each; then lower both to a capacity of 4.
	for _, name := range []string{"tb", "fw"} {
		require.True(t, take(name, 2).OK)
		require.Equal(t, 8.0, remaining(name))
	}
	tbLow, fwLow := tb, fw
	tbLow.Capacity, fwLow.Capacity = 4, 4
	require.NoError(t, lim.SetLimits(ratelimit.Limits{"tb": tbLow, "fw": fwLow}))
	for _, name := range []string{"tb", "fw"} {
		require.Equal(t, 4.0, remaining(name), "%s: the record is cut to the new capacity", name)
		require.True(t, take(name, 4).OK, name)
		res := take(name, 0.5)
		require.False(t, res.OK, "%s: the 4 of the new capacity are spent", name)
		require.Equal(t, 0.0, res.Remaining, name)
	}

	// t0+1s: lower the rate to 2 and raise the capacity to 20: the token
	// bucket refilled 2 in that second, the window granted 2.
	mock.Add(time.Second)
	tbSlow, fwSlow := tb, fw
	tbSlow.Rate, tbSlow.Capacity = 2, 20
	fwSlow.Rate, fwSlow.Capacity = 2, 20
	require.NoError(t, lim.SetLimits(ratelimit.Limits{"tb": tbSlow, "fw": fwSlow}))
	for _, name := range []string{"tb", "fw"} {
		require.Equal(t, 2.0, remaining(name), name)
	}
	// t0+11s: 2 + 10·2 = 22, capped at the raised capacity of 20.
	mock.Add(10 * time.Second)
	for _, name := range []string{"tb", "fw"} {
		require.Equal(t, 20.0, remaining(name), name)
		require.True(t, take(name, 20).OK, name)
		require.False(t, take(name, 1).OK, name)
	}

	// A removed limit is unknown; its records stay for a new declaration.
	require.NoError(t, lim.SetLimits(ratelimit.Limits{"tb": tbSlow}))
	_, err = lim.Limit(ctx, "fw", "k")
	require.ErrorIs(t, err, ratelimit.ErrUnknownLimit)
	require.NoError(t, lim.SetLimit("fw", fwSlow))
	require.Equal(t, 0.0, remaining("fw"))
}

// testKeyHash checks WithKeyHash: a Limiter that hashes its keys answers
// exactly as one that does not (on a store of its own), keeps its
// records under other keys than the clear ones, and two secrets keep
// separate state in one store.
func testKeyHash(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	mock := newMock(epoch)
	limits := ratelimit.Limits{
		"tb":      {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Second, MaxReserved: 10},
		"fw":      {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Second, Start: time.UnixMilli(0)},
		"sharded": {Kind: ratelimit.TokenBucket, Rate: 8, Period: time.Second, Shards: 4},
	}
	secretA := []byte("storetest secret A, 32 bytes....")
	secretB := []byte("storetest secret B, 32 bytes....")
	shared := newStore(t)
	plain, err := ratelimit.New(newStore(t), limits, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(7, 7)))
	require.NoError(t, err)
	hashedA, err := ratelimit.New(shared, limits, ratelimit.WithClock(mock), ratelimit.WithRand(rand.NewPCG(7, 7)), ratelimit.WithKeyHash(secretA))
	require.NoError(t, err)
	hashedB, err := ratelimit.New(shared, limits, ratelimit.WithClock(mock), ratelimit.WithKeyHash(secretB))
	require.NoError(t, err)

	keys := []string{"user-42", "api-key-7f3a", ""}
	for step := range 12 {
		for _, name := range []string{"tb", "fw", "sharded"} {
			for _, key := range keys {
				want, err := plain.Limit(ctx, name, key, ratelimit.Count(2))
				require.NoError(t, err)
				got, err := hashedA.Limit(ctx, name, key, ratelimit.Count(2))
				require.NoError(t, err)
				require.Equal(t, want, got, "step %d %s %q", step, name, key)
				require.Equal(t, key, got.Key)
			}
		}
		r, err := hashedA.Reserve(ctx, "tb", "user-42", ratelimit.Count(3))
		require.NoError(t, err)
		want, err := plain.Reserve(ctx, "tb", "user-42", ratelimit.Count(3))
		require.NoError(t, err)
		require.Equal(t, want.Result(), r.Result())
		require.NoError(t, r.Cancel(ctx))
		require.NoError(t, want.Cancel(ctx))
		mock.Add(300 * time.Millisecond)
	}
	for _, name := range []string{"tb", "sharded"} {
		want, err := plain.Value(ctx, name, "user-42")
		require.NoError(t, err)
		got, err := hashedA.Value(ctx, name, "user-42")
		require.NoError(t, err)
		require.Equal(t, want, got, name)
	}

	// The records are not under the clear key.
	var recs [1]driver.Record
	require.NoError(t, shared.Load(ctx, []driver.RecordID{{Name: "tb", Key: "user-42"}}, recs[:]))
	require.False(t, recs[0].Found, "a record under the clear key")

	// Another secret, another state: B finds full buckets where A has
	// spent; Reset through A empties A's only.
	st, err := hashedB.Value(ctx, "tb", "user-42")
	require.NoError(t, err)
	require.Equal(t, 5.0, st.Remaining)
	require.False(t, st.Shards[0].Stored)
	_, err = hashedB.Limit(ctx, "tb", "user-42", ratelimit.Count(5))
	require.NoError(t, err)
	require.NoError(t, hashedA.Reset(ctx, "tb", "user-42"))
	st, err = hashedA.Value(ctx, "tb", "user-42")
	require.NoError(t, err)
	require.False(t, st.Shards[0].Stored, "Reset through A")
	st, err = hashedB.Value(ctx, "tb", "user-42")
	require.NoError(t, err)
	require.True(t, st.Shards[0].Stored, "B's record outlives A's Reset")
	require.Equal(t, 0.0, st.Remaining)
}
