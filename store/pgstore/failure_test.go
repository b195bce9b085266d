package pgstore_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// The failure test stops a real PostgreSQL server mid-test: not the shared
// one on 5432 but a second cluster that scripts/services.sh starts for
// this.
const failoverAddr = "127.0.0.1:5490"

func failoverURL() string {
	if u := os.Getenv("DATABASE_FAILOVER_URL"); u != "" {
		return u
	}
	return "postgres://postgres@" + failoverAddr + "/test?sslmode=disable&connect_timeout=2"
}

func reachable() bool {
	c, err := net.DialTimeout("tcp", failoverAddr, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// waitFor polls, boundedly, until the server is reachable or not.
func waitFor(t *testing.T, up bool) {
	for range 200 {
		if reachable() == up {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the failover postgresql did not become reachable=%v", up)
}

func pgctl(t *testing.T, action string, args ...string) {
	versions, err := os.ReadDir("/etc/postgresql")
	require.NoError(t, err)
	require.NotEmpty(t, versions)
	v := versions[len(versions)-1].Name()
	out, err := exec.Command("pg_ctlcluster", append([]string{"--skip-systemctl-redirect", v, "ratelimit_failover", action}, args...)...).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "already running") {
		t.Fatalf("pg_ctlcluster %s: %v: %s", action, err, out)
	}
}

func stopFailover(t *testing.T) {
	pgctl(t, "stop", "-m", "immediate")
	waitFor(t, false)
}

func startFailover(t *testing.T) {
	if reachable() {
		return
	}
	pgctl(t, "start")
	waitFor(t, true)
}

func TestStoreFailure(t *testing.T) {
	ctx := context.Background()
	var dialErr error
	if !reachable() {
		dialErr = errors.New("connection refused")
	}
	testserver.Unreachable(t, "failover", failoverAddr, dialErr)
	cfg, err := pgxpool.ParseConfig(failoverURL())
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	store, err := pgstore.New(ctx, pool, pgstore.WithTable("ratelimit_failure_test"))
	require.NoError(t, err)
	t.Cleanup(func() { startFailover(t) })
	storetest.StoreFailure(t, store, stopFailover, startFailover)
}
