package ratelimitgrpc_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/ratelimit-go/ratelimit/internal/clientip"
	"github.com/ratelimit-go/ratelimit/internal/clientip/clientiptest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The tests of this file hold ratelimitgrpc.ClientIP to the answers of
// httplimit.ClientIP: every case runs through both, a call with the
// request's remote address as its peer and its header lines as its
// metadata, and both must find the same key. The cases are those of
// httplimit's tests (internal/clientip/clientiptest).

var lbs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}

// keyPair is a key function of each package, configured alike.
type keyPair struct {
	grpc ratelimitgrpc.KeyFunc
	http httplimit.KeyFunc
}

// pair builds a keyPair from the options of each package.
func pair(t testing.TB, g []ratelimitgrpc.IPOption, h []httplimit.IPOption) keyPair {
	t.Helper()
	gk, err := ratelimitgrpc.ClientIP(g...)
	require.NoError(t, err)
	hk, err := httplimit.ClientIP(h...)
	require.NoError(t, err)
	return keyPair{gk, hk}
}

// trusting returns a keyPair that trusts the prefixes for header:
// "X-Forwarded-For", "Forwarded", or the name of a single-address header;
// "" trusts none and reads no header.
func trusting(t testing.TB, header string, trusted []netip.Prefix, more ...int) keyPair {
	t.Helper()
	return trustingUnix(t, header, trusted, false, more...)
}

// trustingUnix is trusting, and if unix, trusts the peer on a Unix socket
// too (TrustUnixSocket).
func trustingUnix(t testing.TB, header string, trusted []netip.Prefix, unix bool, more ...int) keyPair {
	t.Helper()
	var g []ratelimitgrpc.IPOption
	var h []httplimit.IPOption
	if unix {
		g, h = append(g, ratelimitgrpc.TrustUnixSocket()), append(h, httplimit.TrustUnixSocket())
	}
	switch header {
	case "":
	case "X-Forwarded-For":
		g, h = append(g, ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, trusted...)), append(h, httplimit.TrustProxies(httplimit.XForwardedFor, trusted...))
	case "Forwarded":
		g, h = append(g, ratelimitgrpc.TrustProxies(ratelimitgrpc.Forwarded, trusted...)), append(h, httplimit.TrustProxies(httplimit.Forwarded, trusted...))
	default:
		g, h = append(g, ratelimitgrpc.TrustProxies(ratelimitgrpc.SingleIPHeader(header), trusted...)), append(h, httplimit.TrustProxies(httplimit.SingleIPHeader(header), trusted...))
	}
	for _, bits := range more {
		g, h = append(g, ratelimitgrpc.IPv6Prefix(bits)), append(h, httplimit.IPv6Prefix(bits))
	}
	return pair(t, g, h)
}

// configured returns the keyPair of a configuration of the shared cases.
func configured(t testing.TB, p clientiptest.Proxies) keyPair {
	t.Helper()
	var bits []int
	if p.V6Bits != 0 {
		bits = append(bits, p.V6Bits)
	}
	return trustingUnix(t, p.Header, p.Trusted, p.Unix, bits...)
}

// appSocket is the address of the service's Unix socket listener.
var appSocket = &net.UnixAddr{Name: "/run/app.sock", Net: "unix"}

// callContext is the context of a call from remote (host:port) carrying
// the header lines (name, value, name, value...) as metadata, in order. A
// remote that is not an address and port is a peer without an IP
// address; one of a Unix socket (clientiptest.UnixPeer) is the peer of a
// call over the socket, as gRPC gives it.
func callContext(remote string, headers ...string) context.Context {
	pr := &peer.Peer{Addr: fakeAddr(remote)}
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		pr.Addr = &net.TCPAddr{IP: ap.Addr().AsSlice(), Zone: ap.Addr().Zone(), Port: int(ap.Port())}
	} else if name, ok := clientiptest.UnixPeer(remote); ok {
		pr.Addr, pr.LocalAddr = &net.UnixAddr{Name: name, Net: "unix"}, appSocket
	}
	md := metadata.MD{}
	for i := 0; i+1 < len(headers); i += 2 {
		md.Append(headers[i], headers[i+1]) // lower-cases the name, as gRPC does
	}
	return metadata.NewIncomingContext(peer.NewContext(context.Background(), pr), md)
}

