package ratelimitgrpc

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// This file finds a call's client behind trusted proxies. The walk and the
// parsers below are those of package httplimit (key.go), kept the same so
// that a client is keyed alike over HTTP and gRPC; the tests run the same
// cases, and a fuzz test any input, through both packages and require the
// same key.

// ProxyHeader names the metadata a deployment's proxies write the
// client's address into: XForwardedFor, Forwarded, or a SingleIPHeader.
// gRPC carries HTTP/2 header fields as metadata, so these are the header
// fields the proxies write, by their lower-case names. The zero
// ProxyHeader names none and is refused by TrustProxies.
type ProxyHeader struct {
	name string // a metadata key: lower case
	kind headerKind
}

type headerKind uint8

const (
	xffList       headerKind = iota + 1 // x-forwarded-for: addresses, comma-separated, appended
	forwardedList                       // forwarded (RFC 7239): elements with for= parameters, appended
	singleIP                            // one address, set (overwritten) by the proxy
)

var (
	// XForwardedFor is the x-forwarded-for list, to which each proxy
	// appends the address it received the call from (Envoy and Istio
	// gateways with use_remote_address, nginx's grpc_pass with
	// grpc_set_header X-Forwarded-For $proxy_add_x_forwarded_for, AWS
	// ALB, Google Cloud load balancers, Traefik). Several values (header
	// lines) are read as one list, in order.
	XForwardedFor = ProxyHeader{name: "x-forwarded-for", kind: xffList}
	// Forwarded is the forwarded list of RFC 7239, read by its for=
	// parameters. Choose it only if every trusted proxy appends to it
	// (HAProxy's "option forwarded", for one): most proxies, Envoy
	// among them, pass the client's own forwarded through untouched.
	Forwarded = ProxyHeader{name: "forwarded", kind: forwardedList}
)

// SingleIPHeader names metadata that holds one address, which the proxy
// sets and overwrites whatever the client sent: x-real-ip (nginx with
// grpc_set_header X-Real-IP $remote_addr), x-envoy-external-address
// (Envoy at the edge), cf-connecting-ip (Cloudflare). The name is not case
// sensitive. x-forwarded-for and forwarded are lists: use XForwardedFor
// or Forwarded for them.
func SingleIPHeader(name string) ProxyHeader {
	return ProxyHeader{name: strings.ToLower(strings.TrimSpace(name)), kind: singleIP}
}

// String returns the metadata key.
func (h ProxyHeader) String() string { return h.name }

