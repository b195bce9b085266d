// Package clientip finds a client's address behind trusted proxies, in
// the values of the header they write it into: X-Forwarded-For, Forwarded
// (RFC 7239) or a header of one address. It is the one reading of those
// headers that httplimit.ClientIP (from an HTTP request's header lines)
// and ratelimitgrpc.ClientIP (from a call's metadata) share, so that a
// client is keyed alike over HTTP and gRPC, and a fix to the reading
// reaches both.
//
// # The walk
//
// The client is found by a walk of the list from the right, starting from
// a trusted peer: the first untrusted address is the client; a hop that is
// not an address stops the walk at the last trusted address (or the peer);
// if every hop is trusted, the leftmost is. A client writes only left of
// what the trusted proxies append, so nothing it wrote is ever reached.
//
// A peer on a Unix socket has no address. Trusted (TrustUnix), it starts
// the walk as a trusted address does; where the walk would end at it, the
// key is UnixPeer. It is trusted only when asked: a proxy on the socket is
// the usual deployment, but trusting the header of every peer without an
// address would let any local process choose its key.
//
// The walk keeps nothing per hop: a proxy that passes a header of a
// megabyte of commas (net/http takes header lists of 1 MB by default, gRPC
// of 16 MiB) must not make a request allocate hundreds of megabytes. X-Forwarded-For is read from the right, one hop at a time, up
// to where the walk ends. A Forwarded list can only be read from the left
// (a quote changes the meaning of what follows it): walker takes its hops
// from the left and keeps, instead of the list, the walk's answer for the
// hops so far.
//
// # The options
//
// Both packages' IPOptions (TrustProxies, TrustUnixSocket, IPv6Prefix)
// are Config's methods, which Build applies and ClientIP checks together:
// each refusal is written once, in the words of the package that gives
// the options (Package), and wraps that package's sentinel.
package clientip

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
)

// Kind says how the proxies write the client's address into their header.
// The zero Kind is no header.
type Kind uint8

const (
	// XForwardedFor is a list of addresses, comma-separated, to which
	// each proxy appends.
	XForwardedFor Kind = iota + 1
	// Forwarded is a list of elements (RFC 7239) with for= parameters, to
	// which each proxy appends.
	Forwarded
	// SingleIP is one address, which the proxy sets, overwriting whatever
	// the client sent.
	SingleIP
)

// Proxies are the proxies in front of a service: the Kind of header they
// write, the prefixes of their addresses and, if TrustUnix was called, the
// peer on a Unix socket. The zero Proxies trusts no peer, and Client always
// answers the peer.
type Proxies struct {
	kind    Kind
	trusted []netip.Prefix
	// unix is set when a peer on a Unix socket is one of the proxies.
	unix bool
}

// UnixPeer is the key of a request or call from a trusted peer on a Unix
// socket (TrustUnix) when the walk ends at the peer, which has no address:
// "unix:", the name nginx gives such a peer in $remote_addr. It is no IP
// address's key.
const UnixPeer = "unix:"

// IsUnix reports whether network, a net.Addr's Network, is a Unix
// socket's: "unix" or "unixpacket" (a connection's, never "unixgram").
func IsUnix(network string) bool { return network == "unix" || network == "unixpacket" }

