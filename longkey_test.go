package ratelimit_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// digestForm is the store key of a key longer than 256 bytes, as
// documented (docs/api.md): "sha256:" and the key's SHA-256 in unpadded
// base64url, 50 bytes.
func digestForm(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// Without WithKeyHash, a key longer than 256 bytes reaches the store on
// no path as it is, but as its digest form, one for every path: Limit and
// Check (the Binder's fast path and Apply), Reserve and Cancel, LimitAll, a
// sharded limit, an inline config, Value, Reset and the deny cache; the
// Results and events keep the key as given. A key of 256 bytes reaches
// the store as it is. The store was given the key of a megabyte.
func TestLongKeyOnEveryPath(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{
		"one":     {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Second},
		"window":  {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Second},
		"sharded": {Kind: ratelimit.TokenBucket, Rate: 4, Period: time.Second, Shards: 2},
	}
	long := strings.Repeat("k", 1<<20)
	for _, tc := range []struct {
		key, stored string
	}{
		{long, digestForm(long)},
		{strings.Repeat("k", 257), digestForm(strings.Repeat("k", 257))},
		{strings.Repeat("k", 256), strings.Repeat("k", 256)},
	} {
		store := &keyRecorder{Store: must(memstore.New())}
		var events []ratelimit.Event
		observer := ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) { events = append(events, e) })
		plain, err := ratelimit.New(store, limits, ratelimit.WithClock(newMock()))
		require.NoError(t, err)
		watched, err := ratelimit.New(store, limits, ratelimit.WithClock(newMock()), ratelimit.WithDenyCache(10), ratelimit.WithObserver(observer))
		require.NoError(t, err)
		for _, lim := range []*ratelimit.Limiter{plain, watched} {
			for _, name := range []string{"one", "window", "sharded"} {
				for range 3 {
					res, err := lim.Limit(ctx, name, tc.key)
					require.NoError(t, err)
					require.Equal(t, tc.key, res.Key)
				}
				_, err := lim.Check(ctx, name, tc.key)
				require.NoError(t, err)
				_, err = lim.Value(ctx, name, tc.key)
				require.NoError(t, err)
				r, err := lim.Reserve(ctx, name, tc.key, ratelimit.WithReserve())
				require.NoError(t, err)
				require.NoError(t, r.Cancel(ctx))
				require.NoError(t, lim.Reset(ctx, name, tc.key))
			}
			res, err := lim.LimitAll(ctx, tc.key, []string{"one", "window"})
			require.NoError(t, err)
			require.Equal(t, tc.key, res.Key)
			_, err = lim.Limit(ctx, "inline", tc.key, ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}))
			require.NoError(t, err)
		}
		require.Len(t, store.keys, 1, "key of %d bytes: one store key on every path", len(tc.key))
		for k := range store.keys {
			require.Equal(t, tc.stored, k, "key of %d bytes", len(tc.key))
		}
		require.NotEmpty(t, events)
		for _, e := range events {
			require.Equal(t, tc.key, e.Result.Key)
		}
	}
}

// The record of a long key is the one under its digest form: memstore
// holds nothing under the key as it is.
func TestLongKeyRecordIsTheDigestForm(t *testing.T) {
	ctx := context.Background()
	store := must(memstore.New())
	lim, err := ratelimit.New(store, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Minute}}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	key := strings.Repeat("x", 300)
	res, err := lim.Limit(ctx, "l", key, ratelimit.Count(2))
	require.NoError(t, err)
	require.True(t, res.OK)
	var recs [2]driver.Record
	require.NoError(t, store.Load(ctx, []driver.RecordID{{Name: "l", Key: digestForm(key)}, {Name: "l", Key: key}}, recs[:]))
	assert.True(t, recs[0].Found, "under the digest form")
	assert.Equal(t, 3.0, recs[0].State.Remaining)
	assert.False(t, recs[1].Found, "nothing under the key as it is")
}

// Fresh long keys do not grow the process by their length: 64 keys of
// 256 KiB leave memstore holding a record of a few dozen bytes each. It
// held every key, 16 MiB.
func TestLongKeysDoNotAmplifyMemory(t *testing.T) {
	ctx := context.Background()
	store := must(memstore.New())
	lim, err := ratelimit.New(store, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Hour}}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for i := range 64 {
		key := strings.Repeat(string(rune('a'+i%26)), 256<<10) + string(rune(i))
		res, err := lim.Limit(ctx, "l", key)
		require.NoError(t, err)
		require.True(t, res.OK)
	}
	require.Equal(t, 64, store.Len())
	after := heap()
	grown := int64(after) - int64(before)
	assert.Less(t, grown, int64(4<<20), "the heap grew by %d bytes for 64 records", grown)
	runtime.KeepAlive(lim)
}

