package redisstore_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// markKeyOf returns the key of the mark of the settlement id beside the
// record rec: its hash tag, then "s:" and the ID in hex.
func markKeyOf(rec string, id [16]byte) string {
	return rec[:strings.IndexByte(rec, '}')+1] + "s:" + hex.EncodeToString(id[:])
}

// A settlement whose mark's key holds what is no mark of a cancel or a
// use (a mark of kind 0, 3 or 128, of the wrong length, a record, text)
// fails with ErrBadRecord and settles nothing, alone or batched: the
// token may have been settled already. A mark of another kind was taken
// for a settlement of that kind, and a record there for no mark, which
// the settlement overwrote, settling the token again.
func TestBadMarkFailsTheSettlement(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	record := []byte{1}
	for _, x := range []float64{5, float64(t0.UnixMilli()), math.Inf(1)} {
		record = binary.LittleEndian.AppendUint64(record, math.Float64bits(x))
	}
	for name, bad := range map[string]string{
		"kind 0":      "\x02\x00",
		"kind 3":      "\x02\x03",
		"kind 128":    "\x02\x80",
		"short":       "\x02",
		"long":        "\x02\x01\x00",
		"settler 0":   "\x02\x02" + strings.Repeat("\x00", 16),
		"settler 15":  "\x02\x02" + strings.Repeat("\x01", 15),
		"settler 17":  "\x02\x02" + strings.Repeat("\x01", 17),
		"a record":    string(record),
		"a text one":  "5 " + strconv.FormatInt(t0.UnixMilli(), 10),
		"no record":   "garbage",
		"empty":       "",
		"kind 1 byte": "\x01",
	} {
		store := newStore(c, uniquePrefix(t, c))
		lim, err := ratelimit.New(store, ratelimit.Limits{
			"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
		}, ratelimit.WithClock(newMock(t0)))
		require.NoError(t, err)
		r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
		require.NoError(t, err)
		tok := r.Token()
		mark := markKeyOf(store.Key(driver.RecordID{Name: "jobs", Key: "k"}), tok.ID())
		require.NoError(t, c.Set(ctx, mark, bad, 0).Err())

		for _, err := range storetest.SettleEveryWay(ctx, lim, r) {
			require.ErrorIs(t, err, redisstore.ErrBadRecord, name)
			require.ErrorIs(t, err, driver.ErrBadRecord, "%s: the error of every store", name)
			require.NotErrorIs(t, err, ratelimit.ErrAlreadySettled, name)
			require.ErrorContains(t, err, strconv.Quote(mark), "%s: names the key", name)
			require.ErrorContains(t, err, "treat it as settled", name)
			require.NotContains(t, err.Error(), "script:", name)
		}
		st, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		require.Equal(t, 6.0, st.Remaining, "%s: nothing handed back", name)

		// In a batch, the op fails alone.
		p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute.Milliseconds(), Capacity: 10}
		op := oneItemOp(driver.ModeRefund, t0.UnixMilli(), "jobs", "k", 4, p)
		op.Settle = &driver.Settlement{ID: tok.ID(), Kind: driver.SettleCancel, Until: tok.Expires().UnixMilli()}
		other := oneItemOp(driver.ModeLimit, t0.UnixMilli(), "jobs", "other", 1, p)
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		err = store.ApplyBatch(ctx, []*driver.Op{op, other}, outs)
		require.ErrorIs(t, err, redisstore.ErrBadRecord, name)
		require.Equal(t, []int{0}, storetest.FailedOps(t, err), name)
		require.True(t, outs[1][0].OK, "%s: the other op is decided", name)

		got, err := c.Get(ctx, mark).Result()
		require.NoError(t, err)
		require.Equal(t, bad, got, "%s: the mark is left as it is", name)
	}
}

// A settlement of no settler (a holder's, by its token) writes the mark
// releases that kept no settler write and read, "\x02" and its kind; one
// of a settler (a Reservation's) appends the settler's 16 bytes. A mark of
// no settler, as an earlier release wrote it, is nobody's own: a
// Reservation's retried Wait or Cancel that finds one takes it for a
// holder's, rather than let the job run twice.
func TestMarkFormat(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	store := newStore(c, uniquePrefix(t, c))
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(newMock(t0)))
	require.NoError(t, err)
	markOf := func(tok *ratelimit.Token) string {
		return markKeyOf(store.Key(driver.RecordID{Name: "jobs", Key: "k"}), tok.ID())
	}

	r, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	holders := r.Token()
	require.NoError(t, lim.Refund(ctx, holders))
	require.Equal(t, "\x02\x01", c.Get(ctx, markOf(holders)).Val(), "a holder's mark")

	r, err = lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	owners := r.Token()
	require.NoError(t, r.Cancel(ctx))
	v := c.Get(ctx, markOf(owners)).Val()
	require.Len(t, v, 18, "the owner's mark: kind and settler")
	require.Equal(t, "\x02\x01", v[:2])
	require.NotEqual(t, strings.Repeat("\x00", 16), v[2:])
	require.NoError(t, r.Cancel(ctx), "its own mark")

	// Marks of an earlier release: a use, a cancel, of no settler.
	for kind, want := range map[string]error{"\x02\x02": ratelimit.ErrReservationUsed, "\x02\x01": ratelimit.ErrReservationCanceled} {
		r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.WithReceipt())
		require.NoError(t, err)
		require.NoError(t, c.Set(ctx, markOf(r.Token()), kind, time.Hour).Err())
		require.ErrorIs(t, r.Wait(ctx), want, "%q: Wait", kind)
		r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.WithReceipt())
		require.NoError(t, err)
		require.NoError(t, c.Set(ctx, markOf(r.Token()), kind, time.Hour).Err())
		require.ErrorIs(t, r.Cancel(ctx), want, "%q: Cancel", kind)
	}
}
