package httplimit_test

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/ratelimit-go/ratelimit/internal/clientip/clientiptest"
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

// configured returns the KeyFunc of a configuration of the shared cases.
func configured(t *testing.T, p clientiptest.Proxies) httplimit.KeyFunc {
	t.Helper()
	var opts []httplimit.IPOption
	switch p.Header {
	case "":
	case "X-Forwarded-For":
		opts = append(opts, httplimit.TrustProxies(httplimit.XForwardedFor, p.Trusted...))
	case "Forwarded":
		opts = append(opts, httplimit.TrustProxies(httplimit.Forwarded, p.Trusted...))
	default:
		opts = append(opts, httplimit.TrustProxies(httplimit.SingleIPHeader(p.Header), p.Trusted...))
	}
	if p.V6Bits != 0 {
		opts = append(opts, httplimit.IPv6Prefix(p.V6Bits))
	}
	if p.Unix {
		opts = append(opts, httplimit.TrustUnixSocket())
	}
	return clientIP(t, opts...)
}

// request returns the request of a case. One that came over a Unix socket
// has the peer's name as its RemoteAddr, and the listener's address in its
// context, as net/http serves it.
func request(c clientiptest.Case) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = c.Remote
	if name, ok := clientiptest.UnixPeer(c.Remote); ok {
		r.RemoteAddr = name
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.UnixAddr{Name: "/run/app.sock", Net: "unix"}))
	}
	for i := 0; i+1 < len(c.Headers); i += 2 {
		r.Header.Add(c.Headers[i], c.Headers[i+1])
	}
	return r
}

