package ratelimit

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
)

// Settling reservations and receipts by token: any process with a
// Limiter on the same store and the same limits can hand a charge's tokens
// back (Refund), spend them (Use) or spend part of them (Settle), at most
// once in all, the store keeping the once (docs/reservations.md).

// DefaultSettleWindow is how long past a token's job time (or, for a plain
// charge, its charge) the token may still be settled, unless
// WithSettleWindow says otherwise.
const DefaultSettleWindow = 15 * time.Minute

// Token names a charge that may be settled once: a reservation's tokens
// (Reservation.Token), or a receipt (Result.Token, with WithReceipt). It
// holds a random 128-bit ID, the store key, each limit, shard and amount
// charged, when the charge was made and when its job may run. Its text
// form (String, MarshalText) is compact, URL-safe and opaque; ParseToken
// or UnmarshalText read it back.
//
// A Token is a capability: whoever holds it can settle it, and a forged
// one hands back tokens never charged. Each forged token hands back at
// most each limit's capacity, but a forger makes as many as it likes,
// each with a new ID: it can refill any key of any limit it names, again
// and again, which lifts the limit; and the store keeps the mark of each
// until the Expires the forger chose. Keep tokens where only your workers
// read them, or authenticate them with WithTokenKey, whose keys may be
// rotated (and do not leave WithUnsignedTokensAccepted on).
//
// A reservation's token taken after its job was let run (Reservation.Token
// after Wait returned nil, or after AfterFunc ran its function) carries
// that use: settling it, in any process, does nothing and returns a
// *SettledError of kind driver.SettleUse, as for a token marked used.
//
// A nil *Token, which Reservation.Token and Result.Token return where
// there is no token, answers as the zero Token does: ID all zeros, Key
// empty, Items empty, Charged 0, RunAt, ChargedAt and Expires the Unix
// epoch, Signed and CarriesUse false, Verify an error matching
// ErrInvalidToken; settling it is an error matching ErrInvalidToken too,
// and UnmarshalText, which has nowhere to write, one matching
// ErrInvalidOption. String and MarshalText take a Token value, which Go
// reads through the pointer: called on a nil *Token they panic, as any
// method on a value does; fmt prints a nil *Token as <nil>, and
// encoding/json writes it as null.
type Token struct {
	id    [16]byte
	mac   bool
	used  bool   // made after its job was let run: settled as used
	key   string // the store key the charge was made under
	at    int64  // the charge's time, Unix ms (Decision.Now)
	run   int64  // when the job may run, Unix ms
	until int64  // the last Unix ms it may be settled
	items []tokenItem
	tag   [tagLen]byte
}

type tokenItem struct {
	name   string
	shard  int
	amount float64
}

const (
	tokenVersion = 1
	// maxTokenVersion is the highest version byte taken for a later
	// release's token, rather than for bytes of no token at all: a
	// release changes the format seldom, by one version at a time.
	maxTokenVersion = 8
	// minTokenBytes is the fewest bytes of a token's binary form: the
	// version, flags, ID, three times of a byte each, an empty store key,
	// and one item of an empty name.
	minTokenBytes = 2 + 16 + 3 + 1 + 1 + (1 + 1 + 8)
	tokenMAC      = 1 // flag: a tag follows
	tokenUsed     = 2 // flag: made after its job was let run (Token.used)
	tagLen        = 16
	// maxTokenBytes bounds a token's binary form, against garbage.
	maxTokenBytes = 64 << 10
	// maxTokenItems bounds the shards a token charges, against garbage:
	// a receipt of LimitAll of up to 512 sharded limits. A call with
	// WithReceipt whose receipt would not be read back is refused
	// (receiptFits).
	maxTokenItems = 1024
	// maxTokenKey is the longest store key a Limiter puts in a token
	// (storeKey): a key as given, up to maxRawKey bytes; its digest form
	// and its keyed hash (WithKeyHash) are shorter. A token with a longer
	// key is forged, and refused.
	maxTokenKey = maxRawKey
)

// zeroToken is what the methods of a nil *Token read: the zero Token.
var zeroToken Token

// orZero returns t, or the zero Token when t is nil.
func (t *Token) orZero() *Token {
	if t == nil {
		return &zeroToken
	}
	return t
}

// Neither the digest form of a long key nor a keyed hash is longer than
// maxTokenKey: a Limiter can read back every token it makes.
const (
	_ = uint(maxTokenKey - longKeyLen)
	_ = uint(maxTokenKey - keyHashLen)
)

// ID returns the token's ID: 128 random bits, unique to the charge.
func (t *Token) ID() [16]byte { return t.orZero().id }

// RunAt returns when the charge's job may run, on the clock that decided
// its charge (see Expires): for a reservation, its Time (on a store's own
// clock, the store's time then); for a plain charge, the time of the
// charge.
func (t *Token) RunAt() time.Time { return time.UnixMilli(t.orZero().run) }

// Expires returns the last moment the token may be settled, on the clock
// that decided its charge: the Limiter's, or the store's for a store that
// keeps its own clock (driver.TimeSource), whose time the Limiter then
// reads before each settlement.
func (t *Token) Expires() time.Time { return time.UnixMilli(t.orZero().until) }

// Charged returns the tokens charged to the named limit, all its shards
// together.
func (t *Token) Charged(name string) float64 {
	var n float64
	for _, it := range t.orZero().items {
		if it.name == name {
			n += it.amount
		}
	}
	return n
}

