// Package clientiptest holds the cases that the tests of httplimit's and
// ratelimitgrpc's ClientIP and TrustProxies run alike: requests and their
// keys, lists of trusted prefixes that trust every address of a family
// together, none of them alone, and lists that leave one address
// untrusted. A case added here reaches the tests of both packages.
package clientiptest

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Proxies is a configuration of ClientIP that a Case runs with: the header
// the trusted proxies write ("X-Forwarded-For", "Forwarded", the name of a
// single-address header, or "" for ClientIP with no TrustProxies), the
// trusted prefixes, the IPv6 prefix length (0 for the default), and
// whether TrustUnixSocket trusts the peer on a Unix socket.
type Proxies struct {
	Header  string
	Trusted []netip.Prefix
	V6Bits  int
	Unix    bool
}

// LBs are the trusted proxies of the cases: 10.0.0.0/8 and fd00::/8.
var LBs = Prefixes("10.0.0.0/8", "fd00::/8")

// The configurations of the cases.
var (
	Bare   = Proxies{}
	XFF    = Proxies{Header: "X-Forwarded-For", Trusted: LBs}
	Fwd    = Proxies{Header: "Forwarded", Trusted: LBs}
	Real   = Proxies{Header: "X-Real-IP", Trusted: LBs}
	Wide   = Proxies{Header: "X-Forwarded-For", Trusted: LBs, V6Bits: 56}
	Exact  = Proxies{Header: "X-Forwarded-For", Trusted: LBs, V6Bits: 128}
	Mapped = Proxies{Header: "X-Forwarded-For", Trusted: Prefixes("::ffff:10.0.0.0/104")}
	// A proxy on a Unix socket (nginx's proxy_pass http://unix:/run/app.sock)
	// in front of the service: alone (UnixXFF, UnixFwd, UnixReal), or behind
	// the load balancers (UnixLBs).
	UnixXFF  = Proxies{Header: "X-Forwarded-For", Unix: true}
	UnixFwd  = Proxies{Header: "Forwarded", Unix: true}
	UnixReal = Proxies{Header: "X-Real-IP", Unix: true}
	UnixLBs  = Proxies{Header: "X-Forwarded-For", Trusted: LBs, Unix: true}
)

// Case is a request or call from Remote carrying the header lines Headers
// (name, value, name, value...), in order, whose key under Proxies is Want.
// Remote is an address and port (host:port), or, for a request or call
// that came over a Unix socket, "unix:" followed by the peer's name as the
// listener gives it: net/http's RemoteAddr, the Name of gRPC's peer
// address (UnixPeer).
type Case struct {
	Name    string
	Proxies Proxies
	Remote  string
	Headers []string
	Want    string
}

// Nginx is the Remote of a request or call from nginx, or any client whose
// socket has no name, over a Unix socket: on Linux, Go names the peer "@"
// (net/http's RemoteAddr is "@"); elsewhere "".
const Nginx = "unix:@"

// UnixPeer returns the name of the peer on a Unix socket of a Case's
// Remote, and whether the request or call came over one.
func UnixPeer(remote string) (name string, ok bool) { return strings.CutPrefix(remote, "unix:") }

