package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSetLimitsReplacesTheSet(t *testing.T) {
	ctx := context.Background()
	a := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}
	b := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Minute}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"a": a, "b": b}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)

	a2 := a
	a2.Capacity = 3
	c := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour, FailOpen: true}
	require.NoError(t, lim.SetLimits(ratelimit.Limits{"a": a2, "c": c}))

	assert.Equal(t, ratelimit.Limits{"a": a2, "c": c}, lim.Limits())
	got, ok := lim.Config("a")
	assert.True(t, ok)
	assert.Equal(t, a2, got)
	_, ok = lim.Config("b")
	assert.False(t, ok, "b was removed")

	_, err = lim.Limit(ctx, "b", "k")
	require.ErrorIs(t, err, ratelimit.ErrUnknownLimit)
	_, err = lim.Value(ctx, "b", "k")
	require.ErrorIs(t, err, ratelimit.ErrUnknownLimit)
	require.ErrorIs(t, lim.Reset(ctx, "b", "k"), ratelimit.ErrUnknownLimit)
	_, err = lim.LimitAll(ctx, "k", []string{"a", "b"})
	require.ErrorIs(t, err, ratelimit.ErrUnknownLimit)
	_, err = lim.Limit(ctx, "b", "k", ratelimit.WithConfig(b))
	require.NoError(t, err, "a removed name may still be called inline")

	res, err := lim.Limit(ctx, "a", "k", ratelimit.Count(3))
	require.NoError(t, err)
	assert.True(t, res.OK)
	_, err = lim.Limit(ctx, "a", "k", ratelimit.Count(4))
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount, "4 is beyond the new capacity of 3")
	res, err = lim.Limit(ctx, "c", "k")
	require.NoError(t, err)
	assert.True(t, res.OK)

	// The copy Limits returns is the caller's.
	mine := lim.Limits()
	delete(mine, "a")
	_, ok = lim.Config("a")
	assert.True(t, ok)

	// Inline configs are compared with the declaration in force.
	_, err = lim.Limit(ctx, "a", "k", ratelimit.WithConfig(a))
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	_, err = lim.Check(ctx, "a", "k", ratelimit.WithConfig(a2))
	require.NoError(t, err)
}

func TestSetLimitsValidatesFirst(t *testing.T) {
	ctx := context.Background()
	good := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"a": good}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)

	lower := good
	lower.Capacity = 1
	bad := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10} // no Period
	worse := ratelimit.Config{Rate: 10, Period: time.Second}       // no Kind
	for range 5 {                                                  // the same error whatever the map's order
		err = lim.SetLimits(ratelimit.Limits{"a": lower, "y": bad, "x": worse})
		var ce *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, "x", ce.Name)
		assert.Equal(t, "Kind", ce.Field)
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	}
	err = lim.SetLimit("a", bad)
	var ce *ratelimit.ConfigError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "a", ce.Name)
	assert.Equal(t, "Period", ce.Field)

	// Nothing changed: "a" still holds 10.
	assert.Equal(t, ratelimit.Limits{"a": good}, lim.Limits())
	res, err := lim.Limit(ctx, "a", "k", ratelimit.Count(10))
	require.NoError(t, err)
	assert.True(t, res.OK)
}

func TestSetLimitAddsAndReplacesOne(t *testing.T) {
	ctx := context.Background()
	a := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"a": a}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)

	b := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute}
	require.NoError(t, lim.SetLimit("b", b))
	assert.Equal(t, ratelimit.Limits{"a": a, "b": b}, lim.Limits())

	res, err := lim.Limit(ctx, "a", "k", ratelimit.Count(6))
	require.NoError(t, err)
	require.True(t, res.OK)
	a.Capacity = 5
	require.NoError(t, lim.SetLimit("a", a))
	assert.Equal(t, ratelimit.Limits{"a": a, "b": b}, lim.Limits())
	st, err := lim.Value(ctx, "a", "k")
	require.NoError(t, err)
	assert.Equal(t, 4.0, st.Remaining, "the 4 left are within the new capacity")
	assert.Equal(t, 5.0, st.Capacity)
}

