package ratelimit_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// tokenOfKeyLen returns the text form of a token, made by hand, that
// charges 1 token of shard 0 of limit "jobs" at t0 under a store key whose
// length field says n, followed by key.
func tokenOfKeyLen(n uint64, key string) string {
	b := []byte{1, 0}                  // version, flags
	b = append(b, make([]byte, 16)...) // id
	b = binary.AppendVarint(b, t0.UnixMilli())
	b = binary.AppendUvarint(b, 0)
	b = binary.AppendUvarint(b, 600_000)
	b = binary.AppendUvarint(b, n)
	b = append(b, key...)
	b = binary.AppendUvarint(b, 1)
	b = binary.AppendUvarint(b, uint64(len("jobs")))
	b = append(b, "jobs"...)
	b = binary.AppendUvarint(b, 0)
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(1))
	return base64.RawURLEncoding.EncodeToString(b)
}

// A token whose store key is longer than any a Limiter makes (256 bytes:
// a key as given; a longer one is known to the store by its digest form)
// is forged, and refused with ErrInvalidToken, by ParseToken and by
// UnmarshalText (a token read from a job's JSON, then settled): it would
// have the store keep a record under a key of up to 64 KiB.
func TestTokenWithAStoreKeyLongerThanAnyIsRefused(t *testing.T) {
	ctx := context.Background()
	lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	for _, n := range []int{257, 1 << 10, 60 << 10} {
		text := tokenOfKeyLen(uint64(n), strings.Repeat("k", n))
		_, err := ratelimit.ParseToken(text)
		require.ErrorIs(t, err, ratelimit.ErrInvalidToken, "a store key of %d bytes", n)
		require.ErrorContains(t, err, "longer than any a Limiter makes")

		var job struct{ Token ratelimit.Token }
		err = json.Unmarshal([]byte(`{"Token":"`+text+`"}`), &job)
		require.ErrorIs(t, err, ratelimit.ErrInvalidToken, "a store key of %d bytes, from JSON", n)
	}
	// A length no token could hold, beyond what an int holds too.
	for _, n := range []uint64{1 << 31, 1 << 63, math.MaxUint64} {
		_, err := ratelimit.ParseToken(tokenOfKeyLen(n, "k"))
		require.ErrorIs(t, err, ratelimit.ErrInvalidToken, "a store key length of %d", n)
	}

	key := strings.Repeat("k", 256)
	tok, err := ratelimit.ParseToken(tokenOfKeyLen(256, key))
	require.NoError(t, err, "256 bytes: a key as given")
	require.Equal(t, key, tok.Key())
	require.NoError(t, lim.Use(ctx, tok))
}

// Every token a Limiter makes reads back, whatever the key's length:
// kept as given up to 256 bytes, in its digest form beyond, or as its
// keyed hash (WithKeyHash).
func TestTokenOfAnyKeyLengthReadsBack(t *testing.T) {
	ctx := context.Background()
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}}
	for _, opts := range [][]ratelimit.Option{nil, {ratelimit.WithKeyHash([]byte("key hash secret, 32 bytes long.."))}} {
		lim := must(ratelimit.New(must(memstore.New()), limits, append(opts, ratelimit.WithClock(newMock()))...))
		for _, n := range []int{0, 1, 255, 256, 257, 1 << 16, 1 << 20} {
			r, err := lim.Reserve(ctx, "jobs", strings.Repeat("k", n), ratelimit.WithReceipt())
			require.NoError(t, err)
			require.NotNil(t, r.Token(), "a key of %d bytes", n)
			require.LessOrEqual(t, len(r.Token().Key()), 256)
			tok, err := ratelimit.ParseToken(r.Token().String())
			require.NoError(t, err, "a key of %d bytes", n)
			require.NoError(t, lim.Refund(ctx, tok), "a key of %d bytes", n)
		}
	}
}