// Key returns the store key the charge was made under: the key as the
// store knows it, which is the caller's key only when the Limiter gave it
// as it is. Under WithKeyHash it is the key's keyed hash, and without it a
// key longer than 256 bytes is its digest form (docs/api.md#keys).
func (t *Token) Key() string { return t.orZero().key }

// ChargedAt returns when the charge was made, on the clock that decided
// it (see Expires).
func (t *Token) ChargedAt() time.Time { return time.UnixMilli(t.orZero().at) }

// TokenItem is one shard a Token charged: the limit's name, the shard
// and the tokens charged to it.
type TokenItem struct {
	Name   string  // the limit's name
	Shard  int     // the shard charged, from 0
	Amount float64 // the tokens charged to the shard
}

// Items returns what the token charged, shard by shard, in the order of
// the charge: one item for an unsharded limit, two for a sharded one
// (the two shards a call evaluates), for each limit of the call. The
// slice is a copy, the caller's to keep.
func (t *Token) Items() []TokenItem {
	t = t.orZero()
	items := make([]TokenItem, len(t.items))
	for i, it := range t.items {
		items[i] = TokenItem{Name: it.name, Shard: it.shard, Amount: it.amount}
	}
	return items
}

// Signed reports whether the token carries a tag: it was made by a
// Limiter with WithTokenKey. Whether the tag is valid is Verify's to say.
func (t *Token) Signed() bool { return t != nil && t.mac }

// CarriesUse reports whether the token carries its use: it was taken
// after its job was let run (Reservation.Token after Wait returned nil,
// or after AfterFunc ran its function). Settling it does nothing, in any
// process, and returns a *SettledError of kind driver.SettleUse. A token
// used through the store (Use, Settle) does not carry it: the store's
// mark does, which only a settlement reads.
func (t *Token) CarriesUse() bool { return t != nil && t.used }

// Verify checks the token's tag as a Limiter with WithTokenKey(key,
// accepted...) does before it settles the token: nil if the tag is valid
// under key or under one of accepted, and an error matching
// ErrInvalidToken if it is valid under none of them, or if the token
// carries no tag (as a Limiter without WithUnsignedTokensAccepted
// refuses it). A key shorter than MinKeySecret, or of zero bytes alone,
// which WithTokenKey refuses, is an error matching ErrInvalidOption. It
// reads no store: a valid tag says the token was made by a holder of the
// key, not that it may still be settled. No token (nil, or the zero
// Token) is an error matching ErrInvalidToken, as Use, Refund and Settle
// say of it.
func (t *Token) Verify(key []byte, accepted ...[]byte) error {
	if fault := tokenKeyFault(key, accepted); fault != "" {
		return fmt.Errorf("ratelimit: verify token: %s; WithTokenKey takes no such key: give the token keys the Limiters are given: %w", fault, ErrInvalidOption)
	}
	keys := append([][]byte{key}, accepted...)
	if t == nil || len(t.items) == 0 {
		return fmt.Errorf("ratelimit: verify token: no token (nil, or the zero Token): give one that ParseToken read: %w", ErrInvalidToken)
	}
	if !t.mac {
		return fmt.Errorf("ratelimit: token %x carries no tag: it was made by a Limiter without WithTokenKey (or its tag was stripped), and a Limiter with a token key refuses it unless given WithUnsignedTokensAccepted: %w", t.id[:4], ErrInvalidToken)
	}
	if t.verify(keys, false) != nil {
		under := "the key given"
		if len(keys) > 1 {
			under = fmt.Sprintf("any of the %d keys given", len(keys))
		}
		return fmt.Errorf("ratelimit: token %x: its tag is not valid under %s: it was forged or altered, or signed with another key: %w", t.id[:4], under, ErrInvalidToken)
	}
	return nil
}

// shardsOf returns the fewest shards the named limit had when it charged
// the token: one more than the highest shard of it the token charges.
func (t *Token) shardsOf(name string) int {
	n := 0
	for _, it := range t.items {
		if it.name == name {
			n = max(n, it.shard+1)
		}
	}
	return n
}

