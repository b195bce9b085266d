package httplimit_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/require"
)

var lbs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}

func clientIP(t *testing.T, opts ...httplimit.IPOption) httplimit.KeyFunc {
	t.Helper()
	k, err := httplimit.ClientIP(opts...)
	require.NoError(t, err)
	return k
}

// passed counts the requests of a 5-per-hour limit that reach the handler.
func passed(t *testing.T, key httplimit.KeyFunc, requests func(i int) (remote string, headers []string)) int {
	t.Helper()
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Hour}}, nil)
	var opts []httplimit.Option
	if key != nil {
		opts = append(opts, httplimit.WithKey(key))
	}
	mw, err := httplimit.New(lim, []string{"api"}, opts...)
	require.NoError(t, err)
	h := mw.Wrap(ok)
	n := 0
	for i := range 100 {
		remote, headers := requests(i)
		if serve(h, remote, headers...).Code == http.StatusOK {
			n++
		}
	}
	return n
}

// The attack of issue 12: behind a proxy that appends X-Forwarded-For and
// passes the client's own Forwarded through, a client rotating a forged
// Forwarded (and a forged X-Forwarded-For before the proxy's entry) chose
// a new key each time: 100 of 100 passed a limit of 5.
func TestForgedForwardedBehindXFFProxy(t *testing.T) {
	forged := func(i int) (string, []string) {
		return "10.0.0.2:80", []string{
			"Forwarded", fmt.Sprintf("for=198.18.%d.%d", i/256, i%256),
			"X-Forwarded-For", fmt.Sprintf("198.19.%d.%d, 203.0.113.9", i/256, i%256), // the proxy appended 203.0.113.9
		}
	}
	require.Equal(t, 5, passed(t, clientIP(t, httplimit.TrustProxies(httplimit.XForwardedFor, lbs...)), forged))
	// With no options, no header is read: every request is the proxy's.
	require.Equal(t, 5, passed(t, nil, forged))
	// A deployment whose proxies write Forwarded reads only Forwarded,
	// where the forged values lie left of the proxy's element.
	require.Equal(t, 5, passed(t, clientIP(t, httplimit.TrustProxies(httplimit.Forwarded, lbs...)), func(i int) (string, []string) {
		return "10.0.0.2:80", []string{
			"Forwarded", fmt.Sprintf("for=198.18.%d.%d, for=203.0.113.9", i/256, i%256),
			"X-Forwarded-For", fmt.Sprintf("198.19.%d.%d", i/256, i%256),
		}
	}))
}

// 100 addresses of one /64 passed a limit of 5 when keyed apart.
func TestIPv6ClientKeyedByItsNetwork(t *testing.T) {
	rotate := func(i int) (string, []string) { return fmt.Sprintf("[2001:db8:1:2::%x]:443", i+1), nil }
	require.Equal(t, 5, passed(t, nil, rotate), "the default key")
	require.Equal(t, 5, passed(t, clientIP(t), rotate))
	require.Equal(t, 100, passed(t, clientIP(t, httplimit.IPv6Prefix(128)), rotate), "every address apart, when asked")
	// A /56 customer rotating its /64s.
	rotate64s := func(i int) (string, []string) { return fmt.Sprintf("[2001:db8:1:%x::1]:443", i%256), nil }
	require.Equal(t, 100, passed(t, nil, rotate64s))
	require.Equal(t, 5, passed(t, clientIP(t, httplimit.IPv6Prefix(56)), rotate64s))
	// Behind a proxy, the forwarded address is keyed the same way.
	behind := func(i int) (string, []string) {
		return "10.0.0.2:80", []string{"X-Forwarded-For", fmt.Sprintf("2001:db8:1:2::%x", i+1)}
	}
	require.Equal(t, 5, passed(t, clientIP(t, httplimit.TrustProxies(httplimit.XForwardedFor, lbs...)), behind))
}

