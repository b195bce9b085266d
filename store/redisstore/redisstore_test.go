package redisstore_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.UnixMilli(1_700_000_000_000)

func newMock(at time.Time) *clock.Mock {
	m := clock.NewMock()
	m.Set(at)
	return m
}

// client returns a client of the local Redis server, closed at cleanup.
func client(t testing.TB) *redis.Client {
	opt, err := redis.ParseURL(testserver.RedisURL(t))
	require.NoError(t, err)
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// uniquePrefix returns a prefix of its own for one test, and deletes its
// keys at cleanup.
func uniquePrefix(t testing.TB, c redis.UniversalClient) string {
	prefix := fmt.Sprintf("ratelimit-test:%d:", time.Now().UnixNano())
	t.Cleanup(func() { deletePrefix(c, prefix) })
	return prefix
}

func deletePrefix(c redis.UniversalClient, prefix string) {
	ctx := context.Background()
	scan := func(ctx context.Context, n *redis.Client) error {
		iter := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			n.Del(ctx, iter.Val())
		}
		return iter.Err()
	}
	switch c := c.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, scan)
	case *redis.Ring:
		_ = c.ForEachShard(ctx, scan)
	default:
		_ = scan(ctx, c.(*redis.Client))
	}
}

// newStore returns a store on c with its keys under prefix, which does
// not log the server's settings (the local test servers keep nothing on
// disk, and the tests make many stores).
func newStore(c redis.UniversalClient, prefix string, opts ...redisstore.Option) *redisstore.Store {
	return must(redisstore.New(c, append([]redisstore.Option{redisstore.WithPrefix(prefix), redisstore.WithLogger(nil)}, opts...)...))
}

func TestConformance(t *testing.T) {
	c := client(t)
	storetest.Run(t, func(t *testing.T) ratelimit.Store {
		return newStore(c, uniquePrefix(t, c))
	}, storetest.DifferentialRuns(20, 120), storetest.SpoilRecord(spoilOn(c)))
}

// spoilOn returns the suite's spoiler (storetest.SpoilRecord) of the
// stores on c: it writes, at a record's key, what no release writes.
func spoilOn(c redis.UniversalClient) func(*testing.T, ratelimit.Store, driver.RecordID) {
	return func(t *testing.T, s ratelimit.Store, id driver.RecordID) {
		t.Helper()
		require.NoError(t, c.Set(context.Background(), s.(*redisstore.Store).Key(id), "spoiled", 0).Err())
	}
}

func TestClusterConformance(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ",")})
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.Ping(context.Background()).Err())
	storetest.Run(t, func(t *testing.T) ratelimit.Store {
		return newStore(c, uniquePrefix(t, c))
	}, storetest.DifferentialRuns(10, 100), storetest.SpoilRecord(spoilOn(c)))
}

func TestMultiProcess(t *testing.T) {
	storetest.MultiProcess(t, func(t *testing.T) ratelimit.Store {
		return newStore(client(t), "ratelimit-test:multiprocess:")
	}, 4)
}

// counter counts what a client sends: commands alone and pipelines.
type counter struct {
	cmds  atomic.Int64
	names []string
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.cmds.Add(1)
		c.names = append(c.names, cmd.Name())
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.cmds.Add(1)
		c.names = append(c.names, "pipeline")
		return next(ctx, cmds)
	}
}

func TestOneRoundTripPerCall(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	cnt := &counter{}
	c.AddHook(cnt)
	lim, err := ratelimit.New(newStore(c, uniquePrefix(t, c)), ratelimit.Limits{
		"one":   {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute},
		"two":   {Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Minute},
		"shard": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute, Shards: 8},
	}, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "one", "warm-up") // may load the library: FCALL, FUNCTION LOAD, FCALL
	require.NoError(t, err)

	calls := []func() error{
		func() error { _, err := lim.Limit(ctx, "one", "k"); return err },
		func() error { _, err := lim.Check(ctx, "one", "k"); return err },
		func() error { _, err := lim.Limit(ctx, "shard", "k", ratelimit.Count(20)); return err },
		func() error { _, err := lim.LimitAll(ctx, "k", []string{"one", "two", "shard"}); return err },
	}
	for i, call := range calls {
		cnt.cmds.Store(0)
		cnt.names = nil
		require.NoError(t, call())
		require.Equal(t, int64(1), cnt.cmds.Load(), "call %d sent %v", i, cnt.names)
		require.Equal(t, []string{"fcall"}, cnt.names, "call %d", i)
	}

	// A server that forgot the library (a restart without persistence, a
	// FUNCTION FLUSH): FCALL fails, the store loads the library, once, and
	// calls again.
	require.NoError(t, c.FunctionDelete(ctx, redisstore.FunctionLibrary()).Err())
	cnt.names = nil
	res, err := lim.Limit(ctx, "one", "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Equal(t, []string{"fcall", "function", "fcall"}, cnt.names)
}

