package main

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSimulateSeed(t *testing.T) {
	// A sharded limit near its end: which two shards a call evaluates
	// decides whether it passes.
	args := []string{"simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--capacity", "40", "--shards", "4",
		"--every", "1s", "--for", "40s", "--count", "2"}
	outputs := map[string]string{}
	for _, seed := range []string{"", "1", "7"} {
		a := args
		if seed != "" {
			a = append(slices.Clone(args), "--seed", seed)
		}
		code, first, errOut := exec(a...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, first, "denied")
		code, second, errOut := exec(a...)
		require.Equal(t, 0, code, errOut)
		require.Equal(t, first, second, "seed %q", seed)
		outputs[seed] = first
	}
	require.Equal(t, outputs["1"], outputs[""], "the default seed is 1")
	require.NotEqual(t, outputs["1"], outputs["7"])
}
