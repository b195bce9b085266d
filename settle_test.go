package ratelimit_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTokenRoundTripAndKey(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewMock()
	clk.Set(time.UnixMilli(1_700_000_000_000))
	store := must(memstore.New())
	limits := ratelimit.Limits{"a": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, MaxReserved: 10}}
	signed := must(ratelimit.New(store, limits, ratelimit.WithClock(clk), ratelimit.WithTokenKey([]byte("token key one, 32 bytes long...."))))
	other := must(ratelimit.New(store, limits, ratelimit.WithClock(clk), ratelimit.WithTokenKey([]byte("token key two, 32 bytes long...."))))
	plain := must(ratelimit.New(store, limits, ratelimit.WithClock(clk)))

	r, err := signed.Reserve(ctx, "a", "key\x00with bytes", ratelimit.Count(15))
	require.NoError(t, err)
	tok := r.Token()
	require.Same(t, tok, r.Token(), "made once")
	back, err := ratelimit.ParseToken(tok.String())
	require.NoError(t, err)
	require.Equal(t, tok.String(), back.String())
	require.Equal(t, tok.ID(), back.ID())
	require.Equal(t, r.Time(), back.RunAt())
	require.Equal(t, 15.0, back.Charged("a"))
	require.True(t, back.Expires().After(back.RunAt()))

	// Another key, or none where one is required: refused. A bit flipped: refused.
	require.ErrorIs(t, other.Use(ctx, back), ratelimit.ErrInvalidToken)
	u, err := plain.Reserve(ctx, "a", "k")
	require.NoError(t, err)
	require.ErrorIs(t, signed.Use(ctx, u.Token()), ratelimit.ErrInvalidToken)
	raw, err := tok.MarshalText()
	require.NoError(t, err)
	raw[len(raw)/2] ^= 1
	if forged, err := ratelimit.ParseToken(string(raw)); err == nil {
		require.ErrorIs(t, signed.Refund(ctx, forged), ratelimit.ErrInvalidToken)
	}
	require.NoError(t, signed.Use(ctx, back))

	// Garbage is an error, never a panic.
	for _, s := range []string{"", "!!", "AQ", "AQAAAAAAAAAAAAAAAAAAAAAA", tok.String()[:10], tok.String() + "AA"} {
		_, err := ratelimit.ParseToken(s)
		require.ErrorIs(t, err, ratelimit.ErrInvalidToken, "%q", s)
	}
	require.ErrorIs(t, plain.Refund(ctx, nil), ratelimit.ErrInvalidToken)
	require.ErrorIs(t, plain.Settle(ctx, back, -1), ratelimit.ErrInvalidCount)
}

