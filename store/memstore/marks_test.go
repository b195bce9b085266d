package memstore_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The marks of settlements past their expiry go while calls go on, as
// the records of idle keys do, without DeleteExpired: a store that
// needs no janitor must not keep them for good. After a burst of 3,000
// settlements, calls without settlements for minutes kept every mark:
// only a later settlement, every so many, or DeleteExpired dropped them.
func TestExpiredMarksGoWhileCallsGoOn(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	c := newStepClock(t0)
	s := must(memstore.New(memstore.WithClock(c)))
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 1000, Capacity: 10}
	const n = 3000
	for i := range n {
		cancelMark(t, s, p, i, t0, t0+1000)
	}
	require.Equal(t, n, memstore.Marks(s))
	// The marks are droppable from a second and a grace on. One key is
	// written every 100 ms, through Apply and through a bound limit, for
	// two minutes more.
	b := s.Bind("bound", p, func(string) int64 { return 0 })
	op := &driver.Op{Items: []driver.Item{{Name: "l", Key: "steady", Count: 1, Shards: []driver.Shard{{Params: p}}}}}
	out := make([]driver.Decision, 1)
	for now := t0 + 1000; now < t0+1000+driver.ExpiryGrace+2*60_000; now += 100 {
		c.ms.Store(now)
		op.Now = now
		require.NoError(t, s.Apply(ctx, op, out))
		v, err := b.Decide(ctx, "steady", driver.ModeLimit, now, 1, false)
		require.NoError(t, err)
		require.True(t, v.OK)
	}
	require.Zero(t, memstore.Marks(s), "marks past their expiry and grace held, of %d", n)
}

// Settlements, which hold the marks' lock while they take the stripes',
// run beside calls whose sweep steps drop the marks expired, holding a
// stripe's mutex: neither waits for the other, and each settlement is
// applied once.
func TestMarksDroppedBesideSettlements(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	c := newStepClock(t0)
	s := must(memstore.New(memstore.WithClock(c)))
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1e6, Period: 1000, Capacity: 1e6}
	b := s.Bind("bound", p, func(string) int64 { return 0 })
	const rounds = 400
	// The goroutines take the rounds together: the store's clock is the
	// calls' time, and a goroutine a hundred rounds behind the others
	// would be a calls' clock that far behind, which the sweeps take as
	// the earliest time (a clock come back) and judge by.
	outs := make([][]driver.Decision, 4)
	for g := range outs {
		outs[g] = make([]driver.Decision, 1)
	}
	for i := range rounds {
		now := t0 + int64(i)*1000 // crosses the grace a few times
		c.ms.Store(now)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if g%2 == 0 {
					var id [16]byte
					binary.BigEndian.PutUint64(id[:], uint64(g*rounds+i)+1)
					item := driver.Item{Name: "l", Key: strconv.Itoa(i % 50), Count: 1, At: now, Shards: []driver.Shard{{Params: p}}}
					op := &driver.Op{Mode: driver.ModeRefund, Now: now, Items: []driver.Item{item},
						Settle: &driver.Settlement{ID: id, Kind: driver.SettleCancel, Until: now + 1000}}
					assert.NoError(t, s.Apply(ctx, op, outs[g]))
					assert.Equal(t, driver.SettleKind(0), outs[g][0].Settled, "a first settlement found settled")
					return
				}
				for k := range 50 {
					_, err := b.Decide(ctx, strconv.Itoa(k), driver.ModeLimit, now, 1, false)
					assert.NoError(t, err)
				}
			}()
		}
		wg.Wait()
	}
	require.Less(t, memstore.Marks(s), 2*rounds, "marks past their grace held")
}