// request is the HTTP request of the same client, as net/http serves it.
func request(remote string, headers ...string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = remote
	if name, ok := clientiptest.UnixPeer(remote); ok {
		r.RemoteAddr = name
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, appSocket))
	}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

// keys returns the key each package finds for a client at remote sending
// the header lines.
func (k keyPair) keys(remote string, headers ...string) (g, h string, gerr, herr error) {
	g, gerr = k.grpc(callContext(remote, headers...))
	h, herr = k.http(request(remote, headers...))
	return g, h, gerr, herr
}

func TestClientIPAsHTTPLimit(t *testing.T) {
	for _, tt := range clientiptest.Cases {
		t.Run(tt.Name, func(t *testing.T) {
			g, h, gerr, herr := configured(t, tt.Proxies).keys(tt.Remote, tt.Headers...)
			require.NoError(t, gerr)
			require.NoError(t, herr)
			assert.Equal(t, tt.Want, g, "ratelimitgrpc")
			assert.Equal(t, tt.Want, h, "httplimit")
		})
	}
	for _, tt := range clientiptest.NoKey {
		t.Run(tt.Name, func(t *testing.T) {
			_, _, gerr, herr := configured(t, tt.Proxies).keys(tt.Remote, tt.Headers...)
			assert.ErrorIs(t, gerr, ratelimitgrpc.ErrNoKey, "ratelimitgrpc")
			assert.ErrorIs(t, herr, httplimit.ErrNoKey, "httplimit")
		})
	}
	xff := configured(t, clientiptest.XFF)
	for _, remote := range []string{"not-an-address", "bufconn", "/run/app.sock"} {
		_, _, gerr, herr := xff.keys(remote, "X-Forwarded-For", "198.51.100.1")
		assert.ErrorIs(t, gerr, ratelimitgrpc.ErrNoKey, remote)
		assert.ErrorIs(t, herr, httplimit.ErrNoKey, remote)
	}
	_, err := xff.grpc(context.Background())
	assert.ErrorIs(t, err, ratelimitgrpc.ErrNoKey, "no peer")
}

