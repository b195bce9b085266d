package ratelimitgrpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"runtime/debug"
	"strings"

	"github.com/ratelimit-go/ratelimit/internal/clientip"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// KeyFunc returns the key a call is limited by, from the call's context
// (its peer, its incoming metadata, values a previous interceptor put
// there). An error refuses the call: InvalidArgument for ErrNoKey,
// Canceled or DeadlineExceeded for the context's own error once the
// caller gave up, Internal otherwise.
//
// An empty key, with no error, is no key: the call is refused as for
// ErrNoKey (InvalidArgument). A KeyFunc that reads a key the call may
// lack (a metadata value, an identity an authentication interceptor put
// in the context) and returned "" for its absence put every call without
// it in one budget, which one client could spend for all of them. For
// one budget shared by every call, return a constant such as "all".
//
// A KeyFunc returns an error for what it cannot read, and should never
// panic on it. gRPC recovers no panic of a call's interceptors or handler,
// and one call whose metadata made the KeyFunc panic would end the
// server's process: the Interceptor recovers a panic of its KeyFunc (or
// of a method, Error, Unwrap or Is, of the error it returned: a nil
// pointer returned as an error, a typed nil), and answers the call
// Internal, logged at error level with the panic's value and stack (an
// error matching ErrKeyPanicked). The handler's own panics are not the
// Interceptor's: a server whose handlers may panic puts a recovery
// interceptor (go-grpc-middleware's recovery) ahead of it.
type KeyFunc func(ctx context.Context) (string, error)

// ErrNoKey is returned by a KeyFunc that finds no key for a call, such as
// a missing metadata value.
var ErrNoKey = errors.New("ratelimitgrpc: the call carries no key")

// ErrKeyPanicked is matched (errors.Is) by the error, logged, of a call
// whose KeyFunc panicked (see KeyFunc).
var ErrKeyPanicked = errors.New("ratelimitgrpc: the KeyFunc panicked, which is a bug in it: fix it to return an error")

// errEmptyKey is the error of a call whose KeyFunc returned an empty key
// and no error (see KeyFunc).
var errEmptyKey = fmt.Errorf("ratelimitgrpc: the KeyFunc returned an empty key, which would put every such call in one budget: "+
	"return ErrNoKey for a call that carries no key, or a constant such as \"all\" for one budget shared by every call: %w", ErrNoKey)

// keyOf returns the key of the call of ctx by the Interceptor's KeyFunc,
// with a panic of it, or of its error's methods (see readError), as an
// error matching ErrKeyPanicked, and an empty key as errEmptyKey.
func (i *Interceptor) keyOf(ctx context.Context) (key string, err error) {
	what := "" // the KeyFunc itself
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %s%v\n%s", ErrKeyPanicked, what, p, debug.Stack())
		}
	}()
	if key, err = i.key(ctx); err == nil && key == "" {
		err = errEmptyKey
	}
	what = "a method of the error it returned panicked (a nil pointer returned as an error?): "
	readError(err)
	return key, err
}

// readError reads err, if any, as fail does: its text, and its chain
// (Unwrap, Is) for every target fail matches, whatever the call's context.
// An error whose methods panic (a typed nil: a *T that is nil returned as
// an error) panics here, in the recovery of the call of the KeyFunc that
// returned it, rather than as the call's status is chosen or the call is
// logged, unrecovered: gRPC recovers no interceptor's panic, and one call
// ended the server's process.
func readError(err error) {
	if err != nil {
		_ = err.Error()
		for _, target := range failTargets {
			_ = errors.Is(err, target)
		}
	}
}

// ErrInvalidOption is matched (errors.Is) by the error of New, PeerIP or
// ClientIP when an option cannot work as given, and by that of every call
// through a UnaryClientInterceptor given a negative MaxWait, a nil clock
// or a nil ClientOption (whose gRPC status is codes.InvalidArgument), and by that of Limit of an
// Interceptor New did not build.
var ErrInvalidOption = errors.New("ratelimitgrpc: invalid option")

// DefaultIPv6Prefix is the prefix length an IPv6 peer is keyed by unless
// IPv6Prefix says otherwise: a /64 is the smallest network a site is
// usually given, so one client can take any of its 2^64 addresses.
const DefaultIPv6Prefix = clientip.DefaultIPv6Prefix