// TrustProxies makes ClientIP read header, but only from the proxies at
// the trusted prefixes, and only what they wrote: when the call's peer is
// trusted, a list (XForwardedFor, Forwarded) is read from the right, past
// the addresses of trusted proxies, and the first address that is not
// one is the client; a SingleIPHeader is taken as it is when the call
// carries exactly one value. An unreadable, obfuscated or missing value
// stops the walk at the last trusted address, which becomes the key. List
// every proxy in front of the service: load balancers, gateways, the
// sidecar (on loopback, when the service's peer is its sidecar).
//
// Prefixes that trust every IPv4 or every IPv6 address are refused, one
// alone (0.0.0.0/0, ::/0) or several together (0.0.0.0/1 and
// 128.0.0.0/1; ::ffff:0:0/97 and 128.0.0.0/1): they would let any client
// choose its key. A prefix written as IPv4-mapped IPv6
// (::ffff:10.0.0.0/104) trusts the IPv4 addresses it stands for.
//
// PeerIP refuses TrustProxies: give it to ClientIP.
func TrustProxies(header ProxyHeader, trusted ...netip.Prefix) IPOption {
	return IPOption{func(c *clientIP) error {
		switch header.kind {
		case xffList, forwardedList:
		case singleIP:
			if !validMetadataKey(header.name) {
				return fmt.Errorf("ratelimitgrpc: TrustProxies: %q is not a metadata key: a key is made of letters, digits, '-', '_' and '.': %w", header.name, ErrInvalidOption)
			}
			if strings.HasSuffix(header.name, "-bin") {
				return fmt.Errorf("ratelimitgrpc: TrustProxies: %s is binary metadata, which holds no address as a proxy writes one: name the key without -bin: %w", header.name, ErrInvalidOption)
			}
			if strings.HasPrefix(header.name, "grpc-") {
				return fmt.Errorf("ratelimitgrpc: TrustProxies: %s is reserved by gRPC, and no proxy writes an address into it: %w", header.name, ErrInvalidOption)
			}
			switch header.name {
			case XForwardedFor.name:
				return fmt.Errorf("ratelimitgrpc: TrustProxies: %s is a list that proxies append to, not a single address: use ratelimitgrpc.XForwardedFor: %w", header.name, ErrInvalidOption)
			case Forwarded.name:
				return fmt.Errorf("ratelimitgrpc: TrustProxies: %s is a list that proxies append to, not a single address: use ratelimitgrpc.Forwarded: %w", header.name, ErrInvalidOption)
			}
		default:
			return fmt.Errorf("ratelimitgrpc: TrustProxies: no header chosen: use XForwardedFor, Forwarded or SingleIPHeader(name): %w", ErrInvalidOption)
		}
		if c.header.kind != 0 {
			return fmt.Errorf("ratelimitgrpc: TrustProxies is given twice: give it once, with every trusted prefix: %w", ErrInvalidOption)
		}
		if len(trusted) == 0 {
			return fmt.Errorf("ratelimitgrpc: TrustProxies(%s) names no trusted proxy: list the prefixes of the proxies in front of the service: %w", header.name, ErrInvalidOption)
		}
		var ps []netip.Prefix
		for _, p := range trusted {
			if !p.IsValid() {
				return fmt.Errorf("ratelimitgrpc: TrustProxies: prefix %v is not valid: %w", p, ErrInvalidOption)
			}
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				// Addresses are compared unmapped: ::ffff:10.0.0.0/104 is 10.0.0.0/8.
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			if p.Bits() == 0 {
				return fmt.Errorf("ratelimitgrpc: TrustProxies: prefix %v trusts every address, which lets any client choose its key: list only your proxies: %w", p, ErrInvalidOption)
			}
			ps = append(ps, p.Masked())
		}
		if coversEvery(ps, netip.IPv4Unspecified()) {
			return fmt.Errorf("ratelimitgrpc: TrustProxies: prefixes %v together trust every IPv4 address, which lets any client choose its key: list only your proxies: %w",
				family(ps, true), ErrInvalidOption)
		}
		// Addresses are compared unmapped, so no address ever compared
		// lies in the IPv4-mapped range: prefixes that trust the rest of
		// IPv6 trust every IPv6 client.
		if coversEvery(append(family(ps, false), mappedIPv4), netip.IPv6Unspecified()) {
			return fmt.Errorf("ratelimitgrpc: TrustProxies: prefixes %v together trust every IPv6 address, which lets any client choose its key: list only your proxies: %w",
				family(ps, false), ErrInvalidOption)
		}
		c.header, c.trusted = header, ps
		return nil
	}}
}

// validMetadataKey reports whether s is a key gRPC takes for metadata:
// lower-case letters, digits, '-', '_' and '.'.
func validMetadataKey(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return s != ""
}

// mappedIPv4 is the range of the IPv4-mapped IPv6 addresses.
var mappedIPv4 = netip.MustParsePrefix("::ffff:0:0/96")

// family returns the IPv4 prefixes of ps, or its IPv6 ones.
func family(ps []netip.Prefix, v4 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.Addr().Is4() == v4 {
			out = append(out, p)
		}
	}
	return out
}

// coversEvery reports whether the prefixes of ps of first's family
// together hold every address of that family, first (its lowest) to its
// highest: their ranges, merged in order, leave no gap.
func coversEvery(ps []netip.Prefix, first netip.Addr) bool {
	type span struct{ lo, hi netip.Addr }
	var spans []span
	for _, p := range ps {
		if p.Addr().BitLen() == first.BitLen() {
			spans = append(spans, span{p.Masked().Addr(), lastAddr(p)})
		}
	}
	slices.SortFunc(spans, func(a, b span) int { return a.lo.Compare(b.lo) })
	next := first // the lowest address no span seen so far holds
	for _, s := range spans {
		if next.Less(s.lo) {
			return false // a gap
		}
		if !s.hi.Less(next) {
			if next = s.hi.Next(); !next.IsValid() {
				return true // past the highest address
			}
		}
	}
	return false
}

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b) // cannot fail: 4 or 16 bytes
	return a
}

