package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func newMock() *clock.Mock {
	m := clock.NewMock()
	m.Set(t0)
	return m
}

func TestNewRejectsInvalidConfigs(t *testing.T) {
	valid := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}
	tests := []struct {
		name  string
		edit  func(*ratelimit.Config)
		field string
	}{
		{"zero kind", func(c *ratelimit.Config) { c.Kind = 0 }, "Kind"},
		{"unknown kind", func(c *ratelimit.Config) { c.Kind = 9 }, "Kind"},
		{"zero rate", func(c *ratelimit.Config) { c.Rate = 0 }, "Rate"},
		{"negative rate", func(c *ratelimit.Config) { c.Rate = -1 }, "Rate"},
		{"NaN rate", func(c *ratelimit.Config) { c.Rate = math.NaN() }, "Rate"},
		{"infinite rate", func(c *ratelimit.Config) { c.Rate = math.Inf(1) }, "Rate"},
		{"period under 1ms", func(c *ratelimit.Config) { c.Period = time.Microsecond }, "Period"},
		{"period not whole ms", func(c *ratelimit.Config) { c.Period = 1500 * time.Microsecond }, "Period"},
		{"negative capacity", func(c *ratelimit.Config) { c.Capacity = -3 }, "Capacity"},
		{"NaN capacity", func(c *ratelimit.Config) { c.Capacity = math.NaN() }, "Capacity"},
		{"infinite max reserved", func(c *ratelimit.Config) { c.MaxReserved = math.Inf(1) }, "MaxReserved"},
		{"negative shards", func(c *ratelimit.Config) { c.Shards = -2 }, "Shards"},
		{"start on a token bucket", func(c *ratelimit.Config) { c.Kind = ratelimit.TokenBucket; c.Start = t0 }, "Start"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.edit(&c)
			_, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"signup": c})
			require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
			var ce *ratelimit.ConfigError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, "signup", ce.Name)
			assert.Equal(t, tt.field, ce.Field)
			assert.Contains(t, err.Error(), `limit "signup"`)
		})
	}
	_, err := ratelimit.New(nil, nil)
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	// A store whose New failed, kept instead of its error: its first call
	// would panic.
	var none *memstore.Store
	_, err = ratelimit.New(none, nil)
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	require.ErrorContains(t, err, "*memstore.Store(nil)")
}

// A limit named "", which calls may name as any other, is named in the
// error of its config: the error read "invalid config", as Validate's
// does for a Config of no limit, and told none of New, SetLimit and
// ParseLimits which limit it was.
func TestConfigErrorNamesTheEmptyName(t *testing.T) {
	bad := ratelimit.Config{Kind: ratelimit.FixedWindow, Period: time.Second}
	_, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"": bad, "b": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Second}})
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	assert.EqualError(t, err, `ratelimit: limit "": Rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000`)

	lim, err := ratelimit.New(must(memstore.New()), nil)
	require.NoError(t, err)
	assert.EqualError(t, lim.SetLimit("", bad), `ratelimit: limit "": Rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000`)
	assert.EqualError(t, lim.SetLimits(ratelimit.Limits{"": bad}), `ratelimit: limit "": Rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000`)
	_, err = lim.Limit(context.Background(), "", "k", ratelimit.WithConfig(bad))
	assert.EqualError(t, err, `ratelimit: limit "": Rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000`)

	_, err = ratelimit.ParseLimits([]byte(`"": {kind: fixed window, rate: 0, period: 1m}`))
	assert.EqualError(t, err, `ratelimit: limits file: line 1: limit "": Rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000`)

	assert.EqualError(t, bad.Validate(), `ratelimit: invalid config: Rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000`, "a Config of no limit")
}

// The ConfigError of a limit of any other name than "" is the value its
// exported fields say, so that a program comparing it with one it builds
// (==, reflect.DeepEqual) finds it equal, as it did before the limit ""
// was named: the mark that names "" was set for every limit.
func TestConfigErrorComparesByItsFields(t *testing.T) {
	bad := ratelimit.Config{Kind: ratelimit.FixedWindow, Period: time.Second}
	want := ratelimit.ConfigError{Name: "a", Field: "Rate", Problem: "is 0: it must be a number of tokens from 1e-9 to 1000000000000000"}
	_, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"a": bad})
	var ce *ratelimit.ConfigError
	require.ErrorAs(t, err, &ce)
	assert.True(t, *ce == want, "%#v", *ce)
	assert.Equal(t, want, *ce)

	_, err = ratelimit.ParseLimits([]byte(`a: {kind: fixed window, rate: 0, period: 1s}`))
	require.ErrorAs(t, err, &ce)
	assert.True(t, *ce == want, "%#v", *ce)
}