// A calls' clock that jumps far ahead once, on keys of every stripe, and
// comes back does not stop the sweeps that calls step: the records of
// keys gone idle, and the marks expired, still go while calls go on.
// Each stripe stepped its sweep again only once the calls' time reached
// the jump's, and held every idle record and mark until then.
func TestSweepsGoOnAfterTheCallsClockCameBack(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	c := newStepClock(t0)
	s := must(memstore.New(memstore.WithClock(c)))
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 1000, Capacity: 10}
	const n = 5000
	for i := range n {
		drain(t, s, "once-"+strconv.Itoa(i), t0)
	}
	var id [16]byte
	for i := range n {
		binary.BigEndian.PutUint64(id[:], uint64(i)+1)
		item := driver.Item{Name: "l", Key: "k", Count: 1, At: t0, Shards: []driver.Shard{{Params: p}}}
		op := &driver.Op{Mode: driver.ModeRefund, Now: t0, Items: []driver.Item{item},
			Settle: &driver.Settlement{ID: id, Kind: driver.SettleCancel, Until: t0 + 1000}}
		require.NoError(t, s.Apply(ctx, op, make([]driver.Decision, 1)))
	}
	// Calls on keys of every stripe at a time a year ahead.
	b := s.Bind("bound", p, func(string) int64 { return 0 })
	const ahead = t0 + 365*24*3_600_000
	const jumped = 1000
	for i := range 2 * jumped { // each twice: a write of a record held steps the sweep
		_, err := b.Decide(ctx, "jump-"+strconv.Itoa(i%jumped), driver.ModeLimit, ahead, 1, false)
		require.NoError(t, err)
	}
	// Then one key, written every 100 ms at the right time, for two
	// minutes past the burst's grace.
	for now := t0 + 1000; now < t0+1000+driver.ExpiryGrace+2*60_000; now += 100 {
		c.ms.Store(now)
		v, err := b.Decide(ctx, "steady", driver.ModeLimit, now, 1, false)
		require.NoError(t, err)
		require.True(t, v.OK)
	}
	require.LessOrEqual(t, s.Len(), jumped+1, "records of idle keys held, of %d", n)
	require.Zero(t, memstore.Marks(s), "marks past their expiry and grace held, of %d", n)
}

// Calls of two clocks minutes apart, interleaved (two Limiters on one
// store, one clock off), step the sweeps on each clock's schedule, not at
// every call: a call of the clock behind, more than two steps before the
// next step, took the schedule back to its own time, and the next call of
// the clock ahead found a step due. Every call then examined slots of
// two stripes, and every call a look at every mark.
func TestSweepsOfTwoClocksApartKeepTheirSchedule(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	c := newStepClock(t0)
	s := must(memstore.New(memstore.WithClock(c)))
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1e6, Period: 1000, Capacity: 1e6}
	// One mark and 3,000 records, each droppable from t0+61s on.
	item := driver.Item{Name: "l", Key: "k", Count: 1, At: t0, Shards: []driver.Shard{{Params: p}}}
	op := &driver.Op{Mode: driver.ModeRefund, Now: t0, Items: []driver.Item{item},
		Settle: &driver.Settlement{ID: [16]byte{1}, Kind: driver.SettleCancel, Until: t0 + 1000}}
	require.NoError(t, s.Apply(ctx, op, make([]driver.Decision, 1)))
	const n = 3000
	for i := range n {
		drain(t, s, "idle-"+strconv.Itoa(i), t0)
	}
	// The clock ahead steps the marks' sweep at t0+60.5s, before the mark
	// may go: the next is due a grace later.
	b := s.Bind("bound", p, func(string) int64 { return 0 })
	const ahead = t0 + 60_500
	const behind = ahead - 3*60_000
	c.ms.Store(ahead)
	_, err := b.Decide(ctx, "k", driver.ModeLimit, ahead, 1, false)
	require.NoError(t, err)
	require.Equal(t, 1, memstore.Marks(s))
	// Then both clocks, a call each in turn, for two seconds.
	for i := int64(1); i <= 200; i++ {
		for _, now := range []int64{behind + 10*i, ahead + 10*i} {
			c.ms.Store(ahead + 10*i)
			_, err := b.Decide(ctx, "k", driver.ModeLimit, now, 1, false)
			require.NoError(t, err)
		}
	}
	require.Equal(t, 1, memstore.Marks(s), "the marks were swept before a grace of either clock")
	// 15 steps of the clock ahead since the records may go, of 16 slots
	// and 64 of another stripe, drop at most 1,200.
	require.Greater(t, s.Len(), n-1200, "the stripes' sweep stepped more than once every 100 ms of either clock")
}

