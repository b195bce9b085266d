package storetest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// testExpirer checks DeleteExpired of a store that keeps records until
// told (driver.Expirer): it drops a record only once its bucket has been
// full again for driver.ExpiryGrace, drops every such record, counts what
// it dropped, and a dropped record reads as a full bucket.
func testExpirer(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	s := newStore(t)
	exp := s.(driver.Expirer)
	mock := newMock(epoch)
	lim, err := ratelimit.New(s, ratelimit.Limits{
		"fw": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: time.UnixMilli(0)},
		"tb": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	const keys = 20
	for i := range keys {
		_, err := lim.Limit(ctx, "fw", fmt.Sprint("user-", i), ratelimit.Count(5))
		require.NoError(t, err)
	}
	_, err = lim.Limit(ctx, "tb", "k", ratelimit.Count(10))
	require.NoError(t, err)

	n, err := exp.DeleteExpired(ctx, mock.Now())
	require.NoError(t, err)
	require.Zero(t, n, "no bucket is full yet")
	// The fixed windows are full at the next window start; the bucket a
	// minute after its call.
	grace := time.Duration(driver.ExpiryGrace) * time.Millisecond
	nextWindow := time.UnixMilli(epoch.UnixMilli()/60_000*60_000 + 60_000)
	n, err = exp.DeleteExpired(ctx, nextWindow)
	require.NoError(t, err)
	require.Zero(t, n, "full again, but not for ExpiryGrace yet")
	n, err = exp.DeleteExpired(ctx, nextWindow.Add(grace))
	require.NoError(t, err)
	require.Equal(t, keys, n, "the fixed windows, full since the next window")
	st, err := lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.True(t, st.Shards[0].Stored, "the bucket is kept until it is full")
	n, err = exp.DeleteExpired(ctx, mock.Now().Add(time.Minute+grace))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	st, err = lim.Value(ctx, "tb", "k")
	require.NoError(t, err)
	require.False(t, st.Shards[0].Stored)
	require.Equal(t, 10.0, st.Remaining, "a dropped record reads as a full bucket")

	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = exp.DeleteExpired(done, mock.Now())
	require.ErrorIs(t, err, context.Canceled, "DeleteExpired leaves on its context")

	t.Run("Counts", func(t *testing.T) { testExpirerCounts(t, newStore) })
	t.Run("Marks", func(t *testing.T) { testExpirerMarks(t, newStore) })
	t.Run("ExtremeTimes", func(t *testing.T) { testExpirerExtremeTimes(t, newStore) })
}

// testExpirerExtremeTimes checks DeleteExpired at times far back and far
// ahead: a time before every record's drops none of them, however far
// back (math.MinInt64 ms, or one whose milliseconds do not fit in an
// int64), and a time far ahead drops them all. A store that subtracted
// ExpiryGrace from a time so far back wrapped around to one far ahead,
// and dropped a charged record: its key's bucket read full again.
func testExpirerExtremeTimes(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	now := epoch.UnixMilli()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	s := newStore(t)
	exp := s.(driver.Expirer)
	charge(t, s, now, "extreme", p)
	for _, at := range []time.Time{
		time.UnixMilli(math.MinInt64),
		time.UnixMilli(math.MinInt64 + driver.ExpiryGrace - 1),
		time.Unix(math.MinInt64/1000, 0),
		{},
	} {
		n, err := exp.DeleteExpired(ctx, at)
		require.NoError(t, err, "at %v", at)
		require.Zero(t, n, "at %v, before the record was written", at)
	}
	recs := make([]driver.Record, 1)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "extreme", Key: "k"}}, recs))
	require.NotZero(t, recs[0], "the charged record is kept")
	n, err := exp.DeleteExpired(ctx, time.UnixMilli(math.MaxInt64))
	require.NoError(t, err)
	require.Equal(t, 1, n, "a record full again long before")
}

// testExpirerMarks checks that DeleteExpired keeps a settlement's mark
// until ExpiryGrace past the time it is kept for (Until), and drops it
// then: a swept mark would let its token, which a Limiter may present
// until Until, on a clock read a moment apart, settle a second time.
func testExpirerMarks(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	now := epoch.UnixMilli()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	s := newStore(t)
	exp := s.(driver.Expirer)
	until := now + 60_000
	settle := func(at int64) driver.Decision {
		t.Helper()
		refund := itemOf("mark", "k", 4, p)
		refund.At = now
		op := &driver.Op{Mode: driver.ModeRefund, Now: at, Items: []driver.Item{refund},
			Settle: &driver.Settlement{ID: [16]byte{0x5e, 0x77}, Kind: driver.SettleUse, Until: until, Settler: [16]byte{1}}}
		out := make([]driver.Decision, 1)
		require.NoError(t, s.Apply(ctx, op, out))
		return out[0]
	}
	charge(t, s, now, "mark", p)
	d := settle(now)
	require.True(t, d.OK)
	require.Zero(t, d.Settled, "the first settlement refunds")

	last := until + driver.ExpiryGrace - 1
	n, err := exp.DeleteExpired(ctx, time.UnixMilli(last))
	require.NoError(t, err)
	require.Equal(t, 1, n, "the record, full again since the refund; not the mark")
	d = settle(last)
	require.Equal(t, driver.SettleUse, d.Settled, "the mark is kept until ExpiryGrace past its Until")
	require.True(t, d.Own)
	n, err = exp.DeleteExpired(ctx, time.UnixMilli(last))
	require.NoError(t, err)
	require.Zero(t, n, "the settlement read its mark, and wrote nothing")

	n, err = exp.DeleteExpired(ctx, time.UnixMilli(last+1))
	require.NoError(t, err)
	require.Equal(t, 1, n, "the mark, ExpiryGrace past its Until")
}