// IPOption configures PeerIP and ClientIP: IPv6Prefix, and for ClientIP
// TrustProxies.
type IPOption struct {
	apply clientip.Option
}

// IPv6Prefix keys an IPv6 peer by its network of the given prefix length
// (1 to 128) instead of DefaultIPv6Prefix; 128 keys every address apart.
// Given twice, even alike, it is refused, as TrustProxies is: which width
// was meant cannot be told, and each keys every IPv6 client differently.
func IPv6Prefix(bits int) IPOption {
	return IPOption{func(c *clientip.Config) error { return c.IPv6Prefix(bits) }}
}

// PeerIP returns a KeyFunc that keys a call by the IP address of its peer
// (peer.FromContext), without the port: an IPv4 address as it is (an
// IPv4-mapped IPv6 one, or one of the NAT64 prefix 64:ff9b::/96, 6to4 or
// Teredo, as the IPv4 address it holds, as ClientIP says), an IPv6
// address by its /64 network (IPv6Prefix changes the width). It is the
// default key of New.
//
// Behind a proxy every call's peer is the proxy: key by ClientIP with
// TrustProxies instead, which reads the client's address from the
// metadata the proxies write, and only as far as they vouch for it. The
// KeyFunc fails with ErrNoKey when the peer has no IP address (a Unix
// socket, whatever the name its client gave its end, such as
// "10.0.0.5:80", served directly or by net/http through grpc.Server's
// ServeHTTP; an in-memory listener).
func PeerIP(opts ...IPOption) (KeyFunc, error) {
	c, err := newClientIP("PeerIP", opts)
	if err != nil {
		return nil, err
	}
	if c.ReadsHeader() {
		return nil, fmt.Errorf("ratelimitgrpc: PeerIP reads no metadata, and was given TrustProxies: give it to ClientIP: %w", ErrInvalidOption)
	}
	if c.UnixGiven() {
		return nil, fmt.Errorf("ratelimitgrpc: PeerIP reads no metadata, and was given TrustUnixSocket: give it, with TrustProxies, to ClientIP: %w", ErrInvalidOption)
	}
	return clientIPKey{c}.key, nil
}

// ClientIP returns a KeyFunc that keys a call by its client's IP address:
// an IPv4 address as it is, an IPv6 address by its /64 network
// (IPv6Prefix changes the width). An IPv4-mapped address, or one of the
// NAT64 prefix 64:ff9b::/96, 6to4 (2002::/16) or Teredo (2001::/32), is
// keyed as the IPv4 address it holds, and one of the local-use NAT64
// prefix 64:ff9b:1::/48 as itself: one IPv4 client, one key.
//
// With no options, the client is the call's peer, as PeerIP keys it, and
// no metadata is read: a client cannot choose its own key. Behind proxies
// (Envoy, an Istio gateway and its sidecar, a load balancer) every call's
// peer is a proxy: TrustProxies says which metadata they write and which
// addresses are theirs, and the client is read from that metadata only as
// far as the trusted proxies vouch for it. Keying by the metadata value
// itself (Metadata("x-forwarded-for")) would let a client choose a fresh
// key, and a fresh budget, with every call, since a proxy appends to the
// x-forwarded-for the client sent.
//
// ClientIP finds the same client, for the same peer and the same values,
// as the ClientIP of package httplimit does for an HTTP request's
// RemoteAddr and header lines, so that a service limited over both HTTP
// and gRPC behind the same proxies keys a client alike on both.
//
// The KeyFunc fails with ErrNoKey when the peer has no IP address (an
// in-memory listener, or a Unix socket, unless TrustUnixSocket trusts its
// peer).
func ClientIP(opts ...IPOption) (KeyFunc, error) {
	c, err := newClientIP("ClientIP", opts)
	if err != nil {
		return nil, err
	}
	if err := c.ClientIP(); err != nil {
		return nil, err
	}
	return clientIPKey{c}.key, nil
}