func TestExpiry(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	prefix := uniquePrefix(t, c)
	margin := 2 * time.Minute
	s := newStore(c, prefix, redisstore.WithExpiryMargin(margin))
	mock := newMock(t0)
	lim, err := ratelimit.New(s, ratelimit.Limits{
		"fw": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour, Capacity: 30, Start: time.UnixMilli(0)},
		"tb": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Hour},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	pttl := func(name string) time.Duration {
		d, err := c.PTTL(ctx, s.Key(driver.RecordID{Name: name, Key: "k"})).Result()
		require.NoError(t, err)
		return d
	}
	// A record expires past the moment its bucket is full again, plus the
	// margin, and at most a margin later (the slack that lets most writes
	// leave the expiry alone); a second covers the test's own time, and a
	// millisecond the moment rounded up to a whole one.
	within := func(name string, full time.Duration) time.Duration {
		t.Helper()
		d := pttl(name)
		require.GreaterOrEqual(t, d, full+margin-time.Second, "%s expires too soon", name)
		require.LessOrEqual(t, d, full+2*margin+time.Millisecond, "%s is kept too long", name)
		return d
	}
	windowStart := time.UnixMilli(t0.UnixMilli() / 3_600_000 * 3_600_000)

	// 25 of 30 spent: three grants of 10 are needed, so the bucket is full
	// again at the start of the third window from now.
	_, err = lim.Limit(ctx, "fw", "k", ratelimit.Count(25))
	require.NoError(t, err)
	within("fw", windowStart.Add(3*time.Hour).Sub(mock.Now()))

	// A token bucket 4 tokens short is full 24 minutes later.
	_, err = lim.Limit(ctx, "tb", "k", ratelimit.Count(4))
	require.NoError(t, err)
	within("tb", 24*time.Minute)

	// A lone call's write sets the expiry from its own need (without
	// reading the server's time), also when that needs the record longer.
	mock.Add(10 * time.Minute)
	res, err := lim.Limit(ctx, "tb", "k", ratelimit.Count(5))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.InDelta(t, 6+10.0/6-5, res.Remaining, 1e-9)
	within("tb", time.Duration(float64(time.Hour)*(10-res.Remaining)/10))

	// A batch's write reads the server's time: it sets the expiry and keeps
	// the deadline in the record (a lone call's write left none: with
	// 0.05 tokens more, the record is needed 18 s longer, past what the
	// lone call's expiry covers), then leaves the expiry alone while it
	// still covers the record's need.
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Hour.Milliseconds(), Capacity: 10}
	batch := func(count float64) time.Duration {
		t.Helper()
		now := mock.Now().UnixMilli()
		ops := []*driver.Op{
			{Now: now, Items: []driver.Item{{Name: "tb", Key: "k", Count: count, Shards: []driver.Shard{{Params: p}}}}},
			{Now: now, Items: []driver.Item{{Name: "tb", Key: "other", Count: 1, Shards: []driver.Shard{{Params: p}}}}},
		}
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		require.NoError(t, s.ApplyBatch(ctx, ops, outs))
		require.True(t, outs[0][0].OK)
		return within("tb", time.Duration(float64(time.Hour)*(10-outs[0][0].Remaining)/10))
	}
	before := batch(0.05)
	after := batch(1e-6)
	require.LessOrEqual(t, after, before, "the expiry did not move")

	// Reset drops the records.
	require.NoError(t, lim.Reset(ctx, "tb", "k"))
	require.Equal(t, time.Duration(-2), pttl("tb"), "no key after reset")
}