// Trust returns the Proxies at the trusted prefixes that write a header of
// kind. A prefix written as IPv4-mapped IPv6 (::ffff:10.0.0.0/104) stands
// for the IPv4 addresses it maps, for addresses are compared unmapped.
//
// It refuses an invalid prefix, prefixes that trust every IPv4 or every
// IPv6 address, one alone (0.0.0.0/0, ::/0) or several together
// (0.0.0.0/1 and 128.0.0.0/1), a prefix wider than any network of
// proxies (0.0.0.0/1, 2a00::/16, 64:ff9b::/96, 2001::/32; see tooWide),
// prefixes that together hold a /96 of a translated range (the 256
// /104s of 64:ff9b::/96; see coversTranslated), and prefixes that
// together trust every IPv4 client, by its address or by one Format keys
// as it (IPv4 /8s of one half and the NAT64, 6to4 or Teredo prefixes of
// the other's clients; see embedded):
// they would let any client, or any in a large part of the internet,
// choose its key.
// Its error says what is wrong, without the name of the caller's
// function: the caller adds it, and the sentinel its package's callers
// match.
func Trust(kind Kind, trusted []netip.Prefix) (Proxies, error) {
	ps := make([]netip.Prefix, 0, len(trusted))
	for _, p := range trusted {
		if !p.IsValid() {
			return Proxies{}, fmt.Errorf("prefix %v is not valid", p)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			// Addresses are compared unmapped: ::ffff:10.0.0.0/104 is 10.0.0.0/8.
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Bits() == 0 {
			return Proxies{}, fmt.Errorf("prefix %v trusts every address, which lets any client choose its key: list only your proxies", p)
		}
		ps = append(ps, p.Masked())
	}
	ipv4 := mergeRanges(ranges(32, 0, ps))
	if coversAll(ipv4, 32) {
		return Proxies{}, fmt.Errorf("prefixes %v together trust every IPv4 address, which lets any client choose its key: list only your proxies",
			family(ps, true))
	}
	// Addresses are compared unmapped, so no address ever compared lies in
	// the IPv4-mapped range: prefixes that trust the rest of IPv6 trust
	// every IPv6 client.
	if coversEvery(netip.IPv6Unspecified(), ps, []netip.Prefix{mappedIPv4}) {
		return Proxies{}, fmt.Errorf("prefixes %v together trust every IPv6 address, which lets any client choose its key: list only your proxies",
			family(ps, false))
	}
	for _, p := range ps {
		if err := tooWide(p); err != nil {
			return Proxies{}, err
		}
	}
	if err := coversTranslated(ps); err != nil {
		return Proxies{}, err
	}
	// The IPv4 prefixes are merged already: their spans, fewer, join the
	// embedded ones.
	if coversAll(mergeRanges(append(ranges(32, len(ipv4), embedded(ps)), ipv4...)), 32) {
		// Not every prefix is named: they may be thousands.
		return Proxies{}, fmt.Errorf("prefixes of IPv4 and of %v (NAT64), %v (6to4) or %v (Teredo) together trust every IPv4 client, "+
			"by its own address or by the one those give it, which is keyed as the IPv4 address it stands for "+
			"(a 6to4 site holds its address's /48, a Teredo client picks its server): list only your proxies' prefixes", nat64, sixToFour, teredo)
	}
	return Proxies{kind: kind, trusted: ps}, nil
}

// The shortest prefixes Trust takes: no network of proxies is wider. The
// widest private IPv4 network is 10.0.0.0/8. An IPv6 /28 is sixteen of
// the /32s a registry allocates a provider, wider than the ranges CDNs
// publish for their proxies (Cloudflare's widest is a /29); a shorter
// prefix of global unicast holds whole providers, their clients too. The
// unique local (fc00::/7) and link-local (fe80::/10) ranges, which the
// internet does not route, are taken whole.
const (
	minIPv4Bits = 8
	minIPv6Bits = 28
)

// unrouted are the IPv6 ranges the internet does not route, which Trust
// takes however wide: unique local and link-local addresses.
var unrouted = []netip.Prefix{netip.MustParsePrefix("fc00::/7"), netip.MustParsePrefix("fe80::/10")}

// tooWide returns the error of a trusted prefix p (masked, unmapped) wider
// than any network of proxies: trusted, 0.0.0.0/1 let every client in half
// the IPv4 internet choose its key, and 64:ff9b::/96 every IPv4 client of
// a NAT64 translator, which is no proxy and writes no header.
func tooWide(p netip.Prefix) error {
	const what = "which lets a client anywhere in it choose its key: list only your proxies' prefixes, such as 10.0.0.0/8 or a load balancer's subnet"
	if p.Addr().Is4() {
		if p.Bits() < minIPv4Bits {
			return fmt.Errorf("prefix %v trusts 2^%d addresses, wider than any network of proxies (an IPv4 prefix of /%d or longer), %s", p, 32-p.Bits(), minIPv4Bits, what)
		}
		return nil
	}
	if p.Bits() < minIPv6Bits && !slices.ContainsFunc(unrouted, func(u netip.Prefix) bool { return p.Bits() >= u.Bits() && u.Contains(p.Addr()) }) {
		return fmt.Errorf("prefix %v trusts 2^%d addresses, wider than any network of proxies (an IPv6 prefix of /%d or longer, but for the unique local fc00::/7 and link-local fe80::/10), %s",
			p, 128-p.Bits(), minIPv6Bits, what)
	}
	// The addresses of a translator's prefix stand for IPv4 clients, one
	// an address: a prefix that trusts more of them than an IPv4 prefix
	// may is as wide. Where a prefix puts the IPv4 address differs (a
	// local-use NAT64 one of /48 to /96, RFC 6052), but it always ends by
	// the address's last 32 bits: a prefix shorter than /104 may hold an
	// IPv4 /8 or more. (6to4's /24s, each an IPv4 /8's sites, are shorter
	// than minIPv6Bits already.)
	for _, t := range translated {
		if p.Overlaps(t.prefix) && p.Bits() < 128-32+minIPv4Bits {
			return fmt.Errorf("prefix %v trusts the IPv4 clients that %s, as an IPv4 prefix shorter than /%d would (a translator or relay is no proxy, and writes no header), %s",
				p, t.what, minIPv4Bits, what)
		}
	}
	return nil
}

// coversTranslated returns the error of prefixes of ps (masked, unmapped,
// none tooWide) that together hold a whole /96 of a translated range:
// every IPv4 client its translator or relay gives addresses of, as
// IPv4 prefixes that together hold every IPv4 address would trust. Each
// /104 of 64:ff9b::/96 is an IPv4 /8 and taken, as 10.0.0.0/8 is, but
// its 256 /104s together are the /96 that tooWide refuses.
func coversTranslated(ps []netip.Prefix) error {
	var in []netip.Prefix
	for _, t := range translated {
		in = in[:0]
		for _, p := range ps {
			if p.Bits() >= t.prefix.Bits() && t.prefix.Contains(p.Addr()) {
				in = append(in, p)
			}
		}
		for _, s := range merge(t.prefix.Addr(), in) {
			// The first /96 that starts in s, if s holds it whole.
			block := netip.PrefixFrom(s.lo, 128-32).Masked()
			if block.Addr() != s.lo {
				next := lastAddr(block).Next()
				if !next.IsValid() {
					continue
				}
				block = netip.PrefixFrom(next, 128-32)
			}
			if t.prefix.Contains(block.Addr()) && !s.hi.Less(lastAddr(block)) {
				// Not every prefix is named: they may be hundreds.
				return fmt.Errorf("prefixes of %v together trust all of %v, every IPv4 client that %s, as IPv4 prefixes that together trust every IPv4 address would "+
					"(a translator or relay is no proxy, and writes no header): list only your proxies' prefixes", t.prefix, block, t.what)
			}
		}
	}
	return nil
}

// embedded returns the IPv4 prefixes of the clients that the IPv6
// prefixes of ps (masked, unmapped, none tooWide) trust by an address
// Format keys as an IPv4 client's: that of NAT64's well-known prefix,
// 6to4 or Teredo. Those of a NAT64 /104 or a Teredo one are an IPv4 /8,
// whatever the rest of the address: a Teredo client picks its server,
// and its port when no NAT is in front of it. A 6to4 prefix longer than
// a /48 is part of one site, which holds its whole /48: its address.
func embedded(ps []netip.Prefix) []netip.Prefix {
	n := 0
	for _, p := range ps {
		if p.Addr().Is6() && (nat64.Overlaps(p) || teredo.Overlaps(p) || sixToFour.Overlaps(p)) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]netip.Prefix, 0, n)
	for _, p := range ps {
		a, bits := p.Addr(), p.Bits()
		if !a.Is6() {
			continue
		}
		b := a.As16()
		switch {
		case bits >= 96 && nat64.Contains(a):
			out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte(b[12:])), bits-96))
		case bits >= 96 && teredo.Contains(a):
			out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}), bits-96).Masked())
		case bits >= sixToFour.Bits() && sixToFour.Contains(a):
			out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte(b[2:6])), min(bits, 48)-16))
		}
	}
	return out
}