// Options that cannot be safe are refused by both packages, with the same
// words: an error matching ErrInvalidOption, never a panic.
func TestClientIPRefusesAsHTTPLimit(t *testing.T) {
	all4, all6 := netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")
	type (
		g = []ratelimitgrpc.IPOption
		h = []httplimit.IPOption
	)
	tests := []struct {
		name string
		g    g
		h    h
		want string
	}{
		{"no trusted proxies", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor)}, h{httplimit.TrustProxies(httplimit.XForwardedFor)}, "names no trusted proxy"},
		{"trust everyone", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, all4)}, h{httplimit.TrustProxies(httplimit.XForwardedFor, all4)}, "trusts every address"},
		{"trust every IPv6 address", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.Forwarded, all6)}, h{httplimit.TrustProxies(httplimit.Forwarded, all6)}, "trusts every address"},
		{"trust every IPv4 address, IPv4-mapped", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, netip.MustParsePrefix("::ffff:0.0.0.0/96"))},
			h{httplimit.TrustProxies(httplimit.XForwardedFor, netip.MustParsePrefix("::ffff:0.0.0.0/96"))}, "trusts every address"},
		{"an invalid prefix", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, netip.Prefix{})}, h{httplimit.TrustProxies(httplimit.XForwardedFor, netip.Prefix{})}, "is not valid"},
		{"no header", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.ProxyHeader{}, lbs...)}, h{httplimit.TrustProxies(httplimit.ProxyHeader{}, lbs...)}, "no header chosen"},
		{"a list as a single header", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.SingleIPHeader("X-Forwarded-For"), lbs...)},
			h{httplimit.TrustProxies(httplimit.SingleIPHeader("X-Forwarded-For"), lbs...)}, "is a list that proxies append to"},
		{"Forwarded as a single header", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.SingleIPHeader("Forwarded"), lbs...)},
			h{httplimit.TrustProxies(httplimit.SingleIPHeader("Forwarded"), lbs...)}, "is a list that proxies append to"},
		{"a bad header name", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.SingleIPHeader("X Real IP"), lbs...)}, h{httplimit.TrustProxies(httplimit.SingleIPHeader("X Real IP"), lbs...)}, "is not a"},
		{"an empty header name", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.SingleIPHeader(" "), lbs...)}, h{httplimit.TrustProxies(httplimit.SingleIPHeader(" "), lbs...)}, `""`},
		{"twice", g{ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, lbs...), ratelimitgrpc.TrustProxies(ratelimitgrpc.Forwarded, lbs...)},
			h{httplimit.TrustProxies(httplimit.XForwardedFor, lbs...), httplimit.TrustProxies(httplimit.Forwarded, lbs...)}, "given twice"},
		{"IPv6 prefix 0", g{ratelimitgrpc.IPv6Prefix(0)}, h{httplimit.IPv6Prefix(0)}, "1 to 128"},
		{"IPv6 prefix 129", g{ratelimitgrpc.IPv6Prefix(129)}, h{httplimit.IPv6Prefix(129)}, "1 to 128"},
		{"IPv6 prefix twice", g{ratelimitgrpc.IPv6Prefix(48), ratelimitgrpc.IPv6Prefix(56)}, h{httplimit.IPv6Prefix(48), httplimit.IPv6Prefix(56)}, "IPv6Prefix is given twice (48, then 56)"},
		{"a zero option", g{{}}, h{{}}, "zero IPOption"},
		{"a Unix socket without a header", g{ratelimitgrpc.TrustUnixSocket()}, h{httplimit.TrustUnixSocket()}, "but no TrustProxies says which"},
		{"a Unix socket twice", g{ratelimitgrpc.TrustUnixSocket(), ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor), ratelimitgrpc.TrustUnixSocket()},
			h{httplimit.TrustUnixSocket(), httplimit.TrustProxies(httplimit.XForwardedFor), httplimit.TrustUnixSocket()}, "given twice"},
		{"a Unix socket, no header, and a prefix", g{ratelimitgrpc.TrustUnixSocket(), ratelimitgrpc.IPv6Prefix(48)}, h{httplimit.TrustUnixSocket(), httplimit.IPv6Prefix(48)}, "give TrustProxies(header) too"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gk, err := ratelimitgrpc.ClientIP(tt.g...)
			require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)
			require.ErrorContains(t, err, tt.want)
			require.Nil(t, gk)
			hk, err := httplimit.ClientIP(tt.h...)
			require.ErrorIs(t, err, httplimit.ErrInvalidOption)
			require.ErrorContains(t, err, tt.want)
			require.Nil(t, hk)
		})
	}
}

