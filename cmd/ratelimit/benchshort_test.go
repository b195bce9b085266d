package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// TestBenchTooShort requires a --duration too short to measure to be a
// usage error, and a run that made no call a failure that says so: bench
// --duration 1ns reported "decisions 0 in 0ms: 0/s" and a check of
// nothing "ok", with status 0.
func TestBenchTooShort(t *testing.T) {
	for _, d := range []string{"1ns", "999µs"} {
		code, out, errOut := exec(append([]string{"bench", "--store", "mem:", "--quiet", "--duration", d}, tokenBucket...)...)
		require.Equal(t, 2, code, "%s: %s%s", d, out, errOut)
		require.Empty(t, out, d)
		require.Equal(t, "ratelimit: --duration "+d+" is too short to measure: give 1ms or more, such as 10s\n", firstLine(errOut), d)
	}

	// A run whose goroutines make no call before its end.
	m, err := memstore.New()
	require.NoError(t, err)
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}
	lim, err := ratelimit.New(m, ratelimit.Limits{"x": cfg})
	require.NoError(t, err)
	rep, err := bench(context.Background(), lim, "x", cfg, 2, 4, time.Nanosecond, 0, 1, true, false, io.Discard)
	require.ErrorIs(t, err, errNoCalls)
	require.Nil(t, rep)
	require.EqualError(t, err, "bench --duration 1ns: no call was made before the run's end, so that there is nothing to report or check: give a longer --duration, such as 1s")
}

// firstLine returns the first line of s, with its line break.
func firstLine(s string) string {
	for i := range len(s) {
		if s[i] == '\n' {
			return s[:i+1]
		}
	}
	return s
}