func TestClientIP(t *testing.T) {
	xff := clientIP(t, httplimit.TrustProxies(httplimit.XForwardedFor, lbs...))
	fwd := clientIP(t, httplimit.TrustProxies(httplimit.Forwarded, lbs...))
	real := clientIP(t, httplimit.TrustProxies(httplimit.SingleIPHeader("x-real-ip"), lbs...))
	bare := clientIP(t)
	tests := []struct {
		name    string
		key     httplimit.KeyFunc
		remote  string
		headers []string
		want    string
	}{
		{"no proxy", xff, "203.0.113.7:4000", nil, "203.0.113.7"},
		{"no options read no header", bare, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1", "Forwarded", "for=198.51.100.2", "X-Real-IP", "198.51.100.3"}, "10.0.0.2"},
		{"spoofed header from an untrusted peer", xff, "203.0.113.7:4000", []string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.7"},
		{"behind a trusted proxy", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"spoofed leftmost values", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "1.1.1.1, 2.2.2.2, 198.51.100.1"}, "198.51.100.1"},
		{"spoofed trusted-looking value", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "10.9.9.9, 198.51.100.1"}, "198.51.100.1"},
		{"two trusted hops", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "1.1.1.1, 198.51.100.1, 10.0.0.9, 10.0.0.8"}, "198.51.100.1"},
		{"several header lines are one list", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "1.1.1.1, 198.51.100.1", "X-Forwarded-For", "10.0.0.9"}, "198.51.100.1"},
		{"several header lines, in order", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1", "X-Forwarded-For", "198.51.100.2, 10.0.0.9"}, "198.51.100.2"},
		{"a port on a hop", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1:5555"}, "198.51.100.1"},
		{"an IPv6 hop", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "[2001:db8:a:b::1]:5555"}, "2001:db8:a:b::/64"},
		{"garbage stops at the last trusted address", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1, \x00not an ip, 10.0.0.9"}, "10.0.0.9"},
		{"an empty hop stops the walk", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1,"}, "10.0.0.2"},
		{"all hops trusted: the leftmost", xff, "10.0.0.2:80", []string{"X-Forwarded-For", "10.9.9.9, 10.0.0.3"}, "10.9.9.9"},
		{"no header behind a proxy: the proxy", xff, "10.0.0.2:80", nil, "10.0.0.2"},
		{"X-Forwarded-For is not read for Forwarded", fwd, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1"}, "10.0.0.2"},
		{"Forwarded is not read for X-Forwarded-For", xff, "10.0.0.2:80", []string{"Forwarded", "for=198.51.100.1"}, "10.0.0.2"},
		{"Forwarded with quoted IPv6 and port", fwd, "10.0.0.2:80", []string{"Forwarded", `for="[2001:db8:cafe::17]:4711";proto=https`}, "2001:db8:cafe::/64"},
		{"Forwarded chain", fwd, "10.0.0.2:80", []string{"Forwarded", `for=192.0.2.60;proto=http, For=10.1.2.3`}, "192.0.2.60"},
		{"Forwarded spoofed leftmost", fwd, "10.0.0.2:80", []string{"Forwarded", `for=1.1.1.1, for=192.0.2.60`}, "192.0.2.60"},
		{"Forwarded lines are one list", fwd, "10.0.0.2:80", []string{"Forwarded", `for=1.1.1.1`, "Forwarded", `for=192.0.2.60;proto=https`}, "192.0.2.60"},
		{"Forwarded obfuscated hop", fwd, "10.0.0.2:80", []string{"Forwarded", "for=192.0.2.60, for=_hidden"}, "10.0.0.2"},
		{"Forwarded unclosed quote swallows the rest", fwd, "10.0.0.2:80", []string{"Forwarded", `for="1.1.1.1, for=192.0.2.60`}, "10.0.0.2"},
		{"single header", real, "10.0.0.2:80", []string{"X-Real-Ip", "198.51.100.1", "X-Forwarded-For", "1.1.1.1"}, "198.51.100.1"},
		{"single header from an untrusted peer", real, "203.0.113.7:1", []string{"X-Real-Ip", "198.51.100.1"}, "203.0.113.7"},
		{"single header missing", real, "10.0.0.2:80", nil, "10.0.0.2"},
		{"single header not overwritten (two lines)", real, "10.0.0.2:80", []string{"X-Real-Ip", "1.1.1.1", "X-Real-Ip", "198.51.100.1"}, "10.0.0.2"},
		{"single header holding a list", real, "10.0.0.2:80", []string{"X-Real-Ip", "1.1.1.1, 198.51.100.1"}, "10.0.0.2"},
		{"IPv6 peer", bare, "[2001:db8::5]:443", nil, "2001:db8::/64"},
		{"IPv4-mapped IPv6 peer", bare, "[::ffff:192.0.2.9]:443", nil, "192.0.2.9"},
		{"IPv6 peer with a zone", bare, "[fe80::1%eth0]:443", nil, "fe80::/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for i := 0; i+1 < len(tt.headers); i += 2 {
				r.Header.Add(tt.headers[i], tt.headers[i+1])
			}
			got, err := tt.key(r)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "not-an-address"
	_, err := bare(r)
	require.ErrorIs(t, err, httplimit.ErrNoKey)

	// A trusted prefix written as IPv4-mapped IPv6 trusts the IPv4 proxies.
	mapped := clientIP(t, httplimit.TrustProxies(httplimit.XForwardedFor, netip.MustParsePrefix("::ffff:10.0.0.0/104")))
	r.RemoteAddr = "10.0.0.2:80"
	r.Header.Set("X-Forwarded-For", "198.51.100.1")
	got, err := mapped(r)
	require.NoError(t, err)
	require.Equal(t, "198.51.100.1", got)
}

func TestClientIPRefusesUnsafeOptions(t *testing.T) {
	tests := []struct {
		name string
		opts []httplimit.IPOption
		want string
	}{
		{"no trusted proxies", []httplimit.IPOption{httplimit.TrustProxies(httplimit.XForwardedFor)}, "names no trusted proxy"},
		{"trust everyone", []httplimit.IPOption{httplimit.TrustProxies(httplimit.XForwardedFor, netip.MustParsePrefix("0.0.0.0/0"))}, "trusts every address"},
		{"trust every IPv6 address", []httplimit.IPOption{httplimit.TrustProxies(httplimit.Forwarded, netip.MustParsePrefix("::/0"))}, "trusts every address"},
		{"an invalid prefix", []httplimit.IPOption{httplimit.TrustProxies(httplimit.XForwardedFor, netip.Prefix{})}, "is not valid"},
		{"no header", []httplimit.IPOption{httplimit.TrustProxies(httplimit.ProxyHeader{}, lbs...)}, "no header chosen"},
		{"a list as a single header", []httplimit.IPOption{httplimit.TrustProxies(httplimit.SingleIPHeader("x-forwarded-for"), lbs...)}, "use httplimit.XForwardedFor"},
		{"Forwarded as a single header", []httplimit.IPOption{httplimit.TrustProxies(httplimit.SingleIPHeader("Forwarded"), lbs...)}, "use httplimit.Forwarded"},
		{"a bad header name", []httplimit.IPOption{httplimit.TrustProxies(httplimit.SingleIPHeader("X Real IP"), lbs...)}, "not a header field name"},
		{"twice", []httplimit.IPOption{httplimit.TrustProxies(httplimit.XForwardedFor, lbs...), httplimit.TrustProxies(httplimit.Forwarded, lbs...)}, "given twice"},
		{"IPv6 prefix 0", []httplimit.IPOption{httplimit.IPv6Prefix(0)}, "1 to 128"},
		{"IPv6 prefix 129", []httplimit.IPOption{httplimit.IPv6Prefix(129)}, "1 to 128"},
		{"a zero option", []httplimit.IPOption{{}}, "zero IPOption"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := httplimit.ClientIP(tt.opts...)
			require.ErrorIs(t, err, httplimit.ErrInvalidOption)
			require.ErrorContains(t, err, tt.want)
			require.Nil(t, k)
		})
	}
}

// others returns the prefixes that, with p, cover p's whole address
// space without overlapping it: the sibling of each of its ancestors.
func others(p netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	b := p.Masked().Addr().AsSlice()
	for i := range p.Bits() {
		s := append([]byte(nil), b...)
		s[i/8] ^= 0x80 >> (i % 8)
		a, _ := netip.AddrFromSlice(s)
		out = append(out, netip.PrefixFrom(a, i+1).Masked())
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// Prefixes that trust every address of a family together, none of them
// alone, let any client choose its key as 0.0.0.0/0 does: TrustProxies
// refuses them, and takes any list that leaves one address untrusted.
func TestTrustProxiesRefusesPrefixesCoveringEveryAddress(t *testing.T) {
	v4Mapped := func(ps []netip.Prefix) []netip.Prefix { // as IPv4-mapped IPv6
		var out []netip.Prefix
		for _, p := range ps {
			out = append(out, netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), p.Bits()+96))
		}
		return out
	}
	refused := []struct {
		name    string
		trusted []netip.Prefix
		want    string
	}{
		{"IPv4 halves", prefixes("0.0.0.0/1", "128.0.0.0/1"), "every IPv4 address"},
		{"IPv6 halves", prefixes("::/1", "8000::/1"), "every IPv6 address"},
		{"IPv4 halves, one IPv4-mapped", prefixes("::ffff:0.0.0.0/97", "128.0.0.0/1"), "every IPv4 address"},
		{"IPv4 quarters, overlapping, unordered, among IPv6 proxies", prefixes("fd00::/8", "192.0.0.0/2", "10.0.0.0/8", "64.0.0.0/2", "0.0.0.0/2", "128.0.0.0/3", "160.0.0.0/3", "128.0.0.0/2"), "every IPv4 address"},
		{"IPv4 from the complement of a /32", append(others(netip.MustParsePrefix("203.0.113.7/32")), netip.MustParsePrefix("203.0.113.7/32")), "every IPv4 address"},
		{"IPv4-mapped complement of a /8 with the /8", append(v4Mapped(others(netip.MustParsePrefix("10.0.0.0/8"))), netip.MustParsePrefix("10.0.0.0/8")), "every IPv4 address"},
		{"IPv6 from the complement of a /128", append(others(netip.MustParsePrefix("2001:db8::1/128")), netip.MustParsePrefix("2001:db8::1/128")), "every IPv6 address"},
		// Addresses are compared unmapped: no client is ever at an
		// IPv4-mapped IPv6 address, so the rest of IPv6 is all of it.
		{"IPv6 but for the IPv4-mapped range", others(netip.MustParsePrefix("::ffff:0:0/96")), "every IPv6 address"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			k, err := httplimit.ClientIP(httplimit.TrustProxies(httplimit.XForwardedFor, tt.trusted...))
			require.ErrorIs(t, err, httplimit.ErrInvalidOption)
			require.ErrorContains(t, err, tt.want)
			require.Nil(t, k)
		})
	}
	taken := []struct {
		name      string
		trusted   []netip.Prefix
		untrusted string // an address the list leaves untrusted
	}{
		{"IPv4 but one address", others(netip.MustParsePrefix("203.0.113.7/32")), "203.0.113.7"},
		{"IPv4 but the last address", others(netip.MustParsePrefix("255.255.255.255/32")), "255.255.255.255"},
		{"IPv4 but the first address, IPv4-mapped", v4Mapped(others(netip.MustParsePrefix("0.0.0.0/32"))), "0.0.0.0"},
		{"IPv6 but one address", others(netip.MustParsePrefix("2001:db8::1/128")), "2001:db8::1"},
		{"IPv6 but the last address", others(netip.MustParsePrefix("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")), "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		{"IPv4 and IPv6 halves", prefixes("0.0.0.0/1", "8000::/1"), "128.0.0.1"},
		{"IPv6 over the IPv4-mapped range, which trusts no IPv4 address", prefixes("::/1", "0.0.0.0/1"), "128.0.0.1"},
	}
	for _, tt := range taken {
		t.Run(tt.name, func(t *testing.T) {
			k, err := httplimit.ClientIP(httplimit.TrustProxies(httplimit.XForwardedFor, tt.trusted...), httplimit.IPv6Prefix(128))
			require.NoError(t, err)
			// The one untrusted address is its own key, whatever it sends.
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = net.JoinHostPort(tt.untrusted, "1")
			r.Header.Set("X-Forwarded-For", "198.51.100.1")
			got, err := k(r)
			require.NoError(t, err)
			require.Equal(t, tt.untrusted, got)
		})
	}
}

// TestBehindReverseProxy runs the middleware behind Go's
// httputil.ReverseProxy on loopback, both ways it can forward: the
// client, on 127.0.0.2, forges X-Forwarded-For and Forwarded on every
// request; the proxy, on 127.0.0.1, is the only trusted address.
func TestBehindReverseProxy(t *testing.T) {
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Hour}}, nil)
	key := clientIP(t, httplimit.TrustProxies(httplimit.XForwardedFor, netip.MustParsePrefix("127.0.0.1/32")))
	var keys []string
	spy := func(r *http.Request) (string, error) {
		k, err := key(r)
		keys = append(keys, k)
		return k, err
	}
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(spy))
	require.NoError(t, err)
	app := httptest.NewServer(mw.Wrap(ok))
	t.Cleanup(app.Close)
	target, err := url.Parse(app.URL)
	require.NoError(t, err)

	proxies := map[string]*httputil.ReverseProxy{
		"Director": httputil.NewSingleHostReverseProxy(target), // appends to X-Forwarded-For, passes Forwarded through
		"Rewrite": {Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Header["X-Forwarded-For"] = r.In.Header["X-Forwarded-For"] // append, as the docs show
			r.SetXForwarded()
		}},
	}
	for name, proxy := range proxies {
		t.Run(name, func(t *testing.T) {
			keys = nil
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })
			client := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
				LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)},
			}).DialContext}}
			t.Cleanup(client.CloseIdleConnections)
			var codes []int
			for i := range 5 {
				req, err := http.NewRequest("GET", "http://"+ln.Addr().String()+"/", nil)
				require.NoError(t, err)
				req.Header.Set("X-Forwarded-For", fmt.Sprintf("198.18.0.%d", i))
				req.Header.Set("Forwarded", fmt.Sprintf("for=198.19.0.%d", i))
				resp, err := client.Do(req)
				require.NoError(t, err)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes = append(codes, resp.StatusCode)
			}
			require.Equal(t, []int{200, 200, 200, 429, 429}, codes)
			require.Equal(t, []string{"127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.2"}, keys)
			require.NoError(t, lim.Reset(t.Context(), "api", "127.0.0.2"))
		})
	}
}