// A changed limit keeps the store's fast path (memstore's Binder); a limit
// whose config is unchanged is not rebound.
func TestSetLimitsKeepsTheFastPath(t *testing.T) {
	ctx := context.Background()
	store := &decideCounter{applyCounter: applyCounter{Store: must(memstore.New())}}
	store.owner = store
	lim, err := ratelimit.New(store, bindLimits, ratelimit.WithClock(newMock()))
	require.NoError(t, err)

	changed := ratelimit.Limits{}
	for name, c := range bindLimits {
		changed[name] = c
	}
	one := changed["one"]
	one.Capacity = 2
	changed["one"] = one
	require.NoError(t, lim.SetLimits(changed))
	for range 3 {
		_, err = lim.Limit(ctx, "one", "k")
		require.NoError(t, err)
		_, err = lim.Check(ctx, "window", "k")
		require.NoError(t, err)
	}
	res, err := lim.Limit(ctx, "one", "k")
	require.NoError(t, err)
	assert.False(t, res.OK, "the new capacity of 2 is spent")
	assert.Equal(t, int64(7), store.decides.Load())
	assert.Zero(t, store.applies.Load())
}

// A reservation made before its limit changed or went away is handed back
// to the records it charged.
func TestCancelAfterSetLimits(t *testing.T) {
	ctx := context.Background()
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"a": cfg}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "a", "k", ratelimit.Count(4))
	require.NoError(t, err)
	require.True(t, r.OK())
	require.NoError(t, lim.SetLimits(nil))
	require.NoError(t, r.Cancel(ctx))
	require.NoError(t, lim.SetLimit("a", cfg))
	st, err := lim.Value(ctx, "a", "k")
	require.NoError(t, err)
	assert.Equal(t, 10.0, st.Remaining)
	assert.True(t, st.Shards[0].Stored)
}

// The deny cache never refuses a call against a config no longer in
// force, and keeps what it knows of limits left unchanged.
func TestSetLimitsAndTheDenyCache(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	slow := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": slow}, ratelimit.WithClock(mock), ratelimit.WithDenyCache(10))
	require.NoError(t, err)
	call := func() ratelimit.Result {
		t.Helper()
		res, err := lim.Limit(ctx, "l", "k")
		require.NoError(t, err)
		return res
	}
	require.True(t, call().OK)
	res := call()
	require.False(t, res.OK)
	require.False(t, res.Local, "the store refused; the cache learned the record")
	res = call()
	require.False(t, res.OK)
	require.True(t, res.Local)

	// The same config again: nothing is forgotten.
	require.NoError(t, lim.SetLimits(ratelimit.Limits{"l": slow}))
	require.True(t, call().Local)

	// A second later, 1 a second grants a token that 1 a minute does not.
	fast := slow
	fast.Period = time.Second
	require.NoError(t, lim.SetLimit("l", fast))
	mock.Add(time.Second)
	res = call()
	assert.True(t, res.OK)
	assert.False(t, res.Local)
}