// TrustProxies names no prefix when the proxy on a Unix socket is the only
// one, given before or after TrustUnixSocket; the peer on the socket is
// then the only trusted one, and the key words of the refusal of a peer
// on a Unix socket that is not trusted say what to give.
func TestTrustUnixSocketAlone(t *testing.T) {
	type (
		g = []ratelimitgrpc.IPOption
		h = []httplimit.IPOption
	)
	for name, opts := range map[string]struct {
		g g
		h h
	}{
		"before": {g{ratelimitgrpc.TrustUnixSocket(), ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor)},
			h{httplimit.TrustUnixSocket(), httplimit.TrustProxies(httplimit.XForwardedFor)}},
		"after": {g{ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor), ratelimitgrpc.TrustUnixSocket()},
			h{httplimit.TrustProxies(httplimit.XForwardedFor), httplimit.TrustUnixSocket()}},
	} {
		k := pair(t, opts.g, opts.h)
		for _, c := range []struct{ remote, want string }{
			{clientiptest.Nginx, "198.51.100.1"},
			{"10.0.0.2:80", "10.0.0.2"},
			{"127.0.0.1:80", "127.0.0.1"},
		} {
			g, h, gerr, herr := k.keys(c.remote, "X-Forwarded-For", "198.51.100.1")
			require.NoError(t, gerr, name)
			require.NoError(t, herr, name)
			assert.Equal(t, c.want, g, "%s: ratelimitgrpc, from %s", name, c.remote)
			assert.Equal(t, c.want, h, "%s: httplimit, from %s", name, c.remote)
		}
	}
	assert.Equal(t, "unix:", ratelimitgrpc.UnixPeerKey)
	assert.Equal(t, "unix:", httplimit.UnixPeerKey)

	_, _, gerr, herr := configured(t, clientiptest.XFF).keys(clientiptest.Nginx, "X-Forwarded-For", "198.51.100.1")
	assert.ErrorContains(t, gerr, "came over a Unix socket")
	assert.ErrorContains(t, gerr, "TrustUnixSocket")
	assert.ErrorContains(t, herr, "came over a Unix socket")
	assert.ErrorContains(t, herr, "TrustUnixSocket")
}

// Metadata keys that gRPC would not carry an address in are refused; as
// is TrustProxies given to PeerIP, which reads no metadata.
func TestClientIPRefusesMetadataKeys(t *testing.T) {
	for name, c := range map[string]struct {
		header ratelimitgrpc.ProxyHeader
		want   string
	}{
		"binary":            {ratelimitgrpc.SingleIPHeader("x-real-ip-bin"), "binary metadata"},
		"reserved":          {ratelimitgrpc.SingleIPHeader("grpc-peer"), "reserved by gRPC"},
		"pseudo-header":     {ratelimitgrpc.SingleIPHeader(":authority"), "not a metadata key"},
		"not a key":         {ratelimitgrpc.SingleIPHeader("x-real-ip;"), "not a metadata key"},
		"list as single":    {ratelimitgrpc.SingleIPHeader("X-Forwarded-For"), "use ratelimitgrpc.XForwardedFor"},
		"Forwarded, single": {ratelimitgrpc.SingleIPHeader(" forwarded "), "use ratelimitgrpc.Forwarded"},
		// gRPC takes host out of the metadata, and keeps te out or sets
		// content-type alike for every call: no call's value would be read,
		// and every call through the proxy would share the proxy's key.
		"host":         {ratelimitgrpc.SingleIPHeader("Host"), "takes a call's host out of its metadata"},
		"te":           {ratelimitgrpc.SingleIPHeader("te"), "reserved by gRPC"},
		"content-type": {ratelimitgrpc.SingleIPHeader("content-type"), "reserved by gRPC"},
		"connection":   {ratelimitgrpc.SingleIPHeader("connection"), "reserved by gRPC"},
	} {
		k, err := ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(c.header, lbs...))
		assert.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption, name)
		assert.ErrorContains(t, err, c.want, name)
		assert.Nil(t, k, name)
	}
	k, err := ratelimitgrpc.PeerIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, lbs...))
	assert.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)
	assert.ErrorContains(t, err, "give it to ClientIP")
	assert.Nil(t, k)
	k, err = ratelimitgrpc.PeerIP(ratelimitgrpc.TrustUnixSocket())
	assert.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)
	assert.ErrorContains(t, err, "give it, with TrustProxies, to ClientIP")
	assert.Nil(t, k)

	// A SingleIPHeader is named as the proxy writes it, in any case.
	k, err = ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.SingleIPHeader(" X-Envoy-External-Address "), lbs...))
	require.NoError(t, err)
	got, err := k(callContext("10.0.0.2:80", "x-envoy-external-address", "198.51.100.1"))
	require.NoError(t, err)
	assert.Equal(t, "198.51.100.1", got)
	assert.Equal(t, "x-envoy-external-address", ratelimitgrpc.SingleIPHeader(" X-Envoy-External-Address ").String())
	assert.Equal(t, "x-forwarded-for", ratelimitgrpc.XForwardedFor.String())
}