// Cases are the requests whose keys the tests of both packages check.
var Cases = []Case{
	{"no proxy", XFF, "203.0.113.7:4000", nil, "203.0.113.7"},
	{"no options read no header", Bare, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1", "Forwarded", "for=198.51.100.2", "X-Real-IP", "198.51.100.3"}, "10.0.0.2"},
	{"spoofed header from an untrusted peer", XFF, "203.0.113.7:4000", []string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.7"},
	{"behind a trusted proxy", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
	{"spoofed leftmost values", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "1.1.1.1, 2.2.2.2, 198.51.100.1"}, "198.51.100.1"},
	{"spoofed trusted-looking value", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "10.9.9.9, 198.51.100.1"}, "198.51.100.1"},
	{"two trusted hops", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "1.1.1.1, 198.51.100.1, 10.0.0.9, 10.0.0.8"}, "198.51.100.1"},
	{"several header lines are one list", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "1.1.1.1, 198.51.100.1", "X-Forwarded-For", "10.0.0.9"}, "198.51.100.1"},
	{"several header lines, in order", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1", "X-Forwarded-For", "198.51.100.2, 10.0.0.9"}, "198.51.100.2"},
	{"a port on a hop", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1:5555"}, "198.51.100.1"},
	{"an IPv6 hop", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "[2001:db8:a:b::1]:5555"}, "2001:db8:a:b::/64"},
	{"garbage stops at the last trusted address", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1, \x00not an ip, 10.0.0.9"}, "10.0.0.9"},
	{"an empty hop stops the walk", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1,"}, "10.0.0.2"},
	{"all hops trusted: the leftmost", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "10.9.9.9, 10.0.0.3"}, "10.9.9.9"},
	{"no header behind a proxy: the proxy", XFF, "10.0.0.2:80", nil, "10.0.0.2"},
	{"X-Forwarded-For is not read for Forwarded", Fwd, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1"}, "10.0.0.2"},
	{"Forwarded is not read for X-Forwarded-For", XFF, "10.0.0.2:80", []string{"Forwarded", "for=198.51.100.1"}, "10.0.0.2"},
	{"Forwarded with quoted IPv6 and port", Fwd, "10.0.0.2:80", []string{"Forwarded", `for="[2001:db8:cafe::17]:4711";proto=https`}, "2001:db8:cafe::/64"},
	{"Forwarded chain", Fwd, "10.0.0.2:80", []string{"Forwarded", `for=192.0.2.60;proto=http, For=10.1.2.3`}, "192.0.2.60"},
	{"Forwarded spoofed leftmost", Fwd, "10.0.0.2:80", []string{"Forwarded", `for=1.1.1.1, for=192.0.2.60`}, "192.0.2.60"},
	{"Forwarded lines are one list", Fwd, "10.0.0.2:80", []string{"Forwarded", `for=1.1.1.1`, "Forwarded", `for=192.0.2.60;proto=https`}, "192.0.2.60"},
	{"Forwarded obfuscated hop", Fwd, "10.0.0.2:80", []string{"Forwarded", "for=192.0.2.60, for=_hidden"}, "10.0.0.2"},
	{"Forwarded unclosed quote swallows the rest", Fwd, "10.0.0.2:80", []string{"Forwarded", `for="1.1.1.1, for=192.0.2.60`}, "10.0.0.2"},
	{"single header", Real, "10.0.0.2:80", []string{"X-Real-Ip", "198.51.100.1", "X-Forwarded-For", "1.1.1.1"}, "198.51.100.1"},
	{"single header from an untrusted peer", Real, "203.0.113.7:1", []string{"X-Real-Ip", "198.51.100.1"}, "203.0.113.7"},
	{"single header missing", Real, "10.0.0.2:80", nil, "10.0.0.2"},
	{"single header not overwritten (two lines)", Real, "10.0.0.2:80", []string{"X-Real-Ip", "1.1.1.1", "X-Real-Ip", "198.51.100.1"}, "10.0.0.2"},
	{"single header holding a list", Real, "10.0.0.2:80", []string{"X-Real-Ip", "1.1.1.1, 198.51.100.1"}, "10.0.0.2"},
	{"IPv6 peer", Bare, "[2001:db8::5]:443", nil, "2001:db8::/64"},
	{"IPv4-mapped IPv6 peer", Bare, "[::ffff:192.0.2.9]:443", nil, "192.0.2.9"},
	{"a NAT64 peer: the IPv4 client it stands for", Bare, "[64:ff9b::c000:209]:443", nil, "192.0.2.9"},
	{"a NAT64 hop: the IPv4 client it stands for", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "64:ff9b::198.51.100.1"}, "198.51.100.1"},
	{"a NAT64 hop, keyed by address: the IPv4 client", Exact, "10.0.0.2:80", []string{"X-Forwarded-For", "64:ff9b::198.51.100.1"}, "198.51.100.1"},
	{"next to NAT64's prefix, an IPv6 network", Bare, "[64:ff9b:0:1::c000:209]:443", nil, "64:ff9b:0:1::/64"},
	// A local-use NAT64 prefix (64:ff9b:1::/48) puts the IPv4 address
	// where its length says: each translated address is one IPv4 client.
	{"a local-use NAT64 peer of a /96: its address", Bare, "[64:ff9b:1::c000:209]:443", nil, "64:ff9b:1::c000:209"},
	{"another local-use NAT64 peer of a /96: its own address", Bare, "[64:ff9b:1::c000:20a]:443", nil, "64:ff9b:1::c000:20a"},
	{"a local-use NAT64 peer of a /48: its address", Bare, "[64:ff9b:1:c000:2:900::]:443", nil, "64:ff9b:1:c000:2:900::"},
	{"a local-use NAT64 hop, IPv6 keyed by /56: its address", Wide, "10.0.0.2:80", []string{"X-Forwarded-For", "64:ff9b:1::198.51.100.1"}, "64:ff9b:1::c633:6401"},
	// A 6to4 site (2002::/16) is the IPv4 address in its /48's prefix:
	// it takes any of the /48's 65536 /64s.
	{"a 6to4 peer: the IPv4 address of its site", Bare, "[2002:c000:209:1::1]:443", nil, "192.0.2.9"},
	{"another /64 of the 6to4 site: the same IPv4 address", Bare, "[2002:c000:209:ffff::1]:443", nil, "192.0.2.9"},
	{"a 6to4 hop, keyed by address: the IPv4 address", Exact, "10.0.0.2:80", []string{"X-Forwarded-For", "2002:c633:6401::7"}, "198.51.100.1"},
	// A Teredo client (2001::/32) is its NAT's IPv4 address, the last 32
	// bits inverted; its /64 is its Teredo server's, every client of the
	// server in it.
	{"a Teredo peer: the IPv4 address of its NAT", Bare, "[2001:0:4136:e378:8000:63bf:3fff:fdd2]:443", nil, "192.0.2.45"},
	{"another client of the Teredo server: its own NAT's address", Bare, "[2001:0:4136:e378:8000:63bf:3fff:fdd1]:443", nil, "192.0.2.46"},
	{"next to Teredo's prefix, an IPv6 network", Bare, "[2001:1:4136:e378:8000:63bf:3fff:fdd2]:443", nil, "2001:1:4136:e378::/64"},
	{"IPv6 peer with a zone", Bare, "[fe80::1%eth0]:443", nil, "fe80::/64"},
	{"a trusted prefix written IPv4-mapped", Mapped, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
	{"a trusted IPv6 peer", XFF, "[fd00::2]:80", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
	{"a trusted IPv4-mapped peer", XFF, "[::ffff:10.0.0.2]:80", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
	{"an IPv4-mapped hop", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", "::ffff:198.51.100.1"}, "198.51.100.1"},
	{"an IPv6 hop by its /56", Wide, "10.0.0.2:80", []string{"X-Forwarded-For", "2001:db8:1:2::1"}, "2001:db8:1::/56"},
	{"an IPv6 hop by its address", Exact, "10.0.0.2:80", []string{"X-Forwarded-For", "2001:db8:1:2::1"}, "2001:db8:1:2::1"},
	{"a trusted IPv6 hop, then the client", XFF, "[fd00::2]:80", []string{"X-Forwarded-For", "198.51.100.1, fd00::9"}, "198.51.100.1"},
	{"an empty value", XFF, "10.0.0.2:80", []string{"X-Forwarded-For", ""}, "10.0.0.2"},
	{"Forwarded, an empty value, then the client", Fwd, "10.0.0.2:80", []string{"Forwarded", "", "Forwarded", "for=192.0.2.60"}, "192.0.2.60"},
	{"single header with a port", Real, "10.0.0.2:80", []string{"X-Real-Ip", "198.51.100.1:4000"}, "198.51.100.1"},
	{"single header, not an address", Real, "10.0.0.2:80", []string{"X-Real-Ip", "unknown"}, "10.0.0.2"},

	// A proxy on a Unix socket, trusted by TrustUnixSocket: its peer has no
	// address, and starts the walk as a trusted address does.
	{"Unix socket: behind the proxy on it", UnixXFF, Nginx, []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
	{"Unix socket: a peer whose socket has no name, elsewhere than Linux", UnixXFF, "unix:", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
	{"Unix socket: a peer whose socket has a name", UnixXFF, "unix:/run/nginx/client.sock", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
	{"Unix socket: spoofed leftmost values", UnixXFF, Nginx, []string{"X-Forwarded-For", "1.1.1.1, 10.0.0.9, 198.51.100.1"}, "198.51.100.1"},
	{"Unix socket: a hop of no trusted prefix is the client", UnixXFF, Nginx, []string{"X-Forwarded-For", "198.51.100.1, 10.0.0.9"}, "10.0.0.9"},
	{"Unix socket: behind trusted load balancers", UnixLBs, Nginx, []string{"X-Forwarded-For", "1.1.1.1, 198.51.100.1, 10.0.0.9", "X-Forwarded-For", "fd00::7"}, "198.51.100.1"},
	{"Unix socket: every hop trusted, the leftmost", UnixLBs, Nginx, []string{"X-Forwarded-For", "10.9.9.9, 10.0.0.3"}, "10.9.9.9"},
	{"Unix socket: garbage stops at the last trusted address", UnixLBs, Nginx, []string{"X-Forwarded-For", "198.51.100.1, x, 10.0.0.9"}, "10.0.0.9"},
	{"Unix socket: an IPv6 client by its /64", UnixXFF, Nginx, []string{"X-Forwarded-For", "[2001:db8:a:b::1]:5555"}, "2001:db8:a:b::/64"},
	{"Unix socket: no header, the peer", UnixXFF, Nginx, nil, "unix:"},
	{"Unix socket: garbage right of every address, the peer", UnixXFF, Nginx, []string{"X-Forwarded-For", "198.51.100.1, unknown"}, "unix:"},
	{"Unix socket: an empty value, the peer", UnixXFF, Nginx, []string{"X-Forwarded-For", ""}, "unix:"},
	{"Unix socket: Forwarded", UnixFwd, Nginx, []string{"Forwarded", "for=1.1.1.1, for=192.0.2.60;proto=https", "X-Forwarded-For", "198.51.100.1"}, "192.0.2.60"},
	{"Unix socket: Forwarded obfuscated hop, the peer", UnixFwd, Nginx, []string{"Forwarded", "for=192.0.2.60, for=_hidden"}, "unix:"},
	{"Unix socket: Forwarded after a bad hop", UnixFwd, Nginx, []string{"Forwarded", "for=_hidden, for=192.0.2.60"}, "192.0.2.60"},
	{"Unix socket: single header", UnixReal, Nginx, []string{"X-Real-Ip", "198.51.100.1", "X-Forwarded-For", "1.1.1.1"}, "198.51.100.1"},
	{"Unix socket: single header missing, the peer", UnixReal, Nginx, nil, "unix:"},
	{"Unix socket: single header not overwritten (two lines), the peer", UnixReal, Nginx, []string{"X-Real-Ip", "1.1.1.1", "X-Real-Ip", "198.51.100.1"}, "unix:"},
	// TrustUnixSocket trusts no address.
	{"TrustUnixSocket: a peer with an address is not trusted", UnixXFF, "203.0.113.7:4000", []string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.7"},
	{"TrustUnixSocket: a trusted load balancer still is", UnixLBs, "10.0.0.2:80", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
}

// NoKey are the requests and calls that have no key (ErrNoKey): a peer
// with no address that is not a trusted one on a Unix socket. Want is
// unused.
var NoKey = []Case{
	{"Unix socket, no options", Bare, Nginx, []string{"X-Forwarded-For", "198.51.100.1"}, ""},
	{"Unix socket, proxies trusted by address only", XFF, Nginx, []string{"X-Forwarded-For", "198.51.100.1"}, ""},
	{"Unix socket with a name, proxies trusted by address only", Fwd, "unix:/run/nginx/client.sock", []string{"Forwarded", "for=198.51.100.1"}, ""},
	{"not an address", UnixXFF, "not-an-address", []string{"X-Forwarded-For", "198.51.100.1"}, ""},
	{"no address", UnixXFF, "", []string{"X-Forwarded-For", "198.51.100.1"}, ""},
}

// LongLists returns requests whose header holds a forwarding list of 64
// KiB, mostly of hops that are not addresses or are trusted: the key of
// each must cost no memory per hop.
func LongLists() []Case {
	const size = 64 << 10
	long := func(unit, tail string) string {
		return strings.Repeat(unit, size/len(unit)) + tail
	}
	lists := []struct {
		proxies      Proxies
		header, want string
		value        string
	}{
		{XFF, "X-Forwarded-For", "198.51.100.1", long(",", "198.51.100.1")},
		{XFF, "X-Forwarded-For", "198.51.100.1", long("x,", "198.51.100.1, 10.0.0.9")},
		{XFF, "X-Forwarded-For", "10.0.0.7", long("10.0.0.7,", "10.0.0.9")},
		{Fwd, "Forwarded", "198.51.100.1", long(",", "for=198.51.100.1")},
		{Fwd, "Forwarded", "198.51.100.1", long("for=x,", "for=198.51.100.1")},
		{Fwd, "Forwarded", "198.51.100.1", long(`for="x",`, "for=198.51.100.1")},
		{Fwd, "Forwarded", "198.51.100.1", long(`for="\x",`, "for=198.51.100.1")},
		{Fwd, "Forwarded", "198.51.100.1", long("for=1,", "for=198.51.100.1, for=10.0.0.9")},
		{Fwd, "Forwarded", "10.0.0.7", long("for=10.0.0.7,", "for=10.0.0.9")},
	}
	var cases []Case
	for _, l := range lists {
		cases = append(cases, Case{fmt.Sprintf("%s %.12s", l.header, l.value), l.proxies, "10.0.0.2:80", []string{l.header, l.value}, l.want})
	}
	return cases
}

// Refused is a list of trusted prefixes that together trust every
// address of a family, which lets any client choose its key as 0.0.0.0/0
// does: TrustProxies refuses it, with an error that holds Want.
type Refused struct {
	Name    string
	Trusted []netip.Prefix
	Want    string
}

// Taken is a list of trusted prefixes that leaves one address,
// Untrusted, untrusted: TrustProxies takes it, and a client at Untrusted
// is its own key (keyed by address, IPv6Prefix(128)), whatever it sends:
// Key, or Untrusted if Key is empty.
type Taken struct {
	Name      string
	Trusted   []netip.Prefix
	Untrusted string
	Key       string
}

// CoveringEvery are the lists TrustProxies refuses.
var CoveringEvery = []Refused{
	{"IPv4 halves", Prefixes("0.0.0.0/1", "128.0.0.0/1"), "every IPv4 address"},
	{"IPv6 halves", Prefixes("::/1", "8000::/1"), "every IPv6 address"},
	{"IPv4 halves, one IPv4-mapped", Prefixes("::ffff:0.0.0.0/97", "128.0.0.0/1"), "every IPv4 address"},
	{"IPv4 quarters, overlapping, unordered, among IPv6 proxies", Prefixes("fd00::/8", "192.0.0.0/2", "10.0.0.0/8", "64.0.0.0/2", "0.0.0.0/2", "128.0.0.0/3", "160.0.0.0/3", "128.0.0.0/2"), "every IPv4 address"},
	{"IPv4 from the complement of a /32", append(Others(netip.MustParsePrefix("203.0.113.7/32")), netip.MustParsePrefix("203.0.113.7/32")), "every IPv4 address"},
	{"IPv4-mapped complement of a /8 with the /8", append(V4Mapped(Others(netip.MustParsePrefix("10.0.0.0/8"))), netip.MustParsePrefix("10.0.0.0/8")), "every IPv4 address"},
	{"IPv6 from the complement of a /128", append(Others(netip.MustParsePrefix("2001:db8::1/128")), netip.MustParsePrefix("2001:db8::1/128")), "every IPv6 address"},
	// Addresses are compared unmapped: no client is ever at an
	// IPv4-mapped IPv6 address, so the rest of IPv6 is all of it.
	{"IPv6 but for the IPv4-mapped range", Others(netip.MustParsePrefix("::ffff:0:0/96")), "every IPv6 address"},
	// Each /104 of a translated /96 is an IPv4 /8, taken as 10.0.0.0/8
	// is; together they are the /96 (every IPv4 client of the translator),
	// refused alone.
	{"NAT64 well-known prefix from its /104s", Split(netip.MustParsePrefix("64:ff9b::/96"), 104), "64:ff9b::/96, every IPv4 client that NAT64"},
	{"NAT64 well-known prefix from its /104s, one split down to its /128s, unordered",
		slices.Concat(Split(netip.MustParsePrefix("64:ff9b::8000:0/97"), 104), Within(Others(netip.MustParsePrefix("64:ff9b::a00:1/128")), 104),
			Prefixes("64:ff9b::a00:1/128"), Without(Split(netip.MustParsePrefix("64:ff9b::/97"), 104), netip.MustParsePrefix("64:ff9b::a00:0/104"))),
		"64:ff9b::/96, every IPv4 client that NAT64"},
	{"a local-use NAT64 /96 from its /104s, among IPv4 proxies", append(Split(netip.MustParsePrefix("64:ff9b:1:2::/96"), 104), LBs...), "64:ff9b:1:2::/96, every IPv4 client that NAT64"},
	{"a Teredo /96 from its /104s", Split(netip.MustParsePrefix("2001:0:4136:e378:8000:63bf::/96"), 104), "every IPv4 client that Teredo"},
	// An address of NAT64's well-known prefix, 6to4 or Teredo is keyed
	// as the IPv4 client it stands for: prefixes that trust, together
	// with IPv4 ones, a way in for every IPv4 client, trust every IPv4
	// key. A Teredo client picks its server (and, not behind a NAT, its
	// port), and a 6to4 site holds its IPv4 address's /48.
	{"Teredo /104s of every IPv4 /8 of NAT addresses, each of another server's port", TeredoSpread(-1), "together trust every IPv4 client"},
	{"6to4 from its /28s", Split(netip.MustParsePrefix("2002::/16"), 28), "together trust every IPv4 client"},
	{"IPv4 /8s and the NAT64 /104s of the other half", slices.Concat(Split(netip.MustParsePrefix("0.0.0.0/1"), 8), Split(netip.MustParsePrefix("64:ff9b::8000:0/97"), 104)),
		"together trust every IPv4 client"},
	{"IPv4 /8s, 6to4 /28s and Teredo /104s, in thirds", slices.Concat(Split(netip.MustParsePrefix("0.0.0.0/2"), 8), Split(netip.MustParsePrefix("2002:4000::/18"), 28),
		TeredoSpread(-1)[128:]), "together trust every IPv4 client"},
}

// TeredoSpread returns a Teredo /104 for each IPv4 /8 of NAT addresses
// but the /8 skip (-1 for none), each in the /96 of another port of one
// server: none of them holds a whole /96.
func TeredoSpread(skip int) []netip.Prefix {
	var out []netip.Prefix
	for i := range 256 {
		if i == skip {
			continue
		}
		a := netip.MustParseAddr("2001:0:4136:e378:8000::").As16()
		a[10], a[12] = byte(i), ^byte(i) // the port, and the NAT's address, inverted
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(a), 104))
	}
	return out
}

// TooWide are lists of trusted prefixes one of which is wider than any
// network of proxies (an IPv4 prefix shorter than /8; an IPv6 one shorter
// than /28, outside the unique local and link-local ranges; one that
// trusts the IPv4 clients of NAT64 (64:ff9b::/96, 64:ff9b:1::/48) or
// Teredo (2001::/32) as an IPv4 prefix shorter than /8 would): it trusts
// a large part of the internet, whose clients then choose their keys.
// TrustProxies refuses it, with an error that holds Want.
var TooWide = []Refused{
	{"IPv4 half", Prefixes("0.0.0.0/1"), "wider than"},
	{"IPv4 upper half", Prefixes("10.0.0.0/8", "128.0.0.0/1"), "128.0.0.0/1"},
	{"IPv4 /7", Prefixes("10.0.0.0/7"), "wider than"},
	{"IPv4 half, IPv4-mapped", Prefixes("::ffff:0.0.0.0/97"), "0.0.0.0/1"},
	{"IPv6 half", Prefixes("::/1"), "wider than"},
	{"IPv6 global unicast", Prefixes("fd00::/8", "2000::/3"), "2000::/3"},
	{"IPv6 /15", Prefixes("2001::/15"), "wider than"},
	{"IPv6 /16", Prefixes("2a00::/16"), "2a00::/16 trusts 2^112 addresses"},
	{"IPv6 /27", Prefixes("fd00::/8", "2a00:1450::/27"), "wider than"},
	{"IPv6 /8 over the IPv4-mapped and NAT64 ranges", Prefixes("::/8"), "wider than"},
	{"NAT64 well-known prefix", Prefixes("64:ff9b::/96"), "NAT64"},
	{"a network holding the NAT64 well-known prefix", Prefixes("64:ff9b::/32"), "NAT64"},
	{"NAT64 /7 of IPv4", Prefixes("64:ff9b::a00:0/103"), "NAT64"},
	{"local-use NAT64 prefix", Prefixes("64:ff9b:1::/48"), "NAT64"},
	{"a local-use NAT64 /96", Prefixes("64:ff9b:1::/96"), "NAT64"},
	{"a /103 of a local-use NAT64 /96", Prefixes("64:ff9b:1::a00:0/103"), "NAT64"},
	{"Teredo", Prefixes("2001::/32"), "Teredo"},
	{"a Teredo server's clients", Prefixes("2001:0:4136:e378::/64"), "Teredo"},
	{"a /28 holding Teredo", Prefixes("2001::/28"), "Teredo"},
}

// LeavingOne are the lists TrustProxies takes: the widest it takes, a
// list that leaves one address of a wide network untrusted among them.
var LeavingOne = []Taken{
	{"10.0.0.0/8 but one address", Within(Others(netip.MustParsePrefix("10.1.2.3/32")), 8), "10.1.2.3", ""},
	{"10.0.0.0/8 but its last address", Within(Others(netip.MustParsePrefix("10.255.255.255/32")), 8), "10.255.255.255", ""},
	{"10.0.0.0/8 but its first address, IPv4-mapped", V4Mapped(Within(Others(netip.MustParsePrefix("10.0.0.0/32")), 8)), "10.0.0.0", ""},
	{"a /8 beside 10.0.0.0/8", Prefixes("10.0.0.0/8", "12.0.0.0/8"), "11.0.0.1", ""},
	{"fc00::/7 but one address", Within(Others(netip.MustParsePrefix("fd00::1/128")), 7), "fd00::1", ""},
	{"a /28 but its last address", Within(Others(netip.MustParsePrefix("2a06:98cf:ffff:ffff:ffff:ffff:ffff:ffff/128")), 28), "2a06:98cf:ffff:ffff:ffff:ffff:ffff:ffff", ""},
	{"a CDN's /29", Prefixes("2a06:98c0::/29", "10.0.0.0/8"), "2a06:98c8::1", ""},
	{"a /104 of a local-use NAT64 /96", Prefixes("64:ff9b:1::a00:0/104"), "64:ff9b:1::b00:1", ""},
	{"a local-use NAT64 /96 but one address", append(Without(Split(netip.MustParsePrefix("64:ff9b:1::/96"), 104), netip.MustParsePrefix("64:ff9b:1::b00:0/104")),
		Within(Others(netip.MustParsePrefix("64:ff9b:1::b00:1/128")), 104)...), "64:ff9b:1::b00:1", ""},
	{"NAT64 well-known prefix but one /104", Without(Split(netip.MustParsePrefix("64:ff9b::/96"), 104), netip.MustParsePrefix("64:ff9b::b00:0/104")),
		"64:ff9b::b00:1", "11.0.0.1"},
	{"two neighbouring local-use NAT64 /96s but their edges", slices.Concat(
		Without(Split(netip.MustParsePrefix("64:ff9b:1::/96"), 104), netip.MustParsePrefix("64:ff9b:1::/104")),
		Without(Split(netip.MustParsePrefix("64:ff9b:1::1:0:0/96"), 104), netip.MustParsePrefix("64:ff9b:1::1:ff00:0/104"))), "64:ff9b:1::1", ""},
	// The IPv4 client 203.255.255.254 keyed by its Teredo address.
	{"Teredo /104s of every IPv4 /8 of NAT addresses but one", TeredoSpread(203), "2001:0:4136:e378:8000:cb00:3400:1", "203.255.255.254"},
	{"6to4 but one /28", Without(Split(netip.MustParsePrefix("2002::/16"), 28), netip.MustParsePrefix("2002:cb00::/28")), "2002:cb00:7107::1", "203.0.113.7"},
	{"IPv4 /8s and the NAT64 /104s of the other half but one", slices.Concat(Split(netip.MustParsePrefix("0.0.0.0/1"), 8),
		Without(Split(netip.MustParsePrefix("64:ff9b::8000:0/97"), 104), netip.MustParsePrefix("64:ff9b::cb00:0/104"))), "64:ff9b::cb00:7107", "203.0.113.7"},
	{"link-local", Prefixes("fe80::/10", "10.0.0.0/8"), "fec0::1", ""},
	{"IPv6 over the IPv4-mapped range, which trusts no IPv4 address", Prefixes("::ffff:0:0/95", "10.0.0.0/8"), "128.0.0.1", ""},
}

// Within returns the prefixes of ps longer than bits: of Others(p), those
// that cover p's network of that length, but for p.
func Within(ps []netip.Prefix, bits int) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.Bits() > bits {
			out = append(out, p)
		}
	}
	return out
}

// Others returns the prefixes that, with p, cover p's whole address
// space without overlapping it: the sibling of each of its ancestors.
func Others(p netip.Prefix) []netip.Prefix {
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

// Split returns the prefixes of length bits that p holds, in order.
func Split(p netip.Prefix, bits int) []netip.Prefix {
	var out []netip.Prefix
	for a := p.Masked().Addr(); p.Contains(a); {
		q := netip.PrefixFrom(a, bits)
		out = append(out, q)
		b := q.Addr().AsSlice()
		for i := bits - 1; i >= 0; i-- { // the first address past q: its last, plus one
			b[i/8] ^= 0x80 >> (i % 8)
			if b[i/8]&(0x80>>(i%8)) != 0 {
				break
			}
		}
		next, _ := netip.AddrFromSlice(b)
		if !next.Less(a) && next != a {
			a = next
		} else {
			break // past the highest address
		}
	}
	return out
}

// Without returns ps but for the prefix drop.
func Without(ps []netip.Prefix, drop netip.Prefix) []netip.Prefix {
	return slices.DeleteFunc(slices.Clone(ps), func(p netip.Prefix) bool { return p == drop })
}

// V4Mapped returns the IPv4 prefixes ps written as IPv4-mapped IPv6.
func V4Mapped(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), p.Bits()+96))
	}
	return out
}

// Prefixes parses each of ss as a prefix, and panics if one is not.
func Prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}
