package redisstore_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/redis/go-redis/v9"
)

// fullDialer is a flakyDialer whose first dial once armed makes a
// connection to a server that has too many clients: it answers every
// command "max number of clients reached", as Redis does before it drops
// such a connection, so that go-redis fails to set the connection up
// (CLIENT SETNAME) and finds no connection for the calls it was to send.
type fullDialer struct {
	*flakyDialer
	mu   sync.Mutex
	full bool
}

func (d *fullDialer) arm() {
	d.mu.Lock()
	d.full = true
	d.mu.Unlock()
	d.flakyDialer.mu.Lock()
	d.flakyDialer.gen++
	d.flakyDialer.cut = true
	d.flakyDialer.mu.Unlock()
}

func (d *fullDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	full := d.full
	d.full = false
	d.mu.Unlock()
	if !full {
		return d.flakyDialer.dial(ctx, network, addr)
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &fullConn{Conn: conn}, nil
}

// fullConn answers each write with "max number of clients reached",
// sending nothing to the server.
type fullConn struct {
	net.Conn
	mu      sync.Mutex
	pending []byte
}

func (fc *fullConn) Write(b []byte) (int, error) {
	fc.mu.Lock()
	fc.pending = append(fc.pending, "-ERR max number of clients reached\r\n"...)
	fc.mu.Unlock()
	return len(b), nil
}

func (fc *fullConn) Read(b []byte) (int, error) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	n := copy(b, fc.pending)
	fc.pending = fc.pending[n:]
	return n, nil
}

// TestClusterPipelineMaxClientsNeverSentTwice is
// TestClusterPipelineCallNeverSentTwice with a server that has too many
// clients in place of a dial that fails: go-redis could not set up a
// connection (a client with a name or a password sends CLIENT SETNAME or
// AUTH first, which Redis answers "max number of clients reached"), and
// sent the pipeline again; that send lost its replies, and the calls after
// the first kept the first error, which says that they did not run,
// though the server ran them. The store sent them once more: each op must
// be applied at most once.
func TestClusterPipelineMaxClientsNeverSentTwice(t *testing.T) {
	d := &fullDialer{flakyDialer: &flakyDialer{}}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ","),
		Dialer: d.dial, DialerRetries: 1, ClientName: "ratelimit-test", MaxRetryBackoff: 10 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	pipelineCallsNeverSentTwice(t, c, d.arm)
}
