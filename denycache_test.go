package ratelimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The deny cache must answer exactly as the store would: a limiter with it
// and one without, driven by the same calls, give the same results, while
// the one with it asks the store far less. The calls include reservations
// and their cancels, and the clock goes back now and then (up to three
// seconds), where the cache replays the transition on a record ahead of
// it, as the store does, or (from seed 10) an hour.
func TestDenyCacheIsExact(t *testing.T) {
	ctx := context.Background()
	configs := []ratelimit.Config{
		{Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Second},
		{Kind: ratelimit.FixedWindow, Rate: 0.7, Period: 300 * time.Millisecond, Capacity: 2.1, MaxReserved: 1.3},
		{Kind: ratelimit.TokenBucket, Rate: 7, Period: 3 * time.Second, Capacity: 5},
		{Kind: ratelimit.TokenBucket, Rate: 1.0 / 3, Period: 100 * time.Millisecond, Capacity: 1, MaxReserved: 2},
	}
	for ci, cfg := range configs {
		for seed := range 20 {
			// From seed 10, the clock jumps an hour ahead, and later back,
			// once in a while: past driver.ExpiryGrace, the store may drop
			// records by a time the clock then goes back from, and the
			// cache leaves the calls to the store for that hour.
			jumps, ahead := seed >= 10, false
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(ci)))
			mock := &stepClock{Mock: newMock(), now: t0}
			cached := &flakyStore{Store: must(memstore.New())}
			plain := &flakyStore{Store: must(memstore.New())}
			limits := ratelimit.Limits{"l": cfg}
			withCache, err := ratelimit.New(cached, limits, ratelimit.WithClock(mock), ratelimit.WithDenyCache(100))
			require.NoError(t, err)
			without, err := ratelimit.New(plain, limits, ratelimit.WithClock(mock))
			require.NoError(t, err)
			capacity := cfg.Capacity
			if capacity == 0 {
				capacity = cfg.Rate
			}
			local := 0
			var held [][2]*ratelimit.Reservation // with the cache, without
			for step := range 400 {
				move := time.Duration(rng.IntN(40)) * time.Millisecond
				if rng.IntN(10) == 0 {
					move = -time.Duration(rng.IntN(3000)) * time.Millisecond
				}
				if jumps && rng.IntN(50) == 0 {
					move = time.Hour
					if ahead {
						move = -time.Hour
					}
					ahead = !ahead
				}
				mock.now = mock.now.Add(move)
				key := []string{"attacker", "other"}[rng.IntN(4)/3]
				opts := []ratelimit.CallOption{ratelimit.Count([]float64{0, 1, 0.5, capacity, rng.Float64() * capacity}[rng.IntN(5)])}
				if rng.IntN(4) == 0 {
					opts = append(opts, ratelimit.WithReserve())
				}
				where := fmt.Sprintf("config %d seed %d step %d", ci, seed, step)
				var got, want ratelimit.Result
				var gerr, werr error
				switch rng.IntN(20) {
				case 0:
					require.NoError(t, withCache.Reset(ctx, "l", key))
					require.NoError(t, without.Reset(ctx, "l", key))
					continue
				case 1, 2:
					got, gerr = withCache.Check(ctx, "l", key, opts...)
					want, werr = without.Check(ctx, "l", key, opts...)
				case 3:
					if len(held) > 0 {
						i := rng.IntN(len(held))
						gerr, werr := held[i][0].Cancel(ctx), held[i][1].Cancel(ctx)
						require.Equal(t, werr == nil, gerr == nil, "%s: cancel: %v, %v", where, gerr, werr)
						held = slices.Delete(held, i, i+1)
					}
					continue
				case 4:
					g, gerr := withCache.Reserve(ctx, "l", key, opts...)
					w, werr := without.Reserve(ctx, "l", key, opts...)
					require.Equal(t, werr, gerr, where)
					if gerr != nil {
						continue
					}
					got, want = g.Result(), w.Result()
					if got.OK {
						held = append(held, [2]*ratelimit.Reservation{g, w})
					}
				default:
					got, gerr = withCache.Limit(ctx, "l", key, opts...)
					want, werr = without.Limit(ctx, "l", key, opts...)
				}
				require.Equal(t, werr, gerr, where)
				if got.Local {
					local++
				}
				got.Local = false
				require.Equal(t, want, got, where)
			}
			if !jumps {
				require.Positive(t, local, "config %d seed %d: the cache never answered", ci, seed)
				require.Less(t, cached.calls.Load(), plain.calls.Load())
			}
		}
	}
}