// TestExpiryMarginBelowGrace: New refuses an expiry margin below
// driver.ExpiryGrace. With one, Redis dropped a record the margin after
// its bucket was full again (0: at that moment), not ExpiryGrace after as
// the driver requires: a call judged a moment before, which reached Redis
// a moment after, found a full bucket, and a fixed window granted its
// capacity twice within one window. (A settlement's mark is kept
// ExpiryGrace past its Until whatever the margin.) The least margin
// accepted keeps a record, written by a lone op or in a batch, and a
// mark, for as long as the driver requires, by Redis's clock.
func TestExpiryMarginBelowGrace(t *testing.T) {
	c := client(t)
	for _, m := range []time.Duration{0, time.Millisecond, redisstore.DefaultExpiryMargin - time.Millisecond, -time.Minute} {
		s, err := redisstore.New(c, redisstore.WithExpiryMargin(m))
		require.ErrorContains(t, err, "below driver.ExpiryGrace", "margin %v", m)
		require.ErrorContains(t, err, "pass 1m0s or more", "margin %v", m)
		require.Nil(t, s)
	}

	ctx := context.Background()
	s := newStore(c, uniquePrefix(t, c), redisstore.WithExpiryMargin(time.Duration(driver.ExpiryGrace)*time.Millisecond))
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour.Milliseconds(), Capacity: 10}
	now := t0.UnixMilli()
	full := now/p.Period*p.Period + p.Period // the window's end: every window refills the bucket
	op := func(key string) *driver.Op { return oneItemOp(driver.ModeLimit, now, "l", key, 10, p) }
	// kept checks that Redis keeps key at least need ms past the server's
	// time read before the write (at or before the write's own).
	kept := func(key string, from, need int64) {
		t.Helper()
		at, err := c.PExpireTime(ctx, key).Result()
		require.NoError(t, err)
		require.GreaterOrEqual(t, at.Milliseconds(), from+need, "%s expires too soon", key)
	}
	from, err := s.Now(ctx)
	require.NoError(t, err)
	out := make([]driver.Decision, 1)
	require.NoError(t, s.Apply(ctx, op("alone"), out))
	require.True(t, out[0].OK)
	kept(s.Key(driver.RecordID{Name: "l", Key: "alone"}), from, full-now+driver.ExpiryGrace)

	settle := &driver.Op{Mode: driver.ModeRefund, Now: now, Items: []driver.Item{{Name: "l", Key: "batch", Count: 1, At: now,
		Shards: []driver.Shard{{Params: p}}}}, Settle: &driver.Settlement{ID: [16]byte{7}, Kind: driver.SettleCancel, Until: now + 5_000}}
	from, err = s.Now(ctx)
	require.NoError(t, err)
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1), make([]driver.Decision, 1)}
	require.NoError(t, s.ApplyBatch(ctx, []*driver.Op{op("batch"), op("other"), settle}, outs))
	require.True(t, outs[0][0].OK)
	require.Equal(t, 1.0, outs[2][0].Remaining, "the settlement gave a token back")
	kept(s.Key(driver.RecordID{Name: "l", Key: "batch"}), from, full-now+driver.ExpiryGrace)
	rec := s.Key(driver.RecordID{Name: "l", Key: "batch"})
	mark := rec[:strings.IndexByte(rec, '}')+1] + "s:" + hex.EncodeToString(settle.Settle.ID[:]) // the layout of docs/stores/redis.md
	kept(mark, from, settle.Settle.Until-now+driver.ExpiryGrace)
}

func TestServerTime(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	s := newStore(c, uniquePrefix(t, c), redisstore.WithServerTime())
	require.True(t, s.OwnClock())
	server, err := s.Now(ctx)
	require.NoError(t, err)
	require.InDelta(t, time.Now().UnixMilli(), server, float64(time.Hour.Milliseconds()), "the local server's clock")

	// The Limiter's clock is a year off; the server's decides.
	lim, err := ratelimit.New(s, ratelimit.Limits{"tb": {Kind: ratelimit.TokenBucket, Rate: 1, Period: 24 * time.Hour, Capacity: 2}},
		ratelimit.WithClock(newMock(time.Now().AddDate(-1, 0, 0))))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "tb", "k", ratelimit.Count(2))
	require.NoError(t, err)
	require.True(t, res.OK)
	rec := make([]driver.Record, 1)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "tb", Key: "k"}}, rec))
	require.True(t, rec[0].Found)
	require.InDelta(t, server, rec[0].State.TS, float64(time.Minute.Milliseconds()), "the record is stamped with the server's time")
	st, err := lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.InDelta(t, 0, st.Remaining, 0.01, "Value is judged at the server's time too")

	require.False(t, must(redisstore.New(c)).OwnClock())
}

func TestBadOptions(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	for _, tc := range []struct {
		client redis.UniversalClient
		opts   []redisstore.Option
		want   string
	}{
		{nil, nil, "needs a client"},
		{c, []redisstore.Option{redisstore.WithPrefix("app{1}:")}, "brace"},
		{c, []redisstore.Option{redisstore.WithExpiryMargin(-time.Second)}, "below driver.ExpiryGrace"},
		{c, []redisstore.Option{redisstore.WithMaxBatch(0)}, "below 1"},
	} {
		s, err := redisstore.New(tc.client, tc.opts...)
		require.ErrorContains(t, err, tc.want)
		require.Nil(t, s)
	}
	s, err := redisstore.New(c, redisstore.WithLogger(nil))
	require.NoError(t, err, "a nil logger is silent")
	_, err = s.Now(ctx)
	require.NoError(t, err)
}

