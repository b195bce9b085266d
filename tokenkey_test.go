package ratelimit_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	oldTokenKey   = []byte("the fleet's old token key, 32 B.")
	newTokenKey   = []byte("the fleet's new token key, 32 B.")
	otherTokenKey = []byte("a key nobody in the fleet knows..")
)

var rotationLimits = ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 1000, Period: time.Minute, MaxReserved: 100}}

// A token signed with the old key settles in a Limiter that signs with the
// new key and accepts the old one, and the tokens that Limiter makes carry
// the new key's tag. A token signed with a key the Limiter neither signs
// with nor accepts is refused. Before, a Limiter knew one key: a fleet
// could not change it without refusing every token queued under the old
// one.
func TestTokenKeyAcceptsPreviousKeys(t *testing.T) {
	ctx := context.Background()
	clk := newMock()
	store := must(memstore.New())
	newLim := func(opts ...ratelimit.Option) *ratelimit.Limiter {
		return must(ratelimit.New(store, rotationLimits, append(opts, ratelimit.WithClock(clk))...))
	}
	old := newLim(ratelimit.WithTokenKey(oldTokenKey))
	rotated := newLim(ratelimit.WithTokenKey(newTokenKey, oldTokenKey))
	next := newLim(ratelimit.WithTokenKey(newTokenKey))
	stranger := newLim(ratelimit.WithTokenKey(otherTokenKey))
	plain := newLim()
	reserve := func(lim *ratelimit.Limiter) *ratelimit.Token {
		r, err := lim.Reserve(ctx, "jobs", "k")
		require.NoError(t, err)
		tok, err := ratelimit.ParseToken(r.Token().String())
		require.NoError(t, err)
		return tok
	}

	require.NoError(t, rotated.Use(ctx, reserve(old)), "signed with the old key, accepted")
	require.NoError(t, rotated.Use(ctx, reserve(rotated)), "signed with its own key")
	require.NoError(t, next.Use(ctx, reserve(rotated)), "the rotated Limiter signs with the new key")
	require.ErrorIs(t, old.Use(ctx, reserve(rotated)), ratelimit.ErrInvalidToken, "not with the old one")

	tok := reserve(stranger)
	err := rotated.Refund(ctx, tok)
	require.ErrorIs(t, err, ratelimit.ErrInvalidToken, "a key neither signing nor accepted")
	assert.Contains(t, err.Error(), "nor with a key it accepts")
	require.ErrorIs(t, rotated.Use(ctx, reserve(plain)), ratelimit.ErrInvalidToken, "unsigned, and unsigned not accepted")
	require.NoError(t, stranger.Use(ctx, tok), "the refused settlement left it unsettled")

	// An altered token fails under every key.
	raw := []byte(reserve(old).String())
	raw[len(raw)/2] ^= 1
	if forged, err := ratelimit.ParseToken(string(raw)); err == nil {
		require.ErrorIs(t, rotated.Refund(ctx, forged), ratelimit.ErrInvalidToken)
	}
}