// A long forwarding list cost the key function memory and time in
// proportion to its entries: a trusted proxy that passes headers of 1 MB
// (Go's default) let one request of commas allocate 256 MB. The walk
// reads only the hops it passes (X-Forwarded-For) or keeps nothing per
// hop (Forwarded, read from the left).
func TestLongForwardingListsCostLittle(t *testing.T) {
	const size = 64 << 10
	long := func(unit, tail string) string {
		return strings.Repeat(unit, size/len(unit)) + tail
	}
	tests := []struct {
		header string
		value  string
		want   string
	}{
		{"X-Forwarded-For", long(",", "198.51.100.1"), "198.51.100.1"},
		{"X-Forwarded-For", long("x,", "198.51.100.1, 10.0.0.9"), "198.51.100.1"},
		{"X-Forwarded-For", long("10.0.0.7,", "10.0.0.9"), "10.0.0.7"},
		{"Forwarded", long(",", "for=198.51.100.1"), "198.51.100.1"},
		{"Forwarded", long("for=x,", "for=198.51.100.1"), "198.51.100.1"},
		{"Forwarded", long(`for="x",`, "for=198.51.100.1"), "198.51.100.1"},
		{"Forwarded", long(`for="\x",`, "for=198.51.100.1"), "198.51.100.1"},
		{"Forwarded", long("for=1,", "for=198.51.100.1, for=10.0.0.9"), "198.51.100.1"},
		{"Forwarded", long("for=10.0.0.7,", "for=10.0.0.9"), "10.0.0.7"},
	}
	keys := map[string]httplimit.KeyFunc{
		"X-Forwarded-For": clientIP(t, httplimit.TrustProxies(httplimit.XForwardedFor, lbs...)),
		"Forwarded":       clientIP(t, httplimit.TrustProxies(httplimit.Forwarded, lbs...)),
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %.12s", tt.header, tt.value), func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = "10.0.0.2:80"
			r.Header.Set(tt.header, tt.value)
			key := keys[tt.header]
			got, err := key(r)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range 10 {
				key(r)
			}
			runtime.ReadMemStats(&after)
			perCall := (after.TotalAlloc - before.TotalAlloc) / 10
			require.Less(t, perCall, uint64(4<<10), "bytes allocated per key, for a header of %d bytes", len(tt.value))
		})
	}
}