// translated are the IPv6 ranges whose addresses stand for IPv4 clients,
// the address in the last 32 bits or, in a local-use NAT64 prefix, where
// the translator's prefix length says; what says whose they are.
var translated = []struct {
	prefix netip.Prefix
	what   string
}{
	{nat64, "NAT64 translators give addresses of " + nat64.String()},
	{nat64Local, "NAT64 translators give addresses of the local-use " + nat64Local.String()},
	{teredo, "Teredo gives addresses of " + teredo.String()},
}

// The IPv6 ranges that embed an IPv4 address, which Format keys by it.
var (
	// nat64 is the NAT64 well-known prefix (RFC 6052): the IPv4 address
	// in its addresses' last 32 bits.
	nat64 = netip.MustParsePrefix("64:ff9b::/96")
	// nat64Local is the NAT64 local-use prefix (RFC 8215), of which a
	// network takes a prefix of its own, /48 to /96: the IPv4 address is
	// where that prefix's length says (RFC 6052, section 2.2).
	nat64Local = netip.MustParsePrefix("64:ff9b:1::/48")
	// sixToFour is 6to4 (RFC 3056): the /48 of a site is 2002: followed by
	// the IPv4 address of its router.
	sixToFour = netip.MustParsePrefix("2002::/16")
	// teredo is Teredo (RFC 4380): the last 32 bits are the IPv4 address
	// of the client's NAT, inverted; the /64 is its Teredo server's.
	teredo = netip.MustParsePrefix("2001::/32")
)

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

