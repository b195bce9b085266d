package storetest

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// The settlement cases: tokens and receipts settled at most once
// (driver.Settlement), by one Limiter or several, concurrently and
// repeatedly, with refunds by the rule of docs/model.md.

// testSettle runs the settlement cases.
func testSettle(t *testing.T, newStore NewStore, s suite) {
	t.Run("Differential", func(t *testing.T) { testSettleDifferential(t, newStore, s) })
	t.Run("Once", func(t *testing.T) { testSettleOnce(t, newStore) })
	t.Run("UseAndCancel", func(t *testing.T) { testUseAndCancel(t, newStore) })
	t.Run("RefundRule", func(t *testing.T) { testSettleRefundRule(t, newStore) })
	t.Run("Receipts", func(t *testing.T) { testReceipts(t, newStore) })
	t.Run("Settlers", func(t *testing.T) { testSettlers(t, newStore) })
	t.Run("RetriedAfterAFailure", func(t *testing.T) { testRetriedAfterAFailure(t, newStore) })
	t.Run("HolderRetried", func(t *testing.T) { testHolderRetried(t, newStore) })
	t.Run("SettlersRace", func(t *testing.T) { testSettlersRace(t, newStore) })
	t.Run("Fleet", func(t *testing.T) { testSettleFleet(t, newStore) })
}

// testSettleDifferential compares the store with the Model over random
// limit ops and settlements drawn from a few IDs, so that IDs come back:
// decisions and records must agree to the last bit.
func testSettleDifferential(t *testing.T, newStore NewStore, s suite) {
	ctx := context.Background()
	for seed := range max(s.diffSeeds/4, 1) {
		store, model := newStore(t), NewModel()
		rng := rand.New(rand.NewPCG(uint64(seed), 0x5e77))
		u := newUniverse(rng)
		var ids [6][16]byte
		for i := range ids {
			ids[i] = [16]byte{byte(seed), byte(i), 0x5e, 0x77, byte(rng.Uint32())}
		}
		now := epoch.UnixMilli()
		for step := range s.diffSteps {
			now += randomStep(rng, periods[rng.IntN(len(periods))])
			op := u.randomOp(rng, now)
			if rng.IntN(2) == 0 {
				op = u.randomSettle(rng, now, ids[rng.IntN(len(ids))])
			}
			if len(op.Items) == 0 {
				continue
			}
			withRuns(ctx, rng, model, op)
			applyBoth(t, ctx, store, model, op, seed, step)
			if rng.IntN(4) == 0 {
				compareRecords(t, ctx, store, model, u, now, fmt.Sprintf("seed %d step %d", seed, step))
			}
		}
		compareRecords(t, ctx, store, model, u, now, fmt.Sprintf("seed %d end", seed))
	}
}

// randomSettle draws a settlement of id: a refund of one to three records
// of one key, charged a while before now.
func (u *universe) randomSettle(rng *rand.Rand, now int64, id [16]byte) *driver.Op {
	kind := driver.SettleCancel
	if rng.IntN(2) == 0 {
		kind = driver.SettleUse
	}
	op := &driver.Op{Mode: driver.ModeRefund, Now: now,
		Settle: &driver.Settlement{ID: id, Kind: kind, Until: clampTime(now + rng.Int64N(3_600_000)),
			Settler: settlers[rng.IntN(len(settlers))]}}
	key := u.keys[int(id[1])%len(u.keys)] // an ID comes with one key
	used := map[driver.RecordID]bool{}
	for range 1 + rng.IntN(3) {
		name := u.names[rng.IntN(len(u.names))]
		idx := rng.IntN(3)
		if used[driver.RecordID{Name: name, Key: key, Shard: idx}] {
			continue
		}
		used[driver.RecordID{Name: name, Key: key, Shard: idx}] = true
		p := u.params[name]
		it := driver.Item{Name: name, Key: key, Shards: []driver.Shard{u.shard(rng, name, key, idx)},
			At: clampTime(now - rng.Int64N(3*p.Period))}
		if kind == driver.SettleCancel || rng.IntN(2) == 0 {
			it.Count = randomCount(rng, p, 1)
		}
		op.Items = append(op.Items, it)
	}
	return op
}

// settlers are those of the random settlements: none, and two that an ID
// may be settled by, so that retries find their own marks and others'.
var settlers = [...][16]byte{{}, {0xa, 1}, {0xb, 2}}