// A Token kept by value in a job's payload goes through encoding/json
// (and any encoder of encoding.TextMarshaler) as its text form, and fmt
// prints it so. MarshalText and String were methods of *Token alone: a
// payload marshaled by value (json.Marshal(job), not &job) wrote the
// token as {}, silently, and the worker could neither read it back nor
// settle it; fmt printed its fields, tag and all.
func TestTokenTextOfAValue(t *testing.T) {
	lim := jobsLimiter(must(memstore.New()))
	r, err := lim.Reserve(context.Background(), "jobs", "k", ratelimit.Count(3))
	require.NoError(t, err)
	tok := *r.Token()
	type job struct {
		Name  string
		Token ratelimit.Token
	}
	b, err := json.Marshal(job{Name: "mail", Token: tok})
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"Name":"mail","Token":%q}`, tok.String()), string(b))
	var back job
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, tok.String(), back.Token.String())
	require.Equal(t, 3.0, back.Token.Charged("jobs"))
	require.Equal(t, tok.String(), fmt.Sprint(tok))
	require.Equal(t, "["+tok.String()+"]", fmt.Sprint([]ratelimit.Token{tok}))
}

// The zero Token, of a job that holds no token (its reservation was
// refused, or it needs none), goes through encoding/json as the empty
// string and back: its text form was a token of no charge that
// UnmarshalText refused, which failed the decoding of the whole payload.
// ParseToken still refuses the empty string, and settling the zero Token
// is ErrInvalidToken.
func TestZeroTokenText(t *testing.T) {
	type job struct {
		Name  string
		Token ratelimit.Token
	}
	b, err := json.Marshal(job{Name: "mail"})
	require.NoError(t, err)
	require.JSONEq(t, `{"Name":"mail","Token":""}`, string(b))
	back := job{Token: *must(ratelimit.ParseToken(tokenOfItems(tokenItem{"jobs", 0})))}
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, job{Name: "mail"}, back, "the zero Token")
	require.Equal(t, "", ratelimit.Token{}.String())
	_, err = ratelimit.ParseToken("")
	require.ErrorIs(t, err, ratelimit.ErrInvalidToken)
	require.ErrorIs(t, jobsLimiter(must(memstore.New())).Use(context.Background(), &back.Token), ratelimit.ErrInvalidToken)
}

// WithTokenKey with an empty key (an unset environment variable) left
// the tokens unsigned: the Limiter settled a token that carries no tag.
// New refuses it, and any key shorter than MinKeySecret, as WithKeyHash
// does its secret.
func TestTokenKeyRefusesAnEmptyOrShortKey(t *testing.T) {
	limits := ratelimit.Limits{"a": {Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Hour, Start: time.UnixMilli(0)}}
	for _, key := range [][]byte{nil, {}, []byte("fifteen bytes!!")} {
		_, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithClock(newMock()), ratelimit.WithTokenKey(key))
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "key %q", key)
		assert.Contains(t, err.Error(), "WithTokenKey")
		assert.Contains(t, err.Error(), "at least 16 random bytes")
	}
	_, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithTokenKey([]byte("sixteen bytes!!!")))
	require.NoError(t, err)
}

// A token may be settled until its limits will have granted its amounts
// again since the charge, and a period more, plus the settle window
// (docs/reservations.md, How long a token lives): 5 tokens of 10 per
// minute take a window of a fixed window, 30 s of a token bucket.
func TestTokenExpires(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		kind   ratelimit.Kind
		window []ratelimit.Option
		want   time.Duration
	}{
		{ratelimit.FixedWindow, nil, time.Minute + time.Minute + ratelimit.DefaultSettleWindow},
		{ratelimit.TokenBucket, nil, 30*time.Second + time.Minute + ratelimit.DefaultSettleWindow},
		{ratelimit.FixedWindow, []ratelimit.Option{ratelimit.WithSettleWindow(time.Minute)}, 3 * time.Minute},
	} {
		clk := newMock()
		limits := ratelimit.Limits{"m": {Kind: c.kind, Rate: 10, Period: time.Minute}}
		lim := must(ratelimit.New(must(memstore.New()), limits, append(c.window, ratelimit.WithClock(clk))...))
		r, err := lim.Reserve(ctx, "m", "k", ratelimit.Count(5))
		require.NoError(t, err)
		require.True(t, r.OK())
		assert.Equal(t, clk.Now().Add(c.want).UnixMilli(), r.Token().Expires().UnixMilli(), "%v %v", c.kind, c.want)
	}
}

// FuzzParseToken reads any text as a token: an error matching
// ErrInvalidToken or a token that round-trips, whose items are within the bounds any call charges, and
// that a Limiter verifies and settles without a panic. It starts from
// real tokens (signed or not, of several limits, sharded, carrying a use),
// so that mutations reach the items and the tag.
func FuzzParseToken(f *testing.F) {
	ctx := context.Background()
	limits := ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
		"wide": {Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Minute, Shards: 4},
	}
	key := []byte("the fuzzed tokens' key, 32 bytes")
	f.Add("AQAAAAAAAAAAAAAAAAAAAAAA")
	for _, opts := range [][]ratelimit.Option{nil, {ratelimit.WithTokenKey(key)}} {
		lim := must(ratelimit.New(must(memstore.New()), limits, append(opts, ratelimit.WithClock(newMock()))...))
		res, err := lim.LimitAll(ctx, "k", []string{"jobs", "wide"}, ratelimit.Count(4), ratelimit.WithReceipt())
		require.NoError(f, err)
		f.Add(res.Token.String())
		r, err := lim.Reserve(ctx, "jobs", "k") // within the window: runs now
		require.NoError(f, err)
		require.NoError(f, r.Wait(ctx))
		f.Add(r.Token().String())
		r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(30))
		require.NoError(f, err)
		f.Add(r.Token().String())
	}
	lim := must(ratelimit.New(must(memstore.New()), limits, ratelimit.WithClock(newMock()),
		ratelimit.WithTokenKey(key), ratelimit.WithUnsignedTokensAccepted()))
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ratelimit.ParseToken(s)
		if err != nil {
			if !errors.Is(err, ratelimit.ErrInvalidToken) {
				t.Fatalf("token %q: %v, which does not match ErrInvalidToken", s, err)
			}
			return
		}
		again, err := ratelimit.ParseToken(tok.String())
		if err != nil || again.String() != tok.String() {
			t.Fatalf("token %q does not round-trip: %v", s, err)
		}
		for _, it := range tok.Items() {
			if !(it.Amount >= 0 && it.Amount <= ratelimit.MaxTokens) || it.Shard < 0 || it.Shard >= ratelimit.MaxShards {
				t.Fatalf("token %q: item %+v out of bounds", s, it)
			}
		}
		_ = tok.Verify(key)
		_ = lim.Settle(ctx, tok, 1, ratelimit.Settler([16]byte{1}))
		_ = lim.Refund(ctx, tok)
	})
}

// tokenOfShard returns the text form of a token, made by hand, that
// charges 1 token of shard of limit "jobs" for key "k" at t0.
func tokenOfShard(shard uint64) string { return tokenOfItems(tokenItem{"jobs", shard}) }

// tokenItem is an item of a token made by hand: a limit's name and shard.
type tokenItem struct {
	name  string
	shard uint64
}

// tokenOfItems returns the text form of a token, made by hand, that
// charges 1 token of each of items for key "k" at t0.
func tokenOfItems(items ...tokenItem) string {
	return tokenOfTimes(t0.UnixMilli(), 0, 600_000, items...)
}

// tokenOfTimes is tokenOfItems of a token charged at at (Unix ms), whose
// job may run run ms later and which may be settled until ms later.
func tokenOfTimes(at int64, run, until uint64, items ...tokenItem) string {
	return tokenOfAmount(at, run, until, 1, items...)
}

// tokenOfAmount is tokenOfTimes of a token that charges amount tokens of
// each item.
func tokenOfAmount(at int64, run, until uint64, amount float64, items ...tokenItem) string {
	b := []byte{1, 0}                  // version, flags
	b = append(b, make([]byte, 16)...) // id
	b = binary.AppendVarint(b, at)
	b = binary.AppendUvarint(b, run)
	b = binary.AppendUvarint(b, until)
	b = binary.AppendUvarint(b, 1)
	b = append(b, 'k')
	b = binary.AppendUvarint(b, uint64(len(items)))
	for _, it := range items {
		b = binary.AppendUvarint(b, uint64(len(it.name)))
		b = append(b, it.name...)
		b = binary.AppendUvarint(b, it.shard)
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(amount))
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// A token that names one limit's shard twice is refused with
// ErrInvalidToken: no Limiter makes one, and settled, its op would name
// one record twice, which stores refuse as an invalid op.
func TestTokenWithAnItemTwiceIsRefused(t *testing.T) {
	var many []tokenItem // past the few compared pair by pair
	for i := range 12 {
		many = append(many, tokenItem{fmt.Sprint("l", i), uint64(i % 2)})
	}
	for _, tc := range []struct {
		items []tokenItem
		ok    bool
	}{
		{[]tokenItem{{"jobs", 0}, {"jobs", 1}}, true},
		{[]tokenItem{{"jobs", 0}, {"mail", 0}}, true},
		{[]tokenItem{{"jobs", 0}, {"jobs", 0}}, false},
		{[]tokenItem{{"jobs", 1}, {"mail", 0}, {"jobs", 1}}, false},
		{many, true},
		{append(slices.Clone(many), many[5]), false},
	} {
		_, err := ratelimit.ParseToken(tokenOfItems(tc.items...))
		if tc.ok {
			require.NoError(t, err, "%v", tc.items)
		} else {
			require.ErrorIs(t, err, ratelimit.ErrInvalidToken, "%v", tc.items)
			require.ErrorContains(t, err, "twice")
		}
	}
}

// A token charging more of an item than one call may take (MaxTokens) is
// refused with ErrInvalidToken: no Limiter makes one. Two items of 1e308
// made a limit's charge +Inf, and Settle sent the store a count of NaN,
// refused with a message that blamed the caller's used.
func TestTokenWithAnAmountPastMaxTokensIsRefused(t *testing.T) {
	ctx := context.Background()
	lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0, Shards: 2})
	at := t0.UnixMilli()
	shards := []tokenItem{{"jobs", 0}, {"jobs", 1}}
	for _, amount := range []float64{1e308, math.MaxFloat64, math.Nextafter(ratelimit.MaxTokens, math.Inf(1))} {
		_, err := ratelimit.ParseToken(tokenOfAmount(at, 0, 600_000, amount, shards...))
		require.ErrorIs(t, err, ratelimit.ErrInvalidToken, "a token of %v tokens a shard", amount)
		require.ErrorContains(t, err, "bad item")
	}
	tok, err := ratelimit.ParseToken(tokenOfAmount(at, 0, 600_000, ratelimit.MaxTokens, shards...))
	require.NoError(t, err, "MaxTokens is a count a call may take")
	require.NoError(t, lim.Settle(ctx, tok, 1))
}

// A token naming a shard no limit can have is refused with
// ErrInvalidToken. A shard index of 2^63 or more used to decode to a
// negative int, which passed both the decoder's bound and the settling
// Limiter's check against the limit's shards, and reached the store.
func TestTokenWithOutOfRangeShardIsRefused(t *testing.T) {
	ctx := context.Background()
	lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	for _, shard := range []uint64{math.MaxUint64, 1 << 63, ratelimit.MaxShards} {
		tok, err := ratelimit.ParseToken(tokenOfShard(shard))
		if err == nil {
			err = lim.Refund(ctx, tok)
		}
		require.ErrorIs(t, err, ratelimit.ErrInvalidToken, "a token of shard %d of an unsharded limit", shard)
	}
	// A shard a limit may have is no bad token: the limit's Shards may
	// have been lowered since (TestTokenOfARemovedShard).
	tok, err := ratelimit.ParseToken(tokenOfShard(1))
	require.NoError(t, err)
	require.ErrorIs(t, lim.Refund(ctx, tok), ratelimit.ErrUnknownLimit, "shard 1 of an unsharded limit")
	tok, err = ratelimit.ParseToken(tokenOfShard(0))
	require.NoError(t, err)
	require.NoError(t, lim.Refund(ctx, tok), "shard 0 is the limit's")
}

// A token of a shard that the limit no longer has, its Shards lowered
// since the charge, is refused with ErrUnknownLimit, as a token of a limit
// removed since, and a message that says why and what to do; nothing is
// settled, and declared again with the shards, the limit settles it. It
// was refused with ErrInvalidToken, as if it could not be read or were
// forged, and a message that said neither.
func TestTokenOfARemovedShard(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := must(memstore.New())
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 80, Period: time.Minute, Start: t0, Shards: 8}
	owner := must(ratelimit.New(store, ratelimit.Limits{"jobs": cfg}, ratelimit.WithClock(mock)))
	lowered := cfg
	lowered.Shards = 1
	worker := must(ratelimit.New(store, ratelimit.Limits{"jobs": lowered}, ratelimit.WithClock(mock)))

	// 15 tokens need two shards of 10: one of them is not shard 0.
	r, err := owner.Reserve(ctx, "jobs", "k", ratelimit.Count(15))
	require.NoError(t, err)
	require.True(t, r.OK())
	tok := must(ratelimit.ParseToken(r.Token().String()))
	for _, settle := range []func() error{
		func() error { return worker.Use(ctx, tok) },
		func() error { return worker.Refund(ctx, tok) },
		func() error { return worker.Settle(ctx, tok, 5) },
	} {
		err := settle()
		require.ErrorIs(t, err, ratelimit.ErrUnknownLimit)
		require.NotErrorIs(t, err, ratelimit.ErrInvalidToken, "the token is good")
		require.ErrorContains(t, err, "Shards was lowered")
		require.ErrorContains(t, err, "nothing was settled")
	}

	require.NoError(t, worker.SetLimit("jobs", cfg))
	require.NoError(t, worker.Use(ctx, tok), "declared again with its shards, the limit settles it")
	require.ErrorIs(t, owner.Use(ctx, tok), ratelimit.ErrAlreadySettled)
}

// A LimitAll receipt reads back from its text form whatever the number of
// limits and shards it charges. The decoder refused more than 64 items,
// so that a receipt of 33 sharded limits (66 items) was made, and
// settled in process, but ParseToken refused it. A call whose receipt
// would be too large to read back is refused before it charges anything.
func TestLimitAllReceiptRoundTrips(t *testing.T) {
	ctx := context.Background()
	newLimits := func(n int) (*ratelimit.Limiter, []string) {
		limits := ratelimit.Limits{}
		var names []string
		for i := range n {
			name := fmt.Sprintf("l%03d", i)
			names = append(names, name)
			limits[name] = ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, Shards: 2}
		}
		return must(ratelimit.New(must(memstore.New()), limits, ratelimit.WithClock(newMock()))), names
	}

	lim, names := newLimits(33)
	res, err := lim.LimitAll(ctx, "k", names, ratelimit.WithReceipt())
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NotNil(t, res.Token)
	back, err := ratelimit.ParseToken(res.Token.String())
	require.NoError(t, err, "the receipt's text form reads back")
	require.Equal(t, res.Token.String(), back.String())
	require.NoError(t, lim.Refund(ctx, back), "and settles")
	require.ErrorIs(t, lim.Refund(ctx, res.Token), ratelimit.ErrAlreadySettled)

	lim, names = newLimits(513) // 1,026 shards charged
	_, err = lim.LimitAll(ctx, "k", names, ratelimit.WithReceipt())
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig, "a receipt too large to read back")
	st, err := lim.Value(ctx, names[0], "k")
	require.NoError(t, err)
	require.Equal(t, 10.0, st.Remaining, "nothing was charged")
	res, err = lim.LimitAll(ctx, "k", names)
	require.NoError(t, err, "without a receipt, any number of limits")
	require.True(t, res.OK)
}

// A token taken after Wait let the job run carries the use: settling it,
// here or from its text form elsewhere, fails as for a used reservation,
// and hands nothing back. It used to be a fresh token that Refund
// settled, so that a job ran and had its tokens back.
func TestTokenTakenAfterTheJobRan(t *testing.T) {
	ctx := context.Background()
	for _, key := range [][]byte{nil, []byte("a token key of 32 bytes, or so..")} {
		clk := newMock()
		store := must(memstore.New())
		limits := ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0}}
		opts := []ratelimit.Option{ratelimit.WithClock(clk)}
		if key != nil {
			opts = append(opts, ratelimit.WithTokenKey(key))
		}
		lim := must(ratelimit.New(store, limits, opts...))
		other := must(ratelimit.New(store, limits, opts...))

		r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx), "the job runs now")
		tok := r.Token()
		require.NotNil(t, tok)
		require.Same(t, tok, r.Token())
		back, err := ratelimit.ParseToken(tok.String())
		require.NoError(t, err)

		var se *ratelimit.SettledError
		require.ErrorAs(t, lim.Refund(ctx, tok), &se)
		require.ErrorIs(t, se, ratelimit.ErrReservationUsed)
		require.ErrorIs(t, other.Refund(ctx, back), ratelimit.ErrReservationUsed)
		require.ErrorIs(t, other.Settle(ctx, back, 1), ratelimit.ErrAlreadySettled)
		require.ErrorIs(t, other.Use(ctx, back), ratelimit.ErrReservationUsed, "the job ran already")
		require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed)
		st, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		require.Equal(t, 6.0, st.Remaining, "nothing was handed back")
	}
}

// A Check charges nothing, so it has no receipt to give: with
// WithReceipt it made a token anyway, off the bound path (an inline or a
// sharded limit), and a Refund of it handed back tokens never charged.
func TestCheckWithReceiptGetsNoToken(t *testing.T) {
	ctx := context.Background()
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Hour, Start: time.UnixMilli(0)}
	lim, err := ratelimit.New(must(memstore.New()), nil, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	chk, err := lim.Check(ctx, "inline", "k", ratelimit.WithConfig(cfg), ratelimit.WithReceipt())
	require.NoError(t, err)
	require.True(t, chk.OK)
	require.Nil(t, chk.Token, "a Check charged nothing: it has no receipt to give")
}

// The same, by what it cost: the refunded receipt of a Check let one
// window of Rate 4 grant 6.
func TestCheckReceiptGrantsNothingBeyondTheLimit(t *testing.T) {
	ctx := context.Background()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"sharded": {Kind: ratelimit.FixedWindow, Rate: 4, Period: time.Hour, Start: time.UnixMilli(0), Shards: 2},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	chk, err := lim.Check(ctx, "sharded", "k", ratelimit.Count(2), ratelimit.WithReceipt())
	require.NoError(t, err)
	granted := 0
	for range 4 {
		res, err := lim.Limit(ctx, "sharded", "k")
		require.NoError(t, err)
		if res.OK {
			granted++
		}
	}
	if chk.Token != nil {
		_ = lim.Refund(ctx, chk.Token)
	}
	for range 4 {
		res, err := lim.Limit(ctx, "sharded", "k")
		require.NoError(t, err)
		if res.OK {
			granted++
		}
	}
	require.LessOrEqual(t, granted, 4, "one window of Rate 4 granted more than 4")
}

// The *CountError of Settle's used concerns no one limit, and its message
// named an empty one: `limit "": count -1 used is ...`.
func TestSettleCountErrorNamesNoLimit(t *testing.T) {
	ctx := context.Background()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"a": {Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Hour, Start: time.UnixMilli(0)},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "a", "k", ratelimit.WithReceipt())
	require.NoError(t, err)
	for _, used := range []float64{-1, math.NaN(), math.Inf(1)} {
		err = lim.Settle(ctx, res.Token, used)
		require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
		require.NotContains(t, err.Error(), `limit ""`, "the message names an empty limit")
		require.Contains(t, err.Error(), "Settle")
	}
	require.NoError(t, lim.Settle(ctx, res.Token, 1), "and the token is still to settle")
}

// settledAsStore answers every settlement as settled before, of kind.
type settledAsStore struct {
	ratelimit.Store
	kind driver.SettleKind
}

func (s *settledAsStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if op.Settle == nil {
		return s.Store.Apply(ctx, op, out)
	}
	op.SettledBefore(s.kind, out)
	return nil
}

// A store that answers a settlement neither done (a refund is OK) nor
// settled before, as one whose mark of the token holds kind 0, is taken
// to have found the token settled: nothing done. The Limiter took it for
// a settlement done, so that Use let the job run, and Refund reported its
// tokens handed back, though the store did nothing.
func TestSettlementNeitherDoneNorSettled(t *testing.T) {
	ctx := context.Background()
	lim := jobsLimiter(&settledAsStore{Store: must(memstore.New()), kind: 0})
	for _, settle := range []func(*ratelimit.Token) error{
		func(tok *ratelimit.Token) error { return lim.Use(ctx, tok) },
		func(tok *ratelimit.Token) error { return lim.Refund(ctx, tok) },
		func(tok *ratelimit.Token) error { return lim.Settle(ctx, tok, 0.5) },
	} {
		r, err := lim.Reserve(ctx, "jobs", "k")
		require.NoError(t, err)
		err = settle(r.Token())
		require.ErrorIs(t, err, ratelimit.ErrAlreadySettled)
		require.ErrorContains(t, err, "SettleKind(0), which no Limiter writes")
		require.Error(t, r.Wait(ctx), "the owner does not run the job either")
	}
}

// A store whose mark of a token holds a kind no Limiter writes (its keys
// written by something else) is reported as such: settled, neither used
// nor canceled. Its message said "used", though it matched neither
// ErrReservationUsed nor ErrReservationCanceled.
func TestSettledOfAnUnknownKind(t *testing.T) {
	ctx := context.Background()
	lim := jobsLimiter(&settledAsStore{Store: must(memstore.New()), kind: 3})
	r, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	err = lim.Use(ctx, r.Token())
	require.ErrorIs(t, err, ratelimit.ErrAlreadySettled)
	require.NotErrorIs(t, err, ratelimit.ErrReservationUsed)
	require.NotErrorIs(t, err, ratelimit.ErrReservationCanceled)
	require.NotContains(t, err.Error(), "(used)")
	require.ErrorContains(t, err, "SettleKind(3), which no Limiter writes")

	// The owner's Wait does not run the job, and does not say who
	// canceled it: nobody did, that the mark can tell.
	r, err = lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	require.NotNil(t, r.Token(), "a token taken: the use goes through the store")
	err = r.Wait(ctx)
	require.ErrorIs(t, err, ratelimit.ErrAlreadySettled)
	require.NotErrorIs(t, err, ratelimit.ErrReservationCanceled)
	require.NotContains(t, err.Error(), "canceled by")
	require.ErrorContains(t, err, "SettleKind(3), which no Limiter writes")
}

// A token whose expiry lies beyond driver.MaxTime is refused by ParseToken
// with ErrInvalidToken: no Limiter makes one (it caps it at MaxTime), and
// its settlement is an op every store refuses, which Settle reported as a
// store failure that may have taken effect. Its job time may lie beyond:
// a wait of years from near the bound.
func TestTokenWithTimesBeyondMaxTimeIsRefused(t *testing.T) {
	near := driver.MaxTime - 1000
	for _, tc := range []struct {
		run, until uint64
		ok         bool
	}{
		{0, 1000, true},
		{1000, 1000, true},
		{5000, 1000, true},
		{0, 1001, false},
		{1001, 1001, false},
		{0, uint64(2 * driver.MaxTime), false},
	} {
		_, err := ratelimit.ParseToken(tokenOfTimes(near, tc.run, tc.until, tokenItem{"jobs", 0}))
		if tc.ok {
			require.NoError(t, err, "run %d, until %d", tc.run, tc.until)
		} else {
			require.ErrorIs(t, err, ratelimit.ErrInvalidToken, "run %d, until %d", tc.run, tc.until)
		}
	}
}

// A reservation made near driver.MaxTime whose job time lies beyond it
// (ParseToken reads such a token: a long wait near the bound) is settled
// like any other, by its own Cancel and by a holder's Refund or Use. Its
// refunds used to send the store the job's time as it was, beyond
// MaxTime, an op every store refuses: Cancel and Refund failed with what
// read as a store failure, retried in vain, and the tokens never came back.
func TestTokenWhoseJobRunsBeyondMaxTimeSettles(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	mock.Set(time.UnixMilli(driver.MaxTime - 1000))
	lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, MaxReserved: 100},
	}, ratelimit.WithClock(mock)))
	keys := 0
	reserve := func() *ratelimit.Reservation {
		keys++
		r, err := lim.Reserve(ctx, "jobs", fmt.Sprint("k", keys), ratelimit.Count(50))
		require.NoError(t, err)
		require.True(t, r.OK())
		require.Greater(t, r.Token().RunAt().UnixMilli(), driver.MaxTime, "the job's time lies beyond MaxTime")
		return r
	}
	r := reserve()
	require.NoError(t, r.Cancel(ctx))
	for _, settle := range []func(*ratelimit.Token) error{
		func(tok *ratelimit.Token) error { return lim.Refund(ctx, tok) },
		func(tok *ratelimit.Token) error { return lim.Use(ctx, tok) },
	} {
		tok, err := ratelimit.ParseToken(reserve().Token().String())
		require.NoError(t, err)
		require.NoError(t, settle(tok))
		require.ErrorIs(t, settle(tok), ratelimit.ErrAlreadySettled, "settled once")
	}
}

// A holder of a token whose settlement's answer was lost (the store took
// it) retries it with the same Settler: the retry finds its own
// settlement and returns nil, as a Reservation's Wait or Cancel does, and
// the store settled the token once. Another settler's, or none's, or the
// same settler's other settlement (another kind, or a Settle of another
// amount) is still a *SettledError: the call did nothing. Without
// Settler, a retry could not tell its own use from another worker's, and
// a worker fleet lost the job or ran it twice.
func TestHolderRetriedWithItsSettler(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0}}
	a, b := ratelimit.Settler([16]byte{'a'}), ratelimit.Settler([16]byte{'b'})
	type settle func(lim *ratelimit.Limiter, tok *ratelimit.Token, opts ...ratelimit.SettleOption) error
	use := func(lim *ratelimit.Limiter, tok *ratelimit.Token, opts ...ratelimit.SettleOption) error {
		return lim.Use(ctx, tok, opts...)
	}
	refund := func(lim *ratelimit.Limiter, tok *ratelimit.Token, opts ...ratelimit.SettleOption) error {
		return lim.Refund(ctx, tok, opts...)
	}
	settleN := func(n float64) settle {
		return func(lim *ratelimit.Limiter, tok *ratelimit.Token, opts ...ratelimit.SettleOption) error {
			return lim.Settle(ctx, tok, n, opts...)
		}
	}
	for _, key := range [][]byte{nil, []byte("token key of the fleet, 32 bytes")} {
		for _, tc := range []struct {
			name   string
			settle settle
			left   float64 // Remaining after the settlement of a charge of 4 of 10
			same   []settle
			other  []settle // the same settler's other settlements
			kind   error
		}{
			{"Use", use, 6, []settle{settleN(4), settleN(9)}, []settle{refund, settleN(2), settleN(0)}, ratelimit.ErrReservationUsed},
			{"Refund", refund, 10, []settle{settleN(0)}, []settle{use, settleN(2)}, ratelimit.ErrReservationCanceled},
			{"Settle", settleN(1), 9, nil, []settle{use, refund, settleN(2), settleN(0.5)}, ratelimit.ErrReservationUsed},
		} {
			name := fmt.Sprintf("%s key=%t", tc.name, key != nil)
			mem := must(memstore.New())
			flaky := &flakyStore{Store: mem}
			store := &lostReplyStore{Store: flaky}
			var opts []ratelimit.Option
			if key != nil {
				opts = append(opts, ratelimit.WithTokenKey(key))
			}
			owner := must(ratelimit.New(mem, limits, append(opts, ratelimit.WithClock(newMock()))...))
			holder := must(ratelimit.New(store, limits, append(opts, ratelimit.WithClock(newMock()))...))
			other := must(ratelimit.New(mem, limits, append(opts, ratelimit.WithClock(newMock()))...))
			reserve := func(k string) *ratelimit.Token {
				r, err := owner.Reserve(ctx, "jobs", k, ratelimit.Count(4))
				require.NoError(t, err)
				tok, err := ratelimit.ParseToken(r.Token().String())
				require.NoError(t, err)
				return tok
			}
			remaining := func(k string) float64 {
				st, err := owner.Value(ctx, "jobs", k)
				require.NoError(t, err)
				return st.Remaining
			}

			// The answer lost: the retry finds its own settlement.
			tok := reserve("lost")
			store.lose.Store(true)
			require.Error(t, tc.settle(holder, tok, a), name)
			store.lose.Store(false)
			require.NoError(t, tc.settle(holder, tok, a), "%s: the retry finds its own settlement", name)
			require.NoError(t, tc.settle(holder, tok, a), name)
			require.NoError(t, tc.settle(other, tok, a), "%s: the settler's, from any process", name)
			for i, s := range tc.same {
				require.NoError(t, s(holder, tok, a), "%s: the same settlement, said another way (%d)", name, i)
			}
			require.Equal(t, tc.left, remaining("lost"), "%s: settled once", name)
			for i, s := range tc.other {
				err := s(holder, tok, a)
				require.ErrorIs(t, err, tc.kind, "%s: the settler's other settlement (%d) did not happen", name, i)
				var se *ratelimit.SettledError
				require.ErrorAs(t, err, &se, name)
			}
			for _, opts := range [][]ratelimit.SettleOption{{b}, nil, {{}}} {
				err := tc.settle(holder, tok, opts...)
				require.ErrorIs(t, err, tc.kind, "%s: another settler's, or none's (%v)", name, opts)
				require.ErrorIs(t, err, ratelimit.ErrAlreadySettled, name)
			}
			require.Equal(t, tc.left, remaining("lost"), name)

			// Never sent: another settler settled it meanwhile, and the
			// retry finds that one's settlement, not its own.
			tok = reserve("never")
			flaky.fail.Store(true)
			require.ErrorIs(t, tc.settle(holder, tok, a), errDown, name)
			flaky.fail.Store(false)
			require.NoError(t, tc.settle(other, tok, b), name)
			err := tc.settle(holder, tok, a)
			require.ErrorIs(t, err, tc.kind, "%s: the other settler's: the job is not this one's", name)
			require.NoError(t, tc.settle(other, tok, b), name)

			// Without a settler, the retry cannot tell: as before.
			tok = reserve("none")
			store.lose.Store(true)
			require.Error(t, tc.settle(holder, tok), name)
			store.lose.Store(false)
			require.ErrorIs(t, tc.settle(holder, tok), tc.kind, "%s: a settlement of no settler is nobody's own", name)
			require.ErrorIs(t, tc.settle(holder, tok, a), tc.kind, name)
		}
	}
}

// Settler with an all-zero ID, which names no settler, is refused with an
// error matching ErrInvalidOption, and nothing is settled; the zero
// SettleOption changes nothing.
func TestSettlerOfZeroIsRefused(t *testing.T) {
	ctx := context.Background()
	lim := jobsLimiter(must(memstore.New()))
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
	require.NoError(t, err)
	tok := r.Token()
	zero := ratelimit.Settler([16]byte{})
	for _, err := range []error{
		lim.Use(ctx, tok, zero),
		lim.Refund(ctx, tok, zero),
		lim.Settle(ctx, tok, 1, zero),
		lim.Settle(ctx, tok, 0, zero),
		lim.Use(ctx, tok, ratelimit.Settler([16]byte{1}), zero),
	} {
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
		require.ErrorContains(t, err, "all zero")
	}
	require.NoError(t, lim.Use(ctx, tok, ratelimit.SettleOption{}), "nothing was settled")
	require.ErrorIs(t, lim.Use(ctx, tok, ratelimit.SettleOption{}), ratelimit.ErrReservationUsed)
}

// A token that carries a use (taken after its job was let run) is no
// holder's own use: Use with a Settler returns a *SettledError, and the
// job does not run twice.
func TestSettlerOfATokenTakenAfterTheJobRan(t *testing.T) {
	ctx := context.Background()
	lim := jobsLimiter(must(memstore.New()))
	r, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	tok := r.Token()
	for range 2 {
		require.ErrorIs(t, lim.Use(ctx, tok, ratelimit.Settler([16]byte{'a'})), ratelimit.ErrReservationUsed)
	}
}