func TestDenyCacheInvalidation(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Minute},
	}, ratelimit.WithClock(newMock()), ratelimit.WithDenyCache(10))
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "l", "k", ratelimit.Count(3))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.False(t, res.OK)
	require.False(t, res.Local)
	res, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.Local, "the second refusal is local")

	require.NoError(t, r.Cancel(ctx))
	res, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	assert.True(t, res.OK, "cancel hands tokens back and invalidates the cache")

	_, err = lim.Limit(ctx, "l", "k", ratelimit.Count(2))
	require.NoError(t, err)
	for range 2 {
		_, err = lim.Limit(ctx, "l", "k")
		require.NoError(t, err)
	}
	require.NoError(t, lim.Reset(ctx, "l", "k"))
	res, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	assert.True(t, res.OK, "reset invalidates the cache")
}

// BenchmarkDenyCacheUnderAttack reports the store round trips per call of
// a key under attack (one token per second, called flat out), with and
// without the deny cache.
//
//	go test -bench DenyCache -run ^$ .
func BenchmarkDenyCacheUnderAttack(b *testing.B) {
	for _, size := range []int{0, 1000} {
		b.Run(fmt.Sprintf("cache=%d", size), func(b *testing.B) {
			store := &flakyStore{Store: must(memstore.New())}
			mock := newMock()
			opts := []ratelimit.Option{ratelimit.WithClock(mock)}
			if size > 0 {
				opts = append(opts, ratelimit.WithDenyCache(size))
			}
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"login": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second},
			}, opts...)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if n++; n%1000 == 0 {
					mock.Set(mock.Now().Add(10 * time.Millisecond)) // 10 s of attack per 1e6 calls
				}
				if _, err := lim.Limit(ctx, "login", "203.0.113.9"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(store.calls.Load())/float64(b.N), "roundtrips/op")
		})
	}
}

// stepClock is a clock for one goroutine whose Now is moved by hand,
// without the millisecond pause clock.Mock takes on every move.
type stepClock struct {
	*clock.Mock
	now time.Time
}

func (c *stepClock) Now() time.Time                  { return c.now }
func (c *stepClock) Since(t time.Time) time.Duration { return c.now.Sub(t) }

// With another process spending the same key, a local refusal is still
// one the store would make, and its retry-after is never longer than the
// store's, only shorter; retrying then reaches the store.
func TestDenyCacheRetryAfterWithAnotherProcess(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := must(memstore.New())
	limits := ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Second, Start: t0}}
	cached, err := ratelimit.New(store, limits, ratelimit.WithClock(mock), ratelimit.WithDenyCache(10))
	require.NoError(t, err)
	other, err := ratelimit.New(store, limits, ratelimit.WithClock(mock))
	require.NoError(t, err)

	for range 5 {
		res, err := cached.Limit(ctx, "l", "k")
		require.NoError(t, err)
		require.True(t, res.OK)
	}
	res, err := cached.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.False(t, res.OK)
	require.False(t, res.Local, "the store refused, and the cache learned the record")

	// Another process reserves 12 tokens: the key now owes them.
	res, err = other.Limit(ctx, "l", "k", ratelimit.WithReserve(), ratelimit.Count(12))
	require.NoError(t, err)
	require.True(t, res.OK)

	local, err := cached.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, local.Local)
	require.False(t, local.OK)
	stored, err := other.Check(ctx, "l", "k")
	require.NoError(t, err)
	require.False(t, stored.OK, "the store refuses too")
	assert.Less(t, local.RetryAfter, stored.RetryAfter, "shorter: the cached record does not know the reservation")

	mock.Add(local.RetryAfter)
	res, err = cached.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.False(t, res.Local, "a retry at the local wait goes to the store")
	require.False(t, res.OK)
	assert.Equal(t, stored.RetryAfter-local.RetryAfter, res.RetryAfter, "and learns the store's wait")
}

