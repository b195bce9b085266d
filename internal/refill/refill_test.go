package refill_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/refill"
	"github.com/stretchr/testify/assert"
)

func TestShare(t *testing.T) {
	for _, tc := range []struct {
		rate, capacity float64
		shards         int
		wantR, wantC   float64
	}{
		{10, 0, 0, 10, 10},
		{10, 30, 1, 10, 30},
		{10, 0, 4, 2.5, 2.5},
		{10, 30, 3, 10.0 / 3, 10},
	} {
		r, c := refill.Share(tc.rate, tc.capacity, tc.shards)
		assert.Equal(t, tc.wantR, r, "rate of %+v", tc)
		assert.Equal(t, tc.wantC, c, "capacity of %+v", tc)
	}
}

// A bucket of 5 tokens, 1 a second per record: one record of 2 is full in
// 3 s; two records of 4 shards, holding 6 together of their 10, refill
// their 4 at 2 a second; a full or overfull one is full now. Shards of 0
// or 1 are one record.
func TestMillis(t *testing.T) {
	p := driver.Params{Kind: driver.TokenBucket, Rate: 1, Period: 1000, Capacity: 5}
	for _, tc := range []struct {
		shards    int
		remaining float64
		want      float64
	}{
		{0, 2, 3000},
		{1, 2, 3000},
		{4, 6, 2000},
		{1, 5, 0},
		{2, 11, 0},
		{1, -1, 6000},
	} {
		assert.Equal(t, tc.want, refill.Millis(&p, tc.shards, tc.remaining), "%+v", tc)
	}
}
