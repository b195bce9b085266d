package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ErrInvalidOption is matched (errors.Is) by the error of ClientIP or New
// when an option cannot work as given.
var ErrInvalidOption = errors.New("httplimit: invalid option")

// DefaultIPv6Prefix is the prefix length an IPv6 client is keyed by unless
// IPv6Prefix says otherwise: a /64 is the smallest network a site is
// usually given, so one client can take any of its 2^64 addresses.
const DefaultIPv6Prefix = 64

// ProxyHeader names the header field a deployment's proxies write the
// client's address into: XForwardedFor, Forwarded, or a SingleIPHeader.
// The zero ProxyHeader names none and is refused by TrustProxies.
type ProxyHeader struct {
	name string
	kind headerKind
}

type headerKind uint8

const (
	xffList       headerKind = iota + 1 // X-Forwarded-For: addresses, comma-separated, appended
	forwardedList                       // Forwarded (RFC 7239): elements with for= parameters, appended
	singleIP                            // one address, set (overwritten) by the proxy
)

var (
	// XForwardedFor is the X-Forwarded-For list, to which each proxy
	// appends the address it received the request from (nginx with
	// $proxy_add_x_forwarded_for, AWS ALB, Google Cloud load balancers,
	// Cloudflare, Envoy and Istio gateways, Traefik, Go's
	// httputil.ReverseProxy). Several header lines are read as one list,
	// in order.
	XForwardedFor = ProxyHeader{name: "X-Forwarded-For", kind: xffList}
	// Forwarded is the Forwarded list of RFC 7239, read by its for=
	// parameters. Choose it only if every trusted proxy appends to it
	// (HAProxy's "option forwarded", for one): most proxies pass the
	// client's own Forwarded through untouched.
	Forwarded = ProxyHeader{name: "Forwarded", kind: forwardedList}
)

// SingleIPHeader names a header that holds one address, which the proxy
// sets and overwrites whatever the client sent: X-Real-IP (nginx with
// proxy_set_header X-Real-IP $remote_addr), CF-Connecting-IP
// (Cloudflare), True-Client-IP. X-Forwarded-For and Forwarded are lists:
// use XForwardedFor or Forwarded for them.
func SingleIPHeader(name string) ProxyHeader {
	return ProxyHeader{name: http.CanonicalHeaderKey(strings.TrimSpace(name)), kind: singleIP}
}

// String returns the header's name.
func (h ProxyHeader) String() string { return h.name }

// IPOption configures ClientIP: TrustProxies, IPv6Prefix.
type IPOption struct {
	apply func(*clientIP) error
}

// TrustProxies makes ClientIP read header, but only from the proxies at
// the trusted prefixes, and only what they wrote: when the connection's
// peer is trusted, a list header (XForwardedFor, Forwarded) is read from
// the right, past the addresses of trusted proxies, and the first address
// that is not one is the client; a SingleIPHeader is taken as it is. An
// unreadable, obfuscated or missing value stops the walk at the last
// trusted address, which becomes the key. List every proxy in front of the
// service: load balancers, CDN ranges, sidecars.
//
// Prefixes that trust every address (0.0.0.0/0, ::/0) are refused: they
// would let any client choose its key.
func TrustProxies(header ProxyHeader, trusted ...netip.Prefix) IPOption {
	return IPOption{func(c *clientIP) error {
		switch header.kind {
		case xffList, forwardedList:
		case singleIP:
			if header.name == "" || !validHeaderName(header.name) {
				return fmt.Errorf("httplimit: TrustProxies: header name %q is not a header field name: %w", header.name, ErrInvalidOption)
			}
			if header.name == XForwardedFor.name || header.name == Forwarded.name {
				return fmt.Errorf("httplimit: TrustProxies: %s is a list that proxies append to, not a single address: use httplimit.%s: %w",
					header.name, strings.ReplaceAll(header.name, "-", ""), ErrInvalidOption)
			}
		default:
			return fmt.Errorf("httplimit: TrustProxies: no header chosen: use XForwardedFor, Forwarded or SingleIPHeader(name): %w", ErrInvalidOption)
		}
		if c.header.kind != 0 {
			return fmt.Errorf("httplimit: TrustProxies is given twice: give it once, with every trusted prefix: %w", ErrInvalidOption)
		}
		if len(trusted) == 0 {
			return fmt.Errorf("httplimit: TrustProxies(%s) names no trusted proxy: list the prefixes of the proxies in front of the service: %w", header.name, ErrInvalidOption)
		}
		for _, p := range trusted {
			if !p.IsValid() {
				return fmt.Errorf("httplimit: TrustProxies: prefix %v is not valid: %w", p, ErrInvalidOption)
			}
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				// Addresses are compared unmapped: ::ffff:10.0.0.0/104 is 10.0.0.0/8.
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			if p.Bits() == 0 {
				return fmt.Errorf("httplimit: TrustProxies: prefix %v trusts every address, which lets any client choose its key: list only your proxies: %w", p, ErrInvalidOption)
			}
			c.trusted = append(c.trusted, p.Masked())
		}
		c.header = header
		return nil
	}}
}

