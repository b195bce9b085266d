package clientip

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errTestOption = errors.New("pkg: invalid option")

// errBadName is the error testPkg's CheckName returns for a name with a
// space.
var errBadName = fmt.Errorf("pkg: TrustProxies: a name with a space: %w", errTestOption)

var testPkg = &Package{Name: "pkg", Carrier: "field", Err: errTestOption, CheckName: func(name string) error {
	if strings.Contains(name, " ") {
		return errBadName
	}
	return nil
}}

// build returns the Config of opts, given to a function "F" of testPkg.
func build(opts ...Option) (*Config, error) {
	return Build(testPkg, "F", opts, func(o Option) Option { return o })
}

func trust(name string, kind Kind, prefixes ...string) Option {
	var ps []netip.Prefix
	for _, p := range prefixes {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	return func(c *Config) error { return c.TrustProxies(name, kind, ps) }
}

func v6(bits int) Option { return func(c *Config) error { return c.IPv6Prefix(bits) } }

var unix Option = (*Config).TrustUnixSocket

// TestBuildRefuses checks each refusal of the options, alone and checked
// together (ClientIP): the message, in the package's words, and the
// package's sentinel.
func TestBuildRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"a zero option", []Option{nil}, "pkg: F was given a zero IPOption: pkg: invalid option"},
		{"no header", []Option{trust("", 0, "10.0.0.0/8")}, "pkg: TrustProxies: no header chosen: use XForwardedFor, Forwarded or SingleIPHeader(name): pkg: invalid option"},
		{"a name the package cannot read", []Option{trust("x real ip", SingleIP, "10.0.0.0/8")}, errBadName.Error()},
		{"a list as a single address", []Option{trust("x-forwarded-for", SingleIP, "10.0.0.0/8")},
			"pkg: TrustProxies: x-forwarded-for is a list that proxies append to, not a single address: use pkg.XForwardedFor: pkg: invalid option"},
		{"Forwarded as a single address", []Option{trust("Forwarded", SingleIP, "10.0.0.0/8")},
			"pkg: TrustProxies: Forwarded is a list that proxies append to, not a single address: use pkg.Forwarded: pkg: invalid option"},
		{"TrustProxies twice", []Option{trust("X-Forwarded-For", XForwardedFor, "10.0.0.0/8"), trust("Forwarded", Forwarded, "10.0.0.0/8")},
			"pkg: TrustProxies is given twice: give it once, with every trusted prefix: pkg: invalid option"},
		{"a prefix too wide", []Option{trust("X-Forwarded-For", XForwardedFor, "0.0.0.0/1")}, "pkg: TrustProxies: prefix 0.0.0.0/1 trusts 2^31 addresses"},
		{"NAT64", []Option{trust("X-Forwarded-For", XForwardedFor, "64:ff9b::/96")}, "pkg: TrustProxies: prefix 64:ff9b::/96 trusts the IPv4 clients that NAT64"},
		{"every address", []Option{trust("X-Forwarded-For", XForwardedFor, "::/0")}, "pkg: TrustProxies: prefix ::/0 trusts every address"},
		{"an invalid prefix", []Option{func(c *Config) error { return c.TrustProxies("X-Forwarded-For", XForwardedFor, []netip.Prefix{{}}) }},
			"pkg: TrustProxies: prefix invalid Prefix is not valid: pkg: invalid option"},
		{"TrustUnixSocket twice", []Option{unix, trust("X-Forwarded-For", XForwardedFor), unix}, "pkg: TrustUnixSocket is given twice: give it once: pkg: invalid option"},
		{"IPv6Prefix 0", []Option{v6(0)}, "pkg: IPv6Prefix(0): the prefix length must be 1 to 128: pkg: invalid option"},
		{"IPv6Prefix 129", []Option{v6(129)}, "pkg: IPv6Prefix(129): the prefix length must be 1 to 128"},
		{"IPv6Prefix twice", []Option{v6(48), v6(56)}, "pkg: IPv6Prefix is given twice (48, then 56): give it once, with the width meant: pkg: invalid option"},
		{"IPv6Prefix twice alike", []Option{v6(64), v6(64)}, "pkg: IPv6Prefix is given twice (64, then 64)"},
		{"TrustUnixSocket alone", []Option{unix},
			"pkg: TrustUnixSocket trusts the peer on a Unix socket as a proxy, but no TrustProxies says which field it writes: give TrustProxies(header) too: pkg: invalid option"},
		{"no proxy", []Option{trust("X-Real-IP", SingleIP)},
			"pkg: TrustProxies(X-Real-IP) names no trusted proxy: list the prefixes of the proxies in front of the service, " +
				"or give TrustUnixSocket for a proxy that connects through a Unix socket: pkg: invalid option"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := build(tc.opts...)
			if err == nil {
				err = c.ClientIP()
			}
			require.ErrorIs(t, err, errTestOption)
			assert.True(t, strings.HasPrefix(err.Error(), tc.want), "got %q, want it to start with %q", err, tc.want)
		})
	}
}