// String returns the token's text form: empty for the zero Token, which
// names no charge. Its receiver is a value, as MarshalText's is.
func (t Token) String() string {
	if len(t.items) == 0 {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(t.appendBinary(nil))
}

// MarshalText implements encoding.TextMarshaler: the text form. Its
// receiver is a value, so that a Token kept by value in a struct that is
// marshaled by value (json.Marshal(job), not &job) is written as its text
// form too, not as an empty object.
//
// The zero Token (of a job that holds none) is the empty text, which
// UnmarshalText reads back as the zero Token.
func (t Token) MarshalText() ([]byte, error) {
	if len(t.items) == 0 {
		return []byte{}, nil
	}
	b := t.appendBinary(nil)
	out := make([]byte, base64.RawURLEncoding.EncodedLen(len(b)))
	base64.RawURLEncoding.Encode(out, b)
	return out, nil
}

// UnmarshalText implements encoding.TextUnmarshaler: it reads the text
// form, and reports a malformed one as an error matching ErrInvalidToken.
// It does not check a tag: the Limiter that settles the token does. The
// empty text is the zero Token, as MarshalText writes it; settling it is
// an error matching ErrInvalidToken. A nil *Token has nowhere to keep
// what it reads: an error matching ErrInvalidOption.
func (t *Token) UnmarshalText(text []byte) error {
	if t == nil {
		return fmt.Errorf("ratelimit: UnmarshalText of a nil *Token, which has nowhere to keep the token: read into a Token (var t ratelimit.Token; t.UnmarshalText(text)), or call ParseToken: %w", ErrInvalidOption)
	}
	if len(text) == 0 {
		*t = Token{}
		return nil
	}
	if len(text) > base64.RawURLEncoding.EncodedLen(maxTokenBytes) {
		return notToken(fmt.Sprintf("its %d bytes are more than any token's", len(text)))
	}
	b := make([]byte, base64.RawURLEncoding.DecodedLen(len(text)))
	n, err := base64.RawURLEncoding.Decode(b, text)
	if err != nil {
		return notToken(fmt.Sprintf("it is not base64url (%v), as every token is", err))
	}
	var u Token
	if err := u.decode(b[:n]); err != nil {
		var nt notTokenError
		if errors.As(err, &nt) {
			return notToken(string(nt))
		}
		return fmt.Errorf("ratelimit: token: %s: %w", err, ErrInvalidToken)
	}
	*t = u
	return nil
}

// ParseToken reads a token's text form (Token.String). A text that is no
// token's (the empty one among them, which is no charge), or a token that
// no Limiter makes (forged: it charges an amount above MaxTokens, more
// than any call can, or carries a store key longer than 256 bytes, the
// longest a Limiter puts in a token, Token.Key), is an error matching
// ErrInvalidToken. It does not
// check a tag: the Limiter that settles the token does (WithTokenKey).
func ParseToken(s string) (*Token, error) {
	if s == "" {
		return nil, fmt.Errorf("ratelimit: token is empty: give the text of a token (Token.String): %w", ErrInvalidToken)
	}
	t := new(Token)
	if err := t.UnmarshalText([]byte(s)); err != nil {
		return nil, err
	}
	return t, nil
}

// body appends the token's binary form, its tag excluded.
func (t *Token) body(b []byte) []byte {
	var flags byte
	if t.mac {
		flags |= tokenMAC
	}
	if t.used {
		flags |= tokenUsed
	}
	b = append(b, tokenVersion, flags)
	b = append(b, t.id[:]...)
	b = binary.AppendVarint(b, t.at)
	b = binary.AppendUvarint(b, uint64(t.run-t.at))
	b = binary.AppendUvarint(b, uint64(t.until-t.at))
	b = binary.AppendUvarint(b, uint64(len(t.key)))
	b = append(b, t.key...)
	b = binary.AppendUvarint(b, uint64(len(t.items)))
	for _, it := range t.items {
		b = binary.AppendUvarint(b, uint64(len(it.name)))
		b = append(b, it.name...)
		b = binary.AppendUvarint(b, uint64(it.shard))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(it.amount))
	}
	return b
}

func (t *Token) appendBinary(b []byte) []byte {
	b = t.body(b)
	if t.mac {
		b = append(b, t.tag[:]...)
	}
	return b
}

// notTokenError is an error of decode for bytes that are no token of this
// library, of any release: what is wrong with them.
type notTokenError string

func (e notTokenError) Error() string { return string(e) }

// byteCount writes n bytes, 1 byte.
func byteCount(n int) string {
	if n == 1 {
		return "1 byte"
	}
	return fmt.Sprintf("%d bytes", n)
}

// notToken is the error of UnmarshalText for a text that is no token of
// this library, and why.
func notToken(why string) error {
	return fmt.Errorf("ratelimit: not a token of this library: %s: give the whole text of a token, as Token.String writes it: %w", why, ErrInvalidToken)
}

// decode reads a token's binary form into t. Bytes that no release could
// have written (their first is no version a release writes, or they end
// before the token of their version does, or run on after it) are a
// notTokenError.
func (t *Token) decode(b []byte) error {
	switch {
	case len(b) == 0:
		return notTokenError("it holds no bytes")
	case b[0] == tokenVersion:
	case b[0] > tokenVersion && b[0] <= maxTokenVersion:
		return fmt.Errorf("version %d, not %d: made by a later release? settle it with that release", b[0], tokenVersion)
	default:
		return notTokenError(fmt.Sprintf("its first byte, a token's version, is %d, which no release writes (this one writes %d)", b[0], tokenVersion))
	}
	if len(b) < minTokenBytes {
		return notTokenError(fmt.Sprintf("it holds %s, fewer than any token's %d", byteCount(len(b)), minTokenBytes))
	}
	r := reader{b: b}
	r.byte()
	flags := r.byte()
	t.mac = flags&tokenMAC != 0
	t.used = flags&tokenUsed != 0
	copy(t.id[:], r.bytes(16))
	t.at = r.varint()
	run, until := r.uvarint(), r.uvarint()
	// Bounded before the read, and before the conversion (as a shard
	// is): a Limiter never makes a longer store key.
	if k := r.uvarint(); k > maxTokenKey {
		r.fail(fmt.Sprintf("a store key of %d bytes, longer than any a Limiter makes (%d)", k, maxTokenKey))
	} else {
		t.key = string(r.bytes(int(k)))
	}
	n := r.uvarint()
	if n == 0 || n > maxTokenItems {
		r.fail("bad item count")
	}
	for range n {
		if r.err != "" {
			break
		}
		it := tokenItem{name: string(r.bytes(int(r.uvarint())))}
		// Bounded before the conversion: 2^63 and more would make a
		// negative int, below every check of a shard index.
		shard := r.uvarint()
		it.shard = int(min(shard, MaxShards))
		it.amount = math.Float64frombits(binary.LittleEndian.Uint64(r.bytes(8)))
		// No call takes more than MaxTokens, nor a shard of it more: a
		// larger amount is forged, and a limit's sum of them could be
		// +Inf.
		if !(it.amount >= 0) || it.amount > MaxTokens || shard >= MaxShards {
			r.fail("bad item")
		}
		t.items = append(t.items, it)
	}
	if r.err == "" && repeats(t.items) {
		r.fail("an item (a limit's shard) twice")
	}
	if t.mac {
		copy(t.tag[:], r.bytes(tagLen))
	}
	switch {
	case r.err == truncated:
		return notTokenError(fmt.Sprintf("its %s end before the token of version %d they begin does (cut short?)", byteCount(len(b)), tokenVersion))
	case r.err != "":
		return errors.New(r.err)
	case len(r.b) != 0:
		return notTokenError(fmt.Sprintf("%s more run on after the token of version %d its first %d begin (two run together?)", byteCount(len(r.b)), tokenVersion, len(b)-len(r.b)))
	case flags&^(tokenMAC|tokenUsed) != 0:
		return errors.New("unknown flags")
	case t.at < -driver.MaxTime || t.at > driver.MaxTime || run > uint64(2*driver.MaxTime) || until > uint64(2*driver.MaxTime),
		t.at+int64(until) > driver.MaxTime:
		// A Limiter caps a token's expiry at MaxTime (settleUntil); a
		// settlement kept beyond it is an op every store refuses. Its job
		// time may lie beyond (a long wait near the bound).
		return errors.New("times out of range")
	}
	t.run, t.until = t.at+int64(run), t.at+int64(until)
	return nil
}