// An option given a bad argument makes New fail (docs/api.md). A nil
// clock was accepted, and the first call panicked on it.
func TestNewRefusesANilClock(t *testing.T) {
	var err error
	require.NotPanics(t, func() {
		var lim *ratelimit.Limiter
		lim, err = ratelimit.New(must(memstore.New()), ratelimit.Limits{
			"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second},
		}, ratelimit.WithClock(nil))
		if err == nil {
			_, err = lim.Limit(context.Background(), "l", "k")
		}
	}, "a nil clock panics instead of being reported")
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.Contains(t, err.Error(), "WithClock")
	// A plain nil is written nil, not as %T writes it (<nil>(nil)).
	assert.Contains(t, err.Error(), "the clock is nil:")
	assert.NotContains(t, err.Error(), "<nil>")
	_, err = ratelimit.New(nil, nil)
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.Contains(t, err.Error(), "was given nil:")
	assert.NotContains(t, err.Error(), "<nil>")
}

// nilObserver is an Observer whose methods need a non-nil receiver.
type nilObserver struct{ seen int }

func (o *nilObserver) Observe(context.Context, ratelimit.Event) { o.seen++ }

func TestNewRefusesANilObserver(t *testing.T) {
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}}
	for name, o := range map[string]ratelimit.Observer{
		"nil pointer":      (*nilObserver)(nil),
		"nil ObserverFunc": ratelimit.ObserverFunc(nil),
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() {
				var lim *ratelimit.Limiter
				lim, err = ratelimit.New(must(memstore.New()), limits, ratelimit.WithObserver(o))
				if err == nil {
					_, err = lim.Limit(context.Background(), "l", "k")
				}
			}, "an observer holding nil panics at the first decision instead of being reported")
			require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
			assert.Contains(t, err.Error(), "WithObserver")
		})
	}
	// A plain nil sets no observer, as leaving the option out does.
	lim, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithObserver(nil))
	require.NoError(t, err)
	_, err = lim.Limit(context.Background(), "l", "k")
	require.NoError(t, err)
}

func TestBadCallsChangeNothing(t *testing.T) {
	ctx := context.Background()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"fw":      {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute},
		"bounded": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, MaxReserved: 5},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)

	for _, count := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1, -1e-300} {
		_, err := lim.Limit(ctx, "fw", "k", ratelimit.Count(count))
		require.ErrorIs(t, err, ratelimit.ErrInvalidCount, "count %v", count)
	}
	_, err = lim.Limit(ctx, "fw", "k", ratelimit.Count(10.5))
	var ce *ratelimit.CountError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, 10.0, ce.Max)
	assert.Contains(t, err.Error(), "WithReserve()")
	_, err = lim.Limit(ctx, "bounded", "k", ratelimit.Count(15.5), ratelimit.WithReserve())
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
	res, err := lim.Limit(ctx, "bounded", "k", ratelimit.Count(15), ratelimit.WithReserve())
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, lim.Reset(ctx, "bounded", "k"))

	_, err = lim.Limit(ctx, "nope", "k")
	require.ErrorIs(t, err, ratelimit.ErrUnknownLimit)
	assert.Contains(t, err.Error(), "WithConfig")
	_, err = lim.Limit(ctx, "fw", "k", ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 99, Period: time.Minute}))
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig, "an inline config may not redefine a declared limit")
	_, err = lim.Limit(ctx, "inline", "k", ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: -1, Period: time.Minute}))
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = lim.Limit(canceled, "fw", "k")
	require.ErrorIs(t, err, context.Canceled)

	for _, name := range []string{"fw", "bounded"} {
		st, err := lim.Value(ctx, name, "k")
		require.NoError(t, err)
		assert.Equal(t, 10.0, st.Remaining, "%s: a rejected call must not spend", name)
	}
}

func TestInlineConfig(t *testing.T) {
	ctx := context.Background()
	lim, err := ratelimit.New(must(memstore.New()), nil, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	cfg := ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Second})
	for i := range 3 {
		res, err := lim.Limit(ctx, "adhoc", "k", cfg)
		require.NoError(t, err)
		assert.Equal(t, i < 2, res.OK, "call %d", i)
	}
}

func TestResultErr(t *testing.T) {
	ctx := context.Background()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"sendMessage": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 1},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "sendMessage", "alice")
	require.NoError(t, err)
	require.NoError(t, res.Err())
	res, err = lim.Limit(ctx, "sendMessage", "alice")
	require.NoError(t, err)
	err = res.Err()
	require.ErrorIs(t, err, ratelimit.ErrLimited)
	var le *ratelimit.LimitError
	require.ErrorAs(t, fmt.Errorf("send: %w", err), &le)
	assert.Equal(t, "sendMessage", le.Name)
	assert.Equal(t, "alice", le.Key)
	assert.Equal(t, 6*time.Second, le.RetryAfter)
}