// WithDenyCache(size) holds at most size keys, below the number of the
// cache's stripes too: each stripe once held at least one key, so that a
// cache of one key kept sixteen. Each key is learnt once; looked up
// afterwards, no more than size are refused from the cache.
func TestDenyCacheHoldsAtMostSize(t *testing.T) {
	for _, size := range []int{1, 5, 16, 20} {
		t.Run(fmt.Sprint("size=", size), func(t *testing.T) {
			ctx := context.Background()
			lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
				"l": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour, Start: time.UnixMilli(0)},
			}, ratelimit.WithClock(newMock()), ratelimit.WithDenyCache(size))
			require.NoError(t, err)
			keys := make([]string, 64)
			for i := range keys {
				keys[i] = fmt.Sprint("k", i)
				res, err := lim.Limit(ctx, "l", keys[i])
				require.NoError(t, err)
				require.True(t, res.OK)
				res, err = lim.Limit(ctx, "l", keys[i]) // refused by the store: learnt
				require.NoError(t, err)
				require.False(t, res.OK)
				require.False(t, res.Local)
			}
			// Newest first: the key learnt last is surely held. A miss learns
			// the key it looked up, which is not looked up again, so that
			// only keys held after the loop above are refused locally.
			local := 0
			for i := len(keys) - 1; i >= 0; i-- {
				res, err := lim.Limit(ctx, "l", keys[i])
				require.NoError(t, err)
				require.False(t, res.OK)
				if res.Local {
					local++
				}
			}
			require.GreaterOrEqual(t, local, 1, "the key learnt last is held")
			require.LessOrEqual(t, local, size, "WithDenyCache(%d) refused %d keys from the cache", size, local)
		})
	}
}

// learnHookStore runs a hook after Load has read the records, before it
// returns them, and one before Delete deletes: what another goroutine may
// do in that instant.
type learnHookStore struct {
	ratelimit.Store
	afterLoad, beforeDelete func()
}

func (s *learnHookStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	err := s.Store.Load(ctx, ids, out)
	if h := s.afterLoad; h != nil {
		s.afterLoad = nil
		h()
	}
	return err
}

func (s *learnHookStore) Delete(ctx context.Context, ids []driver.RecordID) error {
	if h := s.beforeDelete; h != nil {
		s.beforeDelete = nil
		h()
	}
	return s.Store.Delete(ctx, ids)
}

// newLearnLimiter returns a Limiter with a deny cache over store, whose
// limit "l" grants one call an hour, and whose key "k" has had its call:
// the next is refused by the store, and the cache learns the record.
func newLearnLimiter(t *testing.T) (*ratelimit.Limiter, *learnHookStore) {
	store := &learnHookStore{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour, Start: time.UnixMilli(0)},
	}, ratelimit.WithClock(newMock()), ratelimit.WithDenyCache(100))
	require.NoError(t, err)
	res, err := lim.Limit(context.Background(), "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	return lim, store
}

// The deny cache learns a refused key by loading its record, then keeping
// it. A Reset of this process between the two must not leave the record
// read before it in the cache: the next call would be refused locally
// although the store, reset, allows it (docs/production.md: every local
// refusal is one the store would make).
func TestDenyCacheResetDuringLearn(t *testing.T) {
	ctx := context.Background()
	lim, store := newLearnLimiter(t)

	store.afterLoad = func() {
		done := make(chan error)
		go func() { done <- lim.Reset(ctx, "l", "k") }() // another goroutine resets the key
		require.NoError(t, <-done)
	}
	res, err := lim.Limit(ctx, "l", "k") // refused by the store: the cache learns
	require.NoError(t, err)
	require.False(t, res.OK)

	// The key was reset: the store holds a full bucket.
	st, err := lim.Value(ctx, "l", "k")
	require.NoError(t, err)
	require.Equal(t, 1.0, st.Remaining)

	res, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK, "after Reset the store would allow the call; got a refusal (Local=%v)", res.Local)
}

