package ratelimitgrpc_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
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
		// A net.Conn whose RemoteAddr returns a nil *net.TCPAddr (a
		// wrapper that has none to give) panicked the call, which gRPC
		// does not recover: the whole server.
		"nil tcp addr":  withPeer((*net.TCPAddr)(nil)),
		"nil udp addr":  withPeer((*net.UDPAddr)(nil)),
		"nil unix addr": withPeer((*net.UnixAddr)(nil)),
		"nil local unix addr": peer.NewContext(context.Background(),
			&peer.Peer{Addr: fakeAddr("bufconn"), LocalAddr: (*net.UnixAddr)(nil)}),
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
	key, err := ratelimitgrpc.PeerIP(ratelimitgrpc.IPv6Prefix(48), ratelimitgrpc.IPv6Prefix(56))
	assert.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption, "IPv6Prefix twice")
	assert.ErrorContains(t, err, "IPv6Prefix is given twice (48, then 56)")
	assert.Nil(t, key)
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

// Metadata("") made every call answer InvalidArgument, as if each client
// had left out its key: a name no call carries is refused by New, with
// advice.
func TestNewRefusesMetadataNoCallCarries(t *testing.T) {
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}})
	for _, name := range []string{"", "  ", "x api key", "x-api-key:", "x-api-key;", "clé", ":path", ":"} {
		ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(ratelimitgrpc.Metadata(name)))
		require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption, "Metadata(%q)", name)
		require.ErrorContains(t, err, `name the metadata that holds the key, such as Metadata("x-api-key")`, "Metadata(%q)", name)
		require.Nil(t, ic, "Metadata(%q)", name)
	}

	// Spaces around a name and its case are ignored; binary metadata and
	// the call's authority, which gRPC puts in the metadata, are keys.
	for name, md := range map[string]metadata.MD{
		" X-API-Key ": metadata.Pairs("x-api-key", "k1"),
		"tenant-bin":  metadata.Pairs("tenant-bin", "k1"),
		":authority":  metadata.Pairs(":authority", "k1"),
	} {
		ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(ratelimitgrpc.Metadata(name)))
		require.NoError(t, err, "Metadata(%q)", name)
		require.NoError(t, ic.Limit(metadata.NewIncomingContext(context.Background(), md)), "Metadata(%q)", name)
	}

	// Inside a KeyFunc of the caller's, New cannot see it: every call is
	// the configuration's fault, Internal, not the client's.
	inner := ratelimitgrpc.Metadata("")
	wrapped := func(ctx context.Context) (string, error) { k, err := inner(ctx); return "key:" + k, err }
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(wrapped), ratelimitgrpc.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-api-key", "k1"))
	assert.Equal(t, codes.Internal, status.Code(ic.Limit(ctx)))
	_, err = inner(ctx)
	assert.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption)
}

// A call through a gRPC server carries its authority in the metadata, so
// that Metadata(":authority") keys it.
func TestMetadataAuthorityOverLoopback(t *testing.T) {
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}})
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(ratelimitgrpc.Metadata(":authority")))
	require.NoError(t, err)
	client, _ := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, nil, grpc.WithAuthority("tenant-a.example"))
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), err)
	st, err := lim.Value(context.Background(), "api", "tenant-a.example")
	require.NoError(t, err)
	assert.Zero(t, st.Remaining)
}

// Metadata("grpc-timeout") answered every call InvalidArgument: gRPC keeps
// its reserved names out of a call's metadata (grpc-timeout, te), or sets
// them itself, alike for every call (content-type) or as the client's
// library chooses (grpc-accept-encoding): all one key, or a key the
// client picks. New refuses them, as it does a name no call carries.
func TestNewRefusesReservedMetadata(t *testing.T) {
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}})
	for _, name := range []string{"grpc-timeout", "Grpc-Encoding", "grpc-accept-encoding", "grpc-previous-rpc-attempts",
		"grpc-trace-bin", "grpc-status", "te", "content-type", "connection"} {
		ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(ratelimitgrpc.Metadata(name)))
		require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption, "Metadata(%q)", name)
		require.ErrorContains(t, err, "reserved", "Metadata(%q)", name)
		require.Nil(t, ic, "Metadata(%q)", name)
	}
	// user-agent, which gRPC puts in the metadata as the client sent it,
	// is a key (of the client's choosing).
	_, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(ratelimitgrpc.Metadata("user-agent")))
	require.NoError(t, err)
}