func TestDerivedPhase(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"h": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	starts := map[int64]bool{}
	for i := range 200 {
		st, err := lim.Value(ctx, "h", fmt.Sprint("user", i))
		require.NoError(t, err)
		starts[st.WindowStart.UnixMilli()] = true
		// stable: the same key always has the same windows
		again, err := lim.Value(ctx, "h", fmt.Sprint("user", i))
		require.NoError(t, err)
		require.Equal(t, st.WindowStart, again.WindowStart)
	}
	assert.Greater(t, len(starts), 190, "phases must spread across keys")

	other, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"h": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour},
	}, ratelimit.WithClock(mock), ratelimit.WithPhaseSeed(42))
	require.NoError(t, err)
	a, _ := lim.Value(ctx, "h", "user0")
	b, _ := other.Value(ctx, "h", "user0")
	assert.NotEqual(t, a.WindowStart, b.WindowStart, "a seed moves the phases")
}

func TestFutureStartFixesOnlyThePhase(t *testing.T) {
	ctx := context.Background()
	start := t0.Add(90*24*time.Hour + 17*time.Minute)
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"launch": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Hour, Start: start},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "launch", "k", ratelimit.Count(5))
	require.NoError(t, err)
	require.True(t, res.OK, "a future Start must not keep the limit closed")
	st, err := lim.Value(ctx, "launch", "k")
	require.NoError(t, err)
	assert.Equal(t, t0.Add(-43*time.Minute), st.WindowStart.UTC())
}

// A Start of any year a Limiter can compute fixes the windows at Start +
// k·Period, however far from now: the year 1 (a millisecond after the
// zero time.Time, which means a derived phase), 9999, beyond RFC 3339's
// years, and up to some 292 million years either side of 1970. Beyond,
// its Unix milliseconds overflow an int64 and the windows fell at another
// phase (a Start of 292278995-01-01T00:00:00Z made hourly windows start
// at 34m8.384s past the hour), without a word: Validate refuses it.
func TestExtremeStart(t *testing.T) {
	ctx := context.Background()
	const period = 7 * time.Hour // not a divisor of a day or a year
	// unixMilli is t's Unix milliseconds, exactly, rounded down.
	unixMilli := func(t time.Time) *big.Int {
		ms := new(big.Int).Mul(big.NewInt(t.Unix()), big.NewInt(1000))
		return ms.Add(ms, big.NewInt(int64(t.Nanosecond()/1e6)))
	}
	for _, start := range []time.Time{
		time.Date(1, 1, 1, 0, 0, 0, 1e6, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC),
		time.Date(123456, 7, 8, 9, 10, 11, 12e6, time.UTC),
		time.Date(-4000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.UnixMilli(math.MaxInt64),
		time.UnixMilli(math.MaxInt64).Add(time.Millisecond - 1),
		time.UnixMilli(math.MinInt64),
	} {
		c := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1, Period: period, Start: start}
		require.NoError(t, c.Validate(), start)
		lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"x": c}, ratelimit.WithClock(newMock()))
		require.NoError(t, err)
		st, err := lim.Value(ctx, "x", "k")
		require.NoError(t, err)
		off := new(big.Int).Sub(unixMilli(st.WindowStart), unixMilli(start))
		assert.Zero(t, new(big.Int).Mod(off, big.NewInt(period.Milliseconds())).Sign(), "%v: window at %v", start, st.WindowStart)
		assert.False(t, st.WindowStart.After(t0), start)
		assert.True(t, st.NextGrant.After(t0), start)
	}

	for _, start := range []time.Time{
		time.Date(292278995, 1, 1, 0, 0, 0, 0, time.UTC),
		time.UnixMilli(math.MaxInt64).Add(time.Millisecond),
		time.UnixMilli(math.MinInt64).Add(-time.Nanosecond),
		time.Date(-1e9, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(1<<62, 0),
	} {
		c := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1, Period: period, Start: start}
		err := c.Validate()
		var ce *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce, start)
		assert.Equal(t, "Start", ce.Field)
		assert.ErrorContains(t, err, "it must be within some 292 million years of 1970", start)
		_, err = ratelimit.New(must(memstore.New()), ratelimit.Limits{"x": c})
		assert.ErrorIs(t, err, ratelimit.ErrInvalidConfig, start)
	}
}

func TestShardChoiceIsInjectable(t *testing.T) {
	ctx := context.Background()
	run := func() []float64 {
		lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
			"s": {Kind: ratelimit.FixedWindow, Rate: 80, Period: time.Minute, Shards: 8, Start: t0},
		}, ratelimit.WithClock(newMock()), ratelimit.WithRand(rand.NewPCG(1, 2)))
		require.NoError(t, err)
		granted := 0
		for range 20 {
			res, err := lim.Limit(ctx, "s", "k", ratelimit.Count(3))
			require.NoError(t, err)
			if res.OK {
				granted++
			}
		}
		st, err := lim.Value(ctx, "s", "k")
		require.NoError(t, err)
		var per []float64
		for _, sh := range st.Shards {
			per = append(per, sh.Remaining)
		}
		assert.InDelta(t, 80-3*float64(granted), st.Remaining, 1e-9)
		return per
	}
	assert.Equal(t, run(), run(), "the same source must choose the same shards")
}