// Each accepted key obeys MinKeySecret, as the signing key does, and a key
// given twice is a configuration error, not a silent no-op: a rotation's
// keys are different secrets.
func TestTokenKeyAcceptedKeyErrors(t *testing.T) {
	short := []byte("fifteen bytes!!")
	for _, c := range []struct {
		name     string
		accepted [][]byte
		want     string
	}{
		{"empty", [][]byte{nil}, "accepted key 1 has 0 bytes, fewer than 16"},
		{"short", [][]byte{oldTokenKey, short}, "accepted key 2 has 15 bytes"},
		{"same as the signing key", [][]byte{append([]byte(nil), newTokenKey...)}, "accepted key 1 is the same as the signing key"},
		{"twice", [][]byte{oldTokenKey, otherTokenKey, append([]byte(nil), oldTokenKey...)}, "accepted key 3 is the same as accepted key 1"},
	} {
		_, err := ratelimit.New(must(memstore.New()), rotationLimits, ratelimit.WithTokenKey(newTokenKey, c.accepted...))
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, c.name)
		assert.Contains(t, err.Error(), "WithTokenKey", c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
		assert.NotContains(t, err.Error(), string(oldTokenKey), "%s: no secret in the message", c.name)
		assert.NotContains(t, err.Error(), string(newTokenKey), "%s: no secret in the message", c.name)
	}
	_, err := ratelimit.New(must(memstore.New()), rotationLimits, ratelimit.WithTokenKey(newTokenKey, oldTokenKey, otherTokenKey))
	require.NoError(t, err)

	// The caller's slices may change after the option is made.
	key, prev := append([]byte(nil), newTokenKey...), append([]byte(nil), oldTokenKey...)
	store := must(memstore.New())
	lim := must(ratelimit.New(store, rotationLimits, ratelimit.WithTokenKey(key, prev)))
	key[0], prev[0] = 'X', 'X'
	old := must(ratelimit.New(store, rotationLimits, ratelimit.WithTokenKey(oldTokenKey)))
	r, err := old.Reserve(context.Background(), "jobs", "k")
	require.NoError(t, err)
	require.NoError(t, lim.Use(context.Background(), r.Token()))
}

// rollOut runs a fleet of three Limiters over one store through stages,
// each a list of options for New, rolled out one process at a time, a
// minute apart, and returns how many tokens the fleet settled and how
// many it refused. At every step (one process restarted with the next
// stage's options), each process makes three tokens for each process: one
// settled at once, one at the next step, after the next restart, and one
// as late as it may be, in the last step before it expires. Before the
// last stage rolls out, the clock moves past the expiry of every token
// made while some process had not reached the stage before it: the wait of
// the procedure, before which the late tokens still pending are settled;
// unless noWait.
func rollOut(t *testing.T, noWait bool, stages ...[]ratelimit.Option) (settled, refused int) {
	t.Helper()
	ctx := context.Background()
	clk := newMock()
	store := must(memstore.New())
	start := func(stage int) *ratelimit.Limiter {
		return must(ratelimit.New(store, rotationLimits, append(stages[stage], ratelimit.WithClock(clk))...))
	}
	const n = 3
	var (
		procs     [n]*ratelimit.Limiter
		stageOf   [n]int
		pending   []queued
		lastMixed time.Time
	)
	for i := range procs {
		procs[i] = start(0)
	}
	settle := func(q queued) {
		tok, err := ratelimit.ParseToken(q.tok)
		require.NoError(t, err)
		if err := procs[q.by].Use(ctx, tok); err != nil {
			require.ErrorIs(t, err, ratelimit.ErrInvalidToken, "a token refused for its key, and for no other reason")
			refused++
			return
		}
		settled++
	}
	// settleBefore settles the pending tokens due before until.
	settleBefore := func(until time.Time) {
		keep := pending[:0]
		for _, q := range pending {
			if q.due.Before(until) {
				settle(q)
			} else {
				keep = append(keep, q)
			}
		}
		pending = keep
	}
	step := func() {
		now := clk.Now()
		settleBefore(now.Add(time.Minute))
		mixed := false
		for _, s := range stageOf {
			mixed = mixed || s < len(stages)-2
		}
		for p := range procs {
			for c := range procs {
				for when := range 3 {
					r, err := procs[p].Reserve(ctx, "jobs", "k")
					require.NoError(t, err)
					tok := r.Token()
					if mixed && tok.Expires().After(lastMixed) {
						lastMixed = tok.Expires()
					}
					q := queued{tok: tok.String(), by: c}
					switch when {
					case 0:
						settle(q)
						continue
					case 1:
						q.due = now.Add(time.Minute)
					case 2:
						q.due = tok.Expires()
					}
					pending = append(pending, q)
				}
			}
		}
		clk.Add(time.Minute)
	}
	step()
	for s := 1; s < len(stages); s++ {
		if wait := lastMixed.Add(time.Millisecond); s == len(stages)-1 && !noWait && clk.Now().Before(wait) {
			settleBefore(wait)
			clk.Set(wait)
		}
		for i := range procs {
			procs[i], stageOf[i] = start(s), s
			step()
		}
	}
	settleBefore(clk.Now().Add(time.Hour))
	require.Empty(t, pending)
	return settled, refused
}

