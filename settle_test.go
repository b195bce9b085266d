package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

func TestTokenRoundTripAndKey(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewMock()
	clk.Set(time.UnixMilli(1_700_000_000_000))
	store := must(memstore.New())
	limits := ratelimit.Limits{"a": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, MaxReserved: 10}}
	signed := must(ratelimit.New(store, limits, ratelimit.WithClock(clk), ratelimit.WithTokenKey([]byte("k1"))))
	other := must(ratelimit.New(store, limits, ratelimit.WithClock(clk), ratelimit.WithTokenKey([]byte("k2"))))
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

func FuzzParseToken(f *testing.F) {
	f.Add("AQAAAAAAAAAAAAAAAAAAAAAA")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ratelimit.ParseToken(s)
		if err == nil {
			again, err := ratelimit.ParseToken(tok.String())
			if err != nil || again.String() != tok.String() {
				t.Fatalf("token %q does not round-trip: %v", s, err)
			}
		}
	})
}
