package memstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// A call that found its record in a table that has since been resized
// holds a stale copy: claim must refuse it, or the call's write is lost.
// So must it a slot that a delete's shift emptied or refilled.
func TestClaimRefusesAMovedRecord(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 1000, Capacity: 10}
	b := s.Bind("l", p, func(string) int64 { return 0 }).(*bound)
	h := s.hash("k", b.salt)
	st := s.stripeOf(h)
	_, err = b.Decide(t.Context(), "k", driver.ModeLimit, 1_000, 1, false)
	require.NoError(t, err)

	// The call probes: it reads the version and finds the record's slot.
	v := st.version.Load()
	tab := st.tab()
	i, found := tab.find(h, b.limit, "k")
	require.True(t, found)
	old := &tab.recs[i]

	// Meanwhile the stripe grows: the record moves to a new table.
	st.mu.Lock()
	st.resize(4 * len(tab.recs))
	st.mu.Unlock()

	require.Equal(t, moved, claim(st, old, v, "k"), "a stale copy was claimed")
	cur := st.lockRecord(h, b.limit, "k")
	require.NotNil(t, cur)
	require.NotSame(t, old, cur)
	cur.mu.Unlock()

	// A record displaced behind another moves back when the other goes.
	tab = st.tab()
	mask := uint32(len(tab.recs) - 1)
	var a, c string
	for n := 0; a == "" || c == ""; n++ {
		k := fmt.Sprint("x", n)
		kh := s.hash(k, b.salt)
		if s.stripeOf(kh) != st || uint32(kh)&mask != uint32(h)&mask {
			continue
		}
		if a == "" {
			a = k
		} else {
			c = k
		}
	}
	for _, k := range []string{a, c} {
		_, err = b.Decide(t.Context(), k, driver.ModeLimit, 1_000, 1, false)
		require.NoError(t, err)
	}
	ch := s.hash(c, b.salt)
	v = st.version.Load()
	i, found = tab.find(ch, b.limit, c)
	require.True(t, found)
	before := &tab.recs[i]
	require.NoError(t, s.Delete(t.Context(), []driver.RecordID{{Name: "l", Key: "k"}}))
	require.NotEqual(t, claimed, claim(st, before, v, c), "a slot the shift emptied or refilled was claimed")
}

// DeleteExpired frees a stripe's mutex between chunks of its scan, so that
// a call adding a record to the stripe waits for a chunk, not for the
// whole table; and drops every record expired, as a scan that held the
// mutex throughout did, though calls add records and deletes move them
// between chunks. Before, it held each stripe's mutex for the stripe's
// whole table.
//
// The store's clock is a mock that stands still: the sweeps of the calls
// judge records at the first call's time, so that only DeleteExpired
// drops the old ones. On the real clock, a run slower than the grace (a
// loaded machine under -race took 69 s) let the inserts' sweeps drop them
// first.
func TestDeleteExpiredInChunks(t *testing.T) {
	ctx := t.Context()
	s, err := New(WithClock(clock.NewMock()))
	require.NoError(t, err)
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1, Period: 1000, Capacity: 1}
	b := s.Bind("l", p, func(string) int64 { return 0 }).(*bound)
	const t0 = int64(1_700_000_000_000)
	now := t0 + 10*driver.ExpiryGrace
	const old, live = 64 * 2 * expiredChunk, 64 * expiredChunk / 2
	for i := range old {
		_, err := b.Decide(ctx, fmt.Sprint("old-", i), driver.ModeLimit, t0, 1, false)
		require.NoError(t, err)
	}
	liveOf := map[*stripe][]string{}
	for i := range live {
		k := fmt.Sprint("live-", i)
		_, err := b.Decide(ctx, k, driver.ModeLimit, now, 1, false)
		require.NoError(t, err)
		st := s.stripeOf(s.hash(k, b.salt))
		liveOf[st] = append(liveOf[st], k)
	}
	require.Equal(t, old+live, s.Len())

	pauses, added, deleted, next := 0, 0, 0, 0
	s.chunked = func(st *stripe) {
		pauses++
		require.True(t, st.mu.TryLock(), "the stripe's mutex is free between chunks")
		st.mu.Unlock()
		for ; ; next++ { // a new key of the stripe, live
			k := fmt.Sprint("new-", next)
			if s.stripeOf(s.hash(k, b.salt)) == st {
				_, err := b.Decide(ctx, k, driver.ModeLimit, now, 1, false)
				require.NoError(t, err)
				added++
				next++
				break
			}
		}
		if keys := liveOf[st]; pauses%3 == 0 && len(keys) > 0 { // a delete shifts records: the scan starts over
			require.NoError(t, s.Delete(ctx, []driver.RecordID{{Name: "l", Key: keys[0]}}))
			liveOf[st] = keys[1:]
			deleted++
		}
	}
	n, err := s.DeleteExpired(ctx, time.UnixMilli(now))
	require.NoError(t, err)
	require.Positive(t, pauses, "the scan paused between chunks")
	require.Positive(t, deleted)
	require.Equal(t, old, n, "every expired record dropped")
	require.Equal(t, live+added-deleted, s.Len(), "every live record kept")
}

// The calls of clocks far apart, interleaved (Limiters on one store,
// their clocks off), step on each clock's schedule: once every step of
// each clock's time, give or take the first. With three clocks, the
// calls of the two behind took the schedule's one back time back and
// forth, and each of their calls stepped (20,100 steps in 10 s of each
// clock's time, where 300 were due); so did the marks' sweep, a look at
// every mark each call.
func TestScheduleOfClocksApart(t *testing.T) {
	const every = sweepEvery
	offsets := []int64{0, -3_600_000, 3_600_000, -24 * 3_600_000, 24 * 3_600_000, -60_000, 600_000}
	for clocks := 1; clocks <= backs+1; clocks++ {
		for _, order := range []string{"ascending", "descending"} {
			t.Run(fmt.Sprint("clocks=", clocks, "/", order), func(t *testing.T) {
				var sc schedule
				sc.init(0)
				const t0, span = int64(1_700_000_000_000), int64(10_000)
				steps := 0
				for ms := int64(0); ms < span; ms++ {
					for i := range clocks {
						if order == "descending" {
							i = clocks - 1 - i
						}
						now := t0 + offsets[i] + ms - ms*5%4 // a little out of order
						if next := sc.due(now, every); next != nil {
							next.Store(now + every)
							steps++
						}
					}
				}
				most := clocks * int(span/every+2)
				require.LessOrEqual(t, steps, most, "%d steps of %d clocks over %d ms of each", steps, clocks, span)
				require.GreaterOrEqual(t, steps, clocks*int(span/every-1), "a clock's steps were missed")
			})
		}
	}
}
