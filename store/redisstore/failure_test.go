package redisstore_test

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
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
	// A server that shuts down closes the connection, which redis-cli may
	// report as an error: what counts is that it is down.
	_ = exec.Command("redis-cli", "-h", "127.0.0.1", "-p", "6390", "shutdown", "nosave").Run()
	testserver.WaitReachable(t, failoverAddr, false)
}

func startFailover(t *testing.T) {
	if testserver.Reachable(failoverAddr) {
		return
	}
	out, err := exec.Command("redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6390",
		"--save", "", "--appendonly", "no", "--dir", "/tmp", "--logfile", "/tmp/ratelimit-failover-redis.log").CombinedOutput()
	require.NoError(t, err, "restarting the failover redis: %s", out)
	testserver.WaitReachable(t, failoverAddr, true)
}

func TestStoreFailure(t *testing.T) {
	testserver.RequireReachable(t, "failover", failoverAddr)
	opt, err := redis.ParseURL(failoverURL())
	require.NoError(t, err)
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	defer c.Close()
	t.Cleanup(func() { startFailover(t) })
	storetest.StoreFailure(t, redisstore.New(c, redisstore.WithPrefix(uniquePrefix(t, c))), stopFailover, startFailover)
}