func TestShardedCountValidation(t *testing.T) {
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"s": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute, Shards: 10},
	})
	require.NoError(t, err)
	res, err := lim.Limit(context.Background(), "s", "k", ratelimit.Count(20))
	require.NoError(t, err)
	require.True(t, res.OK, "two fresh shards grant their 2×10 together")
	_, err = lim.Limit(context.Background(), "s", "k", ratelimit.Count(21))
	var ce *ratelimit.CountError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, 20.0, ce.Max)
	assert.Contains(t, err.Error(), "use at most 9 shards")
}

// A count above Capacity is told to ask WithReserve only when that would
// pass: above Capacity plus MaxReserved it fails too, and the advice sent
// the caller from one ErrInvalidCount to another.
func TestCountErrorSuggestsWithReserveOnlyWhenItFits(t *testing.T) {
	ctx := context.Background()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 3, Period: time.Second, MaxReserved: 1},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "l", "k", ratelimit.Count(5))
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
	assert.NotContains(t, err.Error(), "WithReserve", "5 > Capacity 3 plus MaxReserved 1")
	_, err = lim.Limit(ctx, "l", "k", ratelimit.Count(5), ratelimit.WithReserve())
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount, "as the advice would have found")

	_, err = lim.Limit(ctx, "l", "k", ratelimit.Count(4))
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
	assert.Contains(t, err.Error(), "WithReserve()")
	res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(4), ratelimit.WithReserve())
	require.NoError(t, err, "the advice is good")
	require.True(t, res.Reserved())
}

func TestKindText(t *testing.T) {
	for in, want := range map[string]ratelimit.Kind{
		"fixed window": ratelimit.FixedWindow, "Fixed_Window": ratelimit.FixedWindow, "fixedwindow": ratelimit.FixedWindow,
		"FIXED-WINDOW": ratelimit.FixedWindow, "token bucket": ratelimit.TokenBucket, "TokenBucket": ratelimit.TokenBucket,
		"token_bucket": ratelimit.TokenBucket, "Token-Bucket": ratelimit.TokenBucket,
	} {
		var k ratelimit.Kind
		require.NoError(t, k.UnmarshalText([]byte(in)), in)
		assert.Equal(t, want, k, in)
	}
	// The two words and one separator or none: space around them, two
	// separators, one within a word, or a letter that lower-cases to an
	// ASCII one (the Kelvin sign, K) is a slip, not a kind.
	for _, in := range []string{"leaky bucket", "", " fixed window", "fixed window ", "fixed  window", "fixed_-window",
		"f-i-x-e-d window", "fixed win dow", "token\tbucket", "to\u212Aen bucket", "fixed", "window", "fixed window window"} {
		var k ratelimit.Kind
		err := k.UnmarshalText([]byte(in))
		require.Error(t, err, "%q: got %v", in, k)
		assert.ErrorContains(t, err, `write "fixed window" or "token bucket" (in any case, with a space, _, - or nothing between the words)`, in)
	}
	b, err := ratelimit.TokenBucket.MarshalText()
	require.NoError(t, err)
	assert.Equal(t, "token bucket", string(b))
	_, err = ratelimit.Kind(0).MarshalText()
	require.Error(t, err)
}