// Many goroutines call two limits on a few keys while SetLimits flips them
// between a generous and a strict config. The clock stands still, so no
// key can ever be granted more than the larger capacity; afterwards each
// config applies exactly: the strict one cuts what is left to its
// capacity and refills at its rate, the generous one at its own.
func TestSetLimitsUnderLoad(t *testing.T) {
	ctx := context.Background()
	generous := ratelimit.Limits{
		"tb": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
		"fw": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Start: time.UnixMilli(0)},
	}
	strict := ratelimit.Limits{
		"tb": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Second, Capacity: 4},
		"fw": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Second, Capacity: 4, Start: time.UnixMilli(0)},
	}
	names := []string{"tb", "fw"}
	keys := []string{"k0", "k1", "k2"}
	for _, tc := range []struct {
		name  string
		store func() ratelimit.Store
		opts  []ratelimit.Option
	}{
		{"bound", func() ratelimit.Store { return must(memstore.New()) }, nil},
		{"apply", func() ratelimit.Store { return &applyCounter{Store: must(memstore.New())} }, nil},
		{"denycache", func() ratelimit.Store { return must(memstore.New()) }, []ratelimit.Option{ratelimit.WithDenyCache(100)}},
		{"keyhash", func() ratelimit.Store { return must(memstore.New()) }, []ratelimit.Option{ratelimit.WithKeyHash([]byte("a secret of 16 bytes or more"))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock := newMock()
			lim, err := ratelimit.New(tc.store(), generous, append(tc.opts, ratelimit.WithClock(mock))...)
			require.NoError(t, err)

			var (
				mu      sync.Mutex
				granted = map[string]int{}
				wg      sync.WaitGroup
				stop    = make(chan struct{})
				flips   sync.WaitGroup
			)
			flips.Add(1)
			go func() {
				defer flips.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					var err error
					switch i % 3 {
					case 0:
						err = lim.SetLimits(strict)
					case 1:
						err = lim.SetLimits(generous)
					case 2:
						err = lim.SetLimit("tb", strict["tb"])
					}
					assert.NoError(t, err)
				}
			}()
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					mine := map[string]int{}
					for i := range 300 {
						key := keys[(g+i)%len(keys)]
						if i%5 == 0 {
							res, err := lim.LimitAll(ctx, key, names)
							if !assert.NoError(t, err) {
								return
							}
							if res.OK {
								mine["tb/"+key]++
								mine["fw/"+key]++
							}
							continue
						}
						name := names[i%2]
						res, err := lim.Limit(ctx, name, key)
						if !assert.NoError(t, err) {
							return
						}
						assert.Equal(t, key, res.Key)
						if res.OK {
							mine[name+"/"+key]++
						}
					}
					mu.Lock()
					for k, n := range mine {
						granted[k] += n
					}
					mu.Unlock()
				}()
			}
			wg.Wait()
			close(stop)
			flips.Wait()

			drain := func(name, key string) int {
				t.Helper()
				n := 0
				for {
					res, err := lim.Limit(ctx, name, key)
					require.NoError(t, err)
					if !res.OK {
						return n
					}
					n++
				}
			}
			require.NoError(t, lim.SetLimits(strict))
			for _, name := range names {
				for _, key := range keys {
					id := name + "/" + key
					rest := drain(name, key)
					assert.LessOrEqual(t, rest, 4, "%s: the strict capacity bounds what is left", id)
					assert.LessOrEqual(t, granted[id]+rest, 10, "%s: never more than the generous capacity without time passing", id)
				}
			}
			mock.Add(time.Second)
			for _, name := range names {
				for _, key := range keys {
					assert.Equal(t, 2, drain(name, key), "%s/%s: the strict rate, a second later", name, key)
				}
			}
			require.NoError(t, lim.SetLimits(generous))
			mock.Add(time.Second)
			for _, name := range names {
				for _, key := range keys {
					assert.Equal(t, 10, drain(name, key), "%s/%s: the generous rate, a second later", name, key)
				}
			}
			// A record refreshed under the generous config (9 left) meets
			// the strict one: cut to 4. (Time passing after the change
			// would be refilled at the strict rate.)
			mock.Add(time.Second)
			for _, name := range names {
				for _, key := range keys {
					res, err := lim.Limit(ctx, name, key)
					require.NoError(t, err)
					require.Equal(t, 9.0, res.Remaining)
				}
			}
			require.NoError(t, lim.SetLimits(strict))
			for _, name := range names {
				for _, key := range keys {
					assert.Equal(t, 4, drain(name, key), "%s/%s: 9 left, cut to the strict 4", name, key)
				}
			}
		})
	}
}

// SetLimits and calls may race: the race detector watches this test.
func TestSetLimitsRacesWithEveryCall(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	sets := []ratelimit.Limits{
		{"l": {Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Second, Shards: 2}},
		{"l": {Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Second}},
		{},
	}
	lim, err := ratelimit.New(must(memstore.New()), sets[0], ratelimit.WithClock(mock), ratelimit.WithDenyCache(10))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				key := fmt.Sprint("k", (g+i)%3)
				var err error
				switch i % 6 {
				case 0:
					_, err = lim.Limit(ctx, "l", key)
				case 1:
					_, err = lim.Check(ctx, "l", key)
				case 2:
					var r *ratelimit.Reservation
					if r, err = lim.Reserve(ctx, "l", key); err == nil {
						err = r.Cancel(ctx)
					}
				case 3:
					_, err = lim.Value(ctx, "l", key)
				case 4:
					err = lim.Reset(ctx, "l", key)
				case 5:
					_, err = lim.LimitAll(ctx, key, []string{"l"})
					_, _ = lim.Config("l")
				}
				if err != nil && !errors.Is(err, ratelimit.ErrUnknownLimit) {
					assert.NoError(t, err)
					return
				}
			}
		}()
	}
	for i := range 300 {
		require.NoError(t, lim.SetLimits(sets[i%len(sets)]))
	}
	wg.Wait()
}

