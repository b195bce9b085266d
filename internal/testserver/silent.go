package testserver

import (
	"net"
	"sync"
	"testing"
)

// Silent listens on loopback, accepts every connection and never answers,
// not even a client's handshake: a server stalled from its first byte.
// drop closes the listener and the connections, which ends the reads a
// client has in flight; a client whose Close waits for those reads (as
// go-redis's does) must be closed after it. drop runs at cleanup too, and
// may run more than once.
func Silent(t testing.TB) (addr string, drop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testserver: listen on loopback: %v", err)
	}
	var (
		mu     sync.Mutex
		conns  []net.Conn
		closed bool
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				c.Close()
			} else {
				conns = append(conns, c)
			}
			mu.Unlock()
		}
	}()
	drop = func() {
		mu.Lock()
		defer mu.Unlock()
		if closed {
			return
		}
		closed = true
		ln.Close()
		for _, c := range conns {
			c.Close()
		}
	}
	t.Cleanup(drop)
	return ln.Addr().String(), drop
}