func TestMemstoreForgetsFullBuckets(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := must(memstore.New(memstore.WithClock(mock)))
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"tb":  {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
		"big": {Kind: ratelimit.TokenBucket, Rate: 1e6, Period: time.Second},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	for i := range 1000 {
		_, err := lim.Limit(ctx, "tb", fmt.Sprint("one-off-", i))
		require.NoError(t, err)
	}
	require.Equal(t, 1000, store.Len())
	mock.Add(99 * time.Millisecond) // one token refilled by 100 ms: not yet
	assert.Equal(t, 0, must(store.DeleteExpired(ctx, mock.Now())))
	mock.Add(time.Millisecond)
	// Writes (of any limit and key) drop expired records a few at a time.
	for i := range 300 {
		res, err := lim.Limit(ctx, "big", fmt.Sprint("steady-", i%3))
		require.NoError(t, err)
		require.True(t, res.OK)
	}
	assert.Equal(t, 0, must(store.DeleteExpired(ctx, mock.Now())), "full, but not for ExpiryGrace yet")
	mock.Add(time.Duration(driver.ExpiryGrace) * time.Millisecond)
	// Writes that add records drop expired ones as they go, a few slots of
	// one stripe after another.
	for i := range 300 {
		_, err := lim.Limit(ctx, "big", fmt.Sprint("new-", i))
		require.NoError(t, err)
	}
	assert.Less(t, store.Len(), 1000+3+300-500, "writes must drop expired records as they go")
	assert.Equal(t, store.Len()-303, must(store.DeleteExpired(ctx, mock.Now())))
	assert.Equal(t, 303, store.Len())
}

func TestErrorsAreDistinct(t *testing.T) {
	all := []error{ratelimit.ErrLimited, ratelimit.ErrUnknownLimit, ratelimit.ErrInvalidConfig, ratelimit.ErrInvalidCount}
	for i, a := range all {
		for j, b := range all {
			assert.Equal(t, i == j, errors.Is(a, b))
		}
	}
}

// clockStore is a memstore whose records are judged at its own time when
// own is set, as a store with a server clock (TimeSource) would be.
type clockStore struct {
	*memstore.Store
	own bool
	now time.Time
}

func (s *clockStore) OwnClock() bool { return s.own }

func (s *clockStore) Now(context.Context) (int64, error) { return s.now.UnixMilli(), nil }

func (s *clockStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if s.own {
		op.Now = s.now.UnixMilli()
	}
	return s.Store.Apply(ctx, op, out)
}

func TestStoreClock(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{"tb": {Kind: ratelimit.TokenBucket, Rate: 60, Period: time.Minute}}
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprint("own=", own), func(t *testing.T) {
			mock := newMock()
			store := &clockStore{Store: must(memstore.New()), own: own, now: t0}
			lim, err := ratelimit.New(store, limits, ratelimit.WithClock(mock), ratelimit.WithDenyCache(16))
			require.NoError(t, err)
			res, err := lim.Limit(ctx, "tb", "k", ratelimit.Count(60))
			require.NoError(t, err)
			require.True(t, res.OK)
			// The Limiter's clock moves 30s; the store's stays.
			mock.Add(30 * time.Second)
			st, err := lim.Value(ctx, "tb", "k")
			require.NoError(t, err)
			want := 30.0
			if own {
				want = 0 // judged at the store's time, not the Limiter's
			}
			require.Equal(t, want, st.Remaining)
			// Denied calls: with the store's clock the deny cache must not
			// refuse locally, since the Limiter cannot read that clock.
			for range 2 {
				res, err = lim.Limit(ctx, "tb", "k", ratelimit.Count(45))
				require.NoError(t, err)
				require.False(t, res.OK)
			}
			require.Equal(t, !own, res.Local, "the second refusal is local only on the Limiter's clock")
		})
	}
}

// A store that keeps its own clock and reads a time beyond ±MaxTime
// (a server whose clock is wrong) makes Value, and the settlement of a
// token, fail with ErrTimeRange naming the store's clock, as the
// Limiter's own clock would: not a Status computed at that time, nor a
// token judged expired by it.
func TestStoreClockOutOfRange(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{"fw": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0}}
	for _, at := range []int64{driver.MaxTime + 1, -driver.MaxTime - 1} {
		t.Run(fmt.Sprint(at), func(t *testing.T) {
			store := &clockStore{Store: must(memstore.New()), own: true, now: t0}
			lim, err := ratelimit.New(store, limits, ratelimit.WithClock(newMock()))
			require.NoError(t, err)
			r, err := lim.Reserve(ctx, "fw", "k")
			require.NoError(t, err)
			require.True(t, r.OK())

			store.now = time.UnixMilli(at)
			_, err = lim.Value(ctx, "fw", "k")
			require.ErrorIs(t, err, ratelimit.ErrTimeRange)
			assert.ErrorContains(t, err, "store's clock")
			err = r.Cancel(ctx)
			require.ErrorIs(t, err, ratelimit.ErrTimeRange)
			assert.ErrorContains(t, err, "store's clock")

			store.now = t0
			require.NoError(t, r.Cancel(ctx), "nothing was settled")
			st, err := lim.Value(ctx, "fw", "k")
			require.NoError(t, err)
			assert.Equal(t, 10.0, st.Remaining)
		})
	}
}

func TestResultReset(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"fw": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour, Start: t0},
		"tb": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	mock.Add(15 * time.Minute)
	res, err := lim.Limit(ctx, "fw", "k", ratelimit.Count(10))
	require.NoError(t, err)
	require.Equal(t, 45*time.Minute, res.ResetAfter, "the next window starts at 01:00")
	res, err = lim.Limit(ctx, "fw", "k")
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Equal(t, 45*time.Minute, res.ResetAfter)
	res, err = lim.Limit(ctx, "tb", "k", ratelimit.Count(4))
	require.NoError(t, err)
	require.Equal(t, 24*time.Second, res.ResetAfter, "4 tokens refill in 24s")
	res, err = lim.LimitAll(ctx, "k2", []string{"fw", "tb"}, ratelimit.Count(1))
	require.NoError(t, err)
	require.Equal(t, 45*time.Minute, res.All[0].ResetAfter)
	require.Equal(t, 6*time.Second, res.All[1].ResetAfter)
}

