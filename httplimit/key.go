package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
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
// Prefixes that trust every IPv4 or every IPv6 address are refused, one
// alone (0.0.0.0/0, ::/0) or several together (0.0.0.0/1 and
// 128.0.0.0/1; ::ffff:0:0/97 and 128.0.0.0/1): they would let any client
// choose its key.
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
		if coversEvery(c.trusted, netip.IPv4Unspecified()) {
			return fmt.Errorf("httplimit: TrustProxies: prefixes %v together trust every IPv4 address, which lets any client choose its key: list only your proxies: %w",
				family(c.trusted, true), ErrInvalidOption)
		}
		// Addresses are compared unmapped, so no address ever compared
		// lies in the IPv4-mapped range: prefixes that trust the rest of
		// IPv6 trust every IPv6 client.
		if coversEvery(append(family(c.trusted, false), mappedIPv4), netip.IPv6Unspecified()) {
			return fmt.Errorf("httplimit: TrustProxies: prefixes %v together trust every IPv6 address, which lets any client choose its key: list only your proxies: %w",
				family(c.trusted, false), ErrInvalidOption)
		}
		c.header = header
		return nil
	}}
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
		return c.walkXFF(peer, lines), nil
	default:
		w := walker{c: c, peer: peer, client: peer}
		for _, line := range lines {
			forwardedHops(line, w.add)
		}
		return w.client, nil
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
// The walk keeps nothing per hop: a proxy that passes a header of a
// megabyte of commas must not make a request allocate hundreds of
// megabytes. X-Forwarded-For is read from the right, one hop at a time, up
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

// Header keys a request by the value of a header, such as an API key.
// A request without it is refused through the error handler with ErrNoKey
// (400 by default). Spaces around name are ignored.
//
// An empty name, or one that is not a header field name, is carried by no
// request, and would refuse every one: New refuses a KeyFunc of Header
// given one, with an error matching ErrInvalidOption. (Wrapped in a
// KeyFunc of your own, which New cannot see into, it answers every
// request 500, logged at error level: the fault is the configuration's.)
func Header(name string) KeyFunc {
	switch n := strings.TrimSpace(name); {
	case n == "":
		return badKey{fmt.Errorf("httplimit: Header was given an empty header name, which no request carries: "+
			"name the header that holds the key, such as Header(\"X-API-Key\"): %w", ErrInvalidOption)}.key
	case !validHeaderName(n):
		return badKey{fmt.Errorf("httplimit: Header(%q): %q is not a header field name, which no request carries: "+
			"name the header that holds the key, such as Header(\"X-API-Key\"): %w", name, n, ErrInvalidOption)}.key
	default:
		name = n
	}
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
//
// An empty name is no wildcard's, and would refuse every request: New
// refuses a KeyFunc of PathValue given one, as it does Header's.
func PathValue(name string) KeyFunc {
	if name == "" {
		return badKey{fmt.Errorf("httplimit: PathValue was given an empty name, which no wildcard has: "+
			"name the wildcard that holds the key, such as PathValue(\"tenant\") for /t/{tenant}/: %w", ErrInvalidOption)}.key
	}
	return func(r *http.Request) (string, error) {
		v := r.PathValue(name)
		if v == "" {
			return "", fmt.Errorf("httplimit: path value %s is empty: %w", name, ErrNoKey)
		}
		return v, nil
	}
}

// badKey is the KeyFunc of Header or PathValue given a name no request
// can carry: a configuration error, which New finds (keyError) and
// returns. New cannot see into a KeyFunc of the caller's that calls it:
// then err answers every request 500 (errorStatus), not 400, for the fault
// is not the client's.
type badKey struct{ err error }

func (b badKey) key(*http.Request) (string, error) { return "", b.err }

// badKeyCode identifies the method value badKey.key among KeyFuncs: every
// method value of one method runs the same code.
var badKeyCode = reflect.ValueOf(badKey{}.key).Pointer()

// keyError returns the configuration error of f if f is a badKey's, and
// nil for any other KeyFunc, which it does not call.
func keyError(f KeyFunc) error {
	if reflect.ValueOf(f).Pointer() != badKeyCode {
		return nil
	}
	_, err := f(nil) // badKey.key, which reads no request
	return err
}
