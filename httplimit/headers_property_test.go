package httplimit_test

import (
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/require"
)

// rateLimitItem reads the r and t of the RateLimit field of one limit;
// t is -1 when the item has none.
var rateLimitItem = regexp.MustCompile(`^"l";r=(\d+)(?:;t=(\d+))?$`)

func readItem(t *testing.T, field string) (r, reset int64) {
	t.Helper()
	m := rateLimitItem.FindStringSubmatch(field)
	require.NotNil(t, m, "RateLimit %q", field)
	r = must(strconv.ParseInt(m[1], 10, 64))
	reset = -1
	if m[2] != "" {
		reset = must(strconv.ParseInt(m[2], 10, 64))
	}
	return r, reset
}

// The RateLimit field keeps its word for a random unsharded limit, along
// random timelines: r requests of one token pass at once and the next is
// refused; r grows by one after t seconds and not a second sooner; a
// request refused with Retry-After s passes s seconds later. A probe of
// cost 0 reads the field without spending. The clock steps back now and
// then, as a caller's that lags the records does (t of a token bucket was
// short by the lag).
func TestRateLimitFieldKeepsItsWord(t *testing.T) {
	rates := []float64{0.3, 0.5, 1, 1.0 / 3, 2, 2.5, 3, 7, 10, 100}
	periods := []time.Duration{7 * time.Millisecond, 250 * time.Millisecond, time.Second, 1500 * time.Millisecond, time.Minute}
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		cfg := ratelimit.Config{
			Kind:   []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket}[rng.IntN(2)],
			Rate:   rates[rng.IntN(len(rates))],
			Period: periods[rng.IntN(len(periods))],
		}
		cfg.Capacity = max(cfg.Rate*[]float64{1, 1.5, 2, 3}[rng.IntN(4)], []float64{1, 1.5, 2, 4}[rng.IntN(4)])
		if cfg.Kind == ratelimit.FixedWindow && rng.IntN(2) == 0 {
			cfg.Start = t0.Add(time.Duration(rng.IntN(1000)) * time.Millisecond)
		}
		lim, mock := limiter(t, ratelimit.Limits{"l": cfg}, nil)
		var cost float64
		h := must(httplimit.New(lim, []string{"l"}, httplimit.WithCost(func(*http.Request) (float64, error) { return cost, nil }))).Wrap(ok)
		do := func(c float64) (int, int64, int64, string) {
			cost = c
			w := serve(h, "192.0.2.1:1")
			r, reset := readItem(t, w.Header().Get("RateLimit"))
			return w.Code, r, reset, w.Header().Get("Retry-After")
		}
		where := func(step int) string {
			return "seed " + strconv.FormatUint(seed, 10) + " step " + strconv.Itoa(step) + " " + cfgString(cfg)
		}
		for step := range 30 {
			mock.Add(time.Duration(rng.Int64N(int64(2*cfg.Period/time.Millisecond)+1)) * time.Millisecond)
			if rng.IntN(5) == 0 {
				// The clock steps back: the records are ahead of it, and
				// refill or open their next window from their own time.
				mock.Add(-time.Duration(rng.Int64N(int64(3*cfg.Period/time.Millisecond)+1)) * time.Millisecond)
			}
			switch rng.IntN(3) {
			case 0: // spend what r says, then one more
				_, r, _, _ := do(0)
				for i := range r {
					code, _, _, _ := do(1)
					require.Equal(t, http.StatusOK, code, "%s: request %d of r=%d", where(step), i+1, r)
				}
				code, r2, _, retry := do(1)
				require.Equal(t, http.StatusTooManyRequests, code, "%s: request past r=%d", where(step), r)
				require.Zero(t, r2, where(step))
				s := must(strconv.ParseInt(retry, 10, 64))
				require.GreaterOrEqual(t, s, int64(1), where(step))
				mock.Add(time.Duration(s) * time.Second)
				code, _, _, _ = do(1)
				require.Equal(t, http.StatusOK, code, "%s: refused again %ds later, its Retry-After", where(step), s)
			case 1: // t: r grows then, not a second sooner
				_, r, reset, _ := do(0)
				if reset < 0 {
					continue
				}
				require.GreaterOrEqual(t, reset, int64(1), "%s: t=%d", where(step), reset)
				mock.Add(time.Duration(reset-1) * time.Second)
				_, r1, _, _ := do(0)
				require.Equal(t, r, r1, "%s: r grew before t=%d", where(step), reset)
				mock.Add(time.Second)
				_, r2, _, _ := do(0)
				require.GreaterOrEqual(t, r2, r+1, "%s: r did not grow by t=%d", where(step), reset)
			default:
				do(1)
			}
		}
	}
}

func cfgString(c ratelimit.Config) string {
	return c.Kind.String() + " rate " + strconv.FormatFloat(c.Rate, 'g', -1, 64) + " per " + c.Period.String() +
		" capacity " + strconv.FormatFloat(c.Capacity, 'g', -1, 64) + " start " + c.Start.Format(time.RFC3339Nano)
}