// settleLimits are the limits of the Limiter-level settlement cases.
var settleLimits = ratelimit.Limits{
	"jobs":  {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute, MaxReserved: 1000, Start: time.UnixMilli(0)},
	"burst": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, Capacity: 50, MaxReserved: 100},
	"wide":  {Kind: ratelimit.FixedWindow, Rate: 200, Period: time.Minute, Shards: 4, MaxReserved: 400, Start: time.UnixMilli(0)},
}

// limiters returns n Limiters on store, each with a mock clock of its own
// set at now: several processes of one fleet.
func limiters(t *testing.T, store ratelimit.Store, n int, now time.Time) []*ratelimit.Limiter {
	lims := make([]*ratelimit.Limiter, n)
	for i := range lims {
		l, err := ratelimit.New(store, settleLimits, ratelimit.WithClock(newMock(now)))
		require.NoError(t, err)
		lims[i] = l
	}
	return lims
}

// testSettleOnce makes reservations, and has many goroutines of several
// Limiters settle each one at once, repeatedly, by use or by cancel: one
// settlement wins per token, every other says ErrAlreadySettled, and the
// limit holds exactly what the canceled tokens gave back. The
// reservations leave no debt, so that every cancel gives back its count
// whatever the order (a reservation that later ones stand behind gives
// back nothing while the record owes them).
func testSettleOnce(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store := newStore(t)
	now := epoch.Truncate(time.Minute).Add(time.Second)
	lims := limiters(t, store, 4, now)
	key := fmt.Sprintf("once-%d", now.UnixNano())
	for _, name := range []string{"jobs", "wide"} {
		var tokens []*ratelimit.Token
		for range 40 {
			r, err := lims[0].Reserve(ctx, name, key, ratelimit.Count(2))
			require.NoError(t, err)
			require.True(t, r.OK())
			tok := r.Token()
			require.NotNil(t, tok)
			// Through its text form, as another process gets it.
			back, err := ratelimit.ParseToken(tok.String())
			require.NoError(t, err)
			tokens = append(tokens, back)
		}
		before, err := lims[0].Value(ctx, name, key)
		require.NoError(t, err)
		require.Equal(t, settleLimits[name].Rate-80, before.Remaining)

		var (
			wins     [40]atomic.Int32
			canceled [40]atomic.Bool
			wg       sync.WaitGroup
			errs     = make(chan error, 1000)
		)
		for g := range 16 {
			lim := lims[g%len(lims)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for round := range 3 {
					for i, tok := range tokens {
						use := (i+g+round)%3 == 0
						var err error
						if use {
							err = lim.Use(ctx, tok)
						} else {
							err = lim.Refund(ctx, tok)
						}
						switch {
						case err == nil:
							wins[i].Add(1)
							canceled[i].Store(!use)
						case !isAlreadySettled(err):
							errs <- err
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		back := 0.0
		for i := range wins {
			require.EqualValues(t, 1, wins[i].Load(), "token %d of %s settled %d times", i, name, wins[i].Load())
			if canceled[i].Load() {
				back += 2
			}
		}
		after, err := lims[1].Value(ctx, name, key)
		require.NoError(t, err)
		require.Equal(t, before.Remaining+back, after.Remaining, "%s: the canceled tokens came back, once each", name)
	}
}

func isAlreadySettled(err error) bool { return errors.Is(err, ratelimit.ErrAlreadySettled) }

// testUseAndCancel checks the answers of a settlement after another: a
// cancel after a use, a use after a cancel, a second cancel, and the
// Reservation's own Cancel and Wait against a holder of its token.
func testUseAndCancel(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store := newStore(t)
	now := epoch.Truncate(time.Minute).Add(time.Second)
	lims := limiters(t, store, 2, now)
	a, b := lims[0], lims[1]
	key := fmt.Sprintf("usecancel-%d", now.UnixNano())
	value := func() float64 {
		st, err := a.Value(ctx, "jobs", key)
		require.NoError(t, err)
		return st.Remaining
	}
	reserve := func() *ratelimit.Reservation {
		r, err := a.Reserve(ctx, "jobs", key, ratelimit.Count(10))
		require.NoError(t, err)
		require.True(t, r.OK())
		return r
	}

	// Used, then canceled: nothing comes back.
	r := reserve()
	require.NoError(t, b.Use(ctx, r.Token()))
	err := b.Refund(ctx, r.Token())
	require.ErrorIs(t, err, ratelimit.ErrAlreadySettled)
	require.ErrorIs(t, err, ratelimit.ErrReservationUsed)
	require.ErrorIs(t, b.Use(ctx, r.Token()), ratelimit.ErrAlreadySettled, "a second use")
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed, "the owner's cancel after a remote use")
	require.Equal(t, 90.0, value())

	// Canceled, then used: the job must not run.
	r = reserve()
	require.Equal(t, 80.0, value())
	require.NoError(t, b.Refund(ctx, r.Token()))
	require.Equal(t, 90.0, value())
	err = b.Use(ctx, r.Token())
	require.ErrorIs(t, err, ratelimit.ErrAlreadySettled)
	require.ErrorIs(t, err, ratelimit.ErrReservationCanceled)
	require.ErrorIs(t, b.Refund(ctx, r.Token()), ratelimit.ErrAlreadySettled, "a second cancel")
	require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled, "the owner's wait after a remote cancel")
	require.Equal(t, 90.0, value())

	// The owner cancels first; the holder's use then fails.
	r = reserve()
	tok := r.Token()
	require.NoError(t, r.Cancel(ctx))
	require.NoError(t, r.Cancel(ctx), "the owner's second cancel")
	require.ErrorIs(t, b.Use(ctx, tok), ratelimit.ErrReservationCanceled)
	require.ErrorIs(t, b.Refund(ctx, tok), ratelimit.ErrAlreadySettled)
	require.Equal(t, 90.0, value())

	// A Cancel with no token taken still goes through the store: a token
	// of the same charge made later (none can be) is not needed to keep it
	// once. Its refund comes back once.
	r = reserve()
	require.NoError(t, r.Cancel(ctx))
	require.Equal(t, 90.0, value())

	// Late: past the token's expiry nothing is settled.
	r = reserve()
	tok = r.Token()
	late, err := ratelimit.New(store, settleLimits, ratelimit.WithClock(newMock(tok.Expires().Add(time.Millisecond))))
	require.NoError(t, err)
	require.ErrorIs(t, late.Use(ctx, tok), ratelimit.ErrTokenExpired)
	require.ErrorIs(t, late.Refund(ctx, tok), ratelimit.ErrTokenExpired)
}

// testSettleRefundRule checks that settlements hand back what the refund
// rule says: all within the charge's window, nothing of what the limit
// granted since, never above capacity.
func testSettleRefundRule(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store := newStore(t)
	start := epoch.Truncate(time.Minute).Add(time.Minute)
	clk := newMock(start)
	lim, err := ratelimit.New(store, settleLimits, ratelimit.WithClock(clk))
	require.NoError(t, err)
	key := fmt.Sprintf("rule-%d", start.UnixNano())
	value := func(name string) float64 {
		st, err := lim.Value(ctx, name, key)
		require.NoError(t, err)
		return st.Remaining
	}
	limit := func(name string, n float64, opts ...ratelimit.CallOption) *ratelimit.Token {
		res, err := lim.Limit(ctx, name, key, append(opts, ratelimit.Count(n), ratelimit.WithReceipt())...)
		require.NoError(t, err)
		require.True(t, res.OK)
		require.NotNil(t, res.Token)
		require.Equal(t, n, res.Token.Charged(name))
		return res.Token
	}
	// Within the window: what was not used comes back.
	tok := limit("jobs", 40)
	require.Equal(t, 60.0, value("jobs"))
	require.NoError(t, lim.Settle(ctx, tok, 15))
	require.Equal(t, 85.0, value("jobs"))
	require.ErrorIs(t, lim.Settle(ctx, tok, 0), ratelimit.ErrAlreadySettled)
	require.Equal(t, 85.0, value("jobs"))

	// A reservation into the next window, canceled after it began: the
	// window's grant went to it, and nothing comes back.
	tok = limit("jobs", 185, ratelimit.WithReserve())
	require.Equal(t, -100.0, value("jobs"))
	clk.Add(time.Minute)
	require.Equal(t, 0.0, value("jobs"))
	require.NoError(t, lim.Refund(ctx, tok))
	require.Equal(t, 85.0, value("jobs"), "185 less the 100 granted since")

	// Never above capacity.
	tok = limit("jobs", 10)
	clk.Add(time.Minute)
	require.Equal(t, 100.0, value("jobs"))
	require.NoError(t, lim.Refund(ctx, tok))
	require.Equal(t, 100.0, value("jobs"))

	// A token bucket: the refill since the charge is not given back twice.
	tok = limit("burst", 30)
	require.Equal(t, 20.0, value("burst"))
	clk.Add(time.Second) // 10 refilled
	require.NoError(t, lim.Settle(ctx, tok, 5))
	require.Equal(t, 45.0, value("burst"), "20 + 10 refilled + (25 less the 10 refilled since)")
}

// testReceipts settles the receipts of LimitAll calls over several
// limits, from another Limiter.
func testReceipts(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store := newStore(t)
	start := epoch.Truncate(time.Minute).Add(time.Minute)
	lims := limiters(t, store, 2, start)
	key := fmt.Sprintf("receipts-%d", start.UnixNano())
	res, err := lims[0].LimitAll(ctx, key, []string{"jobs", "burst", "wide"}, ratelimit.Count(20), ratelimit.WithReceipt())
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NotNil(t, res.Token)
	for _, n := range []string{"jobs", "burst", "wide"} {
		require.Equal(t, 20.0, res.Token.Charged(n))
	}
	text, err := res.Token.MarshalText()
	require.NoError(t, err)
	var tok ratelimit.Token
	require.NoError(t, tok.UnmarshalText(text))
	require.NoError(t, lims[1].Settle(ctx, &tok, 8))
	want := map[string]float64{"jobs": 92, "burst": 42, "wide": 192}
	for n, w := range want {
		st, err := lims[1].Value(ctx, n, key)
		require.NoError(t, err)
		require.InDelta(t, w, st.Remaining, 1e-9, n)
	}
	require.ErrorIs(t, lims[0].Refund(ctx, res.Token), ratelimit.ErrReservationUsed)
	// No receipt without WithReceipt, nor for a refused call.
	res, err = lims[0].Limit(ctx, "jobs", key)
	require.NoError(t, err)
	require.Nil(t, res.Token)
	res, err = lims[0].Limit(ctx, "burst", key, ratelimit.Count(50), ratelimit.WithReceipt())
	require.NoError(t, err)
	require.False(t, res.OK)
	require.Nil(t, res.Token)
}

// SettleEveryWay settles r's token each way a caller can, one after the
// other: Limiter.Refund, Use, Settle of one token, and r's Cancel; it
// returns their errors in that order. It is for a store's own tests of a
// settlement that every way must meet alike, such as one whose mark the
// store cannot read.
func SettleEveryWay(ctx context.Context, lim *ratelimit.Limiter, r *ratelimit.Reservation) []error {
	tok := r.Token()
	return []error{lim.Refund(ctx, tok), lim.Use(ctx, tok), lim.Settle(ctx, tok, 1), r.Cancel(ctx)}
}

// testSettlers checks that a settlement found settled before says whether
// its mark records the same settler (driver.Decision.Own): a settler's
// retry finds its own mark, whatever the kind it asks; another settler,
// of the same kind or not, finds another's; a mark of no settler is
// nobody's own, not even a retry of no settler.
func testSettlers(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store := newStore(t)
	p := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: 60_000, Capacity: 10}
	key := fmt.Sprintf("settlers-%d", time.Now().UnixNano())
	now := epoch.UnixMilli()
	var a, b [16]byte
	randomBytes(t, a[:], b[:])
	settle := func(id [16]byte, kind driver.SettleKind, settler [16]byte) driver.Decision {
		t.Helper()
		op := &driver.Op{Mode: driver.ModeRefund, Now: now,
			Items:  []driver.Item{{Name: "jobs", Key: key, Count: 1, At: now, Shards: []driver.Shard{{Params: p}}}},
			Settle: &driver.Settlement{ID: id, Kind: kind, Until: now + 3_600_000, Settler: settler}}
		out := make([]driver.Decision, 1)
		require.NoError(t, store.Apply(ctx, op, out))
		return out[0]
	}
	use, cancel := driver.SettleUse, driver.SettleCancel
	for _, c := range []struct {
		name        string
		first, then driver.SettleKind
		by, retry   [16]byte
		own         bool
	}{
		{"a use retried by its settler", use, use, a, a, true},
		{"a cancel retried by its settler", cancel, cancel, a, a, true},
		{"a use, then a cancel by its settler", use, cancel, a, a, true},
		{"a cancel, then a use by its settler", cancel, use, a, a, true},
		{"a use, then one by another settler", use, use, a, b, false},
		{"a cancel, then one by another settler", cancel, cancel, a, b, false},
		{"a use, then a cancel by another settler", use, cancel, a, b, false},
		{"a use, then one of no settler", use, use, a, [16]byte{}, false},
		{"a use of no settler, then one by a settler", use, use, [16]byte{}, a, false},
		{"a cancel of no settler, retried by none", cancel, cancel, [16]byte{}, [16]byte{}, false},
	} {
		var id [16]byte
		randomBytes(t, id[:])
		d := settle(id, c.first, c.by)
		require.True(t, d.OK, c.name)
		require.Zero(t, d.Settled, c.name)
		require.False(t, d.Own, c.name)
		d = settle(id, c.then, c.retry)
		require.Equal(t, c.first, d.Settled, "%s: the kind of the first settlement", c.name)
		require.Equal(t, c.own, d.Own, "%s: whose mark", c.name)
		require.Equal(t, driver.Decision{Now: now, Settled: c.first, Own: c.own}, d, c.name)
		// Asked again, the mark still says the first settler's.
		require.Equal(t, d, settle(id, c.then, c.retry), c.name)
	}
}

// randomBytes fills each of bs with random bytes.
func randomBytes(t *testing.T, bs ...[]byte) {
	for _, b := range bs {
		_, err := crand.Read(b)
		require.NoError(t, err)
	}
}

// failingStore fails Apply while fail is set, before the store sees the
// op (it never reached it), or, while lose is set, after the store
// applied it (its answer was lost on the way back).
type failingStore struct {
	ratelimit.Store
	fail, lose atomic.Bool
}

func (s *failingStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if s.fail.Load() {
		return errors.New("connection refused: the op never reached the store")
	}
	if err := s.Store.Apply(ctx, op, out); err != nil || !s.lose.Load() {
		return err
	}
	return errors.New("connection reset: the answer was lost")
}

// failingClock is a failingStore over a store that keeps its own clock,
// which the Limiter reads before a settlement as it would the store's.
type failingClock struct {
	*failingStore
	driver.TimeSource
}

// failingRecordClock is a failingClock over a store whose clock is its
// servers', one per record (driver.RecordClock), which it keeps too: the
// Limiter reads the time of the token's server, as through the store.
type failingRecordClock struct {
	failingClock
	driver.RecordClock
}

// failing wraps store in a failingStore, keeping its own clock, and the
// clock of each record.
func failing(store ratelimit.Store) (ratelimit.Store, *failingStore) {
	f := &failingStore{Store: store}
	if ts, ok := store.(driver.TimeSource); ok {
		if rc, ok := store.(driver.RecordClock); ok {
			return failingRecordClock{failingClock{f, ts}, rc}, f
		}
		return failingClock{f, ts}, f
	}
	return f, f
}

// testRetriedAfterAFailure checks a Reservation's Wait and Cancel retried
// after a store error against a holder of its token in another process:
// the retry takes the store's mark for its own only when the first
// attempt made it. When the first never reached the store and a holder
// settled the token meanwhile, the holder's use is the holder's (the
// owner's Wait fails: the job must not run twice), and so is its cancel.
func testRetriedAfterAFailure(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store := newStore(t)
	now := epoch.Truncate(time.Minute).Add(time.Second)
	wrapped, f := failing(store)
	owner, err := ratelimit.New(wrapped, settleLimits, ratelimit.WithClock(newMock(now)))
	require.NoError(t, err)
	holder := limiters(t, store, 1, now)[0]
	key := fmt.Sprintf("retried-%d", now.UnixNano())
	reserve := func() (*ratelimit.Reservation, *ratelimit.Token) {
		t.Helper()
		r, err := owner.Reserve(ctx, "jobs", key, ratelimit.Count(2), ratelimit.WithReceipt())
		require.NoError(t, err)
		require.True(t, r.OK())
		tok, err := ratelimit.ParseToken(r.Token().String())
		require.NoError(t, err)
		return r, tok
	}
	for _, lost := range []bool{false, true} {
		set := &f.fail
		if lost {
			set = &f.lose
		}
		what := map[bool]string{false: "never sent", true: "answer lost"}[lost]

		// Wait, then a holder's use.
		r, tok := reserve()
		set.Store(true)
		require.Error(t, r.Wait(ctx), what)
		set.Store(false)
		if lost {
			require.ErrorIs(t, holder.Use(ctx, tok), ratelimit.ErrAlreadySettled, "%s: the owner's use took effect", what)
			require.NoError(t, r.Wait(ctx), "%s: the owner's retry finds its own use", what)
		} else {
			require.NoError(t, holder.Use(ctx, tok), what)
			err := r.Wait(ctx)
			require.ErrorIs(t, err, ratelimit.ErrReservationUsed, "%s: the holder's use is not the owner's: the job must not run twice", what)
			require.ErrorIs(t, err, ratelimit.ErrAlreadySettled, what)
			require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationUsed, what)
		}

		// Cancel, then a holder's refund.
		r, tok = reserve()
		set.Store(true)
		require.Error(t, r.Cancel(ctx), what)
		set.Store(false)
		if lost {
			require.ErrorIs(t, holder.Refund(ctx, tok), ratelimit.ErrAlreadySettled, "%s: the owner's cancel took effect", what)
			require.NoError(t, r.Cancel(ctx), "%s: the owner's retry finds its own cancel", what)
		} else {
			require.NoError(t, holder.Refund(ctx, tok), what)
			err := r.Cancel(ctx)
			require.ErrorIs(t, err, ratelimit.ErrReservationCanceled, "%s: the holder's cancel is not the owner's", what)
			require.ErrorIs(t, err, ratelimit.ErrAlreadySettled, what)
		}
		require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled, what)

		// Wait, then a holder's refund; Cancel, then a holder's use.
		r, tok = reserve()
		set.Store(true)
		require.Error(t, r.Wait(ctx), what)
		set.Store(false)
		if lost {
			require.ErrorIs(t, holder.Refund(ctx, tok), ratelimit.ErrReservationUsed, what)
			require.NoError(t, r.Wait(ctx), what)
		} else {
			require.NoError(t, holder.Refund(ctx, tok), what)
			require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled, what)
		}
		r, tok = reserve()
		set.Store(true)
		require.Error(t, r.Cancel(ctx), what)
		set.Store(false)
		if lost {
			require.ErrorIs(t, holder.Use(ctx, tok), ratelimit.ErrReservationCanceled, what)
			require.NoError(t, r.Cancel(ctx), what)
			require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled, what)
		} else {
			require.NoError(t, holder.Use(ctx, tok), what)
			require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed, what)
			require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationUsed, what)
		}

		// A Wait whose use was lost, then a Cancel: the use was the
		// owner's, the tokens are spent, and a Wait lets the job run.
		r, _ = reserve()
		set.Store(true)
		require.Error(t, r.Wait(ctx), what)
		set.Store(false)
		if lost {
			require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed, what)
			require.NoError(t, r.Wait(ctx), what)
		} else {
			require.NoError(t, r.Cancel(ctx), what)
			require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled, what)
		}
	}
}