// ResetAfter of a sharded token bucket is how long the two shards the call
// evaluated take to refill their shortfall together, at their rate
// together: a store reports their sum, not each one's. It was documented
// as "until they are full again", which a shard that took the whole call
// is only twice as late; the documented bound holds.
func TestShardedTokenBucketResetAfter(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"tb": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Shards: 2},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "tb", "k", ratelimit.Count(5))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Equal(t, 5.0, res.Remaining)
	require.Equal(t, 30*time.Second, res.ResetAfter, "5 tokens short, refilled at 10 a minute")
	st, err := lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.ElementsMatch(t, []float64{0, 5}, []float64{st.Shards[0].Remaining, st.Shards[1].Remaining},
		"one shard took the whole call")

	mock.Set(t0.Add(res.ResetAfter))
	st, err = lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.Equal(t, 7.5, st.Remaining, "the shard that took the call is not full yet")
	mock.Set(t0.Add(2 * res.ResetAfter))
	st, err = lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.Equal(t, st.Capacity, st.Remaining, "full by twice ResetAfter")
}

func TestRecordIDAppendKeyIsUnambiguous(t *testing.T) {
	seen := map[string]driver.RecordID{}
	for _, p := range storetest.Confusable() {
		for shard := range 3 {
			id := driver.RecordID{Name: p[0], Key: p[1], Shard: shard}
			k := string(id.AppendKey(nil))
			if other, ok := seen[k]; ok {
				t.Fatalf("(%.30q, %.30q, %d) and (%.30q, %.30q, %d) share the encoding",
					other.Name, other.Key, other.Shard, id.Name, id.Key, id.Shard)
			}
			seen[k] = id
		}
	}
	// Shard numbers past one byte of uvarint stay apart from key bytes.
	a := driver.RecordID{Name: "n", Key: "\x01", Shard: 200}
	b := driver.RecordID{Name: "n", Key: "\x01\x01", Shard: 72}
	require.NotEqual(t, a.AppendKey(nil), b.AppendKey(nil))
}

// A limit changed from one record to shards reuses the old record as
// shard 0; it must not keep more tokens than a shard may hold (it kept 93
// over a shard capacity of 50, so the window granted 143 of 100).
func TestShardingALimitCapsItsOldRecord(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := must(memstore.New())
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour, Start: t0}
	before, err := ratelimit.New(store, ratelimit.Limits{"l": cfg}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	_, err = before.Limit(ctx, "l", "k", ratelimit.Count(7))
	require.NoError(t, err)

	cfg.Shards = 2
	after, err := ratelimit.New(store, ratelimit.Limits{"l": cfg}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	st, err := after.Value(ctx, "l", "k")
	require.NoError(t, err)
	for _, sh := range st.Shards {
		assert.LessOrEqual(t, sh.Remaining, 50.0, "shard %d", sh.Index)
	}
	granted := 0
	for range 1000 {
		res, err := after.Limit(ctx, "l", "k")
		require.NoError(t, err)
		if res.OK {
			granted++
		}
	}
	assert.LessOrEqual(t, granted, 100)
}

// Result.ResetAfter follows the window of the record the store decided on:
// after Start moves, a record keeps the windows it was written with until
// it is full again (Reset said 20m while the next grant was 50m away).
func TestResetFollowsTheStoredRecord(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := must(memstore.New())
	hour := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour, Start: t0}
	old, err := ratelimit.New(store, ratelimit.Limits{"l": hour}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	mock.Set(t0.Add(10 * time.Minute))
	res, err := old.Limit(ctx, "l", "k", ratelimit.Count(10))
	require.NoError(t, err)
	require.Equal(t, 50*time.Minute, res.ResetAfter)

	hour.Start = t0.Add(30 * time.Minute)
	moved, err := ratelimit.New(store, ratelimit.Limits{"l": hour}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	res, err = moved.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.False(t, res.OK)
	assert.Equal(t, 50*time.Minute, res.RetryAfter)
	assert.Equal(t, 50*time.Minute, res.ResetAfter, "the next grant of the record as stored")
}

// A call decided by the failure policy gets a RetryAfter in whole
// milliseconds, rounded up, like every other (it said 999.95267ms).
func TestDegradedRetryAfterIsWholeMilliseconds(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	mock := newMock()
	cooldown := 999952670 * time.Nanosecond
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(1, cooldown))
	require.NoError(t, err)
	store.fail.Store(true)
	for range 3 {
		res, err := lim.Limit(ctx, "l", "k")
		require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
		assert.Equal(t, time.Second, res.RetryAfter)
		mock.Add(time.Microsecond)
	}
}

// Configs, counts and clocks outside what every store computes exactly
// are clear errors, never NaN, infinities or overflows in a store.
func TestExtremeValuesAreClearErrors(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		cfg   ratelimit.Config
		field string
	}{
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1e308, Period: time.Second}, "Rate"},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1e-12, Period: time.Second}, "Rate"},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Capacity: 1e300, Period: time.Second}, "Capacity"},
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, MaxReserved: 1e16, Period: time.Second}, "MaxReserved"},
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1, Period: 101 * 365 * 24 * time.Hour}, "Period"},
	} {
		_, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": c.cfg})
		var ce *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce, "%+v", c.cfg)
		assert.Equal(t, c.field, ce.Field)
	}

	// The bounds themselves work: a 100-year window, the largest rate.
	mock := newMock()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"century": {Kind: ratelimit.FixedWindow, Rate: 3, Period: ratelimit.MaxPeriod},
		"huge":    {Kind: ratelimit.TokenBucket, Rate: ratelimit.MaxTokens, Period: time.Millisecond},
		"debt":    {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "century", "k", ratelimit.Count(3))
	require.NoError(t, err)
	require.True(t, res.OK)
	res, err = lim.Limit(ctx, "century", "k")
	require.NoError(t, err)
	require.False(t, res.OK)
	assert.LessOrEqual(t, res.RetryAfter, ratelimit.MaxPeriod)
	res, err = lim.Limit(ctx, "huge", "k", ratelimit.Count(ratelimit.MaxTokens))
	require.NoError(t, err)
	require.True(t, res.OK)

	// Debt beyond MaxTokens, even with MaxReserved unset: refused, finite.
	_, err = lim.Limit(ctx, "debt", "k", ratelimit.WithReserve(), ratelimit.Count(1e308))
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
	for i := range 2 {
		res, err = lim.Limit(ctx, "debt", "k", ratelimit.WithReserve(), ratelimit.Count(ratelimit.MaxTokens))
		require.NoError(t, err)
		if i == 0 {
			// 10^15 seconds, clamped to the longest time.Duration.
			require.True(t, res.OK)
			assert.Equal(t, time.Duration(driver.MaxRetryAfter)*time.Millisecond, res.RetryAfter)
			assert.Equal(t, time.Duration(driver.MaxRetryAfter)*time.Millisecond, res.ResetAfter)
		}
	}
	require.False(t, res.OK, "the second would owe twice MaxTokens")
	st, err := lim.Value(ctx, "debt", "k")
	require.NoError(t, err)
	assert.Equal(t, 1-ratelimit.MaxTokens, st.Remaining)

	// A clock beyond the range is an error, not a disagreement of stores.
	mock.Set(time.UnixMilli(driver.MaxTime + 1))
	_, err = lim.Limit(ctx, "debt", "k")
	require.ErrorIs(t, err, ratelimit.ErrTimeRange)
}

