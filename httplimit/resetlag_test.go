package httplimit_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/require"
)

// A caller whose clock lags the record (the clock stepped back, or another
// process, its clock ahead, wrote it) is told in t when r grows as the
// Limiter will grant it: a token bucket refills from the record's time,
// as ResetAfter and RetryAfter count it. A bucket of 1 a second, capacity
// 5, spent to 3 at t0+10s; the clock steps back to t0: the next token
// comes 11 s on, not 1 s on (t was 1, ten seconds early, and a client
// that came back then was refused). Alone and with a second limit
// (LimitAll), allowed and refused.
func TestTokenBucketResetOnALaggingClock(t *testing.T) {
	tb := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 5}
	for _, tc := range []struct {
		name  string
		names []string
	}{
		{"alone", []string{"tb"}},
		{"LimitAll", []string{"tb", "wide"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := func(r, t string) string { return `"tb";r=` + r + `;t=` + t }
			lim, mock := limiter(t, ratelimit.Limits{"tb": tb,
				"wide": {Kind: ratelimit.TokenBucket, Rate: 1e-3, Period: time.Hour, Capacity: 1e9}}, nil)
			cost := 2.0
			h := must(httplimit.New(lim, tc.names, httplimit.WithCost(func(*http.Request) (float64, error) { return cost, nil }))).Wrap(ok)
			rl := func(c float64) (int, string, string) {
				cost = c
				w := serve(h, "192.0.2.1:1")
				tb, _, _ := strings.Cut(w.Header().Get("RateLimit"), ", ") // the item of tb
				return w.Code, tb, w.Header().Get("Retry-After")
			}
			mock.Set(t0.Add(10 * time.Second))
			code, field, _ := rl(2)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, want("3", "1"), field)

			mock.Set(t0)
			code, field, _ = rl(1)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, want("2", "11"), field, "the next token 11 s on: the refill starts at the record's time")
			code, field, retry := rl(3)
			require.Equal(t, http.StatusTooManyRequests, code)
			require.Equal(t, want("2", "11"), field)
			require.Equal(t, "11", retry)

			mock.Set(t0.Add(11*time.Second - time.Millisecond))
			_, field, _ = rl(0)
			require.Equal(t, want("2", "1"), field, "not a token more a millisecond before")
			mock.Set(t0.Add(11 * time.Second))
			_, field, _ = rl(0)
			require.Equal(t, want("3", "1"), field)
		})
	}
}