// The other order: a refused call learns the record while a Reset is on
// its way to the store, before the delete. Reset drops the entry once the
// store has deleted, not before, where the entry learnt in between would
// stay.
func TestDenyCacheLearnDuringReset(t *testing.T) {
	ctx := context.Background()
	lim, store := newLearnLimiter(t)

	store.beforeDelete = func() {
		done := make(chan ratelimit.Result)
		go func() { // another goroutine's call, refused by the store: the cache learns
			res, err := lim.Limit(ctx, "l", "k")
			assert.NoError(t, err)
			done <- res
		}()
		res := <-done
		require.False(t, res.OK)
		require.False(t, res.Local)
	}
	require.NoError(t, lim.Reset(ctx, "l", "k"))

	res, err := lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK, "after Reset the store would allow the call; got a refusal (Local=%v)", res.Local)
}

// The deny cache answers while the store fails, before the failure
// policy: a key it holds is refused as the store would refuse it, even by
// a limit that fails open, without asking the store and with no error,
// until the call could succeed; that call goes to the store, and the
// failure policy answers it. Other keys are answered by the policy.
func TestDenyCacheWhileTheStoreFails(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	mock := newMock()
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute, Start: t0, FailOpen: true},
	}, ratelimit.WithClock(mock), ratelimit.WithDenyCache(10), ratelimit.WithBreaker(2, time.Hour))
	require.NoError(t, err)
	for _, ok := range []bool{true, false} { // the second is refused, and learnt
		res, err := lim.Limit(ctx, "l", "k")
		require.NoError(t, err)
		require.Equal(t, ok, res.OK)
	}
	store.fail.Store(true)
	for range 2 { // the breaker opens
		res, err := lim.Limit(ctx, "l", "other")
		require.ErrorIs(t, err, errDown)
		require.True(t, res.OK && res.Degraded, "fail open")
	}
	asked := store.calls.Load()
	for _, at := range []time.Duration{0, 30 * time.Second, 59 * time.Second} {
		mock.Set(t0.Add(at))
		for _, check := range []bool{false, true} {
			res, err := lim.Limit(ctx, "l", "k")
			if check {
				res, err = lim.Check(ctx, "l", "k")
			}
			require.NoError(t, err, "at %v", at)
			require.True(t, res.Local, "at %v", at)
			require.False(t, res.OK, "at %v: the store would refuse", at)
			require.False(t, res.Degraded)
			require.Equal(t, time.Minute-at, res.RetryAfter)
		}
	}
	require.Equal(t, asked, store.calls.Load(), "the store was not asked")

	mock.Set(t0.Add(time.Minute)) // the next window: the store may grant
	res, err := lim.Limit(ctx, "l", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.True(t, res.OK && res.Degraded, "the failure policy answers")
	require.False(t, res.Local)
}

// An entry keeps a copy of its key, not the caller's string: a key cut
// from a larger string (a token's claim, a header, a request's body)
// would hold all of it in memory for as long as the entry lives, and
// WithDenyCache(size) would bound the keys it holds but not the memory.
func TestDenyCacheCopiesKeys(t *testing.T) {
	ctx := context.Background()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"l": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour, Start: time.UnixMilli(0)},
	}, ratelimit.WithClock(newMock()), ratelimit.WithDenyCache(10))
	require.NoError(t, err)
	big := strings.Repeat("x", 1<<20) + "203.0.113.9"
	key := big[1<<20:]
	for range 2 {
		_, err := lim.Limit(ctx, "l", key)
		require.NoError(t, err)
	}
	res, err := lim.Limit(ctx, "l", key)
	require.NoError(t, err)
	require.True(t, res.Local, "the key is held")
	held := ratelimit.DenyKeys(lim)
	require.Equal(t, []string{key}, held)
	end := uintptr(unsafe.Pointer(unsafe.StringData(big))) + uintptr(len(big))
	at := uintptr(unsafe.Pointer(unsafe.StringData(held[0])))
	assert.False(t, at >= uintptr(unsafe.Pointer(unsafe.StringData(big))) && at < end,
		"the entry's key points into the caller's %d-byte string, which it keeps alive", len(big))
}