// testHolderRetried checks a holder's Use, Refund and Settle with a
// Settler, retried after a call that never reached the store or whose
// answer was lost, against another holder with a settler of its own: the
// retry returns nil only when the store's mark is its own settlement (the
// same settler, kind and amount), and the token is settled once.
func testHolderRetried(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store := newStore(t)
	now := epoch.Truncate(time.Minute).Add(time.Second)
	wrapped, f := failing(store)
	holder, err := ratelimit.New(wrapped, settleLimits, ratelimit.WithClock(newMock(now)))
	require.NoError(t, err)
	others := limiters(t, store, 2, now)
	owner, other := others[0], others[1]
	key := fmt.Sprintf("holder-retried-%d", now.UnixNano())
	var a, b [16]byte
	randomBytes(t, a[:], b[:])
	mine, theirs := ratelimit.Settler(a), ratelimit.Settler(b)
	// On a store's own clock (a server's) the window may turn during the
	// test: the count is checked on the Limiters' mock clocks only.
	ts, own := store.(driver.TimeSource)
	own = own && ts.OwnClock()
	remaining := func() float64 {
		t.Helper()
		if own {
			return 0
		}
		st, err := owner.Value(ctx, "jobs", key)
		require.NoError(t, err)
		return st.Remaining
	}
	for _, c := range []struct {
		name   string
		settle func(*ratelimit.Limiter, *ratelimit.Token, ...ratelimit.SettleOption) error
		kind   error
		spent  float64 // of the 4 charged
	}{
		{"Use", func(l *ratelimit.Limiter, tok *ratelimit.Token, o ...ratelimit.SettleOption) error {
			return l.Use(ctx, tok, o...)
		}, ratelimit.ErrReservationUsed, 4},
		{"Refund", func(l *ratelimit.Limiter, tok *ratelimit.Token, o ...ratelimit.SettleOption) error {
			return l.Refund(ctx, tok, o...)
		}, ratelimit.ErrReservationCanceled, 0},
		{"Settle", func(l *ratelimit.Limiter, tok *ratelimit.Token, o ...ratelimit.SettleOption) error {
			return l.Settle(ctx, tok, 1, o...)
		}, ratelimit.ErrReservationUsed, 1},
	} {
		for _, lost := range []bool{false, true} {
			set := &f.fail
			if lost {
				set = &f.lose
			}
			what := fmt.Sprintf("%s, %s", c.name, map[bool]string{false: "never sent", true: "answer lost"}[lost])
			before := remaining()
			r, err := owner.Reserve(ctx, "jobs", key, ratelimit.Count(4))
			require.NoError(t, err)
			tok, err := ratelimit.ParseToken(r.Token().String())
			require.NoError(t, err)
			set.Store(true)
			require.Error(t, c.settle(holder, tok, mine), what)
			set.Store(false)
			if lost {
				require.ErrorIs(t, c.settle(other, tok, theirs), c.kind, "%s: the first attempt took effect", what)
				require.NoError(t, c.settle(holder, tok, mine), "%s: the retry finds its own settlement", what)
			} else {
				require.NoError(t, c.settle(other, tok, theirs), what)
				require.ErrorIs(t, c.settle(holder, tok, mine), c.kind, "%s: the other settler's is not the holder's", what)
				require.NoError(t, c.settle(other, tok, theirs), what)
			}
			require.ErrorIs(t, c.settle(holder, tok), c.kind, "%s: none is nobody's", what)
			require.ErrorIs(t, holder.Settle(ctx, tok, 2, mine), ratelimit.ErrAlreadySettled, "%s: another settlement of the settler", what)
			if !own {
				require.InDelta(t, before-c.spent, remaining(), 1e-9, "%s: settled once", what)
			}
		}
	}
}

