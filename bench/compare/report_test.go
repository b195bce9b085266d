package compare

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPerSec holds decisions per second to three significant digits,
// rounded to the nearest, below 100 as above: bbolt's Batch from one
// goroutine makes fewer than 100 a second.
func TestPerSec(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{
		{0, "0"},
		{-1, "0"},
		{2_094_512, "2,090,000"},
		{926.4, "926"},
		{999.6, "1,000"},
		{100, "100"},
		{99.96, "100"},
		{95.66, "95.7"}, // was "95": truncated, one digit short
		{47, "47.0"},
		{9.876, "9.88"}, // was "9"
		{9.996, "10.0"},
		{0.5, "0.500"}, // was "0"
		{0.001234, "0.00123"},
	} {
		assert.Equal(t, tc.want, perSec(tc.v), "%g", tc.v)
	}
}