func (c *clientIP) isTrusted(ip netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// walk finds the client of a call from a trusted peer, in the values of
// the trusted header, as ClientIP and TrustProxies describe.
func (c *clientIP) walk(peer netip.Addr, lines []string) netip.Addr {
	switch c.header.kind {
	case singleIP:
		if len(lines) != 1 {
			return peer // missing, or not overwritten by the proxy
		}
		if ip, ok := parseAddr(lines[0]); ok {
			return ip
		}
		return peer
	case xffList:
		return c.walkXFF(peer, lines)
	default:
		w := walker{c: c, peer: peer, client: peer}
		for _, line := range lines {
			forwardedHops(line, w.add)
		}
		return w.client
	}
}

// hop is one entry of a forwarding list; ok is false for an entry that is
// not an address (unreadable, "unknown", an obfuscated identifier).
type hop struct {
	ip netip.Addr
	ok bool
}

// The client is found by a walk of the list from the right, starting from
// a trusted peer: the first untrusted address is the client; a hop that is
// not an address stops the walk at the last trusted address (or the peer);
// if every hop is trusted, the leftmost is.
//
// The walk keeps nothing per hop: a proxy that passes metadata of a
// megabyte of commas (gRPC takes header lists of up to 16 MiB by default)
// must not make a call allocate hundreds of megabytes. X-Forwarded-For is read from the right, one hop at a time, up
// to where the walk ends. A Forwarded list can only be read from the left
// (a quote changes the meaning of what follows it): walker takes its hops
// from the left and keeps, instead of the list, the walk's answer for the
// hops so far.

// walkXFF walks X-Forwarded-For lines, one list in their order, from the
// right.
func (c *clientIP) walkXFF(peer netip.Addr, lines []string) netip.Addr {
	client := peer
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for end := len(line); end >= 0; {
			start := strings.LastIndexByte(line[:end], ',') + 1
			ip, ok := parseAddr(line[start:end])
			if !ok {
				return client
			}
			client = ip
			if !c.isTrusted(ip) {
				return client
			}
			end = start - 1 // -1 past the line's first hop
		}
	}
	return client
}

// walker finds the client of a list given hop by hop from the left, as the
// walk from the right finds it.
type walker struct {
	c    *clientIP
	peer netip.Addr
	// client is the walk's answer for the hops added so far.
	client netip.Addr
	// n counts the hops added.
	n int
	// afterBad is true when the rightmost hop that ends the walk is not an
	// address and no hop was added right of it.
	afterBad bool
}

// add takes the next hop to the right.
func (w *walker) add(h hop) {
	w.n++
	switch {
	case !h.ok:
		w.client, w.afterBad = w.peer, true // the walk stops right of it
	case !w.c.isTrusted(h.ip):
		w.client, w.afterBad = h.ip, false
	case w.afterBad:
		w.client, w.afterBad = h.ip, false // the first hop right of it
	case w.n == 1:
		w.client = h.ip // every hop trusted so far: the leftmost
	}
}

// forwardedHops reads a Forwarded line (RFC 7239) as a list of elements,
// from the left, and gives add each element's hop, by its for= parameter.
// An element that breaks the syntax (an unclosed quote, a pair without
// "=", a repeated or missing for=) is a hop that is not an address; an
// unclosed quote takes the rest of its line with it, so that a client's
// stray quote can never make a proxy's appended element read as something
// else. A quoted value holding a quoted-pair (a backslash) is not an
// address either: no proxy escapes a character of one.
func forwardedHops(s string, add func(hop)) {
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
				v, n, escaped, ok := quotedString(s[i:])
				if !ok {
					add(hop{}) // unclosed quote: the rest of the line is one bad element
					return
				}
				value, i = v, i+n
				if escaped && strings.EqualFold(name, "for") {
					bad = true
				}
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
				if _, n, _, ok := quotedString(s[i:]); ok {
					i += n
					continue
				}
				add(hop{})
				return
			}
			i++
		}
		h := hop{}
		if !bad && fors == 1 {
			h.ip, h.ok = parseAddr(forValue)
		}
		add(h)
		if i >= len(s) {
			return
		}
		i++ // the ','
	}
}

// quotedString reads a quoted-string at the start of s: what it holds
// between its quotes, as written (quoted-pairs not undone), its length in
// s, whether it holds a quoted-pair, and whether it is closed.
func quotedString(s string) (value string, n int, escaped, ok bool) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '"':
			return s[1:i], i + 1, escaped, true
		case '\\':
			escaped = true
			i++
		}
	}
	return "", 0, false, false
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