// Prefixes that trust every address of a family together, none of them
// alone, are refused as httplimit refuses them, and a list that leaves
// one address untrusted is taken: the lists of httplimit's
// TestTrustProxiesRefusesPrefixesCoveringEveryAddress.
func TestTrustProxiesRefusesPrefixesCoveringEveryAddress(t *testing.T) {
	for _, tt := range slices.Concat(clientiptest.CoveringEvery, clientiptest.TooWide) {
		t.Run(tt.Name, func(t *testing.T) {
			gk, err := ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, tt.Trusted...))
			require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)
			require.ErrorContains(t, err, tt.Want)
			require.Nil(t, gk)
			hk, err := httplimit.ClientIP(httplimit.TrustProxies(httplimit.XForwardedFor, tt.Trusted...))
			require.ErrorIs(t, err, httplimit.ErrInvalidOption)
			require.ErrorContains(t, err, tt.Want)
			require.Nil(t, hk)
		})
	}
	for _, tt := range clientiptest.LeavingOne {
		t.Run(tt.Name, func(t *testing.T) {
			k := trusting(t, "X-Forwarded-For", tt.Trusted, 128)
			// The one untrusted address is its own key, whatever it sends.
			g, h, gerr, herr := k.keys(net.JoinHostPort(tt.Untrusted, "1"), "X-Forwarded-For", "198.51.100.1")
			require.NoError(t, gerr)
			require.NoError(t, herr)
			want := cmp.Or(tt.Key, tt.Untrusted)
			assert.Equal(t, want, g, "ratelimitgrpc")
			assert.Equal(t, want, h, "httplimit")
		})
	}
}

// A long forwarding list costs the key function no memory per entry: gRPC
// takes metadata of up to 16 MiB by default, and a trusted proxy may pass
// on what a client sent.
func TestLongForwardingListsCostLittle(t *testing.T) {
	for _, tt := range clientiptest.LongLists() {
		t.Run(tt.Name, func(t *testing.T) {
			k := configured(t, tt.Proxies)
			g, h, gerr, herr := k.keys(tt.Remote, tt.Headers...)
			require.NoError(t, gerr)
			require.NoError(t, herr)
			assert.Equal(t, tt.Want, g, "ratelimitgrpc")
			assert.Equal(t, tt.Want, h, "httplimit")
			ctx := callContext(tt.Remote, tt.Headers...)
			allocs := testing.AllocsPerRun(10, func() { _, _ = k.grpc(ctx) })
			assert.LessOrEqual(t, allocs, 3.0, "allocations per key, for metadata of %d bytes", len(tt.Headers[1]))
		})
	}
}

var fuzzTrusted = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}