// repeats reports whether items name one limit's shard twice: pair by
// pair for a few, through a set for more (a token holds up to
// maxTokenItems).
func repeats(items []tokenItem) bool {
	type id struct {
		name  string
		shard int
	}
	if len(items) <= 8 {
		for i := range items {
			for _, o := range items[:i] {
				if o.name == items[i].name && o.shard == items[i].shard {
					return true
				}
			}
		}
		return false
	}
	seen := make(map[id]struct{}, len(items))
	for _, it := range items {
		k := id{it.name, it.shard}
		if _, ok := seen[k]; ok {
			return true
		}
		seen[k] = struct{}{}
	}
	return false
}

// truncated is the problem of a reader whose bytes ended before what it
// read.
const truncated = "truncated"

// reader reads a token's binary form; the first problem sticks in err.
type reader struct {
	b   []byte
	err string
}

func (r *reader) fail(msg string) {
	if r.err == "" {
		r.err = msg
	}
	r.b = nil
}

func (r *reader) byte() byte {
	if len(r.b) < 1 {
		r.fail(truncated)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) bytes(n int) []byte {
	if n < 0 || len(r.b) < n {
		r.fail(truncated)
		return make([]byte, max(n, 0)%1024)
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(truncated)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(truncated)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// tokenKeyFault says what makes a key of WithTokenKey, key or one of
// accepted, unfit as a secret, naming it ("the key", "accepted key i"):
// fewer than MinKeySecret bytes, or zero bytes alone, which HMAC takes
// for the empty key; "" when each is fit. WithTokenKey and Token.Verify
// refuse the same keys.
func tokenKeyFault(key []byte, accepted [][]byte) string {
	for i, k := range append([][]byte{key}, accepted...) {
		what := "the key"
		if i > 0 {
			what = fmt.Sprintf("accepted key %d", i)
		}
		switch {
		case len(k) < MinKeySecret:
			return fmt.Sprintf("%s has %d bytes, fewer than %d: use at least %d random bytes (32 from crypto/rand are best)",
				what, len(k), MinKeySecret, MinKeySecret)
		case zeroKey(k):
			return fmt.Sprintf("%s is %d zero bytes, a secret anyone knows (HMAC takes it for the empty key): fill it with random bytes, and check that the configuration read the secret into it",
				what, len(k))
		}
	}
	return ""
}

// zeroKey reports whether key holds zero bytes alone: the buffer of a
// secret never filled. HMAC pads a key shorter than its block with zero
// bytes (and hashes a longer one), so such a key tags as the empty key
// does, or as another key anyone can compute: no secret at all.
func zeroKey(key []byte) bool {
	var or byte
	for _, c := range key {
		or |= c
	}
	return or == 0
}

// sameMACKey reports, in constant time, whether HMAC-SHA-256 takes a and
// b for one key: it hashes a key longer than its block and pads a shorter
// one with zero bytes, so a key and itself followed by zero bytes, or a
// long key and its SHA-256, tag alike.
func sameMACKey(a, b []byte) bool {
	ka, kb := macKey(a), macKey(b)
	return hmac.Equal(ka[:], kb[:])
}

// macKey returns key as HMAC-SHA-256 uses it: a block, of key's SHA-256
// if key is longer, followed by zero bytes.
func macKey(key []byte) [sha256.BlockSize]byte {
	var b [sha256.BlockSize]byte
	if len(key) > sha256.BlockSize {
		sum := sha256.Sum256(key)
		copy(b[:], sum[:])
	} else {
		copy(b[:], key)
	}
	return b
}

// sign sets t's tag under key (none without a key).
func (t *Token) sign(key []byte) {
	if len(key) == 0 {
		return
	}
	t.mac = true
	copy(t.tag[:], t.mac256(key))
}

func (t *Token) mac256(key []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(t.body(nil))
	return h.Sum(nil)[:tagLen]
}

// verify checks t's tag under keys, the Limiter's token keys: a token
// with no keys to check is taken, and so is one without a tag if unsigned
// says unsigned tokens are accepted. Each key is compared in constant
// time; the loop stops at the one that matches, which tells a holder of
// a valid token no more than it knows.
func (t *Token) verify(keys [][]byte, unsigned bool) error {
	if len(keys) == 0 {
		return nil
	}
	if !t.mac {
		if unsigned {
			return nil
		}
		return fmt.Errorf("ratelimit: token %x carries no tag: it was made by a Limiter without WithTokenKey (or its tag was stripped), and this one has a token key; while a fleet moves to signed tokens, give its Limiters WithUnsignedTokensAccepted too: %w", t.id[:4], ErrInvalidToken)
	}
	body := t.body(nil)
	for _, key := range keys {
		h := hmac.New(sha256.New, key)
		h.Write(body)
		if hmac.Equal(t.tag[:], h.Sum(nil)[:tagLen]) {
			return nil
		}
	}
	return fmt.Errorf("ratelimit: token %x is not signed with this Limiter's token key, nor with a key it accepts (WithTokenKey): it was forged or altered, or signed with a key this process does not know: %w", t.id[:4], ErrInvalidToken)
}

// newToken makes a token of a charge under key (the store key) at `at`
// whose job may run at run, of items, marked used if used (a job that ran
// with no token to mark used in the store), signed once if the Limiter has
// a key. It returns nil if the random source fails, which it does not on
// supported platforms.
func (l *Limiter) newToken(key string, at, run int64, items []tokenItem, lims []*limit, used bool) *Token {
	t := &Token{key: key, at: at, run: max(run, at), items: items, used: used}
	if _, err := rand.Read(t.id[:]); err != nil {
		return nil
	}
	t.until = settleUntil(at, t.run, items, lims, l.settleWindow)
	if len(l.tokenKeys) > 0 {
		t.sign(l.tokenKeys[0])
	}
	return t
}

// settleUntil returns the last moment a token may be settled: the later of
// its job's time and the time by which its limits will have granted every
// amount again since the charge (and a period more), plus window. By
// then, a refund by the rule of docs/model.md gives back nothing, so a
// store may forget that the token was settled (see driver.Settlement).
func settleUntil(at, run int64, items []tokenItem, lims []*limit, window time.Duration) int64 {
	end := run
	for i, it := range items {
		p := &lims[i].base
		var span float64
		if p.Kind == driver.FixedWindow {
			span = math.Ceil(it.amount/p.Rate) * float64(p.Period)
		} else {
			span = math.Ceil(it.amount * float64(p.Period) / p.Rate)
		}
		span += float64(p.Period)
		if span >= float64(driver.MaxTime) {
			return driver.MaxTime
		}
		end = max(end, at+int64(span))
	}
	return min(end+window.Milliseconds(), driver.MaxTime)
}

// chargeItems returns the token items of a charge, and their limits.
func chargeItems(ch *charge) ([]tokenItem, []*limit) {
	items := make([]tokenItem, ch.n)
	lims := make([]*limit, ch.n)
	for i := range ch.n {
		items[i] = tokenItem{name: ch.lim.name, shard: ch.shards[i], amount: max(ch.amount[i], 0)}
		lims[i] = ch.lim
	}
	return items, lims
}

// SettleOption configures a settlement by token: Limiter.Use, Refund and
// Settle. The zero SettleOption changes nothing.
type SettleOption struct {
	settler [16]byte
	set     bool
}

// Settler names who settles the token, so that a retry of a settlement
// whose answer was lost (the store took it, the reply never came) can tell
// its own earlier attempt from another process's settlement of the same
// token, as a Reservation's Wait and Cancel do: a Use, Refund or Settle
// with a Settler that finds the token settled before returns nil when the
// store's mark is of the same settlement by the same settler (the same
// kind, handing back as much of each limit: Settle of 0 is Refund, and
// Settle of a used of at least each limit's charge is Use), and a
// *SettledError otherwise, as without a Settler. A retry with the same ID
// but another settlement (Use after Refund, Settle of a used that hands
// back another amount) never returns nil: the first settlement holds, and
// the call did nothing.
//
// id must stay the same across the retries of one settlement, and differ
// between processes that may both use the token, each of which would take
// the other's use for its own. A job attempt's ID (a queue's delivery ID,
// or the job's ID and attempt number) makes each delivery of a job its own
// settler: a redelivery finds the first attempt's use, and does not run
// the job twice. The job's ID alone makes every delivery the same settler:
// a redelivery after a crash runs the job again, as would two deliveries
// at once (docs/reservations.md). A uuid.UUID converts to id.
//
// An all-zero id names no settler: the settlement fails with an error
// matching ErrInvalidOption, and nothing is settled. The store keeps, in
// its mark, a digest of id, the token and the settlement
// (driver.Settlement.Settler), not id itself. Given twice, the last
// Settler counts.
func Settler(id [16]byte) SettleOption { return SettleOption{settler: id, set: true} }

// settleSettler returns the settler that opts name, and whether they name
// one; an all-zero one is an error.
func settleSettler(opts []SettleOption) ([16]byte, bool, error) {
	var (
		id  [16]byte
		set bool
	)
	for _, o := range opts {
		if o.set {
			id, set = o.settler, true
		}
	}
	if set && id == ([16]byte{}) {
		return id, false, fmt.Errorf("ratelimit: settle: Settler's ID is all zero, which names no settler: give the ID of this settling attempt (a job attempt's ID), or leave Settler out; nothing was settled: %w", ErrInvalidOption)
	}
	return id, set, nil
}

// Use marks the token's charge used: its job runs. Call it before running
// a job reserved elsewhere: it fails, and the job must not run, when the
// token was settled before (an error matching ErrAlreadySettled, and
// ErrReservationCanceled if it was canceled), has expired
// (ErrTokenExpired), is not valid (ErrInvalidToken), names a limit this
// Limiter does not declare (ErrUnknownLimit: say, one SetLimits removed
// since; nothing is settled) or a shard the limit no longer has
// (ErrUnknownLimit too: its Shards was lowered since the charge; nothing is
// settled), or the store failed (a *StoreError, matching
// ErrStoreUnavailable and the store's error; the context's error instead
// when ctx ended meanwhile). A token is settled
// under the config in force when it is settled, not the one it was
// charged under (see Refund).
//
// A Use whose store call failed may be retried, but without a Settler
// option its retry cannot tell its own earlier use, taken by the store
// with the answer lost, from another process's: both return a
// *SettledError matching ErrReservationUsed. With Settler(id), the same id
// in every attempt, the retry returns nil when the use found is its own:
// the job may run. A use by another settler, or by none, stays a
// *SettledError, and so does a token that carries a use (one taken after
// its job was let run): the job is not this caller's.
func (l *Limiter) Use(ctx context.Context, t *Token, opts ...SettleOption) error {
	return l.settleToken(ctx, t, driver.SettleUse, 0, true, opts)
}

// Refund hands every token of t's charge back, by the refund rule: the
// tokens charged, less what the limit has granted the record since the
// charge, capped at the capacity (docs/model.md); and nothing while the
// record owes tokens granted after the token's RunAt (for a receipt of a
// plain call, its ChargedAt; for a token of several limits, ChargedAt
// too): reservations made since stand behind it, and keep their times
// (docs/reservations.md). It cancels a
// reservation: the job will not run. It acts at most once for a token,
// whichever process calls it and however often: a token settled before
// is left alone, and the error matches ErrAlreadySettled (and
// ErrReservationUsed, if it was used). The other errors are Use's. A
// Refund whose store call failed may be retried: if the first attempt
// went through after all, the retry says ErrAlreadySettled with
// SettledError.Kind driver.SettleCancel, as it does after another
// process's Refund of the token, unless both name their settler: with
// Settler(id), the same id in every attempt, the retry returns nil when
// the cancel found is its own (see Settler).
//
// The refund rule counts the grants since the charge by the config in
// force when Refund is called (and so does Reservation.Cancel, unless the
// limit was removed or lost the shard charged since). If the limit's Rate
// or Period changed between the charge and the refund, calls of the old
// config were refilled at the old rate, and the refund may hand back up
// to the count charged more than those grants leave room for, once
// (docs/model.md, "Changing limits"); never more than the count charged,
// nor above the capacity in force.
func (l *Limiter) Refund(ctx context.Context, t *Token, opts ...SettleOption) error {
	return l.settleToken(ctx, t, driver.SettleCancel, 0, true, opts)
}

// Settle settles t's charge by its outcome: used tokens (of each limit
// charged) were spent, and the rest is handed back by the refund rule,
// once, as Refund does (nothing, while reservations made since stand
// behind it). used ≥ the count charged spends it all, as Use;
// used 0 is Refund. used must be a finite number ≥ 0.
//
// With Settler(id), a retry whose first attempt took effect, its answer
// lost, returns nil only if it gives the same used (or, for each limit,
// one that hands back as much: 0 and Refund, or ≥ the count charged and
// Use, are the same settlement): the store's mark tells one settlement
// from another, and a retry with another used finds the first one, which
// holds, and returns a *SettledError.
func (l *Limiter) Settle(ctx context.Context, t *Token, used float64, opts ...SettleOption) error {
	if !(used >= 0) || math.IsInf(used, 1) {
		return &CountError{Count: used, Problem: "used, given to Settle, " + countFault(used) + ": give the tokens the job used, a number ≥ 0 (0 hands them all back)"}
	}
	if used == 0 {
		return l.Refund(ctx, t, opts...)
	}
	return l.settleToken(ctx, t, driver.SettleUse, used, false, opts)
}

// settleToken settles t by kind, for a holder of the token: for a cancel,
// every amount comes back; for a use, with all, nothing; otherwise each
// limit gives back its charge less used. With a Settler in opts, a
// settlement found before that is the same settlement by the same settler
// is this one, whose answer was lost: nil.
func (l *Limiter) settleToken(ctx context.Context, t *Token, kind driver.SettleKind, used float64, all bool, opts []SettleOption) error {
	id, named, err := settleSettler(opts)
	if err != nil {
		return err
	}
	if t == nil || len(t.items) == 0 {
		return fmt.Errorf("ratelimit: settle: no token (nil, or the zero Token, which names no charge): give the token of a charge (Reservation.Token, Result.Token, or ParseToken of its text); nothing was settled: %w", ErrInvalidToken)
	}
	if err := t.verify(l.tokenKeys, l.acceptUnsigned); err != nil {
		return err
	}
	lims := make([]*limit, len(t.items))
	for i, it := range t.items {
		lim := l.declared(it.name)
		if lim == nil {
			return fmt.Errorf("ratelimit: settle: the token charges limit %s, which this Limiter does not declare: declare it (New, SetLimits or SetLimit) with the config it was charged under, then settle again; nothing was settled: %w", written(it.name), ErrUnknownLimit)
		}
		if it.shard >= lim.shards {
			// Not a bad token: the limit had more shards when it was
			// charged, and the shard takes no calls any more.
			return fmt.Errorf("ratelimit: settle: the token charges shard %d of limit %s, whose Shards is %d now: "+
				"Shards was lowered since the charge, and that shard takes no calls any more; nothing was settled: "+
				"to settle the token, declare the limit with Shards %d or more (SetLimit), settle it, then lower Shards again; "+
				"or drop the token, and reserve again for a job not run yet: %w",
				it.shard, written(it.name), lim.shards, t.shardsOf(it.name), ErrUnknownLimit)
		}
		lims[i] = lim
	}
	var settler [16]byte
	if named {
		settler = t.holderSettler(id, kind, used, all)
	}
	err = l.settle(ctx, t, lims, kind, used, all, settler)
	if named && err != nil && ownSettlement(err, kind) {
		// This settler's own settlement, the same one (the settler
		// digests it), taken by the store on an earlier call whose
		// answer was lost.
		return nil
	}
	if errors.Is(err, ErrTokenExpired) {
		// What a holder does of it; a Reservation's own settlements say
		// it their way.
		if kind == driver.SettleUse && all {
			return expiredError(t, "do not run its job: reserve again to run it")
		}
		return expiredError(t, "nothing was handed back (past its expiry a token hands nothing back), and nothing is left to do")
	}
	return err
}

// expiredError is the error of a settlement of t past its Expires, which
// the Limiter does not send; advice, if not empty, says what to do.
func expiredError(t *Token, advice string) error {
	if advice != "" {
		advice = "; " + advice
	}
	return fmt.Errorf("ratelimit: settle token %x: it expired at %s%s: %w", t.id[:4], timeText(t.Expires()), advice, ErrTokenExpired)
}

// ownSettlement reports whether err is the *SettledError of a settlement
// of kind by the settler that asked. On its own, so that a settlement
// with no settler, or no error, does not move the target of errors.As to
// the heap: one allocation a call.
func ownSettlement(err error, kind driver.SettleKind) bool {
	var se *SettledError
	return errors.As(err, &se) && se.own && se.Kind == kind
}

// holderSettler returns the settler that a holder's settlement of t by
// kind, used and all (see settle) sends for the caller's id: a digest of
// id, t's ID, kind and what each item hands back, so that the store's
// mark is the caller's own only for the same settlement (driver.Decision.Own),
// which the mark could not tell otherwise (it keeps the kind, not the
// amounts). It is never zero, which would name no settler.
func (t *Token) holderSettler(id [16]byte, kind driver.SettleKind, used float64, all bool) [16]byte {
	b := make([]byte, 0, 64+8*len(t.items))
	b = append(b, "ratelimit settler\x00"...)
	b = append(b, id[:]...)
	b = append(b, t.id[:]...)
	b = append(b, byte(kind))
	for i := range t.items {
		back := t.back(i, kind, used, all)
		if back == 0 {
			back = 0 // not -0: the same settlement, the same digest
		}
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(back))
	}
	sum := sha256.Sum256(b)
	var s [16]byte
	copy(s[:], sum[:])
	if s == ([16]byte{}) {
		s[0] = 1
	}
	return s
}

// back returns the tokens item i of t hands back when settled by kind:
// for a cancel, its amount; for a use, with all, nothing; otherwise its
// limit's charge less used, shared by its shards as they were charged.
func (t *Token) back(i int, kind driver.SettleKind, used float64, all bool) float64 {
	it := t.items[i]
	switch {
	case kind == driver.SettleUse && all:
		return 0
	case kind == driver.SettleUse:
		if total := t.Charged(it.name); total > 0 {
			return it.amount * (max(total-used, 0) / total)
		}
	}
	return it.amount
}

// settle sends the settlement of t, whose items' limits are lims, as
// settler (driver.Settlement.Settler: zero for none, as a holder of the
// token sends without the Settler option). The *SettledError of a
// settlement found before says whether it was settler's own (own).
func (l *Limiter) settle(ctx context.Context, t *Token, lims []*limit, kind driver.SettleKind, used float64, all bool, settler [16]byte) error {
	now := l.now().UnixMilli()
	if err := checkTime(now); err != nil {
		return fmt.Errorf("ratelimit: settle: %w", err)
	}
	if ts := ownClock(l.store); ts != nil {
		// The token's times are the store's (Decision.Now), and so is its
		// mark's life: judged on the Limiter's clock, a token would be
		// refused at once by a Limiter ahead of the store, and sent by one
		// behind it after the store had dropped the mark of its first
		// settlement, to be settled a second time.
		// The time of the server that holds the token's records, and
		// the mark of its settlement (driver.RecordClock).
		n, err := storeTime(ctx, ts, driver.RecordID{Name: t.items[0].name, Key: t.key, Shard: t.items[0].shard})
		if err != nil && !errors.Is(err, ErrTimeRange) {
			err = l.settleStoreErr(ctx, t, err)
		}
		if err != nil {
			return fmt.Errorf("ratelimit: settle token %x: %w; nothing was settled", t.id[:4], err)
		}
		now = n
	}
	if now > t.until {
		return expiredError(t, "")
	}
	if t.used {
		// Its job ran before the token was made: no store knows the
		// use, the token carries it.
		return &SettledError{ID: t.id, Kind: driver.SettleUse}
	}
	op := driver.Op{Mode: driver.ModeRefund, Now: now,
		Settle: &driver.Settlement{ID: t.id, Kind: kind, Until: t.until, Settler: settler},
		Items:  make([]driver.Item, len(t.items))}
	// The job's time, which a limit's own time equals only when the token
	// charged one limit: of several, a limit may have been granted its
	// tokens before run, and others reserved behind them since. Their
	// charge (At) is the one time that none is before.
	// A job time beyond MaxTime (a long wait near the bound) is sent as
	// MaxTime, which every store takes: a debt granted after it is still
	// queued behind the job, and a refund of the tail then gives nothing,
	// never too much.
	run := min(t.run, driver.MaxTime)
	for _, it := range t.items {
		if it.name != t.items[0].name {
			run = t.at
		}
	}
	for i, it := range t.items {
		op.Items[i] = driver.Item{Name: it.name, Key: t.key, Count: t.back(i, kind, used, all), At: t.at, Run: run,
			Shards: []driver.Shard{{Index: it.shard, Params: lims[i].params(l.seed, t.key, it.shard)}}}
	}
	out := make([]driver.Decision, len(op.Items))
	err := storeError("Apply", l.store.Apply(ctx, &op, out))
	if l.deny != nil && (err != nil || out[0].Settled == 0) {
		// After the refund, or a failure that may have made it: a refused
		// call that read the record before it is not to keep it.
		for _, it := range t.items {
			l.deny.forget(it.name, t.key)
		}
	}
	if err != nil {
		return fmt.Errorf("ratelimit: settle token %x: %w; %s", t.id[:4], l.settleStoreErr(ctx, t, err), settleFailed(err))
	}
	if k := out[0].Settled; k != 0 {
		return &SettledError{ID: t.id, Kind: k, own: out[0].Own}
	}
	if !out[0].OK {
		// A refund is always OK (Evaluate): a store that answers one
		// refused, and not settled before, read a mark of the token it
		// could not tell the kind of. The token may have been settled.
		return &SettledError{ID: t.id}
	}
	return nil
}

// settleFailed says what became of a settlement whose store call failed
// with err, and what to do. A record or mark the store cannot read
// (driver.ErrBadRecord) failed the op before anything was written, and
// fails every retry alike: the store's error says what to do, and of a
// mark, to treat the token as settled. A store that its constructor did
// not make (driver.ErrZeroStore) settled nothing either, and never will.
// Any other failure may have come
// after the store took the settlement: a retry tells.
func settleFailed(err error) string {
	if errors.Is(err, driver.ErrZeroStore) {
		return "the store settled nothing, and every retry fails alike: give the Limiter the store its constructor returns"
	}
	if errors.Is(err, driver.ErrBadRecord) {
		return "the store settled nothing, and a retry fails alike until what its error names is dealt with: do as it says " +
			"(a mark it cannot read: treat the token as settled, as it may have been: do not run its job, nor hand its tokens back)"
	}
	return "the store may have taken the settlement or not: retry it (with Settler, a retry whose first attempt was taken returns nil)"
}

// settleStoreErr is the error of a settlement of t whose store call
// failed with err: a *StoreError (matching ErrStoreUnavailable, and err),
// as a call of a limit says of the store's failure; err alone, wrapped,
// for a store that its constructor did not make (zeroStore); or, when ctx had
// ended, the context's error, the store's beside it: the caller gave up,
// which says nothing of the store (as callerError).
func (l *Limiter) settleStoreErr(ctx context.Context, t *Token, err error) error {
	if errors.Is(err, driver.ErrZeroStore) {
		return fmt.Errorf("store: %w", err) // no outage: see zeroStore
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("store: %w", err)
		}
		return fmt.Errorf("%w (store: %w)", cerr, err)
	}
	return &StoreError{Name: t.items[0].name, Err: err}
}

// receiptFits refuses, before the call is made, a call with WithReceipt
// of lims under the store key skey whose receipt ParseToken could not read
// back: one that charges more than maxTokenItems shards, or whose binary
// form could be longer than maxTokenBytes.
func receiptFits(skey string, lims []*limit) error {
	const v = binary.MaxVarintLen64
	items, size := 0, 2+len(Token{}.id)+5*v+len(skey)+tagLen
	for _, lim := range lims {
		k := min(lim.shards, 2) // shards charged by a call (pickShards)
		items += k
		size += k * (2*v + len(lim.name) + 8)
	}
	switch {
	case items > maxTokenItems:
		return fmt.Errorf("ratelimit: the call charges %d shards, and a receipt (WithReceipt) holds at most %d: name fewer limits, or drop WithReceipt: %w",
			items, maxTokenItems, ErrInvalidConfig)
	case size > maxTokenBytes:
		return fmt.Errorf("ratelimit: the receipt (WithReceipt) of the call could take %d bytes, and a token at most %d: use shorter limit names, or drop WithReceipt: %w",
			size, maxTokenBytes, ErrInvalidConfig)
	}
	return nil
}

// receiptOf returns the token of a LimitAll call that charged items
// (decided as out) of lims.
func (l *Limiter) receiptOf(lims []*limit, items []driver.Item, out []driver.Decision) *Token {
	var (
		its  []tokenItem
		ls   []*limit
		at   = out[0].Now
		wait int64
	)
	for i := range items {
		for j, sh := range items[i].Shards {
			its = append(its, tokenItem{name: items[i].Name, shard: sh.Index, amount: max(out[i].Charged[j], 0)})
			ls = append(ls, lims[i])
		}
		wait = max(wait, out[i].RetryAfter)
	}
	return l.newToken(items[0].Key, at, at+wait, its, ls, false)
}
