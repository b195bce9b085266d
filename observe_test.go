package ratelimit_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLimitAll(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"hour":   {Kind: ratelimit.FixedWindow, Rate: 2000, Period: time.Hour, Start: t0},
		"minute": {Kind: ratelimit.FixedWindow, Rate: 33, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	names := []string{"hour", "minute"}

	res, err := lim.LimitAll(ctx, "k", names, ratelimit.Count(30))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Len(t, res.All, 2)
	assert.Equal(t, "minute", res.Name, "the binding limit is the one with fewest tokens left")
	assert.Equal(t, 3.0, res.Remaining)

	mock.Add(10 * time.Second)
	res, err = lim.LimitAll(ctx, "k", names, ratelimit.Count(30))
	require.NoError(t, err)
	require.False(t, res.OK)
	assert.Equal(t, "minute", res.Name)
	assert.Equal(t, 50*time.Second, res.RetryAfter)
	assert.True(t, res.All[0].OK, "the hour alone would grant")
	assert.Equal(t, 1970.0, res.All[0].Remaining, "but was not charged")
	st, err := lim.Value(ctx, "hour", "k")
	require.NoError(t, err)
	assert.Equal(t, 1970.0, st.Remaining, "a refused LimitAll charges no limit")

	_, err = lim.LimitAll(ctx, "k", []string{"hour", "hour"})
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	_, err = lim.LimitAll(ctx, "k", []string{"hour", "nope"})
	require.ErrorIs(t, err, ratelimit.ErrUnknownLimit)
	_, err = lim.LimitAll(ctx, "k", nil)
	require.Error(t, err)
	_, err = lim.LimitAll(ctx, "k", names, ratelimit.Count(34))
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount, "a count one of the limits can never grant")
}

func TestObserver(t *testing.T) {
	ctx := context.Background()
	var events []ratelimit.Event
	store := &flakyStore{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, MaxReserved: 1},
	}, ratelimit.WithClock(newMock()), ratelimit.WithDenyCache(8),
		ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) { events = append(events, e) })))
	require.NoError(t, err)
	_, _ = lim.Limit(ctx, "l", "k")
	_, _ = lim.Limit(ctx, "l", "k", ratelimit.WithReserve())
	_, _ = lim.Limit(ctx, "l", "k")
	_, _ = lim.Check(ctx, "l", "k")
	store.fail.Store(true)
	_, _ = lim.Limit(ctx, "l", "other")
	require.Len(t, events, 5)
	var got []string
	for _, e := range events {
		got = append(got, fmt.Sprintf("%s/%v/local=%v/check=%v/err=%v", e.Result.Name, e.Outcome, e.Result.Local, e.Check, e.Err != nil))
	}
	assert.Equal(t, []string{
		"l/allowed/local=false/check=false/err=false",
		"l/reserved/local=false/check=false/err=false",
		"l/denied/local=false/check=false/err=false",
		"l/denied/local=true/check=true/err=false",
		"l/degraded/local=false/check=false/err=true",
	}, got)
}

// Event.Inline tells the calls of a limit given inline (WithConfig on a
// name not declared), whose names may be made per call, from those of a
// declared limit, WithConfig or not, whichever path decided them: the
// store, the failure policy, a reservation.
func TestObserverInline(t *testing.T) {
	ctx := context.Background()
	var events []ratelimit.Event
	store := &flakyStore{Store: must(memstore.New())}
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}
	lim, err := ratelimit.New(store, ratelimit.Limits{"l": cfg, "m": cfg}, ratelimit.WithClock(newMock()),
		ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) { events = append(events, e) })))
	require.NoError(t, err)
	inline := ratelimit.WithConfig(cfg)
	_, _ = lim.Limit(ctx, "l", "k")
	_, _ = lim.Limit(ctx, "l", "k2", inline)
	_, _ = lim.Limit(ctx, "tenant-42", "k", inline)
	_, _ = lim.Check(ctx, "tenant-42", "k", inline)
	_, _ = lim.Reserve(ctx, "tenant-43", "k", inline)
	_, _ = lim.LimitAll(ctx, "k3", []string{"l", "m"})
	store.fail.Store(true)
	_, _ = lim.Limit(ctx, "tenant-44", "k", inline)
	_, _ = lim.Limit(ctx, "l", "k4")
	var got []string
	for _, e := range events {
		got = append(got, fmt.Sprintf("%s/%v/inline=%v", e.Result.Name, e.Outcome, e.Inline))
	}
	assert.Equal(t, []string{
		"l/allowed/inline=false",
		"l/allowed/inline=false",
		"tenant-42/allowed/inline=true",
		"tenant-42/denied/inline=true",
		"tenant-43/allowed/inline=true",
		"l/allowed/inline=false",
		"m/allowed/inline=false",
		"tenant-44/degraded/inline=true",
		"l/degraded/inline=false",
	}, got)
}

// counterVec is a stand-in for a Prometheus CounterVec, to keep the
// example free of dependencies.
type counterVec struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counterVec) inc(labels string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[labels]++
}

// Feeding a metrics library: count decisions by limit and outcome. Never
// label by key: one series per user or IP grows without bound. Nor by the
// names of limits given inline, which may be made up per call.
func ExampleWithObserver() {
	ctx := context.Background()
	decisions := &counterVec{n: map[string]int{}}
	observer := ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) {
		name := e.Result.Name
		if e.Inline {
			name = "_OTHER"
		}
		decisions.inc(fmt.Sprintf(`limit=%q,outcome=%q`, name, e.Outcome))
	})
	lim, _ := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"search": {Kind: ratelimit.TokenBucket, Rate: 3, Period: time.Minute},
	}, ratelimit.WithObserver(observer))

	for _, user := range []string{"ann", "ann", "ann", "ann", "bob"} {
		_, _ = lim.Limit(ctx, "search", user)
	}
	var lines []string
	for labels, n := range decisions.n {
		lines = append(lines, fmt.Sprintf("ratelimit_decisions_total{%s} %d", labels, n))
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// ratelimit_decisions_total{limit="search",outcome="allowed"} 4
	// ratelimit_decisions_total{limit="search",outcome="denied"} 1
}