// TestEveryDeclaredLimitIsFound calls every limit of sets of 1 to 12
// limits, built by New, SetLimits and SetLimit: a few are found by their
// names in a list, more in a map, whether the name called is the very
// string declared or a copy, and a name that differs from one declared
// in a byte only, or in its length (a prefix sharing its bytes included),
// is not found.
func TestEveryDeclaredLimitIsFound(t *testing.T) {
	ctx := context.Background()
	config := func(i int) ratelimit.Config {
		return ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: float64(i + 2), Period: time.Second} // two calls each
	}
	declared := make([]string, 13) // the strings declared, called as they are
	for i := range declared {
		declared[i] = fmt.Sprintf("limit-%02d", i)
	}
	limits := func(n int) ratelimit.Limits {
		ls := ratelimit.Limits{}
		for i := range n {
			ls[declared[i]] = config(i)
		}
		return ls
	}
	check := func(t *testing.T, lim *ratelimit.Limiter, n int) {
		t.Helper()
		for i := range n {
			for j, name := range []string{declared[i], fmt.Sprintf("limit-%02d", i)} {
				res, err := lim.Limit(ctx, name, "k")
				require.NoError(t, err, name)
				assert.Equal(t, name, res.Name)
				assert.Equal(t, float64(i+2)-float64(j+1), res.Remaining, name) // its own capacity
			}
		}
		for _, name := range []string{fmt.Sprintf("limit-%02d", n), declared[0][:7], "limit-0", "limit-000", "limit-0x", ""} {
			_, err := lim.Limit(ctx, name, "k")
			assert.ErrorIs(t, err, ratelimit.ErrUnknownLimit, "%q", name)
		}
	}
	for n := 1; n <= 12; n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			lim, err := ratelimit.New(must(memstore.New()), limits(n), ratelimit.WithClock(newMock()))
			require.NoError(t, err)
			check(t, lim, n)

			lim, err = ratelimit.New(must(memstore.New()), nil, ratelimit.WithClock(newMock()))
			require.NoError(t, err)
			require.NoError(t, lim.SetLimits(limits(n)))
			check(t, lim, n)

			lim, err = ratelimit.New(must(memstore.New()), nil, ratelimit.WithClock(newMock()))
			require.NoError(t, err)
			for i := range n {
				require.NoError(t, lim.SetLimit(fmt.Sprintf("limit-%02d", i), config(i)))
			}
			check(t, lim, n)
		})
	}
}

// TestShardShareRoundingToZeroIsRefused: a Capacity or MaxReserved so
// small that each shard's share rounds to 0 is refused. A MaxReserved
// share of 0 would mean as many as MaxTokens: a tiny bound on debt would
// become none.
func TestShardShareRoundingToZeroIsRefused(t *testing.T) {
	base := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 1, Shards: 2}
	for _, tc := range []struct {
		field string
		edit  func(*ratelimit.Config)
	}{
		{"MaxReserved", func(c *ratelimit.Config) { c.MaxReserved = 5e-324 }},
		{"Capacity", func(c *ratelimit.Config) { c.Capacity = 5e-324 }},
	} {
		c := base
		tc.edit(&c)
		err := c.Validate()
		var ce *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce, tc.field)
		require.Equal(t, tc.field, ce.Field)
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
		require.ErrorContains(t, err, "rounds to 0")

		c.Shards = 1 // one record holds it all: a tiny share, not none
		require.NoError(t, c.Validate(), tc.field)
	}
}

// A refused call learns its record for the deny cache by loading it, then
// keeping it with the params of the config it was decided under. Limits
// changed in between (to a looser config, whose calls the store grants,
// and back) must not leave the record read before in the cache: it shows
// fewer tokens than the looser config's calls left, and the next call
// would be refused locally although the store grants it.
func TestSetLimitsDuringLearn(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	strict := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour}}
	loose := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}}
	store := &learnHookStore{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, strict, ratelimit.WithClock(mock), ratelimit.WithDenyCache(100))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK)

	store.afterLoad = func() {
		// The record read: 0 tokens. Meanwhile the limit is loosened, a
		// second passes, a call is granted (10 refilled, 9 left), and the
		// strict config comes back.
		require.NoError(t, lim.SetLimits(loose))
		mock.Add(time.Second)
		res, err := lim.Limit(ctx, "l", "k")
		require.NoError(t, err)
		require.True(t, res.OK)
		require.Equal(t, 9.0, res.Remaining)
		require.NoError(t, lim.SetLimits(strict))
	}
	res, err = lim.Limit(ctx, "l", "k") // refused by the store: the cache learns
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Nil(t, store.afterLoad, "the cache loaded the record")

	// The store holds 9 tokens, cut to the strict capacity of 1: it grants.
	st, err := lim.Value(ctx, "l", "k")
	require.NoError(t, err)
	require.Equal(t, 1.0, st.Remaining)
	res, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK, "the store would allow the call; got a refusal (Local=%v)", res.Local)
}

// stallStore wraps a memstore, and runs a hook (once) before a call
// reaches the store, through Apply or, with stallBinder, a BoundLimit,
// and one after Load has read the records: what other goroutines may do
// while a call is on its way to the store.
type stallStore struct {
	*memstore.Store
	beforeCall, afterLoad atomic.Pointer[func()]
}

func runOnce(h *atomic.Pointer[func()]) {
	if f := h.Swap(nil); f != nil {
		(*f)()
	}
}

func (s *stallStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	runOnce(&s.beforeCall)
	return s.Store.Apply(ctx, op, out)
}