// The layout of the keys must not change from one version to the next: a
// store that looked elsewhere would find every limit full again.
func TestKeyLayout(t *testing.T) {
	require.Equal(t, "ratelimit:{32c6d7a54d35dacb}9:sendEmail:0:user-42",
		must(redisstore.New(undialled)).Key(driver.RecordID{Name: "sendEmail", Key: "user-42"}))
	require.Equal(t, "app:{cbf29ce484222325}1:n:3:",
		must(redisstore.New(undialled, redisstore.WithPrefix("app:"))).Key(driver.RecordID{Name: "n", Key: "", Shard: 3}))
}

func TestKeysShareASlot(t *testing.T) {
	s := must(redisstore.New(undialled))
	key := "user:{42}"
	a := s.Key(driver.RecordID{Name: "perHour", Key: key})
	b := s.Key(driver.RecordID{Name: "perMinute", Key: key, Shard: 7})
	tag := func(k string) string { return k[strings.IndexByte(k, '{')+1 : strings.IndexByte(k, '}')] }
	require.Equal(t, tag(a), tag(b))
	require.NotEqual(t, tag(a), tag(s.Key(driver.RecordID{Name: "perHour", Key: "user:{43}"})))
}

// oneItemOp returns an op of mode at now of one item, name and key, of
// count tokens of one shard under p; its At is now (read by a refund only).
func oneItemOp(mode driver.Mode, now int64, name, key string, count float64, p driver.Params) *driver.Op {
	return &driver.Op{Mode: mode, Now: now,
		Items: []driver.Item{{Name: name, Key: key, Count: count, At: now, Shards: []driver.Shard{{Params: p}}}}}
}

// undialled is a client for tests of what a store computes without a
// server: it would dial a closed port, and is never used.
var undialled = redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})

// TestWrongTypeKey: a key of another type than a string where a record
// or a settlement's mark belongs fails its op, alone or in a batch, and
// Load, with ErrBadRecord, the key, its type and what to do, as a string
// that is no record does (rather than with Redis's WRONGTYPE, which names
// neither), and is left as it is. (MGET, which reads a batch, answers nil
// for such a key, as for a missing one: the batch read it as a full bucket
// and overwrote it.) The other op of the batch is decided.
func TestWrongTypeKey(t *testing.T) {
	c := client(t)
	store := newStore(c, uniquePrefix(t, c))
	ctx := context.Background()
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
	now := t0.UnixMilli()
	op := func(key string) *driver.Op { return oneItemOp(driver.ModeLimit, now, "l", key, 1, p) }
	isBad := func(err error, key, typ, how string) {
		t.Helper()
		require.ErrorIs(t, err, redisstore.ErrBadRecord, how)
		require.ErrorIs(t, err, driver.ErrBadRecord, "%s: the error of every store", how)
		require.ErrorContains(t, err, fmt.Sprintf("key %q holds a %s, not a string", key, typ), how)
		require.ErrorContains(t, err, "delete the key", "%s: says what to do", how)
		require.NotContains(t, err.Error(), "WRONGTYPE", how)
		require.NotContains(t, err.Error(), "script:", how)
	}
	for i, plant := range map[string]func(key string) error{
		"hash": func(key string) error { return c.HSet(ctx, key, "f", "v").Err() },
		"list": func(key string) error { return c.RPush(ctx, key, "v").Err() },
	} {
		name := "bad-" + i
		id := driver.RecordID{Name: "l", Key: name}
		key := store.Key(id)
		require.NoError(t, plant(key))
		isBad(store.Apply(ctx, op(name), make([]driver.Decision, 1)), key, i, i+" alone")
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		err := store.ApplyBatch(ctx, []*driver.Op{op("good"), op(name)}, outs)
		isBad(err, key, i, i+" batched")
		require.Equal(t, []int{1}, storetest.FailedOps(t, err), i)
		require.True(t, outs[0][0].OK, "%s: the other op of the batch is decided", i)
		isBad(store.Load(ctx, []driver.RecordID{{Name: "l", Key: "good"}, id}, make([]driver.Record, 2)), key, i, i+" loaded")
		typ, err := c.Type(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, i, typ, "the key is left as it was")
	}

	// A settlement whose mark's key holds a hash.
	settle := &driver.Op{Mode: driver.ModeRefund, Now: now, Items: []driver.Item{{Name: "l", Key: "good", Count: 1, At: now,
		Shards: []driver.Shard{{Params: p}}}}, Settle: &driver.Settlement{ID: [16]byte{8}, Kind: driver.SettleUse, Until: now + 5_000}}
	rec := store.Key(driver.RecordID{Name: "l", Key: "good"})
	mark := rec[:strings.IndexByte(rec, '}')+1] + "s:" + hex.EncodeToString(settle.Settle.ID[:])
	require.NoError(t, c.HSet(ctx, mark, "f", "v").Err())
	isBad(store.Apply(ctx, settle, make([]driver.Decision, 1)), mark, "hash", "a mark alone")
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	isBad(store.ApplyBatch(ctx, []*driver.Op{op("good"), settle}, outs), mark, "hash", "a mark batched")
	require.True(t, outs[0][0].OK)
}

