package httplimit

import (
	"net/http/httptest"
	"net/netip"
	"testing"
)

// FuzzClientIP checks that no header a client sends makes the key function
// fail or choose a key outside what it sent and the peer's address.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:80", "198.51.100.1, 10.0.0.2", `for="[2001:db8::1]:80"`)
	f.Add("203.0.113.1:1", "\x00", "for=;;;,,")
	f.Add("[fd00::1]:1", "[", `for="[`)
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	key := ClientIP(trusted...)
	f.Fuzz(func(t *testing.T, remote, xff, fwd string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", xff)
		r.Header.Set("Forwarded", fwd)
		got, err := key(r)
		peer, ok := parseAddr(remote)
		if !ok {
			if err == nil {
				t.Fatalf("remote %q is no address, but key %q was chosen", remote, got)
			}
			return
		}
		if err != nil {
			t.Fatalf("remote %q: %v", remote, err)
		}
		if _, err := netip.ParseAddr(got); err != nil {
			t.Fatalf("key %q is not an address", got)
		}
		if !isTrusted(peer, trusted) && got != peer.String() {
			t.Fatalf("an untrusted peer %v chose its key %q through headers", peer, got)
		}
	})
}