// ipOptions are the words of the errors of ratelimitgrpc's IPOptions, and
// the metadata keys it cannot read.
var ipOptions = &clientip.Package{Name: "ratelimitgrpc", Carrier: "metadata", Err: ErrInvalidOption, CheckName: checkMetadataKey}

func newClientIP(fn string, opts []IPOption) (*clientip.Config, error) {
	return clientip.Build(ipOptions, fn, opts, func(o IPOption) clientip.Option { return o.apply })
}

// clientIPKey is a PeerIP or ClientIP KeyFunc. The options and the
// reading of the metadata are package clientip's, which
// httplimit.ClientIP shares: a client is keyed alike over HTTP and gRPC.
type clientIPKey struct{ c *clientip.Config }

func (k clientIPKey) key(ctx context.Context) (string, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.Addr == nil {
		return "", fmt.Errorf("ratelimitgrpc: the call has no peer: %w", ErrNoKey)
	}
	ip := peerAddr(pr)
	if !ip.IsValid() {
		if !overUnixSocket(pr) {
			return "", fmt.Errorf("ratelimitgrpc: the peer %s (%s) has no IP address: %w", pr.Addr, pr.Addr.Network(), ErrNoKey)
		}
		if !k.c.TrustsUnix() {
			return "", fmt.Errorf("ratelimitgrpc: the call came over a Unix socket, whose peer (%q) has no IP address: "+
				"if a proxy connects through the socket, trust it with ClientIP's TrustUnixSocket and TrustProxies: %w", pr.Addr, ErrNoKey)
		}
		return k.c.UnixKey(func(name string) []string { return metadata.ValueFromIncomingContext(ctx, name) }), nil
	}
	// The metadata is read, which copies its values, only from a trusted peer.
	return k.c.Key(ip, func(name string) []string { return metadata.ValueFromIncomingContext(ctx, name) }), nil
}

// overUnixSocket reports whether the call of pr came over a Unix socket:
// whether its peer's address or its local one is a Unix socket's.
func overUnixSocket(pr *peer.Peer) bool {
	return isUnix(pr.Addr) || isUnix(pr.LocalAddr)
}

// isUnix reports whether a is a Unix socket's address. A nil *net.UnixAddr
// is one, without a name; its Network would dereference it.
func isUnix(a net.Addr) bool {
	switch a := a.(type) {
	case nil:
		return false
	case *net.UnixAddr:
		return a == nil || clientip.IsUnix(a.Net)
	}
	return clientip.IsUnix(a.Network())
}

// peerAddr returns the IP address of pr, unmapped and without a zone, or
// the zero Addr if it has none. A Unix socket's address has none, whatever
// its name: the client names its end of the socket (it may bind it to the
// path "10.0.0.5:80" before it connects), and would choose its key; so has
// none a peer given only as a string (not a *net.TCPAddr or *net.UDPAddr)
// on a call whose local address is a Unix socket's. Nor has a nil
// *net.TCPAddr, which a connection that has no peer address to
// give may return as its RemoteAddr.
func peerAddr(pr *peer.Peer) netip.Addr {
	var ip netip.Addr
	switch a := pr.Addr.(type) {
	case *net.TCPAddr:
		if a != nil {
			ip, _ = netip.AddrFromSlice(a.IP)
		}
	case *net.UDPAddr:
		if a != nil {
			ip, _ = netip.AddrFromSlice(a.IP)
		}
	case *net.UnixAddr:
	default:
		// An address given only as a string on a Unix socket, as
		// grpc.Server's ServeHTTP gives net/http's RemoteAddr (of network
		// "tcp"), is the name the client gave its end: no IP address.
		if clientip.IsUnix(a.Network()) || isUnix(pr.LocalAddr) {
			break
		}
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			ip = ap.Addr()
		}
	}
	return ip.Unmap().WithZone("")
}