// TestBuildAccepts checks what the options accepted mean: which header is
// read, from which peers, and the width of an IPv6 client's key.
func TestBuildAccepts(t *testing.T) {
	values := func(lines ...string) func(string) []string {
		return func(name string) []string {
			if name != "X-Forwarded-For" {
				return nil
			}
			return lines
		}
	}
	notRead := func(string) []string { panic("an untrusted peer's header was read") }
	lb := netip.MustParseAddr("10.1.2.3")

	c, err := build()
	require.NoError(t, err)
	require.NoError(t, c.ClientIP())
	assert.False(t, c.ReadsHeader())
	assert.False(t, c.TrustsUnix())
	assert.Equal(t, "10.1.2.3", c.Key(lb, notRead), "no proxy trusted: the peer")
	assert.Equal(t, "2001:db8:1:2::/64", c.Key(netip.MustParseAddr("2001:db8:1:2:3::4"), notRead), "DefaultIPv6Prefix")

	c, err = build(v6(48), trust("X-Forwarded-For", XForwardedFor, "10.0.0.0/8"))
	require.NoError(t, err)
	require.NoError(t, c.ClientIP())
	assert.True(t, c.ReadsHeader())
	assert.False(t, c.UnixGiven())
	assert.Equal(t, "203.0.113.9", c.Key(lb, values("198.51.100.1, 203.0.113.9, 10.0.0.7")))
	assert.Equal(t, "2001:db8:1::/48", c.Key(lb, values("2001:db8:1:2::5")))
	assert.Equal(t, "192.0.2.1", c.Key(netip.MustParseAddr("192.0.2.1"), notRead), "an untrusted peer")

	// A prefix written IPv4-mapped trusts the IPv4 addresses it maps.
	c, err = build(trust("X-Forwarded-For", XForwardedFor, "::ffff:10.0.0.0/104"))
	require.NoError(t, err)
	require.NoError(t, c.ClientIP())
	assert.Equal(t, "203.0.113.9", c.Key(lb, values("203.0.113.9")))

	// The peer on a Unix socket, trusted alone.
	c, err = build(unix, trust("X-Forwarded-For", XForwardedFor))
	require.NoError(t, err)
	assert.False(t, c.TrustsUnix(), "not before ClientIP checked the options")
	require.NoError(t, c.ClientIP())
	assert.True(t, c.UnixGiven())
	assert.True(t, c.TrustsUnix())
	assert.Equal(t, "203.0.113.9", c.UnixKey(values("198.51.100.1, 203.0.113.9")))
	assert.Equal(t, UnixPeer, c.UnixKey(values()))
	assert.Equal(t, "10.1.2.3", c.Key(lb, notRead), "no prefix trusted")
}
