package ratelimit_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A nil *Token, which Reservation.Token and Result.Token return where there
// is no token, answers as the zero Token does; its methods panicked on the
// nil receiver, while Verify and settling took it for the zero Token.
func TestNilTokenAnswersAsTheZeroToken(t *testing.T) {
	var zero ratelimit.Token
	var nilTok *ratelimit.Token
	key := []byte("token key one, 32 bytes long....")

	assert.Equal(t, zero.ID(), nilTok.ID())
	assert.Equal(t, zero.RunAt(), nilTok.RunAt())
	assert.Equal(t, zero.Expires(), nilTok.Expires())
	assert.Equal(t, zero.ChargedAt(), nilTok.ChargedAt())
	assert.Equal(t, zero.Charged("jobs"), nilTok.Charged("jobs"))
	assert.Equal(t, zero.Key(), nilTok.Key())
	assert.Equal(t, zero.Items(), nilTok.Items())
	assert.NotNil(t, nilTok.Items(), "an empty slice, as the zero Token's")
	assert.Equal(t, zero.Signed(), nilTok.Signed())
	assert.Equal(t, zero.CarriesUse(), nilTok.CarriesUse())
	assert.ErrorIs(t, nilTok.Verify(key), ratelimit.ErrInvalidToken)
	assert.ErrorIs(t, zero.Verify(key), ratelimit.ErrInvalidToken)

	// UnmarshalText has nowhere to write: an error, not a panic.
	err := nilTok.UnmarshalText([]byte("x"))
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.ErrorContains(t, err, "nil *Token")

	// The value methods are read through the pointer; fmt and encoding/json
	// take a nil *Token as nil.
	assert.Equal(t, "<nil>", fmt.Sprint(nilTok))
	b, err := json.Marshal(struct{ Token *ratelimit.Token }{})
	require.NoError(t, err)
	assert.JSONEq(t, `{"Token":null}`, string(b))
}
