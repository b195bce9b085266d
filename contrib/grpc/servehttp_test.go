package ratelimitgrpc_test

import (
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A gRPC server served by net/http (grpc.Server's ServeHTTP) on a Unix
// socket gives a call's peer as net/http's RemoteAddr, a string of
// network "tcp", whatever the connection; the call's local address is the
// Unix socket's. A client that named its end of the socket "10.0.0.5:80"
// had that name read as its IP address, as net/http reads it: PeerIP keyed
// each call by the name the client chose, and ClientIP took the client for
// a trusted proxy and read the x-forwarded-for it wrote, a fresh key with
// every call; 100 of 100 calls passed a limit of 5. On a Unix socket, a
// peer given only as a string has no IP address, as a Unix address has
// none, whatever its name.
func TestClientIPUnixPeerNamedAsAddressOverServeHTTP(t *testing.T) {
	sock := socketInShortDir(t)

	passed := func(key ratelimitgrpc.KeyFunc) (int, map[codes.Code]int) {
		t.Helper()
		lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"api": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Hour}})
		ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithKey(key), ratelimitgrpc.WithLogger(slog.New(slog.DiscardHandler)))
		require.NoError(t, err)
		srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()))
		healthpb.RegisterHealthServer(srv, health.NewServer())
		var protocols http.Protocols
		protocols.SetUnencryptedHTTP2(true)
		hs := &http.Server{Handler: srv, Protocols: &protocols}
		lis, err := net.Listen("unix", sock)
		require.NoError(t, err)
		go func() { _ = hs.Serve(lis) }()
		defer hs.Close() // removes the socket

		return callsFromNamedPeer(t, sock)
	}

	namedPeerHasNoKey(t, passed)

	// Trusted as the proxy on the socket, the peer is read as one, and
	// its name never as an address.
	onSocket, err := ratelimitgrpc.ClientIP(ratelimitgrpc.TrustProxies(ratelimitgrpc.XForwardedFor), ratelimitgrpc.TrustUnixSocket())
	require.NoError(t, err)
	n, got := passed(onSocket)
	assert.Equal(t, 100, n, "the proxy on the socket vouches for a client per call")
	assert.Equal(t, map[codes.Code]int{codes.OK: 100}, got)
}
