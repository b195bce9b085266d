package clientip

import (
	"fmt"
	"net/netip"
	"strings"
)

// DefaultIPv6Prefix is the prefix length an IPv6 client is keyed by unless
// an IPv6Prefix option says otherwise: a /64 is the smallest network a
// site is usually given, so one client can take any of its 2^64
// addresses. httplimit and ratelimitgrpc export it as theirs.
const DefaultIPv6Prefix = 64

// Package says whose client-IP options a Config is built from: the words
// of their errors, which differ between httplimit (HTTP header fields)
// and ratelimitgrpc (metadata), and the sentinel they wrap. Every refusal
// and the meaning of every option are Config's, written once.
type Package struct {
	// Name starts every error ("httplimit") and names the package of the
	// XForwardedFor and Forwarded headers in them.
	Name string
	// Carrier is what the proxies write the client's address into:
	// "header" or "metadata".
	Carrier string
	// Err is the sentinel every error of the options wraps, last:
	// the package's ErrInvalidOption.
	Err error
	// CheckName returns the error of a single-address header's name that
	// the package cannot read (not a header field name, one its transport
	// takes out), or nil. Its error is whole: it starts with Name and
	// wraps Err.
	CheckName func(name string) error
}

// Option is one of a package's IPOptions: a change to a Config, or the
// error that refuses it.
type Option func(*Config) error

// Config is what a package's client-IP options say: the header the
// proxies write and the Proxies that write it, the trust of the peer on
// a Unix socket, and the IPv6 prefix length. Build makes one; TrustProxies,
// TrustUnixSocket and IPv6Prefix are the options' meanings, refusals
// included; ClientIP checks them together.
type Config struct {
	pkg     *Package
	header  string // the name of the header: empty until TrustProxies
	kind    Kind   // zero until TrustProxies
	proxies Proxies
	unix    bool // TrustUnixSocket: ClientIP makes proxies trust the peer on a Unix socket
	v6bits  int
	v6given bool // IPv6Prefix was given: a second one is refused
}

// Build returns the Config of opts, given to the function fn of pkg
// ("ClientIP"): each option applied in order, the first refusal returned.
// option returns the Option of an IPOption of pkg; a nil one, the zero
// IPOption's, is refused.
func Build[O any](pkg *Package, fn string, opts []O, option func(O) Option) (*Config, error) {
	c := &Config{pkg: pkg, v6bits: DefaultIPv6Prefix}
	for _, o := range opts {
		apply := option(o)
		if apply == nil {
			return nil, c.errorf("%s was given a zero IPOption", fn)
		}
		if err := apply(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// errorf returns an error of c's package: its name, the message, and its
// sentinel wrapped.
func (c *Config) errorf(format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", c.pkg.Name, fmt.Sprintf(format, args...), c.pkg.Err)
}

// TrustProxies is the meaning of the option TrustProxies(header,
// trusted...), for a header named name of kind (zero for the zero
// ProxyHeader): it refuses no header, a single-address header of a name
// the package cannot read (Package.CheckName) or that names one of the
// lists, a second TrustProxies, and prefixes Trust refuses.
func (c *Config) TrustProxies(name string, kind Kind, trusted []netip.Prefix) error {
	switch kind {
	case XForwardedFor, Forwarded:
	case SingleIP:
		if c.pkg.CheckName != nil {
			if err := c.pkg.CheckName(name); err != nil {
				return err
			}
		}
		for _, list := range [...]string{"X-Forwarded-For", "Forwarded"} {
			if strings.EqualFold(name, list) {
				return c.errorf("TrustProxies: %s is a list that proxies append to, not a single address: use %s.%s",
					name, c.pkg.Name, strings.ReplaceAll(list, "-", ""))
			}
		}
	default:
		return c.errorf("TrustProxies: no header chosen: use XForwardedFor, Forwarded or SingleIPHeader(name)")
	}
	if c.kind != 0 {
		return c.errorf("TrustProxies is given twice: give it once, with every trusted prefix")
	}
	proxies, err := Trust(kind, trusted)
	if err != nil {
		return fmt.Errorf("%s: TrustProxies: %w: %w", c.pkg.Name, err, c.pkg.Err)
	}
	c.header, c.kind, c.proxies = name, kind, proxies
	return nil
}

// TrustUnixSocket is the meaning of the option TrustUnixSocket(): the
// peer on a Unix socket is trusted as a proxy, once ClientIP checked that
// TrustProxies says what it writes. It is refused given twice.
func (c *Config) TrustUnixSocket() error {
	if c.unix {
		return c.errorf("TrustUnixSocket is given twice: give it once")
	}
	c.unix = true
	return nil
}

// IPv6Prefix is the meaning of the option IPv6Prefix(bits): an IPv6
// client keyed by its network of bits (1 to 128). Given twice, even
// alike, it is refused: which width was meant cannot be told.
func (c *Config) IPv6Prefix(bits int) error {
	if bits < 1 || bits > 128 {
		return c.errorf("IPv6Prefix(%d): the prefix length must be 1 to 128", bits)
	}
	if c.v6given {
		return c.errorf("IPv6Prefix is given twice (%d, then %d): give it once, with the width meant", c.v6bits, bits)
	}
	c.v6bits, c.v6given = bits, true
	return nil
}

// ReadsHeader reports whether TrustProxies was given: a function that
// reads no header (ratelimitgrpc.PeerIP) refuses it.
func (c *Config) ReadsHeader() bool { return c.kind != 0 }

// UnixGiven reports whether TrustUnixSocket was given.
func (c *Config) UnixGiven() bool { return c.unix }

// ClientIP checks the options together, for a ClientIP: TrustUnixSocket
// needs TrustProxies, which says what the peer on the socket writes, and
// TrustProxies needs a proxy to trust, a prefix or the peer on a Unix
// socket. The peer on a Unix socket is trusted from then on.
func (c *Config) ClientIP() error {
	if c.unix {
		if c.kind == 0 {
			return c.errorf("TrustUnixSocket trusts the peer on a Unix socket as a proxy, but no TrustProxies says which %s it writes: "+
				"give TrustProxies(header) too", c.pkg.Carrier)
		}
		c.proxies.TrustUnix()
	}
	if c.kind != 0 && c.proxies.Empty() {
		return c.errorf("TrustProxies(%s) names no trusted proxy: list the prefixes of the proxies in front of the service, "+
			"or give TrustUnixSocket for a proxy that connects through a Unix socket", c.header)
	}
	return nil
}

// TrustsUnix reports whether the peer on a Unix socket is trusted: whether
// ClientIP accepted TrustUnixSocket.
func (c *Config) TrustsUnix() bool { return c.proxies.TrustsUnix() }

// Key returns the key of a request or call from peer, an IP address
// (unmapped and without a zone): the client Proxies.Client finds, keyed
// by Format. values returns the lines of the named header in order; it is
// called only when the peer is trusted, for reading them may cost.
func (c *Config) Key(peer netip.Addr, values func(name string) []string) string {
	ip := peer
	if c.proxies.Trusts(peer) {
		ip = c.proxies.Client(peer, values(c.header))
	}
	return Format(ip, c.v6bits)
}

// UnixKey returns the key of a request or call from the peer on a Unix
// socket, which the caller found TrustsUnix: see Proxies.UnixKey. values
// is as Key's.
func (c *Config) UnixKey(values func(name string) []string) string {
	return c.proxies.UnixKey(values(c.header), c.v6bits)
}