// FuzzClientIPAsHTTPLimit checks that, for any peer and any values of the
// forwarding metadata, ratelimitgrpc.ClientIP finds the key that
// httplimit.ClientIP finds for the same remote address and header lines.
func FuzzClientIPAsHTTPLimit(f *testing.F) {
	f.Add("10.0.0.1:80", "198.51.100.1, 10.0.0.2", "1.1.1.1", `for="[2001:db8::1]:80"`, "", "198.51.100.9")
	f.Add("203.0.113.1:1", "\x00", "", "for=;;;,,", "for=1.2.3.4", "")
	f.Add("[fd00::1]:1", "[", "", `for="[`, `for=10.0.0.3, for="x`, "[fd00::5]:80")
	f.Add("10.0.0.1:80", "1.1.1.1, 10.0.0.9", "10.0.0.8", `for=1.1.1.1;proto=https, for=10.2.2.2`, `For="\"", for=2001:db8::7`, "1.1.1.1, 2.2.2.2")
	f.Add("[::ffff:10.0.0.1]:80", "::ffff:1.2.3.4", "fe80::1%eth0", `for="[::ffff:10.1.1.1]"`, "for=10.0.0.4", `"1.2.3.4"`)
	f.Add("[fe80::1%eth0]:80", ",,,", "10.0.0.1:8080", "for=unknown", "", "unknown")
	f.Add(clientiptest.Nginx, "198.51.100.1, x", "10.0.0.9", "for=_x, for=10.1.1.1", "", "fd00::1")
	f.Add("unix:", "", "", "", "for=192.0.2.1", "")
	pairs := []keyPair{
		pair(f, nil, nil),
		trusting(f, "X-Forwarded-For", fuzzTrusted),
		trusting(f, "Forwarded", fuzzTrusted),
		trusting(f, "X-Real-IP", fuzzTrusted),
		trusting(f, "X-Forwarded-For", fuzzTrusted, 128),
		trusting(f, "Forwarded", fuzzTrusted, 48),
		trustingUnix(f, "X-Forwarded-For", nil, true),
		trustingUnix(f, "Forwarded", fuzzTrusted, true),
		trustingUnix(f, "X-Real-IP", nil, true, 56),
	}
	f.Fuzz(func(t *testing.T, remote, xff1, xff2, fwd1, fwd2, real string) {
		name, unix := clientiptest.UnixPeer(remote)
		if unix {
			if _, ok := clientip.ParseAddr(name); ok {
				// A peer on a Unix socket named as an address: gRPC's peer is
				// a Unix address, never an IP address
				// (TestClientIPUnixPeerNamedAsAddress), while httplimit takes
				// a RemoteAddr of that name for one, as it cannot tell it
				// from a PROXY protocol listener's.
				return
			}
		} else if ap, err := netip.ParseAddrPort(remote); err != nil || strings.ContainsAny(ap.Addr().Zone(), "[]") {
			// A gRPC peer is an address and a port. One whose zone holds a
			// bracket is written as a host:port that net.SplitHostPort, as
			// httplimit reads RemoteAddr, refuses; a gRPC peer is no string.
			return
		}
		headers := []string{"X-Forwarded-For", xff1, "X-Forwarded-For", xff2, "Forwarded", fwd1, "Forwarded", fwd2, "X-Real-IP", real}
		for i, k := range pairs {
			g, h, gerr, herr := k.keys(remote, headers...)
			if unix && herr != nil {
				// A peer on a Unix socket that is not trusted has no key.
				require.ErrorIs(t, herr, httplimit.ErrNoKey, "key %d", i)
				require.ErrorIs(t, gerr, ratelimitgrpc.ErrNoKey, "key %d", i)
				continue
			}
			require.NoError(t, herr, "key %d", i)
			require.NoError(t, gerr, "key %d", i)
			require.Equal(t, h, g, "key %d: ratelimitgrpc's key is not httplimit's", i)
		}
	})
}