// coversEvery reports whether the prefixes of first's family in lists
// together hold every address of that family, first (its lowest) to its
// highest: their ranges, merged in order, leave no gap.
func coversEvery(first netip.Addr, lists ...[]netip.Prefix) bool {
	bitLen := first.BitLen()
	return coversAll(mergeRanges(ranges(bitLen, 0, lists...)), bitLen)
}

// coversAll reports whether rs, merged, hold every address of the family
// of bitLen bits.
func coversAll(rs []numRange, bitLen int) bool {
	return len(rs) == 1 && rs[0].lo == (num{}) && rs[0].hi == lastNum(num{}, bitLen, 0)
}

// span is the range of addresses lo to hi, both held.
type span struct{ lo, hi netip.Addr }

// merge returns the ranges of the prefixes (masked) of first's family in
// lists, sorted and merged: those that overlap or touch are one span.
func merge(first netip.Addr, lists ...[]netip.Prefix) []span {
	bitLen := first.BitLen()
	rs := mergeRanges(ranges(bitLen, 0, lists...))
	spans := make([]span, len(rs))
	for i, r := range rs {
		spans[i] = span{r.lo.addr(bitLen), r.hi.addr(bitLen)}
	}
	return spans
}

// ranges returns the ranges of the prefixes (masked) of the family of
// bitLen bits in lists, as numbers, in a slice with room for extra more.
// Numbers hold no pointer for the garbage collector to follow, and sort
// without netip.Addr's checks of family and zone: a list may hold a
// hundred thousand prefixes.
func ranges(bitLen, extra int, lists ...[]netip.Prefix) []numRange {
	n := extra
	for _, ps := range lists {
		n += len(ps)
	}
	rs := make([]numRange, 0, n)
	for _, ps := range lists {
		for _, p := range ps {
			if p.Addr().BitLen() == bitLen {
				a := addrNum(p.Addr())
				rs = append(rs, numRange{a.and(prefixMask(bitLen, p.Bits())), lastNum(a, bitLen, p.Bits())})
			}
		}
	}
	return rs
}