type queued struct {
	tok string
	by  int       // the process that settles it
	due time.Time // the last moment it is settled
}

// The procedure of docs/reservations.md ("Rotating the token key") takes a
// fleet from one key to another, and from unsigned tokens to signed ones
// and back, without refusing a token, while each process restarts in
// turn and tokens made before a restart are settled after it, some as
// late as they may be. The shortcuts refuse tokens: going straight from
// one configuration to the other, leaving out the first step, or not
// waiting for the tokens of the old configuration to expire before the
// last step; they are the controls that show the fleet would notice.
func TestTokenKeyRotationDropsNoToken(t *testing.T) {
	key := ratelimit.WithTokenKey
	unsigned := ratelimit.WithUnsignedTokensAccepted()
	// A fleet of 3 makes 27 tokens a step, at the first step and at each
	// of 3 restarts a stage.
	tokens := func(stages int) int { return 27 * (1 + 3*(stages-1)) }
	for _, c := range []struct {
		name    string
		stages  [][]ratelimit.Option
		noWait  bool
		refuses bool
	}{
		{"rotation", [][]ratelimit.Option{
			{key(oldTokenKey)},
			{key(oldTokenKey, newTokenKey)}, // 1: accept the new key everywhere
			{key(newTokenKey, oldTokenKey)}, // 2: sign with it, accept the old one
			{key(newTokenKey)},              // 3: once the old tokens expired, drop the old key
		}, false, false},
		{"rotation without the wait", [][]ratelimit.Option{
			{key(oldTokenKey)}, {key(oldTokenKey, newTokenKey)}, {key(newTokenKey, oldTokenKey)}, {key(newTokenKey)},
		}, true, true},
		{"rotation in one step", [][]ratelimit.Option{{key(oldTokenKey)}, {key(newTokenKey)}}, false, true},
		{"rotation without accepting the new key first", [][]ratelimit.Option{
			{key(oldTokenKey)}, {key(newTokenKey, oldTokenKey)}, {key(newTokenKey)},
		}, false, true},
		{"to signed tokens", [][]ratelimit.Option{
			{},
			{key(newTokenKey), unsigned}, // sign, and accept the unsigned tokens still queued
			{key(newTokenKey)},           // once they expired, refuse unsigned tokens
		}, false, false},
		{"to signed tokens in one step", [][]ratelimit.Option{{}, {key(newTokenKey)}}, false, true},
		{"to signed tokens without the wait", [][]ratelimit.Option{
			{}, {key(newTokenKey), unsigned}, {key(newTokenKey)},
		}, true, true},
		{"to unsigned tokens", [][]ratelimit.Option{
			{key(oldTokenKey)},
			{key(oldTokenKey), unsigned}, // accept the unsigned tokens to come
			{},                           // stop signing
		}, false, false},
		{"to unsigned tokens in one step", [][]ratelimit.Option{{key(oldTokenKey)}, {}}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			settled, refused := rollOut(t, c.noWait, c.stages...)
			require.Equal(t, tokens(len(c.stages)), settled+refused)
			if c.refuses {
				require.NotZero(t, refused, "the control refuses tokens")
			} else {
				require.Zero(t, refused, "tokens refused")
			}
		})
	}
}