func (s *stallStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	err := s.Store.Load(ctx, ids, out)
	runOnce(&s.afterLoad)
	return err
}

// stallBinder is a stallStore whose limits are bound.
type stallBinder struct{ stallStore }

func (s *stallBinder) Bind(name string, p driver.Params, phase func(string) int64) driver.BoundLimit {
	return &stallBound{BoundLimit: s.Store.Bind(name, p, phase), s: s}
}

type stallBound struct {
	driver.BoundLimit
	s *stallBinder
}

func (b *stallBound) Decide(ctx context.Context, key string, mode driver.Mode, now int64, count float64, reserve bool) (driver.Verdict, error) {
	runOnce(&b.s.beforeCall)
	return b.BoundLimit.Decide(ctx, key, mode, now, count, reserve)
}

func (b *stallBound) Store() ratelimit.Store { return b.s }

// A call decided under a config that SetLimits has since replaced may
// reach the store late, after a call of the new config was refused and
// while the deny cache learns that call's record. The late call, granted
// by the old, looser config, leaves the record more tokens than the new
// config's refill of the record learnt: the entry must not be kept, or it
// refuses calls that the store grants.
func TestLateCallOfAnOldConfigAndTheDenyCache(t *testing.T) {
	ctx := context.Background()
	other := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Second}
	loose := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}, "m": other}
	strict := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour}, "m": other}
	for _, tc := range []struct {
		name  string
		store func() (ratelimit.Store, *stallStore)
		call  func(lim *ratelimit.Limiter) (ratelimit.Result, error)
	}{
		{"apply", func() (ratelimit.Store, *stallStore) {
			s := &stallStore{Store: must(memstore.New())}
			return s, s
		}, func(lim *ratelimit.Limiter) (ratelimit.Result, error) { return lim.Limit(ctx, "l", "k") }},
		{"bound", func() (ratelimit.Store, *stallStore) {
			s := &stallBinder{stallStore{Store: must(memstore.New())}}
			return s, &s.stallStore
		}, func(lim *ratelimit.Limiter) (ratelimit.Result, error) { return lim.Limit(ctx, "l", "k") }},
		{"reserve", func() (ratelimit.Store, *stallStore) {
			s := &stallBinder{stallStore{Store: must(memstore.New())}}
			return s, &s.stallStore
		}, func(lim *ratelimit.Limiter) (ratelimit.Result, error) {
			r, err := lim.Reserve(ctx, "l", "k")
			if err != nil {
				return ratelimit.Result{}, err
			}
			return r.Result(), nil
		}},
		{"limitall", func() (ratelimit.Store, *stallStore) {
			s := &stallStore{Store: must(memstore.New())}
			return s, s
		}, func(lim *ratelimit.Limiter) (ratelimit.Result, error) {
			return lim.LimitAll(ctx, "k", []string{"l", "m"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock := newMock()
			store, stall := tc.store()
			lim, err := ratelimit.New(store, loose, ratelimit.WithClock(mock), ratelimit.WithDenyCache(100))
			require.NoError(t, err)
			late, release := holdLateCall(t, lim, mock, stall, func() (ratelimit.Result, error) { return tc.call(lim) })
			require.NoError(t, lim.SetLimits(strict))

			requireLateGrantForgotten(t, lim, stall, late, release)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// SetLimits forgets what the deny cache knows of a name it adds, as
// SetLimit does. A call of a limit since removed, refused by the store
// late, leaves an entry of the removed config; calls of the name with
// another config given inline, granted meanwhile, change the record
// without touching the cache (they are not cached). Declared again with
// the removed config, the name must not find the entry, which shows
// fewer tokens than the record holds.
func TestSetLimitsAddingANameAndTheDenyCache(t *testing.T) {
	ctx := context.Background()
	strict := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour}
	loose := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}
	for _, add := range []string{"SetLimits", "SetLimit"} {
		t.Run(add, func(t *testing.T) {
			mock := newMock()
			store := &stallStore{Store: must(memstore.New())}
			lim, err := ratelimit.New(store, ratelimit.Limits{"l": strict}, ratelimit.WithClock(mock), ratelimit.WithDenyCache(100))
			require.NoError(t, err)
			res, err := lim.Limit(ctx, "l", "k")
			require.NoError(t, err)
			require.True(t, res.OK)

			// A call of the strict config, held on its way to the store
			// while "l" is removed, is refused there: the cache learns
			// the record (0 tokens) under the removed config.
			late, release := stallCall(t, store, func() (ratelimit.Result, error) { return lim.Limit(ctx, "l", "k") })
			require.NoError(t, lim.SetLimits(nil))
			close(release)
			res = <-late
			require.False(t, res.OK)
			require.False(t, res.Local)

			// A second later a call of the loose config is granted (10
			// refilled, 9 left), and the strict config is declared again.
			mock.Add(time.Second)
			res, err = lim.Limit(ctx, "l", "k", ratelimit.WithConfig(loose))
			require.NoError(t, err)
			require.True(t, res.OK)
			require.Equal(t, 9.0, res.Remaining)
			if add == "SetLimits" {
				require.NoError(t, lim.SetLimits(ratelimit.Limits{"l": strict}))
			} else {
				require.NoError(t, lim.SetLimit("l", strict))
			}

			// The store holds 9 tokens, cut to the strict capacity of 1.
			res, err = lim.Limit(ctx, "l", "k")
			require.NoError(t, err)
			require.True(t, res.OK, "the store would allow the call; got a refusal (Local=%v)", res.Local)
		})
	}
}

// A token of a limit removed since it was made cannot be settled through
// the Limiter, which no longer knows the limit's config: the error says
// so, and nothing is settled (declared again, the limit settles it). The
// Reservation itself still cancels, under the config it was made with.
func TestSettleTokenOfARemovedLimit(t *testing.T) {
	ctx := context.Background()
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"a": cfg}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "a", "k", ratelimit.Count(4), ratelimit.WithReceipt())
	require.NoError(t, err)
	require.NotNil(t, res.Token)
	r, err := lim.Reserve(ctx, "a", "k", ratelimit.Count(3))
	require.NoError(t, err)
	require.True(t, r.OK())

	require.NoError(t, lim.SetLimits(nil))
	err = lim.Refund(ctx, res.Token)
	require.ErrorIs(t, err, ratelimit.ErrUnknownLimit)
	assert.ErrorContains(t, err, "SetLimits")
	require.NoError(t, r.Cancel(ctx))

	require.NoError(t, lim.SetLimit("a", cfg))
	require.NoError(t, lim.Refund(ctx, res.Token), "the refused refund settled nothing")
	st, err := lim.Value(ctx, "a", "k")
	require.NoError(t, err)
	assert.Equal(t, 10.0, st.Remaining)
}

// holdLateCall spends the 10 tokens of limit "l" of key "k", lets the
// loose config refill them, and starts call, decided by the loose config
// and held by stall on its way to the store. It returns once the call is
// held: the channel of its result, and the one whose close lets it go.
func holdLateCall(t *testing.T, lim *ratelimit.Limiter, mock *clock.Mock, stall *stallStore, call func() (ratelimit.Result, error)) (<-chan ratelimit.Result, chan struct{}) {
	t.Helper()
	res, err := lim.Limit(context.Background(), "l", "k", ratelimit.Count(10))
	require.NoError(t, err)
	require.True(t, res.OK)
	mock.Add(time.Second) // the loose config refills the 10
	return stallCall(t, stall, call)
}

// stallCall starts call, and returns once it has arrived at stall's next
// Apply, where it waits until release is closed; late has its result.
func stallCall(t *testing.T, stall *stallStore, call func() (ratelimit.Result, error)) (late <-chan ratelimit.Result, release chan struct{}) {
	t.Helper()
	arrived, rel := make(chan struct{}), make(chan struct{})
	res := make(chan ratelimit.Result, 1)
	stall.beforeCall.Store(ptr(func() {
		close(arrived)
		<-rel
	}))
	go func() {
		r, err := call()
		assert.NoError(t, err)
		res <- r
	}()
	<-arrived
	return res, rel
}

// requireLateGrantForgotten lets the call held by holdLateCall go once a
// call of the strict config, refused by the store, has the deny cache read the record (0 tokens), and requires the
// late call granted (9 left) and the cache's entry dropped: the next
// call, which the store allows (9 tokens, cut to the strict capacity of
// 1), is not refused from memory.
func requireLateGrantForgotten(t *testing.T, lim *ratelimit.Limiter, stall *stallStore, late <-chan ratelimit.Result, release chan struct{}) {
	t.Helper()
	ctx := context.Background()
	var lateRes ratelimit.Result
	stall.afterLoad.Store(ptr(func() {
		close(release)
		lateRes = <-late
	}))
	res, err := lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.False(t, res.OK)
	require.False(t, res.Local)
	require.Nil(t, stall.afterLoad.Load(), "the cache loaded the record")
	require.True(t, lateRes.OK)
	require.Equal(t, 9.0, lateRes.Remaining)

	res, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK, "the store would allow the call; got a refusal (Local=%v)", res.Local)
}