// The marks expire in any order of their settlements: each sweep drops
// exactly those expired for a grace at its time, earliest or not, and
// every mark kept still answers a settlement of its ID as settled before.
func TestMarksDropInTheOrderOfTheirExpiry(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	rng := rand.New(rand.NewPCG(7, 11))
	c := newStepClock(t0)
	s := must(memstore.New(memstore.WithClock(c)))
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 1000, Capacity: 10}
	const n = 5000
	until := make([]int64, n)
	for i := range until {
		until[i] = t0 + rng.Int64N(10*60_000)
		require.Zero(t, cancelMark(t, s, p, i, t0, until[i]).Settled, "mark %d", i)
	}
	for _, at := range []int64{t0 + 2*60_000, t0 + 5*60_000 + 1, t0 + 7*60_000 + 333, t0 + 11*60_000} {
		_, err := s.DeleteExpired(ctx, time.UnixMilli(at))
		require.NoError(t, err)
		kept := 0
		for i := range until {
			if until[i] > at-driver.ExpiryGrace {
				kept++
			}
		}
		require.Equal(t, kept, memstore.Marks(s), "marks kept at %d", at)
	}
	// The marks left, those of the latest expiries, still hold.
	for i := range until {
		if until[i] > t0+11*60_000-driver.ExpiryGrace {
			require.Equal(t, driver.SettleCancel, cancelMark(t, s, p, i, t0, until[i]).Settled, "mark %d was dropped before its expiry", i)
		}
	}
}

// Calls of more clocks far apart than the schedule keeps apart step the
// marks' sweep at nearly every call: a step finds no mark expired by
// looking at the earliest, and drops those that are, as one clock's
// would. Before the marks' expiries were kept in order, every such step
// looked at every mark: 20,000 marks cost each call some 300 µs.
func TestMarksOfManyClocksApart(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_000_000_000)
	c := newStepClock(t0)
	s := must(memstore.New(memstore.WithClock(c)))
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 1e6, Period: 1000, Capacity: 1e6}
	for i := range 100 {
		cancelMark(t, s, p, i, t0, t0+int64(i)*1000)
	}
	b := s.Bind("bound", p, func(string) int64 { return 0 })
	// Ten clocks an hour apart, the store's own the earliest: its sweeps
	// judge marks by the earliest clock's time.
	for now := t0; now <= t0+100*1000+driver.ExpiryGrace; now += 250 {
		c.ms.Store(now)
		for k := range int64(10) {
			_, err := b.Decide(ctx, "k", driver.ModeLimit, now+k*3_600_000, 1, false)
			require.NoError(t, err)
		}
		want := 0
		for i := range int64(100) {
			// A step may come up to a grace after a mark may go.
			if t0+i*1000 > now-driver.ExpiryGrace {
				want++
			}
		}
		require.GreaterOrEqual(t, memstore.Marks(s), want, "marks dropped before their grace, at %d", now-t0)
	}
	require.Less(t, memstore.Marks(s), 100, "no mark dropped")
}

// cancelMark applies to s a cancel's refund of a token of key "k" of
// limit "l" (params p), charged at at, settled at at with the ID numbered
// i and a mark kept until until, and returns its decision.
func cancelMark(tb testing.TB, s *memstore.Store, p driver.Params, i int, at, until int64) driver.Decision {
	tb.Helper()
	var id [16]byte
	binary.BigEndian.PutUint64(id[:], uint64(i)+1)
	item := driver.Item{Name: "l", Key: "k", Count: 1, At: at, Shards: []driver.Shard{{Params: p}}}
	op := &driver.Op{Mode: driver.ModeRefund, Now: at, Items: []driver.Item{item},
		Settle: &driver.Settlement{ID: id, Kind: driver.SettleCancel, Until: until}}
	out := make([]driver.Decision, 1)
	require.NoError(tb, s.Apply(context.Background(), op, out))
	return out[0]
}