// A limit no call of the default count can pass is refused at New, with
// what to set: Rate 0.5 without Capacity used to pass New, then fail
// every call.
func TestNewRefusesLimitsNoCallCanPass(t *testing.T) {
	for _, c := range []struct {
		cfg   ratelimit.Config
		field string
		hint  string
	}{
		{ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 0.5, Period: time.Second}, "Rate", "at least 1"},
		{ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Shards: 32}, "Rate", "at least 16"},
	} {
		_, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": c.cfg})
		var ce *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce, "%+v", c.cfg)
		assert.Equal(t, c.field, ce.Field)
		assert.Contains(t, err.Error(), c.hint)
	}
	_, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 0.5, Capacity: 1, Period: time.Second},
	})
	require.NoError(t, err, "one call every two seconds")
	_, err = ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 0.5, Capacity: 0.5, Period: time.Second},
	})
	require.NoError(t, err, "set explicitly, for calls of fractional counts")
}

// WithConfig of a declared name is accepted only with the very config
// declared: every field counts (a new Config field too, since the configs
// are compared whole), and Start as an instant, whatever its location.
func TestWithConfigOfADeclaredName(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Minute, Start: start}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": cfg})
	require.NoError(t, err)

	same := cfg
	same.Start = start.In(time.FixedZone("UTC+2", 2*60*60))
	_, err = lim.Limit(ctx, "l", "k", ratelimit.WithConfig(same))
	require.NoError(t, err, "the same instant in another zone is the same config")

	for _, change := range []func(*ratelimit.Config){
		func(c *ratelimit.Config) { c.FailOpen = true },
		func(c *ratelimit.Config) { c.MaxReserved = 3 },
		func(c *ratelimit.Config) { c.Start = c.Start.Add(time.Second) },
		func(c *ratelimit.Config) { c.Shards = 2 },
	} {
		other := cfg
		change(&other)
		_, err = lim.Limit(ctx, "l", "k", ratelimit.WithConfig(other))
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig, "%+v", other)
	}
}