// Calls of a name declared nowhere may each give their own config inline
// (WithConfig). A call of one config, refused by the store, has the deny
// cache read the record; a call of another, looser config granted
// meanwhile leaves the record more tokens than the first config's refill
// of the record read. Nothing declared changes, so nothing tells the cache
// that the record moved: an entry kept would refuse calls that the store
// grants. Calls with configs given inline are not cached.
func TestInlineConfigsAndTheDenyCache(t *testing.T) {
	ctx := context.Background()
	strict := ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour})
	loose := ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second})
	mock := newMock()
	store := &stallStore{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, nil, ratelimit.WithClock(mock), ratelimit.WithDenyCache(100))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "l", "k", strict)
	require.NoError(t, err)
	require.True(t, res.OK)

	store.afterLoad.Store(ptr(func() {
		// The record read: 0 tokens. Meanwhile, a second later, a call
		// of the loose config is granted (10 refilled, 9 left).
		mock.Add(time.Second)
		res, err := lim.Limit(ctx, "l", "k", loose)
		require.NoError(t, err)
		require.True(t, res.OK)
		require.Equal(t, 9.0, res.Remaining)
	}))
	res, err = lim.Limit(ctx, "l", "k", strict) // refused by the store
	require.NoError(t, err)
	require.False(t, res.OK)
	if store.afterLoad.Load() != nil {
		// The cache read nothing: the loose call all the same.
		runOnce(&store.afterLoad)
	}

	// The store holds 9 tokens, cut to the strict capacity of 1: it grants.
	st, err := lim.Value(ctx, "l", "k", strict)
	require.NoError(t, err)
	require.Equal(t, 1.0, st.Remaining)
	res, err = lim.Limit(ctx, "l", "k", strict)
	require.NoError(t, err)
	require.True(t, res.OK, "the store would allow the call; got a refusal (Local=%v)", res.Local)
}