// TestCorruptRecord: a string where a record belongs that is none (text
// that is no "<value> <ts>", a record cut short or too long, a settlement's
// mark) fails its op, alone or batched, and Load, with ErrBadRecord, the
// key and what to do, rather than with the function's Lua runtime error
// (it read the string as nil numbers and did arithmetic on them), and is
// left as it is. The function and Load refuse the same strings, numbers
// spelled as Lua's tonumber reads them and ParseFloat does not ("0x10",
// "-nan") included, and read the same record from a text one, spelled as
// ParseFloat reads it and tonumber does not ("1_0") included.
func TestCorruptRecord(t *testing.T) {
	b := newBadRecords(t)
	ctx, c, store, key, id, now := context.Background(), b.c, b.store, b.key, b.id, b.now
	op, check := b.op, b.check
	ts := strconv.FormatInt(now, 10)
	for _, raw := range []string{"garbage", "", "1 x", "1 2 3", "\x01short", "\x01" + strings.Repeat("\x00", 25), "\x02\x01",
		// Numbers that Lua's tonumber reads and ParseFloat does not.
		"0x10 " + ts, "-nan " + ts, "+nan " + ts, "nan(1) " + ts, "1e400 " + ts, "infin " + ts, "0x1p " + ts,
		"5 0x18bcfe56800", "5 -nan", "5 1e999", " 5 " + ts, "5  " + ts, "5\t" + ts,
	} {
		b.requireRefused(t, strconv.Quote(raw), raw)
	}

	// A text record, as earlier versions wrote it: read alike.
	require.NoError(t, c.Set(ctx, key, fmt.Sprintf("49.5 %d", now), 0).Err())
	recs := make([]driver.Record, 1)
	require.NoError(t, store.Load(ctx, []driver.RecordID{id}, recs))
	require.Equal(t, driver.Record{State: driver.State{Remaining: 49.5, TS: now}, Found: true}, recs[0])
	out := make([]driver.Decision, 1)
	require.NoError(t, store.Apply(ctx, op("bad"), out))
	require.Equal(t, 48.5, out[0].Remaining)

	// Numbers that ParseFloat reads and Lua's tonumber does not, or reads
	// otherwise: the function reads them as Load does.
	for _, raw := range []string{"1_0 " + ts, "0x1.8p1 " + ts, "0X_1P4 " + ts, "+.5e1 " + ts, "1e-400 " + ts, "4_9.5 1_700_000_000_000",
		"49.5 0x18bcfe568p8", "49.5 0x1.8BCFE568P+40", "1E300 " + ts, "-0x1p1000 " + ts} {
		require.NoError(t, c.Set(ctx, key, raw, 0).Err())
		require.NoError(t, store.Load(ctx, []driver.RecordID{id}, recs), "%q", raw)
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		require.NoError(t, store.ApplyBatch(ctx, []*driver.Op{op("good"), check("bad")}, outs), "%q batched", raw)
		require.NoError(t, store.Apply(ctx, check("bad"), out), "%q", raw)
		require.Equal(t, outs[1][0], out[0], "%q: batched as alone", raw)
		require.Equal(t, now, recs[0].State.TS, "%q", raw)
		require.Equal(t, min(recs[0].State.Remaining, 100), out[0].Remaining, "%q", raw)
	}
}

