package httplimit

import (
	"math"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/clientip"
	"github.com/stretchr/testify/require"
)

var fuzzTrusted = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}

// FuzzClientIP checks, for every header a client or a proxy may send, that
// the key function neither fails on a readable peer nor lets a header
// choose a key it may not: an untrusted peer is its own key; behind
// trusted proxies, the key is the peer or a hop at or to the right of the
// first untrusted hop (counted from the right), never one to its left.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:80", "198.51.100.1, 10.0.0.2", "1.1.1.1", `for="[2001:db8::1]:80"`, "")
	f.Add("203.0.113.1:1", "\x00", "", "for=;;;,,", "for=1.2.3.4")
	f.Add("[fd00::1]:1", "[", "", `for="[`, `for=10.0.0.3, for="x`)
	f.Add("10.0.0.1:80", "1.1.1.1, 10.0.0.9", "10.0.0.8", `for=1.1.1.1;proto=https, for=10.2.2.2`, `For="\"", for=2001:db8::7`)
	xff, err := ClientIP(TrustProxies(XForwardedFor, fuzzTrusted...))
	require.NoError(f, err)
	fwd, err := ClientIP(TrustProxies(Forwarded, fuzzTrusted...))
	require.NoError(f, err)
	bare, err := ClientIP()
	require.NoError(f, err)
	keyed, err := clientip.Trust(clientip.XForwardedFor, fuzzTrusted)
	require.NoError(f, err)
	format := func(ip netip.Addr) string { return clientip.Format(ip, DefaultIPv6Prefix) }
	f.Fuzz(func(t *testing.T, remote, xff1, xff2, fwd1, fwd2 string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		for _, v := range []string{xff1, xff2} {
			if v != "" {
				r.Header.Add("X-Forwarded-For", v)
			}
		}
		for _, v := range []string{fwd1, fwd2} {
			if v != "" {
				r.Header.Add("Forwarded", v)
			}
		}
		peer, ok := clientip.ParseAddr(remote)
		for _, k := range []KeyFunc{bare, xff, fwd} {
			got, err := k(r)
			if !ok {
				if err == nil {
					t.Fatalf("remote %q is no address, but key %q was chosen", remote, got)
				}
				continue
			}
			require.NoError(t, err, "remote %q", remote)
			if _, err := netip.ParsePrefix(got); err != nil {
				if _, err := netip.ParseAddr(got); err != nil {
					t.Fatalf("key %q is neither an address nor a network", got)
				}
			}
		}
		if !ok {
			return
		}
		got, _ := bare(r)
		require.Equal(t, format(peer), got, "ClientIP() read a header")
		if !keyed.Trusts(peer) {
			for _, k := range []KeyFunc{xff, fwd} {
				got, _ := k(r)
				require.Equal(t, format(peer), got, "an untrusted peer chose its key through headers")
			}
			return
		}
		// The hops a key may come from: the peer, and the hops from the
		// right up to and including the first untrusted one.
		check := func(name string, k KeyFunc, hops []clientip.Hop) {
			allowed := []string{format(peer)}
			for i := len(hops) - 1; i >= 0 && hops[i].OK; i-- {
				allowed = append(allowed, format(hops[i].IP))
				if !keyed.Trusts(hops[i].IP) {
					break
				}
			}
			got, _ := k(r)
			require.Contains(t, allowed, got, "%s: the key comes from left of the first untrusted hop", name)
			// And it is the one the walk from the right over the whole
			// list finds.
			want := peer
			for i := len(hops) - 1; i >= 0 && hops[i].OK; i-- {
				want = hops[i].IP
				if !keyed.Trusts(want) {
					break
				}
			}
			require.Equal(t, format(want), got, "%s: not the walk's answer", name)
		}
		// X-Forwarded-For, split here on its own: a comma-separated list.
		var hops []clientip.Hop
		for _, line := range r.Header.Values("X-Forwarded-For") {
			for _, v := range strings.Split(line, ",") {
				ip, ok := clientip.ParseAddr(v)
				hops = append(hops, clientip.Hop{IP: ip, OK: ok})
			}
		}
		check("X-Forwarded-For", xff, hops)
		check("Forwarded", fwd, forwardedLines(r.Header.Values("Forwarded")))
	})
}