// Metadata returns a KeyFunc that keys a call by a value of its incoming
// metadata, such as an API key ("x-api-key"); the name is not case
// sensitive, and spaces around it are ignored. A call without the value,
// with an empty one, or with several (which would be ambiguous) has no
// key: ErrNoKey.
//
// An empty name, or one that is not a metadata key (lower-case letters,
// digits, '-', '_' and '.', or ":authority", which gRPC puts in the
// metadata), is carried by no call, and would refuse every one; a name
// reserved by gRPC (starting with "grpc-"; te, content-type, connection)
// holds no key a client is known by: gRPC keeps it out of the metadata or
// sets it itself. Nor does any call carry host, which gRPC takes out of
// the metadata (into :authority, or drops it when :authority is there): to
// key by the host a client asked for, give Metadata(":authority"). New
// refuses a KeyFunc of Metadata given any of these, with an error matching
// ErrInvalidOption. (Wrapped in a KeyFunc of your own, which New cannot
// see into, it answers every call Internal, logged at error level: the
// fault is the configuration's.)
//
// The value is what the client sent, or what a proxy made of it: a proxy
// appends to the x-forwarded-for a client sent, so that keyed by it a
// client chooses its key. Key by the client's address with ClientIP and
// TrustProxies.
func Metadata(name string) KeyFunc {
	switch n := strings.ToLower(strings.TrimSpace(name)); {
	case n == "":
		return badKey{fmt.Errorf("ratelimitgrpc: Metadata was given an empty name, which no call carries: "+
			"name the metadata that holds the key, such as Metadata(\"x-api-key\"): %w", ErrInvalidOption)}.key
	case !validMetadataKey(n) && n != ":authority":
		return badKey{fmt.Errorf("ratelimitgrpc: Metadata(%q): %q is not a metadata key, which no call carries: "+
			"a key is made of letters, digits, '-', '_' and '.': "+
			"name the metadata that holds the key, such as Metadata(\"x-api-key\"): %w", name, n, ErrInvalidOption)}.key
	case n == "host":
		return badKey{fmt.Errorf("ratelimitgrpc: Metadata(%q): gRPC takes a call's host out of its metadata (into :authority, or drops it when :authority is there), "+
			"so that no call carries it: to key by the host a client asked for, give Metadata(\":authority\"): %w", name, ErrInvalidOption)}.key
	case reservedMetadata(n):
		return badKey{fmt.Errorf("ratelimitgrpc: Metadata(%q): %q is reserved by gRPC, which keeps it out of a call's metadata or sets it itself "+
			"(the same for every call, or as the client's library chooses), and holds no key: "+
			"name the metadata that holds the key, such as Metadata(\"x-api-key\"): %w", name, n, ErrInvalidOption)}.key
	default:
		name = n
	}
	return func(ctx context.Context) (string, error) {
		vs := metadata.ValueFromIncomingContext(ctx, name)
		switch {
		case len(vs) == 0 || (len(vs) == 1 && vs[0] == ""):
			return "", fmt.Errorf("ratelimitgrpc: metadata %s is missing: %w", name, ErrNoKey)
		case len(vs) > 1:
			return "", fmt.Errorf("ratelimitgrpc: metadata %s has %d values, not one: %w", name, len(vs), ErrNoKey)
		}
		return vs[0], nil
	}
}

// reservedMetadata reports whether name (lower case) is reserved by gRPC
// for its own use: a name starting with "grpc-", and the HTTP/2 fields of
// the protocol, which the transport keeps out of a call's metadata (te,
// connection) or sets alike for every call (content-type).
func reservedMetadata(name string) bool {
	switch name {
	case "te", "content-type", "connection":
		return true
	}
	return strings.HasPrefix(name, "grpc-")
}

// badKey is the KeyFunc of Metadata given a name no call can carry: a
// configuration error, which WithKey finds (keyError) and New returns. New
// cannot see into a KeyFunc of the caller's that calls it: then err
// answers every call Internal (fail), not InvalidArgument, for the fault
// is not the client's.
type badKey struct{ err error }

func (b badKey) key(context.Context) (string, error) { return "", b.err }

// badKeyCode identifies the method value badKey.key among KeyFuncs: every
// method value of one method runs the same code.
var badKeyCode = reflect.ValueOf(badKey{}.key).Pointer()

// keyError returns the configuration error of f if f is a badKey's, and
// nil for any other KeyFunc, which it does not call.
func keyError(f KeyFunc) error {
	if reflect.ValueOf(f).Pointer() != badKeyCode {
		return nil
	}
	_, err := f(context.Background()) // badKey.key, which reads no call
	return err
}