// IPv6Prefix keys an IPv6 client by its network of the given prefix length
// (1 to 128) instead of DefaultIPv6Prefix; 128 keys every address apart.
func IPv6Prefix(bits int) IPOption {
	return IPOption{func(c *clientIP) error {
		if bits < 1 || bits > 128 {
			return fmt.Errorf("httplimit: IPv6Prefix(%d): the prefix length must be 1 to 128: %w", bits, ErrInvalidOption)
		}
		c.v6bits = bits
		return nil
	}}
}

// ClientIP returns a KeyFunc that keys a request by its client's IP
// address: an IPv4 address as it is, an IPv6 address by its /64 network
// (IPv6Prefix changes the width).
//
// With no options, the client is the connection's peer (RemoteAddr) and
// no header is read: a client cannot choose its own key. Behind proxies,
// TrustProxies says which header they write and which addresses are
// theirs; nothing else is ever read, so a header the proxies pass through
// from the client is never mistaken for theirs.
//
// The KeyFunc fails with ErrNoKey when RemoteAddr is not an IP address
// (a Unix socket, a test request without one).
func ClientIP(opts ...IPOption) (KeyFunc, error) {
	c := &clientIP{v6bits: DefaultIPv6Prefix}
	for _, o := range opts {
		if o.apply == nil {
			return nil, fmt.Errorf("httplimit: ClientIP was given a zero IPOption: %w", ErrInvalidOption)
		}
		if err := o.apply(c); err != nil {
			return nil, err
		}
	}
	return c.key, nil
}

// clientIP is the configuration of a ClientIP KeyFunc.
type clientIP struct {
	header  ProxyHeader // zero: read no header
	trusted []netip.Prefix
	v6bits  int
}

func (c *clientIP) key(r *http.Request) (string, error) {
	ip, err := c.addr(r)
	if err != nil {
		return "", err
	}
	return c.format(ip), nil
}

// format writes the key of ip: the address, or its IPv6 network.
func (c *clientIP) format(ip netip.Addr) string {
	if ip.Is6() && c.v6bits < 128 {
		p, _ := ip.Prefix(c.v6bits) // cannot fail: 1 ≤ v6bits ≤ 128, ip is IPv6
		return p.String()
	}
	return ip.String()
}

func (c *clientIP) isTrusted(ip netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// addr finds the client of r, as ClientIP and TrustProxies describe.
func (c *clientIP) addr(r *http.Request) (netip.Addr, error) {
	peer, ok := parseAddr(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("httplimit: remote address %q is not an IP address: %w", r.RemoteAddr, ErrNoKey)
	}
	if c.header.kind == 0 || !c.isTrusted(peer) {
		return peer, nil
	}
	lines := r.Header.Values(c.header.name)
	switch c.header.kind {
	case singleIP:
		if len(lines) != 1 {
			return peer, nil // missing, or not overwritten by the proxy
		}
		if ip, ok := parseAddr(lines[0]); ok {
			return ip, nil
		}
		return peer, nil
	case xffList:
		return c.walk(peer, xffHops(lines)), nil
	default:
		return c.walk(peer, forwardedHops(lines)), nil
	}
}

// hop is one entry of a forwarding list; ok is false for an entry that is
// not an address (unreadable, "unknown", an obfuscated identifier).
type hop struct {
	ip netip.Addr
	ok bool
}

// walk reads hops from the right, starting from a trusted peer: the first
// untrusted address is the client; an unreadable hop stops the walk at the
// last trusted address; if every hop is trusted, the leftmost is.
func (c *clientIP) walk(peer netip.Addr, hops []hop) netip.Addr {
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		if !hops[i].ok {
			return client
		}
		client = hops[i].ip
		if !c.isTrusted(client) {
			return client
		}
	}
	return client
}

