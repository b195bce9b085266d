package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An amount below 1 shows with three significant digits, as one below
// 0.0005 did: three decimals showed 0.0007 tokens as 0.001, in a row of
// 0.001 tokens before and a count of 0.0003, and 0.0123 as 0.012. From 1
// up, three decimals still show three significant digits or more.
func TestNumBelowOneThreeSignificantDigits(t *testing.T) {
	for x, want := range map[float64]string{
		0.0007: "0.0007", -0.0007: "-0.0007", 0.0005: "0.0005", 0.0123456: "0.0123", 0.1666666: "0.167",
		0.30000000000000004: "0.3", 0.99951: "1", 0.9994: "0.999", 1.0004: "1", 1.6666: "1.667", 0.00001234: "1.23e-5",
	} {
		assert.Equal(t, want, num(x), "%v", x)
	}

	code, out, errOut := exec("simulate", "--kind", "token bucket", "--rate", "0.001", "--capacity", "0.001", "--period", "1h",
		"--at", "0s=0.0003,0s=0.0003")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, [][]string{
		{"00:00:00", "-", "0.001", "0.0003", "allowed", "0.0007", "0s"},
		{"00:00:00", "-", "0.0007", "0.0003", "allowed", "0.0004", "0s"},
	}, rows(out), out)
}