// FuzzForwardedAppend plays a trusted proxy that appends its client's
// address to whatever Forwarded (or X-Forwarded-For) the client sent: the
// key must be that client, or at worst the proxy itself, never anything
// the client wrote.
func FuzzForwardedAppend(f *testing.F) {
	f.Add(`for=1.2.3.4`, "203.0.113.9", false)
	f.Add(`for="`, "2001:db8::1", true)
	f.Add(`for=1.1.1.1, for="[::1]:1";by=x`, "198.51.100.2", false)
	f.Add(`for=\"1.1.1.1\", for="\\`, "198.51.100.2", false)
	fwd, err := ClientIP(TrustProxies(Forwarded, fuzzTrusted...))
	require.NoError(f, err)
	xff, err := ClientIP(TrustProxies(XForwardedFor, fuzzTrusted...))
	require.NoError(f, err)
	keyed, err := clientip.Trust(clientip.XForwardedFor, fuzzTrusted)
	require.NoError(f, err)
	format := func(ip netip.Addr) string { return clientip.Format(ip, DefaultIPv6Prefix) }
	f.Fuzz(func(t *testing.T, forged, client string, newLine bool) {
		ip, err := netip.ParseAddr(client)
		if err != nil || keyed.Trusts(ip.Unmap()) || ip.Zone() != "" {
			return
		}
		ip = ip.Unmap()
		for _, tc := range []struct {
			header string
			k      KeyFunc
			elem   string
		}{
			{"Forwarded", fwd, `for="` + netip.AddrPortFrom(ip, 443).String() + `"`},
			{"X-Forwarded-For", xff, ip.String()},
		} {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = "10.0.0.2:80"
			if newLine {
				r.Header.Add(tc.header, forged)
				r.Header.Add(tc.header, tc.elem)
			} else {
				r.Header.Set(tc.header, forged+", "+tc.elem)
			}
			got, err := tc.k(r)
			require.NoError(t, err)
			require.Contains(t, []string{format(ip), "10.0.0.2"}, got, "%s: forged %q", tc.header, forged)
		}
	})
}

func TestQuota(t *testing.T) {
	tests := []struct {
		rate   float64
		period time.Duration
		q, w   int64
	}{
		{2, time.Minute, 2, 60},
		{0.5, time.Second, 1, 2},
		{1, 100 * time.Millisecond, 10, 1},
		{1, 1500 * time.Millisecond, 2, 3},
		{1.0 / 3, time.Second, 1, 3},
		{0.1, time.Second, 1, 10},
		{0.3, time.Second, 3, 10},
		{2000, time.Hour, 2000, 3600},
		{1, 1001 * time.Millisecond, 1000, 1001},
		{0.5, 7 * 24 * time.Hour, 1, 14 * 24 * 3600},
		{1e-6, time.Second, 1, 1_000_000},
		{1e18, time.Second, maxSFInteger, 1},
	}
	for _, tt := range tests {
		q, w := quota(tt.rate, tt.period)
		require.Equal(t, [2]int64{tt.q, tt.w}, [2]int64{q, w}, "rate %v per %v", tt.rate, tt.period)
	}
	// No whole quota states π per second within a day: rounded down.
	q, w := quota(math.Pi, time.Second)
	require.LessOrEqual(t, float64(q)/float64(w), math.Pi)
	require.Greater(t, float64(q)/float64(w), math.Pi*0.9999)
}

// TestQuotaNeverPromisesMore checks the announcement of many rates and
// periods: a whole quota ≥ 1 over whole seconds ≥ 1, never above the rate.
func TestQuotaNeverPromisesMore(t *testing.T) {
	rates := []float64{1e-7, 0.001, 0.013, 0.25, 0.7, 1, 1.1, math.E, 7, 33.3, 1000, 123456.789}
	periods := []time.Duration{time.Millisecond, 7 * time.Millisecond, 250 * time.Millisecond, 999 * time.Millisecond,
		time.Second, 1001 * time.Millisecond, time.Minute, 97 * time.Second, time.Hour, 24 * time.Hour, 365 * 24 * time.Hour}
	for _, rate := range rates {
		for _, period := range periods {
			q, w := quota(rate, period)
			perSecond := rate / period.Seconds()
			require.GreaterOrEqual(t, q, int64(1), "rate %v per %v", rate, period)
			require.GreaterOrEqual(t, w, int64(1), "rate %v per %v", rate, period)
			require.LessOrEqual(t, float64(q)/float64(w), perSecond*(1+1e-9), "rate %v per %v: q=%d w=%d", rate, period, q, w)
		}
	}
}

// forwardedLines reads Forwarded lines as one list of hops, leftmost first.
func forwardedLines(lines []string) []clientip.Hop {
	var hops []clientip.Hop
	for _, line := range lines {
		clientip.ForwardedHops(line, func(h clientip.Hop) { hops = append(hops, h) })
	}
	return hops
}
