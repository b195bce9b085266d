package redisstore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// binaryRecord is a record as the store writes it: value, ts, and a key
// that Redis does not expire.
func binaryRecord(v, ts float64) string {
	rec := []byte{1}
	for _, x := range []float64{v, ts, math.Inf(1)} {
		rec = binary.LittleEndian.AppendUint64(rec, math.Float64bits(x))
	}
	return string(rec)
}

// badRecords is the setting of the tests of what the store refuses to
// read: a store of its own, a fixed window of 100 an hour at now, and the
// record (l, bad) at key, which the tests write by hand.
type badRecords struct {
	c     *redis.Client
	store *redisstore.Store
	now   int64
	id    driver.RecordID
	key   string
}

func newBadRecords(t *testing.T) *badRecords {
	c := client(t)
	store := newStore(c, uniquePrefix(t, c))
	id := driver.RecordID{Name: "l", Key: "bad"}
	return &badRecords{c: c, store: store, now: t0.UnixMilli(), id: id, key: store.Key(id)}
}

var badRecordParams = driver.Params{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour.Milliseconds(), Capacity: 100}

// op is a limit of one token of key's record; check a check of it.
func (b *badRecords) op(key string) *driver.Op {
	return oneItemOp(driver.ModeLimit, b.now, "l", key, 1, badRecordParams)
}

func (b *badRecords) check(key string) *driver.Op {
	return oneItemOp(driver.ModeCheck, b.now, "l", key, 0, badRecordParams)
}

// requireRefused writes raw at the record's key and requires that its op,
// alone, checked and batched (the other op of the batch decided), and
// Load fail with ErrBadRecord, naming the key and what to do, with no Lua
// runtime error, and leave raw as it is; what names raw in failures.
func (b *badRecords) requireRefused(t *testing.T, what, raw string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, b.c.Set(ctx, b.key, raw, 0).Err())
	isBad := func(err error, how string) {
		t.Helper()
		require.ErrorIs(t, err, redisstore.ErrBadRecord, "%s %s", what, how)
		require.ErrorIs(t, err, driver.ErrBadRecord, "%s %s: the error of every store", what, how)
		require.ErrorContains(t, err, fmt.Sprintf("key %q", b.key), "%s %s: names the key", what, how)
		require.ErrorContains(t, err, "delete the key", "%s %s: says what to do", what, how)
		require.NotContains(t, err.Error(), "user_function", "%s %s", what, how)
		require.NotContains(t, err.Error(), "script:", "%s %s", what, how)
	}
	isBad(b.store.Apply(ctx, b.op("bad"), make([]driver.Decision, 1)), "alone")
	isBad(b.store.Apply(ctx, b.check("bad"), make([]driver.Decision, 1)), "checked")
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	err := b.store.ApplyBatch(ctx, []*driver.Op{b.op("good"), b.op("bad")}, outs)
	isBad(err, "batched")
	require.Equal(t, []int{1}, storetest.FailedOps(t, err), what)
	require.True(t, outs[0][0].OK, "%s: the other op is decided", what)
	isBad(b.store.Load(ctx, []driver.RecordID{b.id}, make([]driver.Record, 1)), "loaded")
	got, err := b.c.Get(ctx, b.key).Result()
	require.NoError(t, err)
	require.Equal(t, raw, got, "%s: left as it is", what)
}

// TestRecordNoReleaseWrites: a record of NaN or infinite tokens, or of a
// time beyond any op's (driver.CheckState), as binary or as text, fails
// its op, alone or batched, and Load, with ErrBadRecord, the key and what
// to do, and is left as it is; the function and Load read the same. The
// function decided on them: NaN tokens refused every call and reported
// NaN, +Inf read as a full bucket, -Inf refused forever, and a time of
// 2^60 ms kept the bucket at what it held for millions of years. Every
// finite number of tokens (a debt of any size, a value above the
// capacity) at a time within the bounds reads as before.
func TestRecordNoReleaseWrites(t *testing.T) {
	b := newBadRecords(t)
	ctx, c, store, key, id, now := context.Background(), b.c, b.store, b.key, b.id, b.now
	op, check := b.op, b.check
	tn := float64(now)
	bad := map[string]string{}
	for name, st := range map[string][2]float64{
		"NaN tokens":                  {math.NaN(), tn},
		"+Inf tokens":                 {math.Inf(1), tn},
		"-Inf tokens":                 {math.Inf(-1), tn},
		"a time of NaN":               {5, math.NaN()},
		"a time 2^60 ms away":         {5, 1 << 60},
		"a time 2^60 ms before 1970":  {5, -(1 << 60)},
		"a time of +Inf":              {5, math.Inf(1)},
		"a time past MaxTime":         {5, float64(driver.MaxTime + 1)},
		"a time before MinRecordTime": {5, float64(driver.MinRecordTime - 1)},
	} {
		bad[name] = binaryRecord(st[0], st[1])
		if !math.IsNaN(st[1]) && !math.IsInf(st[1], 0) {
			bad[name+" (text)"] = strconv.FormatFloat(st[0], 'g', -1, 64) + " " + strconv.FormatFloat(st[1], 'f', -1, 64)
		}
	}
	for name, raw := range bad {
		b.requireRefused(t, name, raw)
	}

	// At the bounds, and any finite number of tokens: read alike.
	for _, st := range []driver.State{
		{Remaining: -1e300, TS: now},
		{Remaining: 1e300, TS: now},
		{Remaining: 5, TS: driver.MaxTime},
		{Remaining: 5, TS: driver.MinRecordTime},
	} {
		for _, raw := range []string{binaryRecord(st.Remaining, float64(st.TS)),
			strconv.FormatFloat(st.Remaining, 'g', -1, 64) + " " + strconv.FormatInt(st.TS, 10)} {
			require.NoError(t, c.Set(ctx, key, raw, 0).Err())
			recs := make([]driver.Record, 1)
			require.NoError(t, store.Load(ctx, []driver.RecordID{id}, recs), "%+v", st)
			require.Equal(t, driver.Record{State: st, Found: true}, recs[0])
			out := make([]driver.Decision, 1)
			require.NoError(t, store.Apply(ctx, check("bad"), out), "%+v", st)
			outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
			require.NoError(t, store.ApplyBatch(ctx, []*driver.Op{op("good"), check("bad")}, outs), "%+v batched", st)
			require.Equal(t, out[0], outs[1][0], "%+v: batched as alone", st)
		}
	}
}
