package numtext_test

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/numtext"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFormat: a number in a message reads as a user writes it, and back
// as itself. %v wrote 8388607 as 8.388607e+06 and 1e300 as 1e+300.
func TestFormat(t *testing.T) {
	for x, want := range map[float64]string{
		0:                           "0",
		math.Copysign(0, -1):        "0",
		1:                           "1",
		-3:                          "-3",
		8388607:                     "8388607",
		8388607.5:                   "8388607.5",
		1e15:                        "1000000000000000",
		1<<53 - 1:                   "9007199254740991",
		1 << 53:                     "9.007199254740992e15",
		1e300:                       "1e300",
		-1e300:                      "-1e300",
		math.MaxFloat64:             "1.7976931348623157e308",
		0.25:                        "0.25",
		0.0001:                      "0.0001",
		1e-9:                        "1e-9",
		1.5e-5:                      "1.5e-5",
		math.SmallestNonzeroFloat64: "5e-324",
		math.NaN():                  "NaN",
		math.Inf(1):                 "+Inf",
		math.Inf(-1):                "-Inf",
	} {
		assert.Equal(t, want, numtext.Format(x), "%v", x)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		x := math.Float64frombits(r.Uint64())
		if math.IsNaN(x) || math.IsInf(x, 0) {
			continue
		}
		for _, x := range []float64{x, math.Round(x), float64(r.Int64N(1<<54) - 1<<53)} {
			got, err := strconv.ParseFloat(numtext.Format(x), 64)
			require.NoError(t, err, "%v", x)
			require.Equal(t, x, got, "%s reads back", numtext.Format(x))
		}
	}
}