// TestCorruptRecordSpellings: the function (ratelimit.lua's gonum) and
// Load (strconv.ParseFloat) refuse the same text records, and read the
// same values from those they accept, over random strings of the
// characters that number syntaxes use.
func TestCorruptRecordSpellings(t *testing.T) {
	c := client(t)
	store := newStore(c, uniquePrefix(t, c))
	ctx := context.Background()
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour.Milliseconds(), Capacity: 100}
	now := t0.UnixMilli()
	id := driver.RecordID{Name: "l", Key: "k"}
	key := store.Key(id)
	check := &driver.Op{Mode: driver.ModeCheck, Now: now,
		Items: []driver.Item{{Name: "l", Key: "k", Shards: []driver.Shard{{Params: p}}}}}
	rng := rand.New(rand.NewPCG(1, 2))
	parts := []string{"0", "1", "5", "9", "0x", "0X", "a", "e", "E", "f", "p", "P", "+", "-", ".", "_", "inf", "Infinity", "nan", "n", "(", "400"}
	accepted := 0
	for range 2000 {
		var b strings.Builder
		for range 1 + rng.IntN(6) {
			b.WriteString(parts[rng.IntN(len(parts))])
		}
		raw := b.String() + " " + strconv.FormatInt(now, 10)
		require.NoError(t, c.Set(ctx, key, raw, 0).Err())
		recs := make([]driver.Record, 1)
		errGo := store.Load(ctx, []driver.RecordID{id}, recs)
		out := make([]driver.Decision, 1)
		errLua := store.Apply(ctx, check, out)
		if errGo != nil {
			require.ErrorIs(t, errGo, redisstore.ErrBadRecord, "%q", raw)
			require.ErrorIs(t, errLua, redisstore.ErrBadRecord, "%q: ParseFloat refuses it, the function does not", raw)
			continue
		}
		require.NoError(t, errLua, "%q: ParseFloat reads it, the function does not", raw)
		accepted++
		if v := recs[0].State.Remaining; v >= 0 && v <= 100 {
			require.Equal(t, v, out[0].Remaining, "%q", raw)
		}
	}
	require.Greater(t, accepted, 100, "the strings exercise both sides")
}

// TestSettlementInAFailedBatch: a settlement that went in a batch the
// function failed for another op gives its tokens back once, when sent
// again: the batch wrote nothing, its mark included. (The mark was
// written as its op was decided, before a later op failed the call: the
// settlement then read as done, and its tokens never came back.)
func TestSettlementInAFailedBatch(t *testing.T) {
	c := client(t)
	store := newStore(c, uniquePrefix(t, c))
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, store.Key(driver.RecordID{Name: "l", Key: "bad"}), "garbage", 0).Err())
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour.Milliseconds(), Capacity: 100}
	now := t0.UnixMilli()
	op := func(mode driver.Mode, key string, count float64) *driver.Op {
		return oneItemOp(mode, now, "l", key, count, p)
	}
	out := make([]driver.Decision, 1)
	require.NoError(t, store.Apply(ctx, op(driver.ModeLimit, "good", 10), out))
	require.Equal(t, 90.0, out[0].Remaining)

	settle := op(driver.ModeRefund, "good", 3)
	settle.Settle = &driver.Settlement{ID: [16]byte{1, 2, 3}, Kind: driver.SettleCancel, Until: now + time.Minute.Milliseconds()}
	err := store.ApplyBatch(ctx, []*driver.Op{settle, op(driver.ModeLimit, "bad", 1)},
		[][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)})
	require.Error(t, err, "the bad record fails its op")
	require.NoError(t, store.Apply(ctx, settle, out), "the settlement, sent again")
	recs := make([]driver.Record, 1)
	require.NoError(t, store.Load(ctx, []driver.RecordID{{Name: "l", Key: "good"}}, recs))
	require.Equal(t, 93.0, recs[0].State.Remaining, "the settlement's tokens came back once")
}

// TestRecordTimeNotWholeMs: a record whose time is not a whole number of
// ms (no store writes one, but the function must not fail on what it
// reads once it has written) decides in a batch as alone. The key's
// expiry was set at a fraction of a ms, which Redis refuses, after the
// batch's other records were written.
func TestRecordTimeNotWholeMs(t *testing.T) {
	c := client(t)
	store := newStore(c, uniquePrefix(t, c))
	ctx := context.Background()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Hour.Milliseconds(), Capacity: 100}
	now := t0.UnixMilli()
	rec := []byte{1}
	for _, x := range []float64{50, float64(now) + 0.5, 0} {
		rec = binary.LittleEndian.AppendUint64(rec, math.Float64bits(x))
	}
	require.NoError(t, c.Set(ctx, store.Key(driver.RecordID{Name: "l", Key: "odd"}), rec, 0).Err())
	op := func(key string) *driver.Op { return oneItemOp(driver.ModeLimit, now, "l", key, 1, p) }
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	require.NoError(t, store.ApplyBatch(ctx, []*driver.Op{op("good"), op("odd")}, outs))
	require.True(t, outs[1][0].OK)
	require.Equal(t, 49.0, outs[1][0].Remaining)
}

