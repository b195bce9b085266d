package redisstore_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The failure test stops a real Redis server mid-test: not the shared one
// on 6379 but a second one that scripts/services.sh starts for this.
const failoverAddr = "127.0.0.1:6390"

func failoverURL() string {
	if u := os.Getenv("REDIS_FAILOVER_URL"); u != "" {
		return u
	}
	return "redis://" + failoverAddr + "/0"
}

func stopFailover(t *testing.T) {
	out, err := exec.Command("redis-cli", "-h", "127.0.0.1", "-p", "6390", "shutdown", "nosave").CombinedOutput()
	// A server that shut down closes the connection: redis-cli may report
	// that as an error.
	if err != nil && reachable() {
		t.Fatalf("stopping the failover redis: %v: %s", err, out)
	}
	for range 100 {
		if !reachable() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the failover redis did not stop")
}

func startFailover(t *testing.T) {
	if reachable() {
		return
	}
	out, err := exec.Command("redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6390",
		"--save", "", "--appendonly", "no", "--dir", "/tmp", "--logfile", "/tmp/ratelimit-failover-redis.log").CombinedOutput()
	if err != nil {
		t.Errorf("restarting the failover redis: %v: %s", err, out)
		return
	}
	for range 100 {
		if reachable() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Error("the failover redis did not come back")
}

func reachable() bool {
	c, err := net.DialTimeout("tcp", failoverAddr, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

func TestStoreFailure(t *testing.T) {
	ctx := context.Background()
	opt, err := redis.ParseURL(failoverURL())
	require.NoError(t, err)
	var dialErr error
	if !reachable() {
		dialErr = errors.New("connection refused")
	}
	testserver.Unreachable(t, "failover", failoverAddr, dialErr)
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	defer c.Close()
	sent := &counter{}
	c.AddHook(sent)

	mock := newMock(t0)
	const failures, cooldown = 3, 10 * time.Second
	lim, err := ratelimit.New(redisstore.New(c, redisstore.WithPrefix(uniquePrefix(t, c))), ratelimit.Limits{
		"open":   {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Minute, FailOpen: true},
		"closed": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Minute},
	}, ratelimit.WithClock(mock), ratelimit.WithBreaker(failures, cooldown))
	require.NoError(t, err)

	for _, name := range []string{"open", "closed"} {
		res, err := lim.Limit(ctx, name, "k")
		require.NoError(t, err)
		require.True(t, res.OK)
		require.False(t, res.Degraded)
	}

	stopFailover(t)
	t.Cleanup(func() { startFailover(t) })

	// Every call returns within its deadline, decided by its policy; after
	// `failures` of them the breaker stops asking the server.
	for i := range 2 * failures {
		for _, name := range []string{"open", "closed"} {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			before := sent.cmds.Load()
			res, err := lim.Limit(cctx, name, "k")
			require.NoError(t, cctx.Err(), "call %d of %s outlived its deadline", i, name)
			cancel()
			require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable, "call %d of %s", i, name)
			require.True(t, res.Degraded)
			require.Equal(t, name == "open", res.OK, "call %d: the %s policy decides", i, name)
			var serr *ratelimit.StoreError
			require.ErrorAs(t, err, &serr)
			asked := sent.cmds.Load() > before
			if i*2+boolInt(name == "closed") >= failures {
				require.False(t, asked, "call %d of %s: the breaker is open, the server must not be asked", i, name)
				require.Nil(t, serr.Err)
			} else {
				require.True(t, asked)
				require.Error(t, serr.Err, "the server's own error is visible")
			}
		}
	}

	startFailover(t)
	// Still within the cool-down: decided by policy without asking.
	res, err := lim.Limit(ctx, "closed", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.False(t, res.OK)
	// After it, a probe reaches the server, which answers: recovered, with
	// the same client and no help.
	mock.Add(cooldown + time.Millisecond)
	for _, name := range []string{"closed", "open"} {
		res, err = lim.Limit(ctx, name, "k")
		require.NoError(t, err, name)
		require.True(t, res.OK, name)
		require.False(t, res.Degraded, name)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