// Metadata("host") answered every call InvalidArgument, as if each client
// had left out its key: gRPC takes a call's host header out of the
// metadata (into :authority, or dropped when :authority is there), so that
// no call carries it, though the client sent one. New refuses it, and
// says to key by :authority.
func TestNewRefusesMetadataHost(t *testing.T) {
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}})
	for _, name := range []string{"host", "Host", " HOST "} {
		ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(ratelimitgrpc.Metadata(name)))
		require.ErrorIs(t, err, ratelimitgrpc.ErrInvalidOption, "Metadata(%q)", name)
		require.ErrorContains(t, err, `Metadata(":authority")`, "Metadata(%q)", name)
		require.Nil(t, ic, "Metadata(%q)", name)
	}

	// What a real server hands the interceptors: no host in the metadata,
	// though the client sent one; its authority is there instead.
	var got metadata.MD
	seen := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		got, _ = metadata.FromIncomingContext(ctx)
		return handler(ctx, req)
	}
	client, _ := serve(t, []grpc.UnaryServerInterceptor{seen}, nil, grpc.WithAuthority("tenant-a.example"))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "host", "tenant-b.example")
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Empty(t, got.Get("host"))
	assert.Equal(t, []string{"tenant-a.example"}, got.Get(":authority"))
}

// A KeyFunc of the user's that returns an empty key, and no error, for a
// call without the identity it reads put every such call in one budget:
// one client spent it for all. An empty key is no key, refused
// InvalidArgument as ErrNoKey, at the open of a stream too and through
// Limit; the call whose key is there goes on.
func TestEmptyKeyIsNoKey(t *testing.T) {
	var logs bytes.Buffer
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute}})
	ic, err := ratelimitgrpc.New(lim, []string{"api"},
		ratelimitgrpc.WithKey(func(ctx context.Context) (string, error) {
			if vs := metadata.ValueFromIncomingContext(ctx, "user"); len(vs) == 1 {
				return vs[0], nil
			}
			return "", nil // a KeyFunc's mistake: no user is no key
		}),
		ratelimitgrpc.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	require.NoError(t, err)
	handler := func(context.Context, any) (any, error) { return "ok", nil }
	unary := func(ctx context.Context) error {
		_, err := ic.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod}, handler)
		return err
	}
	anonymous := context.Background()
	for range 3 {
		err := unary(anonymous)
		assert.Equal(t, codes.InvalidArgument, status.Code(err))
		assert.Equal(t, "rate limit: the call carries no key", status.Convert(err).Message())
		assert.Equal(t, codes.InvalidArgument, status.Code(ic.Limit(anonymous)))
		err = ic.Stream()(nil, &fakeStream{ctx: anonymous}, &grpc.StreamServerInfo{FullMethod: watchMethod, IsServerStream: true},
			func(any, grpc.ServerStream) error { return nil })
		assert.Equal(t, codes.InvalidArgument, status.Code(err))
	}
	assert.Contains(t, logs.String(), "empty key")
	v, err := lim.Value(context.Background(), "api", "")
	require.NoError(t, err)
	assert.Equal(t, 1.0, v.Remaining, "the empty key's budget is untouched")

	user := metadata.NewIncomingContext(context.Background(), metadata.Pairs("user", "ann"))
	require.NoError(t, unary(user))
	assert.Equal(t, codes.ResourceExhausted, status.Code(unary(user)))
}