// holdFcalls holds, once armed, the first max calls of the function
// (FCALL) the client sends, each signaled on held, until gate is closed.
type holdFcalls struct {
	armed atomic.Bool
	n     atomic.Int32
	max   int32
	held  chan struct{}
	gate  chan struct{}
}

func (h *holdFcalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdFcalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() && cmd.Name() == "fcall" && h.n.Add(1) <= h.max {
			h.held <- struct{}{}
			<-h.gate
		}
		return next(ctx, cmd)
	}
}

func (h *holdFcalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// queuedCtx is a context that says, by closing queued, when the store's
// batcher first waits on it (coalesce's wait asks for Done): the call is
// then in the queue, or in flight, and no longer on its way there.
type queuedCtx struct {
	context.Context
	once   sync.Once
	queued chan struct{}
}

func newQueuedCtx(ctx context.Context) *queuedCtx {
	return &queuedCtx{Context: ctx, queued: make(chan struct{})}
}

func (c *queuedCtx) Done() <-chan struct{} {
	if pc, _, _, ok := runtime.Caller(1); ok {
		if name := runtime.FuncForPC(pc).Name(); strings.Contains(name, "/internal/coalesce.") && strings.HasSuffix(name, ".wait") {
			c.once.Do(func() { close(c.queued) })
		}
	}
	return c.Context.Done()
}

// waitQueued waits until the batcher waits on c. Should the batcher's wait
// no longer be recognised by its name, the test fails rather than hangs.
func (c *queuedCtx) waitQueued(t *testing.T) {
	t.Helper()
	select {
	case <-c.queued:
	case <-time.After(10 * time.Second):
		t.Fatal("the call never waited in the store's batcher (was coalesce's wait renamed? queuedCtx looks for it by name)")
	}
}

// fcallKeys records, for each call of the function a client sends, the
// number of keys it carries and its error.
type fcallKeys struct {
	mu    sync.Mutex
	calls []string
}

func (f *fcallKeys) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *fcallKeys) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		f.record(cmd, err) // go-redis sets cmd's error after the hooks
		return err
	}
}

func (f *fcallKeys) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			f.record(cmd, cmd.Err())
		}
		return err
	}
}

func (f *fcallKeys) record(cmd redis.Cmder, err error) {
	if cmd.Name() != "fcall" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("%v keys, failed %v", cmd.Args()[2], err != nil))
}

func (f *fcallKeys) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// TestBadRecordFailsOnlyItsCaller: a record the function cannot read (a
// corrupt string) fails its caller's call, and no other: a caller on a
// sound record whose call was coalesced with it gets its decision, not
// a store error (which would apply its failure policy and count towards
// the breaker).
func TestBadRecordFailsOnlyItsCaller(t *testing.T) {
	hold := &holdFcalls{max: 3, held: make(chan struct{}, 3), gate: make(chan struct{})}
	c := client(t)
	calls := &fcallKeys{}
	c.AddHook(calls)
	c.AddHook(hold)
	store := newStore(c, uniquePrefix(t, c))
	lim, err := ratelimit.New(store, ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute}},
		ratelimit.WithBreaker(0, 0))
	require.NoError(t, err)
	ctx := context.Background()
	_, err = lim.Limit(ctx, "l", "warm-up") // the library is loaded
	require.NoError(t, err)
	require.NoError(t, c.Set(ctx, store.Key(driver.RecordID{Name: "l", Key: "bad"}), "garbage", 0).Err())

	hold.armed.Store(true)
	var wg sync.WaitGroup
	for i := range 3 { // the three round trips in flight, held
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := lim.Limit(ctx, "l", fmt.Sprint("held-", i))
			assert.NoError(t, err)
		}()
	}
	for range 3 {
		<-hold.held
	}
	type answer struct {
		res ratelimit.Result
		err error
	}
	bad, good := make(chan answer, 1), make(chan answer, 1)
	badCtx, goodCtx := newQueuedCtx(ctx), newQueuedCtx(ctx)
	go func() { r, err := lim.Limit(badCtx, "l", "bad"); bad <- answer{r, err} }()
	go func() { r, err := lim.Limit(goodCtx, "l", "good"); good <- answer{r, err} }()
	badCtx.waitQueued(t) // both queue behind the round trips held
	goodCtx.waitQueued(t)
	close(hold.gate)
	b, g := <-bad, <-good
	wg.Wait()
	require.ErrorIs(t, b.err, redisstore.ErrBadRecord, "the bad record's own call fails")
	require.NoError(t, g.err, "a call on a sound record, coalesced with the bad one")
	require.True(t, g.res.OK)
	require.Equal(t, 99.0, g.res.Remaining)
	require.Contains(t, calls.list(), "2 keys, failed true", "the two went in one call, which failed (calls: %q)", calls.list())
}