// mergeRanges sorts rs and merges those that overlap or touch, in place,
// and returns the merged ranges.
func mergeRanges(rs []numRange) []numRange {
	slices.SortFunc(rs, func(a, b numRange) int { return a.lo.cmp(b.lo) })
	// The merged ranges are never more than those read.
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if r.lo.cmp(last.hi) <= 0 || r.lo == last.hi.next() {
				// r overlaps or touches the last range.
				if last.hi.cmp(r.hi) < 0 {
					last.hi = r.hi
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// num is an address as a number, its highest 64 bits in hi; an IPv4
// address's 32 bits are the lowest of lo.
type num struct{ hi, lo uint64 }

// numRange is the range of addresses lo to hi, both held, as numbers.
type numRange struct{ lo, hi num }

// addrNum returns a as a number.
func addrNum(a netip.Addr) num {
	if a.Is4() {
		b := a.As4()
		return num{lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return num{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// addr returns the address of n in the family of bitLen bits.
func (n num) addr(bitLen int) netip.Addr {
	if bitLen == 32 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(n.lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], n.hi)
	binary.BigEndian.PutUint64(b[8:], n.lo)
	return netip.AddrFrom16(b)
}

// cmp compares n and m as numbers: -1, 0 or +1.
func (n num) cmp(m num) int {
	if c := cmp.Compare(n.hi, m.hi); c != 0 {
		return c
	}
	return cmp.Compare(n.lo, m.lo)
}

// and returns the bits n and m both set.
func (n num) and(m num) num { return num{n.hi & m.hi, n.lo & m.lo} }

// next returns n+1; past the highest number of 128 bits, 0 (no address
// of either family compares equal to it then, nor does it need to: no
// span starts past the highest address).
func (n num) next() num {
	lo := n.lo + 1
	hi := n.hi
	if lo == 0 {
		hi++
	}
	return num{hi, lo}
}

// hostBits returns the number whose lowest bitLen-bits bits are set: the
// host part of a prefix of that length in a family of bitLen bits.
func hostBits(bitLen, bits int) num {
	host := uint(bitLen - bits)
	if host >= 64 {
		return num{hi: 1<<(host-64) - 1, lo: math.MaxUint64}
	}
	return num{lo: 1<<host - 1}
}

// prefixMask returns the mask of a prefix of bits bits in a family of
// bitLen bits.
func prefixMask(bitLen, bits int) num {
	h := hostBits(bitLen, bits)
	m := num{^h.hi, ^h.lo}
	if bitLen == 32 {
		m.hi, m.lo = 0, m.lo&math.MaxUint32
	}
	return m
}

// lastNum returns the highest address, as a number, of the prefix of
// bits bits of the address a, as a number, in a family of bitLen bits.
func lastNum(a num, bitLen, bits int) num {
	h := hostBits(bitLen, bits)
	return num{a.hi | h.hi, a.lo | h.lo}
}

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	n := p.Addr().BitLen()
	return lastNum(addrNum(p.Addr()), n, p.Bits()).addr(n)
}

// TrustUnix makes p trust, besides the addresses of its prefixes, the peer
// of a request or call that came over a Unix socket: a proxy on the same
// machine that connects to the service through the socket (nginx's
// proxy_pass http://unix:/run/app.sock). Whoever can connect to the
// socket is then trusted to write the header: a caller gives it only
// when the service's users say so, never because a peer has no address.
func (p *Proxies) TrustUnix() { p.unix = true }

// TrustsUnix reports whether p trusts the peer on a Unix socket
// (TrustUnix). A caller whose header values cost something to get asks it
// first: UnixKey reads them only from a trusted peer.
func (p *Proxies) TrustsUnix() bool { return p.unix }

// Empty reports whether p trusts no peer: no prefix, nor the peer on a
// Unix socket.
func (p *Proxies) Empty() bool { return len(p.trusted) == 0 && !p.unix }

// Trusts reports whether ip, unmapped and without a zone, is the address
// of one of the proxies. A caller whose header values cost something to
// get asks it first: Client reads them only from a trusted peer.
func (p *Proxies) Trusts(ip netip.Addr) bool {
	for _, t := range p.trusted {
		if t.Contains(ip) {
			return true
		}
	}
	return false
}

// Client returns the client of a request or call from peer (unmapped and
// without a zone) that carries values, the lines of the proxies' header
// in order: the peer itself unless it is trusted; behind trusted proxies,
// the address the walk finds (see the package doc) in a list, or the one
// address of a single-address header when there is exactly one line and
// it is an address.
func (p *Proxies) Client(peer netip.Addr, values []string) netip.Addr {
	if !p.Trusts(peer) {
		return peer
	}
	return p.walk(peer, values)
}

// UnixKey returns the key of a request or call that came over a Unix
// socket carrying values, the lines of the proxies' header in order, when
// p trusts the peer on the socket (TrustsUnix): the client the walk from
// that peer finds, as Client finds it from a trusted address, keyed as
// Format keys it with v6bits; or UnixPeer, where Client would answer the
// peer (no header, a hop that is not an address right of every address),
// for the peer has no address. It is UnixPeer too when p does not trust
// the peer, which callers refuse before.
func (p *Proxies) UnixKey(values []string, v6bits int) string {
	if !p.unix {
		return UnixPeer
	}
	if ip := p.walk(netip.Addr{}, values); ip.IsValid() {
		return Format(ip, v6bits)
	}
	return UnixPeer
}

// walk returns the client of a request or call from a trusted peer: the
// peer's address, or the zero Addr for a peer on a Unix socket, where the
// walk ends at the peer.
func (p *Proxies) walk(peer netip.Addr, values []string) netip.Addr {
	switch p.kind {
	case SingleIP:
		if len(values) != 1 {
			return peer // missing, or not overwritten by the proxy
		}
		if ip, ok := ParseAddr(values[0]); ok {
			return ip
		}
		return peer
	case XForwardedFor:
		return p.walkXFF(peer, values)
	case Forwarded:
		w := walker{p: p, peer: peer, client: peer}
		for _, line := range values {
			ForwardedHops(line, w.add)
		}
		return w.client
	}
	return peer
}

// walkXFF walks X-Forwarded-For lines, one list in their order, from the
// right.
func (p *Proxies) walkXFF(peer netip.Addr, lines []string) netip.Addr {
	client := peer
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for end := len(line); end >= 0; {
			start := strings.LastIndexByte(line[:end], ',') + 1
			ip, ok := ParseAddr(line[start:end])
			if !ok {
				return client
			}
			client = ip
			if !p.Trusts(ip) {
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
	p    *Proxies
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
func (w *walker) add(h Hop) {
	w.n++
	switch {
	case !h.OK:
		w.client, w.afterBad = w.peer, true // the walk stops right of it
	case !w.p.Trusts(h.IP):
		w.client, w.afterBad = h.IP, false
	case w.afterBad:
		w.client, w.afterBad = h.IP, false // the first hop right of it
	case w.n == 1:
		w.client = h.IP // every hop trusted so far: the leftmost
	}
}

// Format returns the key of a client at ip: the address, or for an IPv6
// address its network of v6bits (1 to 128; 128 keeps the address).
// (IPv4-mapped addresses are unmapped before, by ParseAddr and the
// callers.) An IPv6 address that stands for an IPv4 client is keyed as
// that client, not by its network, which holds many of them or which one
// of them has many of:
//
//   - an address of the NAT64 well-known prefix 64:ff9b::/96 (RFC 6052)
//     as the IPv4 address in its last 32 bits: by its /64, every IPv4
//     client behind the translator would share one key;
//   - an address of the local-use NAT64 prefix 64:ff9b:1::/48 (RFC 8215)
//     as itself: a network's prefix in it, /48 to /96, puts the IPv4
//     address where its length says, which cannot be known here, but
//     its translator gives each IPv4 client one address. By its /64, all
//     IPv4 clients of a /96 prefix would share a key, and all those of
//     an IPv4 /16 of a /48 one;
//   - a 6to4 address (2002::/16, RFC 3056) as the IPv4 address of its
//     site, in bits 16 to 47: the site takes any of its /48's 2^16 /64s;
//   - a Teredo address (2001::/32, RFC 4380) as the IPv4 address of the
//     client's NAT, its last 32 bits inverted: its /64 is its Teredo
//     server's, shared by every client of the server.
func Format(ip netip.Addr, v6bits int) string {
	if ip.Is6() {
		switch b := ip.As16(); {
		case nat64.Contains(ip):
			return netip.AddrFrom4([4]byte(b[12:])).String()
		case nat64Local.Contains(ip):
			return ip.String()
		case sixToFour.Contains(ip):
			return netip.AddrFrom4([4]byte(b[2:6])).String()
		case teredo.Contains(ip):
			return netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}).String()
		}
		if v6bits < 128 {
			if p, err := ip.Prefix(v6bits); err == nil { // fails only for v6bits out of range
				return p.String()
			}
		}
	}
	return ip.String()
}