// What the deny cache costs where it cannot help: keys that change at
// every call (a client rotating its keys, a scan of addresses) are each
// refused by the store once, and each refusal is followed by a read of
// the key's record to learn it, a second round trip, for an entry never
// looked up again. Called again, a key it holds is refused with none
// (docs/production.md, "What it costs").
func TestDenyCacheCostUnderKeyRotation(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		size                    int
		firstRefusals, repeated int64 // store calls of 100 first refusals, of 100 repeated ones
	}{
		{size: 0, firstRefusals: 100, repeated: 100},
		{size: 1000, firstRefusals: 200, repeated: 0},
	} {
		t.Run(fmt.Sprint("size=", c.size), func(t *testing.T) {
			store := &flakyStore{Store: must(memstore.New())}
			lim, err := ratelimit.New(store, ratelimit.Limits{
				"l": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour, Start: time.UnixMilli(0)},
			}, ratelimit.WithClock(newMock()), ratelimit.WithDenyCache(c.size))
			require.NoError(t, err)
			limit := func(key string) ratelimit.Result {
				res, err := lim.Limit(ctx, "l", key)
				require.NoError(t, err)
				return res
			}
			for i := range 100 {
				require.True(t, limit(fmt.Sprint("k", i)).OK)
			}
			before := store.calls.Load()
			for i := range 100 {
				require.False(t, limit(fmt.Sprint("k", i)).OK)
			}
			assert.Equal(t, c.firstRefusals, store.calls.Load()-before, "store calls of the first refusals")
			before = store.calls.Load()
			for i := range 100 {
				require.False(t, limit(fmt.Sprint("k", i)).OK)
			}
			assert.Equal(t, c.repeated, store.calls.Load()-before, "store calls of the repeated refusals")
		})
	}
}

// cancelAfterApply cancels the context of the calls it decides once the
// store has decided them: the caller gives up as the answer comes back.
type cancelAfterApply struct {
	ratelimit.Store
	cancel   context.CancelFunc
	loadErrs []error
}

func (s *cancelAfterApply) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	err := s.Store.Apply(ctx, op, out)
	if s.cancel != nil {
		s.cancel()
		s.cancel = nil
	}
	return err
}

func (s *cancelAfterApply) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	err := s.Store.Load(ctx, ids, out)
	s.loadErrs = append(s.loadErrs, err)
	return err
}

// The cache learns a refused key by a read made with the refused call's
// context, for the calls that come after it: the caller pays for the read,
// and its deadline bounds it. A caller that gives up meanwhile costs the
// cache that one learn, never another call its answer: the read fails and
// nothing is kept, the call is refused as the store refused it, and the
// next call goes to the store, which refuses it, and learns.
func TestDenyCacheLearnOfACallThatEnded(t *testing.T) {
	store := &cancelAfterApply{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour, Start: time.UnixMilli(0)},
	}, ratelimit.WithClock(newMock()), ratelimit.WithDenyCache(100))
	require.NoError(t, err)
	ctx := context.Background()
	res, err := lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK)

	ended, cancel := context.WithCancel(ctx)
	defer cancel()
	store.cancel = cancel
	res, err = lim.Limit(ended, "l", "k")
	require.NoError(t, err, "the store answered before the caller gave up")
	require.False(t, res.OK)
	require.False(t, res.Local)
	require.Len(t, store.loadErrs, 1)
	require.ErrorIs(t, store.loadErrs[0], context.Canceled, "the learn reads with the refused call's context")

	for _, local := range []bool{false, true} { // nothing learnt; then learnt
		res, err = lim.Limit(ctx, "l", "k")
		require.NoError(t, err)
		require.False(t, res.OK)
		require.Equal(t, local, res.Local)
	}
	require.Len(t, store.loadErrs, 2)
	require.NoError(t, store.loadErrs[1])
}