// WithUnsignedTokensAccepted takes unsigned tokens, and still refuses a
// signed one whose tag is not valid under any key of the Limiter; without
// WithTokenKey it changes nothing.
func TestUnsignedTokensAccepted(t *testing.T) {
	ctx := context.Background()
	store := must(memstore.New())
	newLim := func(opts ...ratelimit.Option) *ratelimit.Limiter {
		return must(ratelimit.New(store, rotationLimits, append(opts, ratelimit.WithClock(newMock()))...))
	}
	moving := newLim(ratelimit.WithTokenKey(newTokenKey), ratelimit.WithUnsignedTokensAccepted())
	signed := newLim(ratelimit.WithTokenKey(newTokenKey))
	plain := newLim(ratelimit.WithUnsignedTokensAccepted())
	stranger := newLim(ratelimit.WithTokenKey(otherTokenKey))
	token := func(lim *ratelimit.Limiter) *ratelimit.Token {
		r, err := lim.Reserve(ctx, "jobs", "k")
		require.NoError(t, err)
		return r.Token()
	}

	require.NoError(t, moving.Use(ctx, token(plain)), "unsigned, accepted")
	require.NoError(t, signed.Use(ctx, token(moving)), "it signs its tokens")
	require.ErrorIs(t, moving.Use(ctx, token(stranger)), ratelimit.ErrInvalidToken, "a bad tag is refused still")
	require.NoError(t, plain.Use(ctx, token(stranger)), "a Limiter without a key takes every token, as before")
	err := signed.Use(ctx, token(plain))
	require.ErrorIs(t, err, ratelimit.ErrInvalidToken)
	assert.Contains(t, err.Error(), "WithUnsignedTokensAccepted", "the message names the way out")
}

// What a forger can do where unsigned tokens are taken (a Limiter without
// a key, or one WithUnsignedTokensAccepted): a signed token stripped of
// its tag settles, and forged tokens, each with a new ID, refill a key
// as often as the forger likes, a capacity at a time, past any limit; the
// mark of each stays in the store as long as the forged token says. A
// Limiter with the key alone refuses them all. The docs said a forged
// token hands back no more than a limit's capacity, which reads as a
// bound: it bounds one token, not the forger.
func TestUnsignedTokensAcceptedLetAForgerLiftTheLimit(t *testing.T) {
	ctx := context.Background()
	clk := newMock()
	store := must(memstore.New())
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0}}
	moving := must(ratelimit.New(store, limits, ratelimit.WithClock(clk), ratelimit.WithTokenKey(newTokenKey), ratelimit.WithUnsignedTokensAccepted()))
	signed := must(ratelimit.New(store, limits, ratelimit.WithClock(clk), ratelimit.WithTokenKey(newTokenKey)))

	r, err := moving.Reserve(ctx, "jobs", "other")
	require.NoError(t, err)
	raw, err := base64.RawURLEncoding.DecodeString(r.Token().String())
	require.NoError(t, err)
	raw[1] &^= 1 // the tag flag
	stripped, err := ratelimit.ParseToken(base64.RawURLEncoding.EncodeToString(raw[:len(raw)-16]))
	require.NoError(t, err)
	require.ErrorIs(t, signed.Refund(ctx, stripped), ratelimit.ErrInvalidToken)
	require.NoError(t, moving.Refund(ctx, stripped), "the tag stripped, the token settles")

	const years = 30 * 365 * 24 * time.Hour
	granted := 0
	for i := range 5 {
		for {
			res, err := moving.Limit(ctx, "jobs", "k")
			require.NoError(t, err)
			if !res.OK {
				break
			}
			granted++
		}
		// A token made by hand, unsigned, with a new ID each time: 10
		// tokens of key "k" charged now, settled for decades.
		forged, err := ratelimit.ParseToken(forgedToken(byte(i+1), clk.Now().UnixMilli(), uint64(years.Milliseconds()), 10))
		require.NoError(t, err)
		require.ErrorIs(t, signed.Refund(ctx, forged), ratelimit.ErrInvalidToken)
		require.NoError(t, moving.Refund(ctx, forged))
		assert.Greater(t, forged.Expires(), clk.Now().Add(years-time.Hour), "its mark lives as long as it says")
	}
	assert.Equal(t, 50, granted, "five capacities of 10 in one window")
}

// forgedToken returns the text form of an unsigned token made by hand,
// with an ID of id: amount tokens of limit "jobs", shard 0, key "k",
// charged at at (Unix ms), settled until ms later.
func forgedToken(id byte, at int64, until uint64, amount float64) string {
	b := []byte{1, 0} // version, flags: no tag
	b = append(b, bytes.Repeat([]byte{id}, 16)...)
	b = binary.AppendVarint(b, at)
	b = binary.AppendUvarint(b, 0)
	b = binary.AppendUvarint(b, until)
	b = binary.AppendUvarint(b, 1)
	b = append(b, 'k')
	b = binary.AppendUvarint(b, 1)
	b = binary.AppendUvarint(b, 4)
	b = append(b, "jobs"...)
	b = binary.AppendUvarint(b, 0)
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(amount))
	return base64.RawURLEncoding.EncodeToString(b)
}