// A late call of a config no longer in force, refused by the store, has
// the deny cache learn the record (0 tokens) while calls of another config
// are granted on it: under another name's declared config (changed)
// during the learn, or given inline once the name was removed (removed).
// Nothing tells the cache that the record moved, and the entry stays. When
// the first config is declared again, SetLimits publishes it before it
// forgets the name's entries: a call in between must not be refused by
// that entry, which shows fewer tokens than the record holds. The change
// is held between the two steps by the stripe of the deny cache it
// forgets first, which is not the key's.
func TestDenyCacheEntryOfAnOldConfigAfterSetLimits(t *testing.T) {
	ctx := context.Background()
	strict := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour}
	loose := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}
	for _, how := range []string{"changed", "removed"} {
		t.Run(how, func(t *testing.T) {
			mock := newMock()
			store := &stallStore{Store: must(memstore.New())}
			lim, err := ratelimit.New(store, ratelimit.Limits{"l": strict}, ratelimit.WithClock(mock), ratelimit.WithDenyCache(100))
			require.NoError(t, err)
			key := ""
			for i := 0; key == ""; i++ {
				if k := fmt.Sprint("k", i); ratelimit.DenyStripe(lim, "l", k) != 0 {
					key = k
				}
			}
			res, err := lim.Limit(ctx, "l", key)
			require.NoError(t, err)
			require.True(t, res.OK)

			// A call of the strict config, held on its way to the store
			// while "l" changes or goes away.
			late, release := stallCall(t, store, func() (ratelimit.Result, error) { return lim.Limit(ctx, "l", key) })
			grantLoose := func() {
				// A second later, a call of the loose config is
				// granted: 10 refilled, 9 left.
				mock.Add(time.Second)
				opts := []ratelimit.CallOption{}
				if how == "removed" {
					opts = append(opts, ratelimit.WithConfig(loose))
				}
				res, err := lim.Limit(ctx, "l", key, opts...)
				require.NoError(t, err)
				require.True(t, res.OK)
				require.Equal(t, 9.0, res.Remaining)
			}
			if how == "changed" {
				require.NoError(t, lim.SetLimits(ratelimit.Limits{"l": loose}))
				// While the cache learns the late call's record.
				store.afterLoad.Store(ptr(grantLoose))
			} else {
				require.NoError(t, lim.SetLimits(nil))
			}
			close(release)
			res = <-late
			require.False(t, res.OK)
			require.False(t, res.Local)
			require.Nil(t, store.afterLoad.Load(), "the cache loaded the record")
			if how == "removed" {
				grantLoose()
			}

			// The strict config again, held once it is published.
			hold := ratelimit.HoldDenyStripe(lim, 0)
			done := make(chan error, 1)
			go func() { done <- lim.SetLimits(ratelimit.Limits{"l": strict}) }()
			for c, ok := lim.Config("l"); !ok || c != strict; c, ok = lim.Config("l") {
				runtime.Gosched()
			}
			// The store holds 9 tokens, cut to the strict capacity of 1.
			res, err = lim.Limit(ctx, "l", key)
			hold()
			require.NoError(t, <-done)
			require.NoError(t, err)
			require.True(t, res.OK, "the store would allow the call; got a refusal (Local=%v)", res.Local)
		})
	}
}

