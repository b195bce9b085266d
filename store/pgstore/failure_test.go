package pgstore_test

import (
	"context"
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
	testserver.WaitReachable(t, failoverAddr, false)
}

func startFailover(t *testing.T) {
	if testserver.Reachable(failoverAddr) {
		return
	}
	pgctl(t, "start")
	testserver.WaitReachable(t, failoverAddr, true)
}

func TestStoreFailure(t *testing.T) {
	ctx := context.Background()
	testserver.LockServer(t, "postgres-failover") // it stops and starts the server
	testserver.RequireReachable(t, "failover", failoverAddr)
	cfg, err := pgxpool.ParseConfig(failoverURL())
	require.NoError(t, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	waitAccepting(t, pool)
	store, err := pgstore.New(ctx, pool, pgstore.WithTable("ratelimit_failure_test"))
	require.NoError(t, err)
	t.Cleanup(func() { startFailover(t) })
	storetest.StoreFailure(t, store, stopFailover, startFailover)
}

// waitAccepting waits until the server behind pool answers a query: a
// server that listens may still be starting up (SQLSTATE 57P03), say when
// another test binary has just restarted it.
func waitAccepting(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var err error
	for range 150 {
		if err = pool.Ping(context.Background()); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond) // a server starting up: no clock to mock
	}
	t.Fatalf("the failover server does not answer: %v", err)
}
