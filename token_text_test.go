package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// A text that is no token of this library says so; only a version byte a
// later release may write suggests one. Garbage said "version 199, not 1:
// made by another release?".
func TestNotAToken(t *testing.T) {
	lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(newMock())))
	res, err := lim.Limit(context.Background(), "jobs", "user-42", ratelimit.WithReceipt())
	require.NoError(t, err)
	tok := res.Token.String()
	for text, why := range map[string]string{
		"x7z_":                   "its first byte, a token's version, is 199, which no release writes (this one writes 1)",
		"AAAA":                   "its first byte, a token's version, is 0, which no release writes (this one writes 1)",
		"not a token":            "it is not base64url (illegal base64 data at input byte 3), as every token is",
		"AQ":                     "it holds 1 byte, fewer than any token's 33",
		tok[:len(tok)-8]:         "end before the token of version 1 they begin does (cut short?)",
		tok + "AAAA":             "3 bytes more run on after the token of version 1 its first",
		strings.Repeat("A", 1e6): "its 1000000 bytes are more than any token's",
	} {
		_, err := ratelimit.ParseToken(text)
		require.ErrorIs(t, err, ratelimit.ErrInvalidToken)
		require.ErrorContains(t, err, "ratelimit: not a token of this library: ")
		require.ErrorContains(t, err, why)
		require.NotContains(t, err.Error(), "release?")
		var u ratelimit.Token
		require.Equal(t, err, u.UnmarshalText([]byte(text)))
	}
	// A later version: the hint stays.
	_, err = ratelimit.ParseToken("Ag" + tok[2:])
	require.ErrorIs(t, err, ratelimit.ErrInvalidToken)
	require.EqualError(t, err, "ratelimit: token: version 2, not 1: made by a later release? settle it with that release: ratelimit: invalid token")
	require.False(t, errors.Is(err, ratelimit.ErrInvalidOption))
}
