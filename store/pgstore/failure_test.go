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
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
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

func pgctl(t *testing.T, action string, args ...string) {
	versions, err := os.ReadDir("/etc/postgresql")
	require.NoError(t, err)
	require.NotEmpty(t, versions)
	v := versions[len(versions)-1].Name()
	cmd := append([]string{"--skip-systemctl-redirect", v, "ratelimit_failover", action}, args...)
	out, err := exec.Command("pg_ctlcluster", cmd...).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "already running") {
		t.Errorf("pg_ctlcluster %s: %v: %s", action, err, out)
	}
}

func waitFor(t *testing.T, up bool) {
	for range 200 {
		if reachable() == up {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the failover postgresql did not become reachable=%v", up)
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

	mock := newMock(t0)
	const failures, cooldown = 3, 10 * time.Second
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"open":   {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Minute, FailOpen: true},
		"closed": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Minute},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(failures, cooldown))
	require.NoError(t, err)
	key := time.Now().String()
	for _, name := range []string{"open", "closed"} {
		res, err := lim.Limit(ctx, name, key)
		require.NoError(t, err)
		require.True(t, res.OK)
	}

	pgctl(t, "stop", "-m", "immediate")
	t.Cleanup(func() {
		if !reachable() {
			pgctl(t, "start")
			waitFor(t, true)
		}
	})
	waitFor(t, false)

	// Every call returns within its deadline, decided by its policy; after
	// `failures` of them the breaker stops asking the server.
	for i := range 2 * failures {
		for j, name := range []string{"open", "closed"} {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			res, err := lim.Limit(cctx, name, key)
			require.NoError(t, cctx.Err(), "call %d of %s outlived its deadline", i, name)
			cancel()
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "call %d of %s", i, name)
			require.True(t, res.Degraded)
			require.Equal(t, name == "open", res.OK, "call %d: the %s policy decides", i, name)
			var serr *ratelimit.StoreError
			require.ErrorAs(t, err, &serr)
			if 2*i+j >= failures {
				require.Nil(t, serr.Err, "call %d of %s: the breaker is open, the server must not be asked", i, name)
			} else {
				require.Error(t, serr.Err, "the server's own error is visible")
			}
		}
	}

	pgctl(t, "start")
	waitFor(t, true)
	// After each cool-down one probe reaches the server; connections the
	// stop broke are dropped as they fail, and the pool dials anew: the
	// limiter recovers on its own, with the same pool.
	var res ratelimit.Result
	for attempt := range 10 {
		mock.Add(cooldown + time.Millisecond)
		res, err = lim.Limit(ctx, "closed", key)
		if err == nil {
			t.Logf("recovered at probe %d", attempt+1)
			break
		}
	}
	require.NoError(t, err)
	require.True(t, res.OK)
	require.False(t, res.Degraded)
	res, err = lim.Limit(ctx, "open", key)
	require.NoError(t, err)
	require.False(t, res.Degraded)
}
