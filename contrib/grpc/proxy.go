package ratelimitgrpc

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/ratelimit-go/ratelimit/internal/clientip"
)

// This file names the metadata that proxies write a call's client into.
// Its reading is package clientip's, which httplimit.ClientIP shares, so
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
	kind clientip.Kind
}

var (
	// XForwardedFor is the x-forwarded-for list, to which each proxy
	// appends the address it received the call from (Envoy and Istio
	// gateways with use_remote_address, nginx's grpc_pass with
	// grpc_set_header X-Forwarded-For $proxy_add_x_forwarded_for, AWS
	// ALB, Google Cloud load balancers, Traefik). Several values (header
	// lines) are read as one list, in order.
	XForwardedFor = ProxyHeader{name: "x-forwarded-for", kind: clientip.XForwardedFor}
	// Forwarded is the forwarded list of RFC 7239, read by its for=
	// parameters. Choose it only if every trusted proxy appends to it
	// (HAProxy's "option forwarded", for one): most proxies, Envoy
	// among them, pass the client's own forwarded through untouched.
	Forwarded = ProxyHeader{name: "forwarded", kind: clientip.Forwarded}
)

// SingleIPHeader names metadata that holds one address, which the proxy
// sets and overwrites whatever the client sent: x-real-ip (nginx with
// grpc_set_header X-Real-IP $remote_addr), x-envoy-external-address
// (Envoy at the edge), cf-connecting-ip (Cloudflare). The name is not case
// sensitive. x-forwarded-for and forwarded are lists: use XForwardedFor
// or Forwarded for them. TrustProxies refuses a name gRPC keeps out of a
// call's metadata or sets itself (host, te, content-type, connection,
// grpc-*), and binary metadata (-bin): no proxy's address is read there.
func SingleIPHeader(name string) ProxyHeader {
	return ProxyHeader{name: strings.ToLower(strings.TrimSpace(name)), kind: clientip.SingleIP}
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
// sidecar (on loopback, when the service's peer is its sidecar). A proxy
// that connects through a Unix socket has no address: TrustUnixSocket
// trusts it, and then the prefixes may be none.
//
// A trusted address is believed about who the client is, so a prefix
// that holds clients lets each of them choose its key. Prefixes wider
// than any network of proxies are refused: an IPv4 prefix shorter than /8
// (0.0.0.0/1, ::ffff:0:0/97), an IPv6 one shorter than /28 outside the
// unique local fc00::/7 and link-local fe80::/10 ranges (2a00::/16), one
// that trusts the IPv4 clients of NAT64 translators or Teredo as such an
// IPv4 prefix would (64:ff9b::/96, 64:ff9b:1::/96, 2001::/32), prefixes
// that together hold a whole /96 of those ranges (the 256 /104s of
// 64:ff9b::/96), and prefixes that together trust every IPv4 or every
// IPv6 address, counting for IPv4 the NAT64, 6to4 (2002::/16) and Teredo
// addresses keyed as the IPv4 clients they stand for (IPv4 /8s of one
// half beside the NAT64 /104s of the other, the /28s of 2002::/16).
// A prefix written as IPv4-mapped IPv6 (::ffff:10.0.0.0/104) trusts the
// IPv4 addresses it stands for.
//
// PeerIP refuses TrustProxies: give it to ClientIP.
func TrustProxies(header ProxyHeader, trusted ...netip.Prefix) IPOption {
	return IPOption{func(c *clientip.Config) error { return c.TrustProxies(header.name, header.kind, trusted) }}
}

// checkMetadataKey returns the error of a SingleIPHeader name (lower case)
// that no call's metadata carries as a proxy wrote it, or nil.
func checkMetadataKey(name string) error {
	if !validMetadataKey(name) {
		return fmt.Errorf("ratelimitgrpc: TrustProxies: %q is not a metadata key: a key is made of letters, digits, '-', '_' and '.': %w", name, ErrInvalidOption)
	}
	if strings.HasSuffix(name, "-bin") {
		return fmt.Errorf("ratelimitgrpc: TrustProxies: %s is binary metadata, which holds no address as a proxy writes one: name the key without -bin: %w", name, ErrInvalidOption)
	}
	if name == "host" {
		return fmt.Errorf("ratelimitgrpc: TrustProxies: gRPC takes a call's host out of its metadata, and holds no address a proxy writes: "+
			"name the metadata the proxy writes the client's address into, such as x-real-ip: %w", ErrInvalidOption)
	}
	if reservedMetadata(name) {
		return fmt.Errorf("ratelimitgrpc: TrustProxies: %s is reserved by gRPC, and no proxy writes an address into it: %w", name, ErrInvalidOption)
	}
	return nil
}

// TrustUnixSocket makes ClientIP trust the peer of a call that came over a
// Unix socket as one of the proxies of TrustProxies: a proxy on the same
// machine that connects to the service through the socket (Envoy or
// nginx's grpc_pass to unix:/run/app.sock, a sidecar). Such a peer has no
// IP address, and without this option ClientIP finds no key for its
// calls, which are refused with ErrNoKey (InvalidArgument).
//
// TrustProxies must be given too: it says which metadata the proxy writes,
// and lists the prefixes of any proxies in front of it (none, when the
// proxy on the socket is the only one). The metadata is read as from a
// trusted address: the first untrusted address from the right is the
// client. Where the key would be the peer's (no metadata, an unreadable
// value right of every address), it is UnixPeerKey, one key for every
// such call.
//
// Trust is never implied by the peer having no address: anyone who can
// connect to the socket chooses the metadata, so give it only when the
// socket's permissions keep all but the proxy out. A call came over a Unix
// socket when its peer's address, or its local one, is a Unix socket's
// (peer.Peer's Addr or LocalAddr of network "unix"); its peer then has no
// IP address, even given as a string that reads as one (net/http's
// RemoteAddr, through grpc.Server's ServeHTTP). An in-memory
// listener's peer (bufconn) is no Unix socket, and keeps no key.
//
// PeerIP refuses TrustUnixSocket, as it does TrustProxies.
func TrustUnixSocket() IPOption {
	return IPOption{(*clientip.Config).TrustUnixSocket}
}

// UnixPeerKey is the key ClientIP with TrustUnixSocket gives a call from
// the trusted peer on a Unix socket that names no client: no metadata, or
// a value it cannot read right of every address. It is the name nginx
// gives such a peer ($remote_addr), and no IP address's key; httplimit's
// UnixPeerKey is the same.
const UnixPeerKey = clientip.UnixPeer

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