// testSettlersRace has holders of receipts of several limits, one of them
// sharded, each with a Settler of its own, settle each receipt at once
// and retry: exactly one settler's settlement is taken, and only that
// settler's calls return nil, its retries included (the store's mark is
// its own); every other call is a *SettledError, whichever settlements
// the store's batches gather.
func testSettlersRace(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	store := newStore(t)
	now := epoch.Truncate(time.Minute).Add(time.Second)
	lims := limiters(t, store, 4, now)
	key := fmt.Sprintf("settlers-race-%d", now.UnixNano())
	const tokens, holders = 20, 8
	toks := make([]*ratelimit.Token, tokens)
	for i := range toks {
		res, err := lims[0].LimitAll(ctx, key, []string{"jobs", "wide"}, ratelimit.Count(2), ratelimit.WithReceipt())
		require.NoError(t, err)
		require.True(t, res.OK)
		toks[i], err = ratelimit.ParseToken(res.Token.String())
		require.NoError(t, err)
	}
	var ids [holders][16]byte
	for i := range ids {
		randomBytes(t, ids[i][:])
	}
	var (
		wins [tokens][holders]atomic.Int32
		wg   sync.WaitGroup
		errs = make(chan error, tokens*holders*2)
	)
	for h := range holders {
		lim, by := lims[h%len(lims)], ratelimit.Settler(ids[h])
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, tok := range toks {
				for range 2 { // the call, then its retry
					var err error
					switch (i + h) % 3 {
					case 0:
						err = lim.Use(ctx, tok, by)
					case 1:
						err = lim.Refund(ctx, tok, by)
					default:
						err = lim.Settle(ctx, tok, float64(1+h%2), by)
					}
					var se *ratelimit.SettledError
					switch {
					case err == nil:
						wins[i][h].Add(1)
					case !errors.As(err, &se):
						errs <- err
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for i := range wins {
		winners := 0
		for h := range wins[i] {
			switch n := wins[i][h].Load(); n {
			case 0:
			case 2:
				winners++
			default:
				t.Fatalf("token %d: settler %d won %d of its 2 calls: the retry of a taken settlement is its own", i, h, n)
			}
		}
		require.Equal(t, 1, winners, "token %d: the settlers whose settlement was taken", i)
	}
}