// parseAddr reads an IP address, with or without a port, brackets or
// quotes: 192.0.2.1, 192.0.2.1:443, 2001:db8::1, [2001:db8::1]:443,
// "[2001:db8::1]:443". An IPv4-mapped IPv6 address reads as IPv4, and a
// zone is dropped.
//
// It allocates nothing, whatever s holds: a forwarding list may hold any
// number of values that are not addresses, and netip.ParseAddr and
// net.SplitHostPort allocate the error that says so. isAddr and
// splitHostPort answer as they do, without it.
func parseAddr(s string) (netip.Addr, bool) {
	s = strings.Trim(strings.TrimSpace(s), `"`)
	host := s
	if !isAddr(host) {
		var ok bool
		if host, ok = splitHostPort(s); !ok || !isAddr(host) {
			if !strings.HasPrefix(s, "[") || !strings.HasSuffix(s, "]") {
				return netip.Addr{}, false
			}
			if host = s[1 : len(s)-1]; !isAddr(host) {
				return netip.Addr{}, false
			}
		}
	}
	ip, err := netip.ParseAddr(host)
	if err != nil { // cannot happen: isAddr(host)
		return netip.Addr{}, false
	}
	return ip.Unmap().WithZone(""), true
}

// splitHostPort returns the host of net.SplitHostPort(s), and whether it
// returns no error.
func splitHostPort(s string) (string, bool) {
	i := strings.LastIndexByte(s, ':') // the port starts after the last colon
	if i < 0 {
		return "", false
	}
	host, j, k := s[:i], 0, 0
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 || end+1 != i { // "]:" must end the host
			return "", false
		}
		host, j, k = s[1:end], 1, end+1
	} else if strings.IndexByte(host, ':') >= 0 {
		return "", false
	}
	if strings.IndexByte(s[j:], '[') >= 0 || strings.IndexByte(s[k:], ']') >= 0 {
		return "", false
	}
	return host, true
}

// isAddr reports whether netip.ParseAddr(s) returns no error.
func isAddr(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '.':
			return isIPv4(s)
		case ':':
			return isIPv6(s)
		case '%':
			return false
		}
	}
	return false
}

// isIPv4 reports whether s is an IPv4 address in dotted decimal, as
// netip.ParseAddr reads one: four decimal octets of at most 255, without
// leading zeros.
func isIPv4(s string) bool {
	dots, val, digits := 0, 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case '0' <= c && c <= '9':
			if digits == 1 && val == 0 {
				return false // a leading zero
			}
			val = val*10 + int(c-'0')
			digits++
			if val > 255 {
				return false
			}
		case c == '.':
			if digits == 0 || i == len(s)-1 || dots == 3 {
				return false
			}
			dots++
			val, digits = 0, 0
		default:
			return false
		}
	}
	return dots == 3
}

// isIPv6 reports whether s is an IPv6 address, with or without a zone, as
// netip.ParseAddr reads one.
func isIPv6(s string) bool {
	if i := strings.IndexByte(s, '%'); i >= 0 {
		if i == len(s)-1 {
			return false // an empty zone
		}
		s = s[:i]
	}
	ellipsis := false
	if strings.HasPrefix(s, "::") {
		ellipsis, s = true, s[2:]
		if s == "" {
			return true
		}
	}
	n := 0 // bytes of the address read
	for n < 16 {
		digits := 0
		for digits < len(s) && isHexDigit(s[digits]) {
			digits++
		}
		if digits == 0 || digits > 4 {
			return false
		}
		if digits < len(s) && s[digits] == '.' {
			// An IPv4 address ends it, in place of the last two groups.
			if !ellipsis && n != 12 || n+4 > 16 || !isIPv4(s) {
				return false
			}
			n, s = n+4, ""
			break
		}
		n += 2
		if s = s[digits:]; s == "" {
			break
		}
		if s[0] != ':' || len(s) == 1 {
			return false
		}
		if s = s[1:]; s[0] == ':' {
			if ellipsis {
				return false // a second "::"
			}
			if ellipsis, s = true, s[1:]; s == "" {
				break
			}
		}
	}
	if s != "" {
		return false
	}
	// Without "::", eight groups; with it, fewer, for it stands for one
	// at least.
	return (n == 16) != ellipsis
}

func isHexDigit(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
