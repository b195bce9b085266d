package ratelimit_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseLimits(t *testing.T) {
	limits, err := ratelimit.ParseLimits([]byte(`{
		"sendMessage": {"kind": "token bucket", "rate": 10, "period": "1m", "capacity": 3},
		"signup": {"kind": "fixed window", "rate": 100, "period": "1h", "start": "2024-01-01T00:00:00Z", "failOpen": true},
		"llm": {"kind": "fixed_window", "rate": 40000, "period": "1m", "maxReserved": 20000, "shards": 4}
	}`))
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 3}, limits["sendMessage"])
	assert.Equal(t, time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), limits["signup"].Start)
	assert.True(t, limits["signup"].FailOpen)
	assert.Equal(t, 4, limits["llm"].Shards)

	// A config survives a round trip.
	b, err := json.Marshal(limits)
	require.NoError(t, err)
	again, err := ratelimit.ParseLimits(b)
	require.NoError(t, err)
	for name, want := range limits {
		got := again[name]
		assert.True(t, want.Start.Equal(got.Start), name)
		want.Start, got.Start = time.Time{}, time.Time{} // same instant, maybe another location
		assert.Equal(t, want, got, name)
	}

	for _, bad := range []struct{ in, want string }{
		{`{"a": {"kind": "fixed window", "rate": 1, "period": "an hour"}}`, `period "an hour"`},
		{`{"a": {"kind": "leaky", "rate": 1, "period": "1h"}}`, `unknown kind`},
		{`{"a": {"kind": "fixed window", "rate": 1, "period": "1h", "capcity": 3}}`, `unknown field "capcity"`},
		{`{"a": {"kind": "fixed window", "rate": 0, "period": "1h"}}`, `limit "a": Rate is 0`},
		{`[1]`, `limits file`},
	} {
		_, err := ratelimit.ParseLimits([]byte(bad.in))
		require.Error(t, err, bad.in)
		assert.Contains(t, err.Error(), bad.want)
	}
}
