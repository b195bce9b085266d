package ratelimit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// A token read back from its text form says what it charged, under which
// store key, when, whether it is signed and whether it carries its use,
// and checks its tag under a key, without a Limiter: what a tool that
// looks into tokens needs, which only ID, RunAt, Expires and Charged told.
func TestTokenAccessors(t *testing.T) {
	ctx := context.Background()
	clk := newMock()
	key := []byte("token key one, 32 bytes long....")
	other := []byte("token key two, 32 bytes long....")
	limits := ratelimit.Limits{
		"jobs":  {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0, Shards: 2},
		"plain": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
	}
	store := must(memstore.New())
	signed := must(ratelimit.New(store, limits, ratelimit.WithClock(clk), ratelimit.WithTokenKey(key)))
	hashed := must(ratelimit.New(store, limits, ratelimit.WithClock(clk), ratelimit.WithKeyHash(key)))

	r, err := signed.Reserve(ctx, "jobs", "user-42", ratelimit.Count(14), ratelimit.WithReceipt())
	require.NoError(t, err)
	tok, err := ratelimit.ParseToken(r.Token().String())
	require.NoError(t, err)
	require.Equal(t, "user-42", tok.Key())
	require.Equal(t, clk.Now().UnixMilli(), tok.ChargedAt().UnixMilli())
	require.Equal(t, r.Time().UnixMilli(), tok.RunAt().UnixMilli())
	items := tok.Items()
	require.Len(t, items, 2, "the two shards of a sharded limit")
	var sum float64
	for _, it := range items {
		require.Equal(t, "jobs", it.Name)
		require.Contains(t, []int{0, 1}, it.Shard)
		sum += it.Amount
	}
	require.Equal(t, 14.0, sum)
	require.Equal(t, tok.Charged("jobs"), sum)
	items[0].Amount = 1000
	require.Equal(t, 14.0, tok.Charged("jobs"), "Items returns a copy")
	require.True(t, tok.Signed())
	require.False(t, tok.CarriesUse())

	require.NoError(t, tok.Verify(key))
	require.NoError(t, tok.Verify(other, key), "an accepted key")
	err = tok.Verify(other)
	require.ErrorIs(t, err, ratelimit.ErrInvalidToken)
	require.Contains(t, err.Error(), "not valid under the key given")
	require.ErrorIs(t, tok.Verify([]byte("short")), ratelimit.ErrInvalidOption)
	require.ErrorIs(t, tok.Verify(key, nil), ratelimit.ErrInvalidOption)
	var none *ratelimit.Token // ParseToken's answer with its error
	require.ErrorIs(t, none.Verify(key), ratelimit.ErrInvalidToken, "no token, no panic")
	require.ErrorIs(t, new(ratelimit.Token).Verify(key), ratelimit.ErrInvalidToken, "the zero Token")

	// A plain charge's receipt, of a hashed key, unsigned; then a token
	// taken after its job was let run.
	res, err := hashed.Limit(ctx, "plain", "user-42", ratelimit.Count(3), ratelimit.WithReceipt())
	require.NoError(t, err)
	tok, err = ratelimit.ParseToken(res.Token.String())
	require.NoError(t, err)
	require.Len(t, tok.Key(), 22, "the keyed hash, not the key")
	require.NotEqual(t, "user-42", tok.Key())
	require.Equal(t, []ratelimit.TokenItem{{Name: "plain", Shard: 0, Amount: 3}}, tok.Items())
	require.Equal(t, tok.ChargedAt(), tok.RunAt(), "a plain charge's job may run at once")
	require.False(t, tok.Signed())
	err = tok.Verify(key)
	require.ErrorIs(t, err, ratelimit.ErrInvalidToken)
	require.Contains(t, err.Error(), "carries no tag")

	long := strings.Repeat("k", 300)
	r, err = signed.Reserve(ctx, "plain", long, ratelimit.Count(1))
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	tok, err = ratelimit.ParseToken(r.Token().String())
	require.NoError(t, err)
	require.True(t, tok.CarriesUse())
	require.True(t, strings.HasPrefix(tok.Key(), "sha256:"), "the digest form of a long key: %q", tok.Key())
}
