// Package testserver finds the local servers the store tests talk to, and
// decides what a test does when one cannot be reached: in CI (CI set) it
// fails, never skips; on a developer's machine it skips with a message
// saying how to start the server.
package testserver

import (
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

const (
	// DefaultRedisURL is the local Redis server.
	DefaultRedisURL = "redis://127.0.0.1:6379/0"
	// DefaultPostgresURL is the local PostgreSQL server's database test.
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	// DefaultClusterAddrs are the nodes of the local three-node Redis Cluster.
	DefaultClusterAddrs = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
)

// RedisURL returns REDIS_URL or the default, once its server answers TCP.
func RedisURL(t testing.TB) string {
	return reach(t, "REDIS_URL", DefaultRedisURL, "redis")
}

// PostgresURL returns DATABASE_URL or the default, once its server answers
// TCP.
func PostgresURL(t testing.TB) string {
	return reach(t, "DATABASE_URL", DefaultPostgresURL, "postgres")
}

// ClusterAddrs returns REDIS_CLUSTER_ADDRS (comma-separated) or the
// default, once the first node answers TCP.
func ClusterAddrs(t testing.TB) string {
	addrs := os.Getenv("REDIS_CLUSTER_ADDRS")
	if addrs == "" {
		addrs = DefaultClusterAddrs
	}
	first := addrs
	for i := range addrs {
		if addrs[i] == ',' {
			first = addrs[:i]
			break
		}
	}
	Unreachable(t, "cluster", first, dial(first))
	return addrs
}

func reach(t testing.TB, env, def, service string) string {
	u := os.Getenv(env)
	if u == "" {
		u = def
	}
	p, err := url.Parse(u)
	if err != nil {
		t.Fatalf("%s=%q is not a URL: %v", env, u, err)
	}
	host := p.Host
	if p.Port() == "" {
		host = net.JoinHostPort(p.Hostname(), map[string]string{"redis": "6379", "postgres": "5432"}[service])
	}
	Unreachable(t, service, host, dial(host))
	return u
}

func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// Unreachable fails (in CI) or skips (elsewhere) the test when err, the
// outcome of reaching service at addr, is not nil.
func Unreachable(t testing.TB, service, addr string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	msg := "%s at %s cannot be reached (%v): start it with scripts/services.sh %s"
	if os.Getenv("CI") != "" {
		t.Fatalf(msg, service, addr, err, service)
	}
	t.Skipf(msg, service, addr, err, service)
}

// Reachable reports whether a TCP server answers at addr.
func Reachable(addr string) bool { return dial(addr) == nil }

// RequireReachable fails or skips the test, as Unreachable does, unless a
// server answers at addr.
func RequireReachable(t testing.TB, service, addr string) {
	t.Helper()
	Unreachable(t, service, addr, dial(addr))
}

// WaitReachable polls addr until a server answers there (up) or no longer
// does (!up), for at most ten seconds, and fails the test otherwise.
func WaitReachable(t testing.TB, addr string, up bool) {
	t.Helper()
	for range 200 {
		if Reachable(addr) == up {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the server at %s did not become reachable=%v", addr, up)
}
