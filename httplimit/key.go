package httplimit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP keys a request by its client's IP address.
//
// The client is the peer of the connection (RemoteAddr) unless that peer
// is one of the trusted proxies: then the X-Forwarded-For or Forwarded
// (RFC 7239; preferred when both are present) header is read from the
// right, skipping the addresses of trusted proxies, and the first address
// that is not one is the client. A client cannot choose its own key: what
// it writes into those headers is read only behind a proxy you trust, and
// only to the left of what that proxy appended. With no trusted proxies,
// the headers are ignored.
func ClientIP(trusted ...netip.Prefix) KeyFunc {
	return clientNet(128, trusted)
}

// ClientIPv6Prefix is ClientIP, but keys an IPv6 client by its network of
// the given prefix length (64 is common: one customer's network), since a
// single client often has many addresses of one /64.
func ClientIPv6Prefix(bits int, trusted ...netip.Prefix) KeyFunc {
	return clientNet(bits, trusted)
}

func clientNet(v6bits int, trusted []netip.Prefix) KeyFunc {
	return func(r *http.Request) (string, error) {
		ip, err := clientAddr(r, trusted)
		if err != nil {
			return "", err
		}
		if ip.Is6() && v6bits < 128 {
			p, err := ip.Prefix(v6bits)
			if err != nil {
				return "", fmt.Errorf("httplimit: IPv6 prefix /%d: %w", v6bits, err)
			}
			return p.String(), nil
		}
		return ip.String(), nil
	}
}

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// clientAddr finds the client of r, as ClientIP describes.
func clientAddr(r *http.Request, trusted []netip.Prefix) (netip.Addr, error) {
	peer, ok := parseAddr(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("httplimit: remote address %q is not an IP address: %w", r.RemoteAddr, ErrNoKey)
	}
	if !isTrusted(peer, trusted) {
		return peer, nil
	}
	hops := forwardedFor(r.Header)
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		ip, ok := parseAddr(hops[i])
		if !ok {
			// Unreadable, or obfuscated ("unknown", "_hidden"): the last
			// address we can vouch for is the proxy that wrote it.
			return client, nil
		}
		client = ip
		if !isTrusted(ip, trusted) {
			return ip, nil
		}
	}
	return client, nil
}

// forwardedFor returns the chain of client addresses in Forwarded (its
// for= parameters) or, without it, X-Forwarded-For, leftmost first.
func forwardedFor(h http.Header) []string {
	var hops []string
	if fwd := h.Values("Forwarded"); len(fwd) > 0 {
		for _, line := range fwd {
			for elem := range strings.SplitSeq(line, ",") {
				for pair := range strings.SplitSeq(elem, ";") {
					k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
					if ok && strings.EqualFold(k, "for") {
						hops = append(hops, v)
					}
				}
			}
		}
		return hops
	}
	for _, line := range h.Values("X-Forwarded-For") {
		for hop := range strings.SplitSeq(line, ",") {
			hops = append(hops, hop)
		}
	}
	return hops
}

// parseAddr reads an IP address, with or without a port, brackets or
// quotes: 192.0.2.1, 192.0.2.1:443, 2001:db8::1, [2001:db8::1]:443,
// "[2001:db8::1]:443".
func parseAddr(s string) (netip.Addr, bool) {
	s = strings.Trim(strings.TrimSpace(s), `"`)
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.Unmap().WithZone(""), true
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil {
			return ip.Unmap().WithZone(""), true
		}
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if ip, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return ip.Unmap().WithZone(""), true
		}
	}
	return netip.Addr{}, false
}

// Header keys a request by the value of a header, such as an API key.
// A request without it is refused through the error handler with ErrNoKey
// (400 by default).
func Header(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		v := r.Header.Get(name)
		if v == "" {
			return "", fmt.Errorf("httplimit: header %s is missing: %w", name, ErrNoKey)
		}
		return v, nil
	}
}

// PathValue keys a request by a wildcard of its http.ServeMux pattern
// (r.PathValue), such as {tenant} in "/t/{tenant}/".
func PathValue(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		v := r.PathValue(name)
		if v == "" {
			return "", fmt.Errorf("httplimit: path value %s is empty: %w", name, ErrNoKey)
		}
		return v, nil
	}
}
