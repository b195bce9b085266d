package memstore

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// deferredLen is how many places the store's list of bound params has.
func deferredLen(s *Store) int {
	if l := s.deferred.Load(); l != nil {
		return len(*l)
	}
	return 0
}

// A control plane that pushes a new rate through SetLimit again and again
// leaves the store's list of bound params at the params still bound, plus
// a few: not one place per config ever bound. The records written under
// each config keep the expiry of the params that wrote them.
func TestDeferredParamsBoundedUnderSetLimit(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.UnixMilli(1_700_000_000_000))
	s, err := New(WithClock(mock))
	require.NoError(t, err)
	cfg := func(i int) ratelimit.Config {
		return ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: float64(10 + i), Period: time.Second}
	}
	lim, err := ratelimit.New(s, ratelimit.Limits{"api": cfg(0)}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	const n = 10_000
	most := 0
	for i := 1; i <= n; i++ {
		require.NoError(t, lim.SetLimit("api", cfg(i)))
		// A record written under each config, its expiry left to a sweep.
		_, err := lim.Limit(t.Context(), "api", "k"+string(rune('a'+i%26)))
		require.NoError(t, err)
		if i%100 == 0 {
			runtime.GC() // the Limiter dropped the configs it bound before
		}
		most = max(most, deferredLen(s))
	}
	require.LessOrEqual(t, most, 512, "the list of bound params grows with every config ever bound")

	// The records carry the expiry of the params that last wrote them.
	for i := n - 25; i <= n; i++ {
		key := "k" + string(rune('a'+i%26))
		c := cfg(i)
		p := driver.Params{Kind: c.Kind, Rate: c.Rate, Period: c.Period.Milliseconds(), Capacity: c.Rate}
		var rec [1]driver.Record
		require.NoError(t, s.Load(t.Context(), []driver.RecordID{{Name: "api", Key: key}}, rec[:]))
		require.True(t, rec[0].Found, key)
		require.Equal(t, ratelimit.FullAt(p, rec[0].State), ExpiryOf(s, "api", key), key)
	}
	runtime.KeepAlive(lim)
}

// The place of params no bound limit uses any more is given to other
// params only once no record carries it: the expiries it marked are
// computed with the params that wrote them, and a refusal remembered under
// its number is not given to a call of the params that take it next.
func TestDeferredPlaceReusedWithoutMixingParams(t *testing.T) {
	s, err := New()
	require.NoError(t, err)
	const now = 1_700_000_000_000
	p1 := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}
	p2 := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 60_000, Capacity: 1}
	noPhase := func(string) int64 { return 0 }

	func() {
		b := s.Bind("api", p1, noPhase).(*bound)
		require.Equal(t, uint64(1), b.params)
		// "a" written at now (its expiry deferred), then refused a
		// millisecond later: the refusal is remembered.
		v, err := b.Decide(t.Context(), "a", driver.ModeLimit, now, 1, false)
		require.NoError(t, err)
		require.True(t, v.OK)
		v, err = b.Decide(t.Context(), "a", driver.ModeLimit, now+1, 1, false)
		require.NoError(t, err)
		require.False(t, v.OK)
		require.Equal(t, int64(999), v.RetryAfter)
	}()
	runtime.GC() // the bound of p1 is gone
	s.deferredMu.Lock()
	s.reclaimDeferred()
	s.deferredMu.Unlock()
	require.Equal(t, 0, deferredLen(s), "params no bound limit uses are kept")
	require.Equal(t, ratelimit.FullAt(p1, driver.State{Remaining: 0, TS: now}), ExpiryOf(s, "api", "a"))

	// p2 takes p1's place and number: its refusal is its own.
	b := s.Bind("api", p2, noPhase).(*bound)
	require.Equal(t, uint64(1), b.params)
	v, err := b.Decide(t.Context(), "a", driver.ModeLimit, now+1, 1, false)
	require.NoError(t, err)
	require.False(t, v.OK)
	require.Equal(t, int64(59_999), v.RetryAfter, "p1's refusal given to a call of p2")
	runtime.KeepAlive(b)
}

// Params bound and dropped while other goroutines decide through bounds
// of their own, old and new: the places freed and given again never lose
// a mark that a record still carries (its expiry would be computed with
// the params that took the place next, or a freed place indexed) nor mix
// two params' refusals.
func TestDeferredReclaimUnderConcurrentCalls(t *testing.T) {
	mock := clock.NewMock()
	s, err := New(WithClock(mock))
	require.NoError(t, err)
	const now = 1_700_000_000_000
	noPhase := func(string) int64 { return 0 }
	params := func(i int) driver.Params {
		return driver.Params{Kind: ratelimit.TokenBucket, Rate: float64(1 + i), Period: 1000, Capacity: float64(1 + i)}
	}
	keep := s.Bind("api", params(0), noPhase)
	done := make(chan struct{})
	type result struct {
		wrote map[string]driver.Params // the params of each key's last write
		err   error
	}
	results := make(chan result, 2)
	for g := range 2 {
		go func() {
			res := result{wrote: map[string]driver.Params{}}
			defer func() { results <- res }()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				b, p := keep, params(0)
				if i%3 != 0 {
					p = params(1 + (g*7919+i)%500)
					b = s.Bind("api", p, noPhase)
				}
				key := fmt.Sprint(g, "-", i%26)
				v, err := b.Decide(context.Background(), key, driver.ModeLimit, now+int64(i%4), 1, false)
				if res.err = err; err != nil {
					return
				}
				if v.OK {
					res.wrote[key] = p
				}
			}
		}()
	}
	for i := range 300 {
		s.Bind("other", params(1000+i), noPhase)
		if i%50 == 0 {
			runtime.GC()
		}
	}
	close(done)
	var all [2]result
	for g := range all {
		all[g] = <-results
		require.NoError(t, all[g].err)
	}
	// The places of the callers' bounds freed, and given to other params.
	for i := range 300 {
		if i%50 == 0 {
			runtime.GC()
		}
		s.Bind("other", params(2000+i), noPhase)
	}
	for _, res := range all {
		// Every record's expiry is that of the params that wrote it last.
		for key, p := range res.wrote {
			var rec [1]driver.Record
			require.NoError(t, s.Load(t.Context(), []driver.RecordID{{Name: "api", Key: key}}, rec[:]))
			require.Equal(t, ratelimit.FullAt(p, rec[0].State), ExpiryOf(s, "api", key), key)
		}
	}
	runtime.KeepAlive(keep)
}