// The bypass of keying by the metadata behind Envoy, over loopback: the
// service's peer is the proxy at 127.0.0.1, which appends the address it
// received the call from (203.0.113.9) to the x-forwarded-for the client
// sent, a fresh one with every call. Keyed by the metadata value, each
// call had a key of its own and 100 of 100 passed a limit of 5; keyed by
// ClientIP behind the trusted proxy, 5 pass. A client that calls the
// service directly, from 127.0.0.2, is keyed by its own address, whatever
// it sends.
func TestClientIPBehindProxyOverLoopback(t *testing.T) {
	trusted, err := ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, netip.MustParsePrefix("127.0.0.1/32")))
	require.NoError(t, err)
	passed := func(key ratelimitgrpc.KeyFunc, from string, xff func(i int) string) (int, *ratelimit.Limiter) {
		t.Helper()
		lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Hour}})
		ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(key))
		require.NoError(t, err)
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		client, _ := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil,
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dialer.DialContext(ctx, "tcp", addr) }))
		n := 0
		for i := range 100 {
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-forwarded-for", xff(i))
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			if err == nil {
				n++
			} else {
				require.Equal(t, codes.ResourceExhausted, status.Code(err), err)
			}
		}
		return n, lim
	}
	viaProxy := func(i int) string { return fmt.Sprintf("198.18.%d.%d, 203.0.113.9", i/256, i%256) }

	n, _ := passed(ratelimitgrpc.Metadata("x-forwarded-for"), "127.0.0.1", viaProxy)
	assert.Equal(t, 100, n, "keyed by the metadata value, which the client chooses")

	n, lim := passed(trusted, "127.0.0.1", viaProxy)
	assert.Equal(t, 5, n, "keyed by the address the proxy appended")
	st, err := lim.Value(context.Background(), "api", "203.0.113.9")
	require.NoError(t, err)
	assert.Zero(t, st.Remaining)

	n, lim = passed(trusted, "127.0.0.2", func(i int) string { return fmt.Sprintf("198.18.%d.%d", i/256, i%256) })
	assert.Equal(t, 5, n, "a client that is no proxy is keyed by its address")
	st, err = lim.Value(context.Background(), "api", "127.0.0.2")
	require.NoError(t, err)
	assert.Zero(t, st.Remaining)
}

// A service that listens on a Unix socket behind a proxy on the same
// machine (Envoy, nginx's grpc_pass to unix:/run/app.sock; here a client
// on the socket that appends to x-forwarded-for as they do): its calls'
// peer is the socket's, with no IP address. With TrustProxies alone every
// call was refused InvalidArgument (no key), and no option trusted the
// proxy: TrustUnixSocket does. A client forging x-forwarded-for is keyed
// by the address the proxy appended; a call with no metadata by
// UnixPeerKey.
func TestClientIPBehindProxyOnUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "ratelimitgrpc") // short: a socket's path is limited to about 100 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "app.sock")

	passed := func(key ratelimitgrpc.KeyFunc, xff func(i int) string) (n int, code codes.Code, lim *ratelimit.Limiter) {
		t.Helper()
		lim = newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Hour}})
		defer serveHealthOnUnix(t, lim, key, sock)() // removes the socket
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer conn.Close()
		client := healthpb.NewHealthClient(conn)
		for i := range 100 {
			ctx := context.Background()
			if v := xff(i); v != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "x-forwarded-for", v)
			}
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			if err == nil {
				n++
			} else {
				code = status.Code(err)
			}
		}
		return n, code, lim
	}
	viaProxy := func(i int) string { return fmt.Sprintf("198.18.%d.%d, 203.0.113.9", i/256, i%256) }

	byAddress, err := ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, netip.MustParsePrefix("127.0.0.1/32")))
	require.NoError(t, err)
	n, code, _ := passed(byAddress, viaProxy)
	assert.Equal(t, 0, n, "the proxy on the socket is not trusted: no key")
	assert.Equal(t, codes.InvalidArgument, code)

	trusted, err := ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor), ratelimitgrpc.TrustUnixSocket())
	require.NoError(t, err)
	n, code, lim := passed(trusted, viaProxy)
	assert.Equal(t, 5, n, "keyed by the address the proxy appended")
	assert.Equal(t, codes.ResourceExhausted, code)
	st, err := lim.Value(context.Background(), "api", "203.0.113.9")
	require.NoError(t, err)
	assert.Zero(t, st.Remaining)

	n, _, lim = passed(trusted, func(int) string { return "" })
	assert.Equal(t, 5, n, "with no metadata, every call is the peer's")
	st, err = lim.Value(context.Background(), "api", ratelimitgrpc.UnixPeerKey)
	require.NoError(t, err)
	assert.Zero(t, st.Remaining)
}