// testExpirerCounts checks what DeleteExpired counts: the records and
// settlement marks it dropped, and nothing else. An op refused as a whole
// on records never written leaves none (a store that locks missing records
// by inserting placeholders drops them uncounted); a settled refund leaves
// its record and its mark.
func testExpirerCounts(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	now := epoch.UnixMilli()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	later := time.UnixMilli(now).Add(time.Hour)

	s := newStore(t)
	out := make([]driver.Decision, 2)
	refused := &driver.Op{Now: now, Items: []driver.Item{itemOf("p1", "k", 1, p), itemOf("p2", "k", 11, p)}}
	require.NoError(t, s.Apply(ctx, refused, out))
	require.True(t, out[0].OK)
	require.False(t, out[1].OK)
	recs := make([]driver.Record, 2)
	require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "p1", Key: "k"}, {Name: "p2", Key: "k"}}, recs))
	require.Equal(t, make([]driver.Record, 2), recs, "a refused op writes nothing")
	n, err := s.(driver.Expirer).DeleteExpired(ctx, later)
	require.NoError(t, err)
	require.Zero(t, n, "DeleteExpired counts the records it dropped: the refused op wrote none")

	charge(t, s, now, "r", p)
	refund := itemOf("r", "k", 4, p)
	refund.At = now
	settle := &driver.Settlement{ID: [16]byte{1, 2, 3}, Kind: driver.SettleCancel, Until: now + 60_000}
	require.NoError(t, s.Apply(ctx, &driver.Op{Mode: driver.ModeRefund, Now: now, Settle: settle,
		Items: []driver.Item{refund}}, out[:1]))
	n, err = s.(driver.Expirer).DeleteExpired(ctx, later)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the record and the settlement's mark")
}

// testSweepDifferential drives the store and Model as
// testSettleDifferential does, charges, refunds, reservations and
// settlements, and sweeps the store (DeleteExpired) now and then as far
// ahead of the calls as the grace allows (ExpiryGrace less a millisecond:
// a call judged at a now read that long before the sweep's): the store
// must answer as Model, which keeps every record and mark, and its records
// read the same. A sweep that dropped a record still in debt, or a mark of
// a token that may still be settled, would change an answer.
func testSweepDifferential(t *testing.T, newStore NewStore, s suite) {
	ctx := context.Background()
	for seed := range max(s.diffSeeds/4, 1) {
		store, model := newStore(t), NewModel()
		exp := store.(driver.Expirer)
		rng := rand.New(rand.NewPCG(uint64(seed), 0x5ee9))
		u := newUniverse(rng)
		var ids [6][16]byte
		for i := range ids {
			ids[i] = [16]byte{byte(seed), byte(i), 0x5e, 0xe9, byte(rng.Uint32())}
		}
		// A token is settled until it expires (its first settlement's
		// Until), as a Limiter settles it: no later.
		until := map[[16]byte]int64{}
		now := epoch.UnixMilli()
		for step := range s.diffSteps {
			now += randomStep(rng, periods[rng.IntN(len(periods))])
			op := u.randomOp(rng, now)
			if rng.IntN(2) == 0 {
				id := ids[rng.IntN(len(ids))]
				if first, ok := until[id]; ok && now > first {
					continue
				}
				op = u.randomSettle(rng, now, id)
				if _, ok := until[id]; !ok {
					until[id] = op.Settle.Until
				}
				op.Settle.Until = until[id]
			}
			if len(op.Items) == 0 {
				continue
			}
			withRuns(ctx, rng, model, op)
			applyBoth(t, ctx, store, model, op, seed, step)
			if rng.IntN(3) == 0 {
				_, err := exp.DeleteExpired(ctx, time.UnixMilli(now+driver.ExpiryGrace-1))
				require.NoError(t, err)
			}
			if rng.IntN(4) == 0 {
				compareRecords(t, ctx, store, model, u, now, fmt.Sprintf("seed %d step %d", seed, step))
			}
		}
		compareRecords(t, ctx, store, model, u, now, fmt.Sprintf("seed %d end", seed))
	}
}