// Two long keys that differ in their last byte only are two records,
// limited apart, through the Binder's path and through Apply (sharded).
func TestLongKeysDifferingInTheLastByteAreApart(t *testing.T) {
	ctx := context.Background()
	a := strings.Repeat("h", 4096) + "a"
	b := strings.Repeat("h", 4096) + "b"
	for _, shards := range []int{1, 2} {
		lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Hour, Shards: shards}},
			ratelimit.WithClock(newMock()))
		require.NoError(t, err)
		res, err := lim.Limit(ctx, "l", a, ratelimit.Count(2))
		require.NoError(t, err)
		require.True(t, res.OK)
		res, err = lim.Limit(ctx, "l", a)
		require.NoError(t, err)
		require.False(t, res.OK, "%d shards: a is spent", shards)
		res, err = lim.Limit(ctx, "l", b, ratelimit.Count(2))
		require.NoError(t, err)
		require.True(t, res.OK, "%d shards: b is not a", shards)
	}
}

// A long key is granted, refused, reserved and settled by token, read by
// Value and Reset, all on one record; a receipt or a reservation's token
// of a long key reads back (the store key in it is the digest form, 50
// bytes) and settles against that record. A key of a megabyte gave no
// token, or refused WithReceipt.
func TestLongKeyActsOnOneRecord(t *testing.T) {
	ctx := context.Background()
	key := strings.Repeat("m", 1<<20)
	for _, shards := range []int{1, 2} {
		lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Hour, Shards: shards})
		remaining := func() float64 {
			st, err := lim.Value(ctx, "jobs", key)
			require.NoError(t, err)
			return st.Remaining
		}
		res, err := lim.Limit(ctx, "jobs", key, ratelimit.Count(6))
		require.NoError(t, err)
		require.True(t, res.OK)
		require.Equal(t, 4.0, remaining(), "%d shards", shards)
		res, err = lim.Limit(ctx, "jobs", key, ratelimit.Count(5))
		require.NoError(t, err)
		require.False(t, res.OK, "%d shards: refused, 4 left", shards)

		res, err = lim.Limit(ctx, "jobs", key, ratelimit.Count(3), ratelimit.WithReceipt())
		require.NoError(t, err, "%d shards", shards)
		require.True(t, res.OK)
		require.NotNil(t, res.Token, "%d shards: a receipt", shards)
		require.Less(t, len(res.Token.String()), 200, "%d shards: the token holds the digest form", shards)
		require.Equal(t, 1.0, remaining(), "%d shards", shards)
		back, err := ratelimit.ParseToken(res.Token.String())
		require.NoError(t, err)
		require.NoError(t, lim.Refund(ctx, back), "%d shards", shards)
		require.Equal(t, 4.0, remaining(), "%d shards: refunded to the record", shards)

		r, err := lim.Reserve(ctx, "jobs", key, ratelimit.Count(4))
		require.NoError(t, err)
		require.True(t, r.OK())
		require.Equal(t, 0.0, remaining(), "%d shards", shards)
		tok := r.Token()
		require.NotNil(t, tok, "%d shards: a reservation's token", shards)
		back, err = ratelimit.ParseToken(tok.String())
		require.NoError(t, err)
		require.NoError(t, lim.Settle(ctx, back, 1), "%d shards", shards)
		require.Equal(t, 3.0, remaining(), "%d shards: 3 of 4 handed back", shards)

		require.NoError(t, lim.Reset(ctx, "jobs", key))
		require.Equal(t, 10.0, remaining(), "%d shards: reset", shards)
		mock.Add(time.Minute)
	}
}

// A short key spelt exactly as the digest form of a long key does not
// share the long key's record: the digest form is shown wherever the
// store's keys are (redis-cli, psql, a token's store key, ratelimit token
// inspect), so whoever saw it could otherwise spend the long key's tokens
// without knowing the key. Such a key reaches the store as a digest form
// of its own; the long key keeps its record.
func TestShortKeySpeltAsDigestForm(t *testing.T) {
	ctx := context.Background()
	long := strings.Repeat("secret-session-", 100)
	lookalike := digestForm(long)
	require.Len(t, lookalike, 50)
	store := &keyRecorder{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"one": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "one", long)
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = lim.Limit(ctx, "one", lookalike)
	require.NoError(t, err)
	assert.True(t, res.OK, "the look-alike key was refused: it spent from the long key's record")
	res, err = lim.Limit(ctx, "one", long)
	require.NoError(t, err)
	assert.False(t, res.OK, "the long key's own record")
	assert.Len(t, store.keys, 2, "two keys, two store keys")
	assert.Contains(t, store.keys, lookalike, "the long key's digest form")
	assert.Contains(t, store.keys, digestForm(lookalike), "the look-alike's own digest form")
}