// A client on a Unix socket names its own end: it may bind its socket,
// before it connects, to a path that reads as an address and port
// ("10.0.0.5:80", in its working directory), and the server's peer is a
// Unix address of that name. The peer's address was read from its name:
// the client chose its key, and naming a trusted proxy's address, had
// its x-forwarded-for read, a fresh key with every call; 100 of 100 calls
// passed a limit of 5. A Unix address is no IP address, whatever its
// name: PeerIP finds no key, and ClientIP trusts the peer only with
// TrustUnixSocket.
func TestClientIPUnixPeerNamedAsAddress(t *testing.T) {
	sock := socketInShortDir(t)

	passed := func(key ratelimitgrpc.KeyFunc) (int, map[codes.Code]int) {
		t.Helper()
		lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Hour}})
		defer serveHealthOnUnix(t, lim, key, sock)() // removes the socket
		return callsFromNamedPeer(t, sock)
	}

	namedPeerHasNoKey(t, passed)
}

// socketInShortDir returns the path of a Unix socket app.sock in a
// directory of its own, short, as a socket's path is limited to about 100
// bytes, and makes it the working directory, which the client's end of a
// socket named by a relative path (callsFromNamedPeer) is bound in.
func socketInShortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ratelimitgrpc")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Chdir(dir)
	return filepath.Join(dir, "app.sock")
}

// callsFromNamedPeer makes 100 health checks over the Unix socket sock
// from a client that binds its end of the socket to the path
// "10.0.0.5:80", a name that reads as an address, each call with an
// x-forwarded-for of its own; it returns how many passed, and the codes of
// all.
func callsFromNamedPeer(t *testing.T, sock string) (int, map[codes.Code]int) {
	t.Helper()
	const name = "10.0.0.5:80"
	conn, err := grpc.NewClient("passthrough:///app", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			_ = os.Remove(name) // left by a connection before
			return net.DialUnix("unix", &net.UnixAddr{Name: name, Net: "unix"}, &net.UnixAddr{Name: sock, Net: "unix"})
		}))
	require.NoError(t, err)
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	answers := map[codes.Code]int{}
	for i := range 100 {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-forwarded-for", fmt.Sprintf("198.18.%d.%d", i/256, i%256))
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		answers[status.Code(err)]++
	}
	return answers[codes.OK], answers
}

// namedPeerHasNoKey checks, through passed (a server keyed by the KeyFunc
// given and callsFromNamedPeer), that a peer whose socket is named as an
// address gets no key from PeerIP, nor from ClientIP trusting proxies at
// that address: every call is refused as keyless.
func namedPeerHasNoKey(t *testing.T, passed func(ratelimitgrpc.KeyFunc) (int, map[codes.Code]int)) {
	t.Helper()
	peerIP, err := ratelimitgrpc.PeerIP()
	require.NoError(t, err)
	n, got := passed(peerIP)
	assert.Equal(t, 0, n, "the peer has no IP address: no key")
	assert.Equal(t, map[codes.Code]int{codes.InvalidArgument: 100}, got)

	byAddress, err := ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor, lbs...))
	require.NoError(t, err)
	n, got = passed(byAddress)
	assert.Equal(t, 0, n, "a peer named as a trusted proxy is no proxy: no key")
	assert.Equal(t, map[codes.Code]int{codes.InvalidArgument: 100}, got)
}

// serveHealthOnUnix serves the health service on the Unix socket sock,
// each call limited by "api" of lim and keyed by key, and returns the
// function that stops the server (and removes the socket).
func serveHealthOnUnix(t *testing.T, lim *ratelimit.Limiter, key ratelimitgrpc.KeyFunc, sock string) (stop func()) {
	t.Helper()
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(key), ratelimitgrpc.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("unix", sock)
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	return srv.Stop
}