// HMAC pads a key shorter than its block with zero bytes, so a key of
// zero bytes only signs as the empty key: anyone can tag a token with
// it. Such a key is what a buffer made for the secret and never filled
// holds (make([]byte, 32), or a hex decode of an unset variable into
// it), and New took it as a 32-byte secret: the Limiter then settled a
// token forged with the empty key. New refuses it, as it does the empty
// key, and so does Verify.
func TestTokenKeyRefusesAZeroKey(t *testing.T) {
	ctx := context.Background()
	zero := make([]byte, 32)
	for _, c := range []struct {
		name string
		opt  ratelimit.Option
		want string
	}{
		{"signing", ratelimit.WithTokenKey(zero), "the key is 32 zero bytes"},
		{"long", ratelimit.WithTokenKey(make([]byte, 100)), "the key is 100 zero bytes"},
		{"accepted", ratelimit.WithTokenKey(newTokenKey, oldTokenKey, make([]byte, 16)), "accepted key 2 is 16 zero bytes"},
	} {
		_, err := ratelimit.New(must(memstore.New()), rotationLimits, c.opt)
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, c.name)
		assert.Contains(t, err.Error(), "WithTokenKey", c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
	}

	// The forgery the key let through: a token tagged under the empty key.
	raw, err := base64.RawURLEncoding.DecodeString(forgedToken(7, t0.UnixMilli(), 600_000, 10))
	require.NoError(t, err)
	raw[1] = 1 // the flag of a tag
	mac := hmac.New(sha256.New, nil)
	mac.Write(raw)
	forged, err := ratelimit.ParseToken(base64.RawURLEncoding.EncodeToString(mac.Sum(raw)[:len(raw)+16]))
	require.NoError(t, err)
	require.True(t, forged.Signed())
	err = forged.Verify(zero)
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.Contains(t, err.Error(), "the key is 32 zero bytes")
	require.ErrorIs(t, forged.Verify(newTokenKey, zero), ratelimit.ErrInvalidOption)
	lim := must(ratelimit.New(must(memstore.New()), rotationLimits, ratelimit.WithTokenKey(newTokenKey)))
	require.ErrorIs(t, lim.Refund(ctx, forged), ratelimit.ErrInvalidToken)
}

// HMAC hashes a key longer than its block (64 bytes) and pads a shorter
// one with zero bytes: a key and itself followed by zero bytes, or a long
// key and its SHA-256, are one key, whose tokens each takes for its own.
// WithTokenKey refuses them as a key given twice, as it does two equal
// ones: the rotation they meant to make does not happen.
func TestTokenKeyRefusesKeysHMACTakesForOne(t *testing.T) {
	long := bytes.Repeat([]byte("a long token key "), 5)
	sum := sha256.Sum256(long)
	for _, c := range []struct {
		name string
		opt  ratelimit.Option
		want string
	}{
		{"zero bytes after", ratelimit.WithTokenKey(newTokenKey, append(bytes.Clone(newTokenKey), 0, 0)), "accepted key 1 is the same as the signing key"},
		{"the hash of a long key", ratelimit.WithTokenKey(newTokenKey, long, sum[:]), "accepted key 2 is the same as accepted key 1"},
	} {
		_, err := ratelimit.New(must(memstore.New()), rotationLimits, c.opt)
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
	}
	// What they let through: each signs as the other.
	signer := must(ratelimit.New(must(memstore.New()), rotationLimits, ratelimit.WithTokenKey(long)))
	r, err := signer.Reserve(context.Background(), "jobs", "k")
	require.NoError(t, err)
	require.NoError(t, r.Token().Verify(sum[:]), "a token of the long key is valid under its hash")
}
