package ratelimitgrpc_test

import (
	"context"
	"net"
	"testing"

	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

func withPeer(addr net.Addr) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: addr})
}

func TestPeerIP(t *testing.T) {
	def, err := ratelimitgrpc.PeerIP()
	require.NoError(t, err)
	exact, err := ratelimitgrpc.PeerIP(ratelimitgrpc.IPv6Prefix(128))
	require.NoError(t, err)
	wide, err := ratelimitgrpc.PeerIP(ratelimitgrpc.IPv6Prefix(48))
	require.NoError(t, err)
	tcp := func(s string, port int) net.Addr { return &net.TCPAddr{IP: net.ParseIP(s), Port: port} }
	for _, c := range []struct {
		name string
		key  ratelimitgrpc.KeyFunc
		addr net.Addr
		want string
	}{
		{"ipv4, port dropped", def, tcp("203.0.113.7", 50123), "203.0.113.7"},
		{"ipv4, another port", def, tcp("203.0.113.7", 40000), "203.0.113.7"},
		{"ipv4-mapped", def, tcp("::ffff:203.0.113.7", 1), "203.0.113.7"},
		{"ipv6 by its /64", def, tcp("2001:db8:1:2:aaaa::1", 1), "2001:db8:1:2::/64"},
		{"another address of the /64", def, tcp("2001:db8:1:2:ffff::9", 1), "2001:db8:1:2::/64"},
		{"ipv6 by its /48", wide, tcp("2001:db8:1:2::1", 1), "2001:db8:1::/48"},
		{"ipv6 exact", exact, tcp("2001:db8:1:2::1", 1), "2001:db8:1:2::1"},
		{"zone dropped", exact, &net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0"}, "fe80::1"},
		{"udp", def, &net.UDPAddr{IP: net.ParseIP("198.51.100.1"), Port: 5}, "198.51.100.1"},
		{"other addr type", def, fakeAddr("192.0.2.1:443"), "192.0.2.1"},
	} {
		got, err := c.key(withPeer(c.addr))
		require.NoError(t, err, c.name)
		assert.Equal(t, c.want, got, c.name)
	}

	for name, ctx := range map[string]context.Context{
		"no peer":     context.Background(),
		"nil addr":    peer.NewContext(context.Background(), &peer.Peer{}),
		"unix socket": withPeer(&net.UnixAddr{Name: "/run/app.sock", Net: "unix"}),
		"in memory":   withPeer(fakeAddr("bufconn")),
	} {
		_, err := def(ctx)
		assert.ErrorIs(t, err, ratelimitgrpc.ErrNoKey, name)
	}
}

type fakeAddr string

func (a fakeAddr) Network() string { return "fake" }
func (a fakeAddr) String() string  { return string(a) }

func TestPeerIPRefuses(t *testing.T) {
	for name, opt := range map[string]ratelimitgrpc.IPOption{
		"prefix 0":   ratelimitgrpc.IPv6Prefix(0),
		"prefix 129": ratelimitgrpc.IPv6Prefix(129),
		"zero":       {},
	} {
		key, err := ratelimitgrpc.PeerIP(opt)
		assert.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption, name)
		assert.Nil(t, key, name)
	}
}

func TestMetadata(t *testing.T) {
	key := ratelimitgrpc.Metadata(" X-API-Key ")
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "k1"))
	got, err := key(ctx)
	require.NoError(t, err)
	assert.Equal(t, "k1", got)

	bin := ratelimitgrpc.Metadata("tenant-bin")
	got, err = bin(metadata.NewIncomingContext(context.Background(), metadata.Pairs("tenant-bin", "\x00\x01")))
	require.NoError(t, err)
	assert.Equal(t, "\x00\x01", got, "binary metadata, as decoded")

	for name, ctx := range map[string]context.Context{
		"no metadata": context.Background(),
		"other key":   metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "x")),
		"empty":       metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "")),
		"two values":  metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "a", "x-api-key", "b")),
	} {
		_, err := key(ctx)
		assert.ErrorIs(t, err, ratelimitgrpc.ErrNoKey, name)
	}
}
