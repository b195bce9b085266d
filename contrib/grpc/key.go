package ratelimitgrpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// KeyFunc returns the key a call is limited by, from the call's context
// (its peer, its incoming metadata, values a previous interceptor put
// there). An error refuses the call: InvalidArgument for ErrNoKey,
// Canceled or DeadlineExceeded for the context's own error once the
// caller gave up, Internal otherwise.
type KeyFunc func(ctx context.Context) (string, error)

// ErrNoKey is returned by a KeyFunc that finds no key for a call, such as
// a missing metadata value.
var ErrNoKey = errors.New("ratelimitgrpc: the call carries no key")

// ErrInvalidOption is matched (errors.Is) by the error of New or PeerIP
// when an option cannot work as given.
var ErrInvalidOption = errors.New("ratelimitgrpc: invalid option")

// DefaultIPv6Prefix is the prefix length an IPv6 peer is keyed by unless
// IPv6Prefix says otherwise: a /64 is the smallest network a site is
// usually given, so one client can take any of its 2^64 addresses.
const DefaultIPv6Prefix = 64

// IPOption configures PeerIP.
type IPOption struct {
	apply func(*peerIP) error
}

// IPv6Prefix keys an IPv6 peer by its network of the given prefix length
// (1 to 128) instead of DefaultIPv6Prefix; 128 keys every address apart.
func IPv6Prefix(bits int) IPOption {
	return IPOption{func(p *peerIP) error {
		if bits < 1 || bits > 128 {
			return fmt.Errorf("ratelimitgrpc: IPv6Prefix(%d): the prefix length must be 1 to 128: %w", bits, ErrInvalidOption)
		}
		p.v6bits = bits
		return nil
	}}
}

// PeerIP returns a KeyFunc that keys a call by the IP address of its peer
// (peer.FromContext), without the port: an IPv4 address (or an
// IPv4-mapped IPv6 one) as it is, an IPv6 address by its /64 network
// (IPv6Prefix changes the width). It is the default key of New.
//
// Behind a proxy every call's peer is the proxy: key by a metadata value
// the proxy sets instead (Metadata), one it overwrites whatever the client
// sent. The KeyFunc fails with ErrNoKey when the peer has no IP address (a
// Unix socket, an in-memory listener).
func PeerIP(opts ...IPOption) (KeyFunc, error) {
	p := &peerIP{v6bits: DefaultIPv6Prefix}
	for _, o := range opts {
		if o.apply == nil {
			return nil, fmt.Errorf("ratelimitgrpc: PeerIP was given a zero IPOption: %w", ErrInvalidOption)
		}
		if err := o.apply(p); err != nil {
			return nil, err
		}
	}
	return p.key, nil
}

type peerIP struct{ v6bits int }

func (p *peerIP) key(ctx context.Context) (string, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.Addr == nil {
		return "", fmt.Errorf("ratelimitgrpc: the call has no peer: %w", ErrNoKey)
	}
	var ip netip.Addr
	switch a := pr.Addr.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			ip = ap.Addr()
		}
	}
	if !ip.IsValid() {
		return "", fmt.Errorf("ratelimitgrpc: the peer %s (%s) has no IP address: %w", pr.Addr, pr.Addr.Network(), ErrNoKey)
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() && p.v6bits < 128 {
		pfx, _ := ip.Prefix(p.v6bits) // cannot fail: 1 ≤ v6bits ≤ 128, ip is IPv6
		return pfx.String(), nil
	}
	return ip.String(), nil
}

// Metadata returns a KeyFunc that keys a call by a value of its incoming
// metadata, such as an API key ("x-api-key"); the name is not case
// sensitive. A call without the value, with an empty one, or with several
// (which would be ambiguous) has no key: ErrNoKey.
func Metadata(name string) KeyFunc {
	name = strings.ToLower(strings.TrimSpace(name))
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
