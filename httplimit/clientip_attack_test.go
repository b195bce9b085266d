package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ratelimit-go/ratelimit/httplimit"
	"github.com/stretchr/testify/require"
)

// A client behind a trusted proxy (10.0.0.1, which appends to the header
// it is configured for) writes what it likes into the header it sends;
// whatever it writes, its key is its own address, or at worst the
// proxy's, never one the client chose. The proxy appends to the client's
// line (same) or adds a line of its own.
func TestClientIPSpoofingAttempts(t *testing.T) {
	const proxy = "10.0.0.1:443"
	v4, v6 := "203.0.113.66", "2001:db8:1:2::66"
	xff := clientIP(t, httplimit.TrustProxies(httplimit.XForwardedFor, lbs...))
	fwd := clientIP(t, httplimit.TrustProxies(httplimit.Forwarded, lbs...))
	key := func(k httplimit.KeyFunc, remote, header string, lines ...string) string {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		for _, l := range lines {
			r.Header.Add(header, l)
		}
		got, err := k(r)
		require.NoError(t, err)
		return got
	}
	forgedXFF := []string{"1.2.3.4", "10.0.0.2", "1.2.3.4, 10.0.0.5", "::ffff:10.0.0.2", "fd00::9", "64:ff9b::a00:2",
		"fe80::1%eth0", "[10.0.0.2]:80", `"10.0.0.2"`, ",,", "unknown", "1.2.3.4 10.0.0.2", "\t10.0.0.3\t"}
	for _, forged := range forgedXFF {
		for _, client := range []string{v4, v6} {
			want := client
			if client == v6 {
				want = "2001:db8:1:2::/64"
			}
			require.Equal(t, want, key(xff, proxy, "X-Forwarded-For", forged+", "+client), "same line, forged %q", forged)
			require.Equal(t, want, key(xff, proxy, "X-Forwarded-For", forged, client), "own line, forged %q", forged)
			// Straight to the service, not through the proxy: the header
			// is not read at all.
			peer := client + ":5555"
			if client == v6 {
				peer = "[" + client + "]:5555"
			}
			require.Equal(t, want, key(xff, peer, "X-Forwarded-For", forged), "untrusted peer, forged %q", forged)
		}
	}
	forgedFwd := []string{`for=1.2.3.4`, `for=10.0.0.2`, `for="[fd00::9]:80"`, `for=1.2.3.4;by="`, `for="1.2.3.4`,
		`for=1.2.3.4, for=10.0.0.2;proto=https`, `for=1.2.3.4;for=10.0.0.2`, `for="\"10.0.0.2"`, `for=_hidden`,
		`for="1.2.3.4, for=10.0.0.2"`, `;;,,`, `for=1.2.3.4,`}
	for _, forged := range forgedFwd {
		for _, client := range []string{v4, v6} {
			want, appended := client, "for="+client
			if client == v6 {
				want, appended = "2001:db8:1:2::/64", fmt.Sprintf(`for="[%s]:443"`, client)
			}
			require.Equal(t, want, key(fwd, proxy, "Forwarded", forged, appended), "own line, forged %q", forged)
			// On the client's own line, a stray quote of the client's
			// may swallow what the proxy appended: the key is then the
			// proxy's, never what the client wrote.
			got := key(fwd, proxy, "Forwarded", forged+", "+appended)
			require.Contains(t, []string{want, "10.0.0.1"}, got, "same line, forged %q", forged)
		}
	}
}

// The default key is the peer's address: a client reaching the service
// over IPv4, or over IPv6 as an IPv4-mapped address, has one key, and an
// IPv6 client one key for its whole /64, whichever of its addresses and
// zones it uses.
func TestClientIPOneKeyPerClient(t *testing.T) {
	bare := clientIP(t)
	keyOf := func(remote string) string {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		got, err := bare(r)
		require.NoError(t, err, remote)
		return got
	}
	require.Equal(t, keyOf("203.0.113.66:1"), keyOf("[::ffff:203.0.113.66]:2"))
	require.Equal(t, keyOf("203.0.113.66:1"), keyOf("[64:ff9b::203.0.113.66]:2"))
	for _, a := range []string{"[2001:db8:1:2::1]:1", "[2001:db8:1:2:ffff:ffff:ffff:ffff]:9", "[2001:db8:1:2::1%eth0]:1", "2001:db8:1:2::77"} {
		require.Equal(t, "2001:db8:1:2::/64", keyOf(a), a)
	}
}