// Reset deletes the records of every shard the limit has had in this
// process: after Shards is lowered from 4 to 2, a Reset that deleted only
// shards 0 and 1 left 2 and 3 as they were, and raising Shards again
// brought back their state from before the Reset.
func TestResetAfterLoweringShards(t *testing.T) {
	ctx := context.Background()
	for _, change := range []string{"SetLimits", "SetLimit", "removed"} {
		t.Run(change, func(t *testing.T) {
			four := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 8, Period: time.Hour, Shards: 4}
			two := four
			two.Shards = 2
			lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"l": four},
				ratelimit.WithClock(newMock()), ratelimit.WithRand(rand.NewPCG(1, 2)))
			require.NoError(t, err)
			for range 20 {
				_, err := lim.Limit(ctx, "l", "k")
				require.NoError(t, err)
			}
			st, err := lim.Value(ctx, "l", "k")
			require.NoError(t, err)
			for _, sh := range st.Shards {
				require.True(t, sh.Stored, "shard %d", sh.Index)
				require.Less(t, sh.Remaining, 2.0, "shard %d", sh.Index)
			}

			var opts []ratelimit.CallOption
			switch change {
			case "SetLimits":
				require.NoError(t, lim.SetLimits(ratelimit.Limits{"l": two}))
			case "SetLimit":
				require.NoError(t, lim.SetLimit("l", two))
			case "removed":
				require.NoError(t, lim.SetLimits(nil))
				opts = append(opts, ratelimit.WithConfig(two))
			}
			require.NoError(t, lim.Reset(ctx, "l", "k", opts...))

			require.NoError(t, lim.SetLimit("l", four))
			st, err = lim.Value(ctx, "l", "k")
			require.NoError(t, err)
			assert.Equal(t, 8.0, st.Remaining)
			for _, sh := range st.Shards {
				assert.False(t, sh.Stored, "shard %d", sh.Index)
			}
		})
	}
}

// A count of 0 is OK unless the bucket owes tokens, even with none left,
// as Count and docs/model.md say (they said it asked whether any capacity
// was left, which an empty bucket has not).
func TestCountZero(t *testing.T) {
	ctx := context.Background()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"tb": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
		"fw": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	for _, name := range []string{"tb", "fw"} {
		res, err := lim.Limit(ctx, name, "k", ratelimit.Count(10))
		require.NoError(t, err)
		require.True(t, res.OK)
		res, err = lim.Limit(ctx, name, "k", ratelimit.Count(0))
		require.NoError(t, err)
		assert.True(t, res.OK, "%s: empty", name)
		assert.Equal(t, 0.0, res.Remaining)
		res, err = lim.Limit(ctx, name, "k", ratelimit.WithReserve())
		require.NoError(t, err)
		require.True(t, res.Reserved())
		res, err = lim.Check(ctx, name, "k", ratelimit.Count(0))
		require.NoError(t, err)
		assert.False(t, res.OK, "%s: in debt", name)
		assert.Equal(t, -1.0, res.Remaining)
		assert.Positive(t, res.RetryAfter)
	}
}

// A refusal's message names a key a client chose, however long, in a line
// of bounded length, and a short key whole.
func TestLimitErrorOfALongKey(t *testing.T) {
	long := strings.Repeat("é", 1<<19) // a megabyte
	err := (&ratelimit.LimitError{Name: "api", Key: long, RetryAfter: time.Second}).Error()
	require.Less(t, len(err), 200, "the message of a megabyte key")
	require.Contains(t, err, `"`+strings.Repeat("é", 32)+`"… (1048576 bytes)`)
	err = (&ratelimit.LimitError{Name: "api", Key: "user-42", RetryAfter: time.Second}).Error()
	require.Equal(t, `ratelimit: limit "api" exceeded for key "user-42": retry after 1s`, err)
}

// A count above MaxTokens is told that no config could grant it: a plain
// call was told to raise Capacity (which is at most MaxTokens), or, on a
// sharded limit, to use one shard, and a reserving one to raise
// MaxReserved.
func TestCountAboveMaxTokens(t *testing.T) {
	ctx := context.Background()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"whole":   {Kind: ratelimit.TokenBucket, Rate: ratelimit.MaxTokens, Period: time.Second},
		"sharded": {Kind: ratelimit.TokenBucket, Rate: ratelimit.MaxTokens, Period: time.Second, Shards: 2},
		"bounded": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, MaxReserved: 5},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	for _, name := range []string{"whole", "sharded", "bounded"} {
		for _, opts := range [][]ratelimit.CallOption{nil, {ratelimit.WithReserve()}} {
			_, err := lim.Limit(ctx, name, "k", append(opts, ratelimit.Count(2*ratelimit.MaxTokens))...)
			require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
			assert.ErrorContains(t, err, "exceeds 1000000000000000, the most tokens one call may ask for: split the call", "%s %v", name, opts)
		}
	}
	// Nor is a Capacity beyond MaxTokens suggested for fewer shards.
	lim, err = ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: ratelimit.MaxTokens, Period: time.Second, Shards: 1024},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "l", "k", ratelimit.Count(9e14))
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
	assert.ErrorContains(t, err, "use at most 2 shards")
	assert.NotContains(t, err.Error(), "raise Capacity")
}