// TestClientIP runs the cases that ratelimitgrpc's ClientIP is held to as
// well.
func TestClientIP(t *testing.T) {
	for _, tt := range clientiptest.Cases {
		t.Run(tt.Name, func(t *testing.T) {
			got, err := configured(t, tt.Proxies)(request(tt))
			require.NoError(t, err)
			require.Equal(t, tt.Want, got)
		})
	}
	for _, tt := range clientiptest.NoKey {
		t.Run(tt.Name, func(t *testing.T) {
			_, err := configured(t, tt.Proxies)(request(tt))
			require.ErrorIs(t, err, httplimit.ErrNoKey)
		})
	}
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
		// net/http takes these out of Request.Header: no request's value
		// would be read, and every request through the proxy would share
		// the proxy's key.
		{"Host as a single header", []httplimit.IPOption{httplimit.TrustProxies(httplimit.SingleIPHeader("host"), lbs...)}, "net/http moves Host out"},
		{"Transfer-Encoding as a single header", []httplimit.IPOption{httplimit.TrustProxies(httplimit.SingleIPHeader("Transfer-Encoding"), lbs...)}, "net/http moves Transfer-Encoding out"},
		{"Trailer as a single header", []httplimit.IPOption{httplimit.TrustProxies(httplimit.SingleIPHeader("Trailer"), lbs...)}, "net/http moves Trailer out"},
		{"twice", []httplimit.IPOption{httplimit.TrustProxies(httplimit.XForwardedFor, lbs...), httplimit.TrustProxies(httplimit.Forwarded, lbs...)}, "given twice"},
		{"IPv6 prefix 0", []httplimit.IPOption{httplimit.IPv6Prefix(0)}, "1 to 128"},
		{"IPv6 prefix 129", []httplimit.IPOption{httplimit.IPv6Prefix(129)}, "1 to 128"},
		// The last one silently won: which width was meant cannot be
		// told, and each keys every IPv6 client differently.
		{"IPv6 prefix twice", []httplimit.IPOption{httplimit.IPv6Prefix(48), httplimit.TrustProxies(httplimit.XForwardedFor, lbs...), httplimit.IPv6Prefix(56)}, "IPv6Prefix is given twice (48, then 56)"},
		{"IPv6 prefix twice alike", []httplimit.IPOption{httplimit.IPv6Prefix(64), httplimit.IPv6Prefix(64)}, "IPv6Prefix is given twice"},
		{"a zero option", []httplimit.IPOption{{}}, "zero IPOption"},
		{"a Unix socket without a header", []httplimit.IPOption{httplimit.TrustUnixSocket()}, "no TrustProxies says which header"},
		{"a Unix socket twice", []httplimit.IPOption{httplimit.TrustUnixSocket(), httplimit.TrustProxies(httplimit.XForwardedFor), httplimit.TrustUnixSocket()}, "given twice"},
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

// Prefixes that trust every address of a family together, none of them
// alone, let any client choose its key as 0.0.0.0/0 does: TrustProxies
// refuses them. So it does a prefix wider than any network of proxies,
// which was taken: trusted, 0.0.0.0/1 let every client in half the IPv4
// internet choose its key. It takes the widest lists that leave one
// address untrusted. The lists are those ratelimitgrpc's TrustProxies is
// tested with.
func TestTrustProxiesRefusesPrefixesCoveringEveryAddress(t *testing.T) {
	for _, tt := range slices.Concat(clientiptest.CoveringEvery, clientiptest.TooWide) {
		t.Run(tt.Name, func(t *testing.T) {
			k, err := httplimit.ClientIP(httplimit.TrustProxies(httplimit.XForwardedFor, tt.Trusted...))
			require.ErrorIs(t, err, httplimit.ErrInvalidOption)
			require.ErrorContains(t, err, tt.Want)
			require.Nil(t, k)
		})
	}
	for _, tt := range clientiptest.LeavingOne {
		t.Run(tt.Name, func(t *testing.T) {
			k, err := httplimit.ClientIP(httplimit.TrustProxies(httplimit.XForwardedFor, tt.Trusted...), httplimit.IPv6Prefix(128))
			require.NoError(t, err)
			// The one untrusted address is its own key, whatever it sends.
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = net.JoinHostPort(tt.Untrusted, "1")
			r.Header.Set("X-Forwarded-For", "198.51.100.1")
			got, err := k(r)
			require.NoError(t, err)
			require.Equal(t, cmp.Or(tt.Key, tt.Untrusted), got)
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
	for _, tt := range clientiptest.LongLists() {
		t.Run(tt.Name, func(t *testing.T) {
			r := request(tt)
			key := configured(t, tt.Proxies)
			got, err := key(r)
			require.NoError(t, err)
			require.Equal(t, tt.Want, got)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range 10 {
				key(r)
			}
			runtime.ReadMemStats(&after)
			perCall := (after.TotalAlloc - before.TotalAlloc) / 10
			require.Less(t, perCall, uint64(4<<10), "bytes allocated per key, for a header of %d bytes", len(tt.Headers[1]))
		})
	}
}

// unixSocket returns the path of a Unix socket in a directory of its own,
// removed when the test ends. The directory is short-named under the
// system's temporary directory: a socket's path is limited to about 100
// bytes, which a test's own directory may exceed.
func unixSocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "httplimit")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "app.sock")
}

// A service that listens on a Unix socket behind a reverse proxy on the
// same machine (nginx → unix:/run/app.sock; here Go's
// httputil.ReverseProxy on loopback, which appends to X-Forwarded-For)
// sees the peer as net/http names a socket without a name: RemoteAddr "@"
// on Linux, "" elsewhere, no IP address. With TrustProxies alone every
// request was refused 400 (no key), and no option trusted the proxy:
// TrustUnixSocket does. The client, on 127.0.0.2, forges X-Forwarded-For
// on every request and is keyed by its own address; a request made on the
// socket directly, with no header (a health check), is keyed UnixPeerKey.
func TestBehindReverseProxyOnUnixSocket(t *testing.T) {
	sock := unixSocket(t)
	lim, _ := limiter(t, ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Hour}}, nil)
	var (
		mu            sync.Mutex // guards what follows, which the server's goroutines share
		keys, remotes []string
		key           httplimit.KeyFunc
	)
	spy := func(r *http.Request) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		k, err := key(r)
		keys, remotes = append(keys, k), append(remotes, r.RemoteAddr)
		return k, err
	}
	seen := func() ([]string, []string) {
		mu.Lock()
		defer mu.Unlock()
		k, r := keys, remotes
		keys, remotes = nil, nil
		return k, r
	}
	mw, err := httplimit.New(lim, []string{"api"}, httplimit.WithKey(spy))
	require.NoError(t, err)
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	app := &http.Server{Handler: mw.Wrap(ok), ReadHeaderTimeout: 10 * time.Second}
	go app.Serve(ln)
	t.Cleanup(func() { app.Close() })

	overSocket := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(overSocket.CloseIdleConnections)
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: "app"})
	proxy.Transport = overSocket
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	front := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	go front.Serve(pln)
	t.Cleanup(func() { front.Close() })
	client := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)},
	}).DialContext}}
	t.Cleanup(client.CloseIdleConnections)
	get := func(c *http.Client, url string, i int) int {
		t.Helper()
		req, err := http.NewRequest("GET", url, nil)
		require.NoError(t, err)
		if i >= 0 {
			req.Header.Set("X-Forwarded-For", fmt.Sprintf("198.18.0.%d", i))
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	run := func(opts ...httplimit.IPOption) (codes []int, keyed, peers []string) {
		t.Helper()
		k := clientIP(t, opts...)
		mu.Lock()
		key = k
		mu.Unlock()
		for i := range 5 {
			codes = append(codes, get(client, "http://"+pln.Addr().String()+"/", i))
		}
		keyed, peers = seen()
		return codes, keyed, peers
	}

	codes, _, peers := run(httplimit.TrustProxies(httplimit.XForwardedFor, netip.MustParsePrefix("127.0.0.1/32")))
	require.Equal(t, []int{400, 400, 400, 400, 400}, codes, "the proxy on the socket is not trusted: no key")
	if runtime.GOOS == "linux" {
		require.Equal(t, []string{"@", "@", "@", "@", "@"}, peers, "net/http's RemoteAddr of a peer on a Unix socket")
	}

	codes, got, _ := run(httplimit.TrustProxies(httplimit.XForwardedFor), httplimit.TrustUnixSocket())
	require.Equal(t, []int{200, 200, 200, 429, 429}, codes)
	require.Equal(t, []string{"127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.2"}, got)

	// Straight on the socket, with no header: the peer's key.
	require.Equal(t, 200, get(&http.Client{Transport: overSocket}, "http://app/", -1))
	got, _ = seen()
	require.Equal(t, []string{httplimit.UnixPeerKey}, got)
}
