package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// exactPairWait is the least wait of a call refused on recs, by the
// decision itself: a binary search of every millisecond up to
// MaxRetryAfter, the wait a call that succeeds only later is told.
func exactPairWait(recs []driver.Record, p, q driver.Params, now int64, count float64, reserve bool) int64 {
	end := now + driver.MaxRetryAfter
	if !okAt(recs, p, q, end, count, reserve) {
		return driver.MaxRetryAfter
	}
	return leastOK(recs, p, q, now, end, count, reserve) - now
}

// year is a year of 365 days, in milliseconds.
const year = 365 * 24 * 3600 * 1000

// The least wait of a sharded call holds at the bounds of the config
// space too: a Period of up to 100 years, a Rate down to 1e-9, waits of
// decades. There the estimate of both shards together, which counts their
// shortfall in full though they grant a call short by less than twice the
// noise, can be late by more than the cap (a shortfall of 1.7e-9 at
// 4.3e-9 tokens a century is a century), and the call was told the cap,
// 292 years, where the first century after it granted it; and records
// written by a clock ahead of the caller's, which the estimates do not
// model, left an estimate early past every candidate tried, which stood:
// a retry at RetryAfter was refused. The wait is the first millisecond at
// which the call succeeds, found by a binary search of every millisecond
// up to the cap.
func TestPairRetryAfterAtTheBoundsIsTheLeastWait(t *testing.T) {
	century := MaxPeriod.Milliseconds()
	cases := []struct {
		name    string
		p, q    driver.Params
		recs    []driver.Record
		now     int64
		count   float64
		reserve bool
		want    int64
	}{{
		// Both shards short by 1.68e-9 at the fourth century, within the
		// noise: told the cap, 292 years, where 256 sufficed.
		name: "fixed window of a century",
		p:    driver.Params{Kind: driver.FixedWindow, Rate: 4.329647261991161e-09, Period: century, Capacity: 9.667181816985408e-09, MaxReserved: 9.224013196245124e-09},
		recs: []driver.Record{
			{State: driver.State{Remaining: -6.078757276015956e-09, TS: century}, Found: true},
			{State: driver.State{Remaining: 1.6976535942251243e-09, TS: 0}, Found: true},
		},
		now: 4524109630001, count: 1.826406759220565e-08,
		want: 4*century - 4524109630001,
	}, {
		name: "token bucket of a century",
		p:    driver.Params{Kind: driver.TokenBucket, Rate: 3.0688434318218836e-09, Period: century, Capacity: 8.272252307605854e-09, MaxReserved: 6.91685759215378e-09},
		recs: []driver.Record{
			{State: driver.State{Remaining: -4.4522904727171026e-09, TS: 168100897838}, Found: true},
			{State: driver.State{Remaining: 3.87748153544406e-09, TS: 1052345504379}, Found: true},
		},
		now: 2048764005515, count: 1.6252982788980235e-08,
		want: 8847550802385, // 280 years
	}, {
		// A reservation spread over both shards: told 292 years, where 32
		// sufficed.
		name: "token bucket reservation",
		p:    driver.Params{Kind: driver.TokenBucket, Rate: 2.92565974809056e-10, Period: century, Capacity: 1e-06, MaxReserved: 1.0812010260176851e-07},
		recs: []driver.Record{
			{State: driver.State{Remaining: 6.084883577085264e-07, TS: 706573237901}, Found: true},
			{State: driver.State{Remaining: 8.868927497757599e-07, TS: 1287236665316}, Found: true},
		},
		now: 1712447324124, count: 1.7139427396645659e-06, reserve: true,
		want: 1017944622164,
	}, {
		// A record of a clock an hour ahead, which gains tokens alone for
		// 9.8 seconds before the other: the estimate was 4,908 ms early,
		// past the candidates tried, and stood.
		name: "fixed window of a millisecond, a clock ahead",
		p:    driver.Params{Kind: driver.FixedWindow, Rate: 3.5, Period: 1, Capacity: 4194303.5, MaxReserved: 5e-10},
		recs: []driver.Record{
			{State: driver.State{Remaining: 2515635.0800377512, TS: 1700003733594}, Found: true},
			{State: driver.State{Remaining: 0, TS: 1700003743410}, Found: true},
		},
		now: 1700000146217, count: 4397055.47802727,
		want: 3861060,
	}, {
		name: "fixed window of a second, a clock ahead",
		p:    driver.Params{Kind: driver.FixedWindow, Rate: 1.296971759068489, Period: 1000, Capacity: 4.447590286234671, MaxReserved: 1.3452865030222183, Phase: 609},
		q:    driver.Params{Kind: driver.FixedWindow, Rate: 1.296971759068489, Period: 1000, Capacity: 4.447590286234671, MaxReserved: 1.3452865030222183, Phase: 885},
		recs: []driver.Record{
			{State: driver.State{Remaining: -0.7938270966807645, TS: 1700000038609}, Found: true},
			{State: driver.State{Remaining: -0.49258468716489484, TS: 1700000042335}, Found: true},
		},
		now: 1700000040038, count: 5.830822600703125,
		want: 4297,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := c.q
			if q.Kind == 0 {
				q = c.p
			}
			require.Equal(t, c.want, exactPairWait(c.recs, c.p, q, c.now, c.count, c.reserve), "the least wait")
			d, _, _ := pair(c.p, q, c.recs[0], c.recs[1], c.now, c.count, c.reserve)
			require.False(t, d.OK)
			require.Equal(t, c.want, d.RetryAfter, "RetryAfter")
		})
	}

	// Limits at and near the bounds of the config space, whose records a
	// few calls, some of a clock ahead, left anywhere between a debt and
	// full.
	space := pairSpace{
		fixedEvery: 2,
		shards:     []int{2, 3, 8, MaxShards},
		periods:    []int64{1, 1000, 24 * 3600 * 1000, year, 10 * year, century},
		limit: func(rng *rand.Rand, cfg *Config) {
			cfg.Rate = math.Pow(10, -9+12*rng.Float64())
			switch rng.IntN(3) {
			case 1:
				cfg.Capacity = cfg.Rate * (0.5 + 3*rng.Float64())
			case 2:
				cfg.Capacity = float64(cfg.Shards) * []float64{1, 0.5, 2, 1e-6, 10}[rng.IntN(5)]
			}
		},
		skewed: true,
	}
	rng := rand.New(rand.NewPCG(31, 37))
	refused, long := 0, 0
	for i := range 40_000 {
		c, ok := space.draw(rng, i)
		if !ok || c.count < MinCount {
			continue
		}
		d := c.decide()
		if d.OK {
			continue
		}
		refused++
		want := exactPairWait(c.recs, c.p, c.q, c.now, c.count, c.reserve)
		if want > 10*year && want < driver.MaxRetryAfter {
			long++
		}
		require.Equal(t, want, d.RetryAfter, "%s", fmt.Sprintf("case %d: %v", i, c))
	}
	t.Logf("%d refused calls, %d told more than 10 years and less than the cap", refused, long)
	require.Greater(t, refused, 8000)
	require.Greater(t, long, 500)
}