// oneBadRecord decides, in one batch, ops on the record of the key good
// (limits, a refund, a settlement) around two ops on records the function
// cannot read: one of the key bad (a string that is no record), one of the
// key good (so of the same hash tag; a hash). Only the bad ops fail; each
// other op takes effect once.
func oneBadRecord(t *testing.T, c redis.UniversalClient, store *redisstore.Store, good, bad string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, store.Key(driver.RecordID{Name: "l", Key: bad}), "garbage", 0).Err())
	require.NoError(t, c.HSet(ctx, store.Key(driver.RecordID{Name: "x", Key: good}), "f", "v").Err())
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour.Milliseconds(), Capacity: 100}
	now := t0.UnixMilli()
	op := func(mode driver.Mode, name, key string, count float64) *driver.Op {
		return oneItemOp(mode, now, name, key, count, p)
	}
	settle := op(driver.ModeRefund, "l", good, 3)
	settle.Settle = &driver.Settlement{ID: [16]byte{4, 5, 6}, Kind: driver.SettleCancel, Until: now + time.Minute.Milliseconds()}
	ops := []*driver.Op{
		op(driver.ModeLimit, "l", good, 10),
		op(driver.ModeRefund, "l", good, 4),
		settle,
		op(driver.ModeLimit, "l", bad, 1),
		op(driver.ModeLimit, "x", good, 1),
		op(driver.ModeLimit, "l", good, 1),
	}
	outs := make([][]driver.Decision, len(ops))
	for i := range outs {
		outs[i] = make([]driver.Decision, 1)
	}
	err := store.ApplyBatch(ctx, ops, outs)
	require.Equal(t, []int{3, 4}, storetest.FailedOps(t, err), "the two bad ops, alone")
	require.ErrorIs(t, err, redisstore.ErrBadRecord)
	for i, want := range []float64{90, 94, 97} {
		require.True(t, outs[i][0].OK, "op %d", i)
		require.Equal(t, want, outs[i][0].Remaining, "op %d", i)
	}
	require.Zero(t, outs[2][0].Settled, "the settlement was not done before")
	require.True(t, outs[5][0].OK, "the op after the bad ones is reported")
	require.Equal(t, 96.0, outs[5][0].Remaining)

	// The last op, after the bad ones, was decided too, and each op once.
	value := func() float64 {
		recs := make([]driver.Record, 1)
		require.NoError(t, store.Load(ctx, []driver.RecordID{{Name: "l", Key: good}}, recs))
		return recs[0].State.Remaining
	}
	require.Equal(t, 96.0, value())
	out := make([]driver.Decision, 1)
	require.NoError(t, store.Apply(ctx, settle, out))
	require.Equal(t, driver.SettleCancel, out[0].Settled, "the settlement is marked done")
	require.Equal(t, 96.0, value())
	for _, o := range ops[3:5] {
		require.ErrorIs(t, store.Apply(ctx, o, out), redisstore.ErrBadRecord, "a bad op alone")
	}
}

// TestBadRecordFailsOnlyItsOp: see oneBadRecord. TestWithoutFunctions
// runs it on the script, and TestClusterBadRecordFailsOnlyItsOp on a
// Cluster.
func TestBadRecordFailsOnlyItsOp(t *testing.T) {
	c := client(t)
	oneBadRecord(t, c, newStore(c, uniquePrefix(t, c)), "good", "bad")
}

// TestBadRecordKeyReadsLikeAnotherError: oneBadRecord on keys whose text
// holds what Redis says of a call that did not run (MOVED, TRYAGAIN, a
// library missing, ...): the error of the bad record names its key, and
// must still be taken for a bad record, which fails only its op, not for
// the answer the key spells.
func TestBadRecordKeyReadsLikeAnotherError(t *testing.T) {
	words := []string{"MOVED", "TASK", "TRYAGAIN", "CROSSSLOT", "CLUSTERDOWN", "non local key", "Function not found",
		"unknown command 'fcall'", "NOPERM fcall"}
	c := client(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ",")})
	t.Cleanup(func() { cc.Close() })
	for _, w := range words {
		oneBadRecord(t, c, newStore(c, uniquePrefix(t, c)), "good "+w, "bad "+w)
		oneBadRecord(t, cc, newStore(cc, uniquePrefix(t, cc)), "good "+w, "bad "+w)
	}
}