// A reservation made under one config and canceled after SetLimit changed
// its Rate, Period or Capacity is handed back under the config in force,
// as Refund of its token is (both are checked): the record it writes
// holds no more than the new capacity, and expires when the new config
// would have filled it.
// Written under the reservation's own config, a refund of 1 token left a
// record that expired within a second, and the key had a full bucket
// again (100 tokens, or 10) where the new config had granted it about 1.
func TestCancelAcrossAChangeOfRate(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name           string
		before, after  ratelimit.Config
		reserve, spend float64
		capacity       float64 // the new config's
		most           float64 // the most the key may hold two minutes later
	}{
		{"token bucket", ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Second},
			ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour, Capacity: 100}, 1, 99, 100, 1 + 120.0/3600},
		{"fixed window", ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Start: t0},
			ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour, Start: t0}, 1, 9, 10, 1},
		{"capacity lowered", ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Second},
			ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour, Capacity: 5}, 100, 0, 5, 5},
	} {
		for _, by := range []string{"cancel", "token"} {
			t.Run(tc.name+"/"+by, func(t *testing.T) {
				mock := newMock()
				store := must(memstore.New(memstore.WithClock(mock)))
				lim, err := ratelimit.New(store, ratelimit.Limits{"l": tc.before}, ratelimit.WithClock(mock))
				require.NoError(t, err)
				r, err := lim.Reserve(ctx, "l", "k", ratelimit.Count(tc.reserve))
				require.NoError(t, err)
				require.True(t, r.OK())
				require.NoError(t, lim.SetLimit("l", tc.after))
				if tc.spend > 0 {
					res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(tc.spend))
					require.NoError(t, err)
					require.True(t, res.OK)
				}
				if by == "token" {
					require.NoError(t, lim.Refund(ctx, r.Token()))
				} else {
					require.NoError(t, r.Cancel(ctx))
				}
				recs := make([]driver.Record, 1)
				require.NoError(t, store.Load(ctx, []driver.RecordID{{Name: "l", Key: "k"}}, recs))
				require.True(t, recs[0].Found)
				assert.LessOrEqual(t, recs[0].State.Remaining, tc.capacity,
					"the record the cancel wrote holds more than the new config's capacity")

				mock.Add(2 * time.Minute)
				_, err = store.DeleteExpired(ctx, mock.Now())
				require.NoError(t, err)
				st, err := lim.Value(ctx, "l", "k")
				require.NoError(t, err)
				assert.LessOrEqual(t, st.Remaining, tc.most+1e-9, "the cancel handed back more than the reservation took")
			})
		}
	}
}

// A count below the noise a decision forgives was granted on an empty
// bucket, and again, without end: 100,000 calls of 5e-10 passed a limit
// holding none. A count above 0 below MinCount is refused as invalid; from
// MinCount on, an empty bucket refuses the call, sharded or not.
func TestCountBelowMinCount(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range []ratelimit.Config{
		{Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour},
		{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour},
		{Kind: ratelimit.TokenBucket, Rate: 8, Period: time.Hour, Shards: 4},
	} {
		t.Run(fmt.Sprintf("%s, %d shards", cfg.Kind, cfg.Shards), func(t *testing.T) {
			lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": cfg}, ratelimit.WithClock(newMock()))
			require.NoError(t, err)
			for range 64 { // empty every shard
				_, err := lim.Limit(ctx, "l", "k", ratelimit.Count(1))
				require.NoError(t, err)
			}
			res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(1e-6))
			require.NoError(t, err)
			require.False(t, res.OK, "every shard is empty")
			for _, c := range []float64{5e-10, 1.9e-9, ratelimit.MinCount / 2} {
				res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(c))
				require.ErrorIs(t, err, ratelimit.ErrInvalidCount, "count %v", c)
				require.False(t, res.OK, "count %v", c)
				assert.Contains(t, err.Error(), "the least count above 0 a call may ask for (MinCount)")
			}
			res, err = lim.Limit(ctx, "l", "k", ratelimit.Count(ratelimit.MinCount))
			require.NoError(t, err)
			require.False(t, res.OK, "an empty bucket refuses a call of MinCount")
			res, err = lim.Limit(ctx, "l", "k", ratelimit.Count(0))
			require.NoError(t, err)
			require.True(t, res.OK, "a call of 0 asks for nothing")
		})
	}
}
