package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The y axis's labels are written as numtext writes numbers, to the
// step's precision: %g wrote 2e+07 and 1e-06, and num's three decimals
// wrote the ticks 0.0006, 0.0008 and 0.001 all as 0.001.
func TestTickWritesNumbersAsAUserDoes(t *testing.T) {
	for _, c := range []struct {
		v, step float64
		want    string
	}{
		{0, 1, "0"}, {3 * 0.1, 0.1, "0.3"}, {3 * 0.0002, 0.0002, "0.0006"}, {4 * 0.0002, 0.0002, "0.0008"},
		{3 * 1e-6, 1e-6, "3e-6"}, {7 * 1e-5, 1e-5, "7e-5"}, {3 * 2e-7, 2e-7, "6e-7"}, {15 * 1e-7, 1e-7, "1.5e-6"},
		{2e7, 1e7, "2e7"}, {-1e6, 5e5, "-1e6"}, {-500000, 5e5, "-500000"}, {1e15, 2e14, "1e15"},
		{3 * 5e13, 5e13, "1.5e14"}, {1000, 200, "1000"}, {1.5, 0.5, "1.5"}, {3e300, 1e300, "3e300"},
	} {
		assert.Equal(t, c.want, tick(c.v, c.step), "tick(%v, %v)", c.v, c.step)
	}

	svg := filepath.Join(t.TempDir(), "chart.svg")
	for _, c := range []struct {
		capacity string
		want     []string
	}{
		{"0.001", []string{"0", "0.0002", "0.0004", "0.0006", "0.0008", "0.001"}},
		{"0.00001", []string{"0", "2e-6", "4e-6", "6e-6", "8e-6", "1e-5"}},
		{"30000000", []string{"0", "1e7", "2e7", "3e7"}},
	} {
		code, _, errOut := exec("simulate", "--kind", "token bucket", "--rate", c.capacity, "--capacity", c.capacity, "--period", "1s",
			"--at", "0s="+c.capacity, "--svg", svg)
		require.Equal(t, 0, code, errOut)
		assert.Equal(t, c.want, chartTicks(t, svg), "capacity %s", c.capacity)
	}
}
