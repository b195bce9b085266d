package compare

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestHistogramQuantileRank holds the quantiles to the nearest rank: the p
// quantile of n latencies is the ⌈p·n⌉-th smallest, the least latency that
// at least a share p of the calls did not exceed. Latencies under 64 ns
// have buckets of one nanosecond, so the quantiles are exact.
func TestHistogramQuantileRank(t *testing.T) {
	var h histogram
	assert.Equal(t, time.Duration(0), h.quantile(1, 2), "empty")
	for v := range uint64(60) {
		h.add(v + 1) // 1 to 60 ns
	}
	assert.Equal(t, 30*time.Nanosecond, h.quantile(1, 2), "p50 of 60: the 30th")
	assert.Equal(t, 60*time.Nanosecond, h.quantile(99, 100), "p99 of 60: the 60th")
	assert.Equal(t, 6*time.Nanosecond, h.quantile(1, 10), "p10 of 60: the 6th")
	assert.Equal(t, 1*time.Nanosecond, h.quantile(0, 1), "p0: the least")
	assert.Equal(t, 60*time.Nanosecond, h.quantile(1, 1), "p100: the most")

	var k histogram
	for v := range uint64(100) {
		k.add(v % 50) // 0 to 49 ns, twice each
	}
	assert.Equal(t, 24*time.Nanosecond, k.quantile(1, 2), "p50 of 100: the 50th")
	assert.Equal(t, 49*time.Nanosecond, k.quantile(99, 100), "p99 of 100: the 99th")
	assert.Equal(t, 48*time.Nanosecond, k.quantile(49, 50), "p98 of 100: the 98th")
}

// TestHistogramBuckets checks that every value falls in a bucket whose
// upper end is at least the value and within 1/32 of it, and that the
// buckets are in order, up to the largest uint64.
func TestHistogramBuckets(t *testing.T) {
	vals := []uint64{0, 1, 31, 32, 63, 64, 65, 127, 128, 1000, 123_456_789, 1<<63 - 1, 1 << 63, 1<<64 - 1}
	last := -1
	for _, v := range vals {
		i := histIndex(v)
		assert.GreaterOrEqual(t, i, last, "%d", v)
		last = i
		up := histUpper(i)
		assert.GreaterOrEqual(t, up, v, "%d", v)
		assert.LessOrEqual(t, float64(up-v), float64(v)/32, "%d", v)
		if i > 0 {
			assert.Less(t, histUpper(i-1), v, "%d: the bucket below ends below it", v)
		}
	}
	assert.Equal(t, len(histogram{}.counts)-1, histIndex(1<<64-1))
}
