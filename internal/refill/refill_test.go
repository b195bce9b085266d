package refill_test

import (
	"math"
	"math/rand/v2"
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

// The arithmetic Share and Millis replaced, as config.go's params,
// result.go's resetMillis and httplimit's lagMillis each wrote it: one
// share of a limit, the wait of the n records a call evaluated, and the
// wait httplimit took from a Config.
func formerShare(rate, capacity float64, shards int) (float64, float64) {
	if capacity == 0 {
		capacity = rate
	}
	n := float64(max(shards, 1))
	if n > 1 {
		rate /= n
		capacity /= n
	}
	return rate, capacity
}

func formerResetMillis(p *driver.Params, n int, remaining float64) float64 {
	capacity := p.Capacity * float64(min(n, 2))
	return max(capacity-remaining, 0) * float64(p.Period) / p.Rate / float64(min(n, 2))
}

func formerLagFull(rate, capacity float64, shards int, period int64, remaining float64) float64 {
	if capacity == 0 {
		capacity = rate
	}
	n := float64(max(shards, 1))
	if n > 1 {
		capacity /= n
		rate /= n
	}
	k := math.Min(n, 2)
	return max(capacity*k-remaining, 0) * float64(period) / rate / k
}

// Share and Millis give, bit for bit, what the code they replaced gave,
// for rates and capacities of every magnitude, fractional or not, shards
// of none to many, and a remainder negative, in range or above capacity.
func TestMatchesFormerArithmetic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(vs ...float64) float64 { return vs[rng.IntN(len(vs))] }
	number := func() float64 {
		switch rng.IntN(4) {
		case 0:
			return pick(0, 1, 3, 1e-300, 0.1, 1<<53, 1e300, math.MaxFloat64, math.SmallestNonzeroFloat64)
		case 1:
			return float64(rng.IntN(1000))
		case 2:
			return rng.Float64() * 100
		}
		return math.Ldexp(rng.Float64(), rng.IntN(2000)-1000)
	}
	same := func(got, want float64) bool {
		return math.Float64bits(got) == math.Float64bits(want) || math.IsNaN(got) && math.IsNaN(want)
	}
	for range 100000 {
		rate, capacity := number(), pick(0, number())
		shards := int(pick(-1, 0, 1, 2, 3, 7, 1000, 1<<20))
		period := int64(pick(1, 1000, 86_400_000, float64(rng.Int64N(1<<40))))
		remaining := pick(0, -number(), number(), capacity, capacity*2, math.Nextafter(capacity, math.Inf(1)))

		r, c := refill.Share(rate, capacity, shards)
		wr, wc := formerShare(rate, capacity, shards)
		if !same(r, wr) || !same(c, wc) {
			t.Fatalf("Share(%v, %v, %d) = %v, %v; the former params gave %v, %v", rate, capacity, shards, r, c, wr, wc)
		}
		p := driver.Params{Kind: driver.TokenBucket, Rate: r, Capacity: c, Period: period}
		for n := 1; n <= 3; n++ {
			if got, want := refill.Millis(&p, n, remaining), formerResetMillis(&p, n, remaining); !same(got, want) {
				t.Fatalf("Millis(%+v, %d, %v) = %v; the former resetMillis gave %v", p, n, remaining, got, want)
			}
		}
		if got, want := refill.Millis(&p, shards, remaining), formerLagFull(rate, capacity, shards, period, remaining); !same(got, want) {
			t.Fatalf("Millis(%+v, %d, %v) = %v; the former lagMillis gave %v", p, shards, remaining, got, want)
		}
	}
}
