package main

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMessagesWriteNumbersAsAUserDoes: the numbers the command's messages
// quote read as a user writes them, as the library's errors write them:
// %v wrote 8388607 as 8.388607e+06 and MaxTokens as 1e+15.
func TestMessagesWriteNumbersAsAUserDoes(t *testing.T) {
	assert.EqualError(t, checkRecord(driver.State{Remaining: 2e15}),
		"it holds 2000000000000000 tokens, and a record holds from -1000000000000000 to 1000000000000000")

	// A limit of 8388607 tokens a second whose store granted 3 times as
	// many within a few milliseconds.
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 8388607, Period: time.Second}
	at := time.UnixMilli(1_000_000)
	var gs []grant
	for i := range 2 {
		g := at.Add(time.Duration(i) * time.Millisecond)
		gs = append(gs, grant{from: g, to: g})
	}
	assert.Contains(t, verify(cfg, append(gs, gs[1]), 8388607, 1, nil), "key 0: 25165821 tokens granted within 2ms, but the limit allows at most 16777214")
	assert.Contains(t, verify(cfg, gs, 8388607, 1, []int64{at.UnixMilli()}),
		"key 0: 16777214 tokens granted in the windows from 00:16:40.000 to 00:16:41.000, but the limit allows at most 8388607")
	tb := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 8388607, Period: time.Hour}
	assert.Contains(t, verify(tb, gs, 8388607, 1, nil), "key 0: 16777214 tokens granted within 2ms, but the limit allows at most 8388611.660337223")

	code, out, errOut := exec("simulate", "--kind", "token bucket", "--rate", "8388607", "--capacity", "1e15", "--max-reserved", "1000000000000000", "--period", "1s", "--at", "0s=8388607")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "token bucket, rate 8388607 per 1s, capacity 1000000000000000, max reserved 1000000000000000\n")
}