// xffHops reads X-Forwarded-For lines as one list, leftmost first.
func xffHops(lines []string) []hop {
	var hops []hop
	for _, line := range lines {
		for v := range strings.SplitSeq(line, ",") {
			ip, ok := parseAddr(v)
			hops = append(hops, hop{ip, ok})
		}
	}
	return hops
}

// forwardedHops reads Forwarded lines (RFC 7239) as one list of elements,
// leftmost first, each by its for= parameter. An element that breaks the
// syntax (an unclosed quote, a pair without "=", a repeated or missing
// for=) is a hop that is not an address; an unclosed quote takes the rest
// of its line with it, so that a client's stray quote can never make a
// proxy's appended element read as something else.
func forwardedHops(lines []string) []hop {
	var hops []hop
	for _, line := range lines {
		hops = appendForwarded(hops, line)
	}
	return hops
}

func appendForwarded(hops []hop, s string) []hop {
	i := 0
	for {
		// One element: pairs separated by ";", up to a "," outside quotes.
		var forValue string
		fors, bad := 0, false
		for {
			i = skipOWS(s, i)
			start := i
			for i < len(s) && isTokenChar(s[i]) {
				i++
			}
			name := s[start:i]
			if name == "" || i >= len(s) || s[i] != '=' {
				bad = true
				break
			}
			i++
			var value string
			if i < len(s) && s[i] == '"' {
				v, n, ok := quotedString(s[i:])
				if !ok {
					return append(hops, hop{}) // unclosed quote: the rest of the line is one bad element
				}
				value, i = v, i+n
			} else {
				start := i
				for i < len(s) && isValueChar(s[i]) {
					i++
				}
				value = s[start:i]
				if value == "" {
					bad = true
					break
				}
			}
			if strings.EqualFold(name, "for") {
				fors++
				forValue = value
			}
			i = skipOWS(s, i)
			if i < len(s) && s[i] == ';' {
				i++
				continue
			}
			break
		}
		// Skip to the end of the element (past any garbage, outside quotes).
		for i < len(s) && s[i] != ',' {
			bad = true
			if s[i] == '"' {
				if _, n, ok := quotedString(s[i:]); ok {
					i += n
					continue
				}
				return append(hops, hop{})
			}
			i++
		}
		h := hop{}
		if !bad && fors == 1 {
			h.ip, h.ok = parseAddr(forValue)
		}
		hops = append(hops, h)
		if i >= len(s) {
			return hops
		}
		i++ // the ','
	}
}

// quotedString reads a quoted-string at the start of s: its unescaped
// value, its length in s, and whether it is closed.
func quotedString(s string) (string, int, bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '"':
			return b.String(), i + 1, true
		case '\\':
			i++
			if i == len(s) {
				return "", 0, false
			}
		}
		b.WriteByte(s[i])
	}
	return "", 0, false
}

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// isTokenChar reports whether c is a tchar of RFC 9110.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isValueChar reports whether c may appear in an unquoted parameter value:
// a tchar, or one of ":[]", which RFC 7239 asks to quote but some proxies
// do not.
func isValueChar(c byte) bool {
	return isTokenChar(c) || c == ':' || c == '[' || c == ']'
}

func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isTokenChar(s[i]) {
			return false
		}
	}
	return s != ""
}

// parseAddr reads an IP address, with or without a port, brackets or
// quotes: 192.0.2.1, 192.0.2.1:443, 2001:db8::1, [2001:db8::1]:443,
// "[2001:db8::1]:443". An IPv4-mapped IPv6 address reads as IPv4, and a
// zone is dropped.
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
