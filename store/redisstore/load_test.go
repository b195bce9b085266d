package redisstore_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// failLoads fails the first n FUNCTION LOADs with err, before they are
// sent, and counts the FCALLs and the loads sent.
type failLoads struct {
	err error

	mu            sync.Mutex
	n             int
	fcalls, loads int
}

func (h *failLoads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failLoads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		h.mu.Lock()
		switch {
		case strings.EqualFold(cmd.Name(), "fcall"):
			h.fcalls++
		case strings.EqualFold(cmd.Name(), "function") && len(args) > 1 && strings.EqualFold(args[1].(string), "load"):
			if h.n > 0 {
				h.n--
				h.mu.Unlock()
				cmd.SetErr(h.err)
				return h.err
			}
			h.loads++
		}
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *failLoads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A call that finds the library missing, on a server that lost it, waits
// for the store to load it. When that load fails for a passing reason
// (here a pool timeout: no connection free, so nothing was sent), the
// call, which did not run (Redis refused it for the missing function),
// goes again after a pause, as a call Redis refused for its state does,
// within the client's MaxRetries; it failed with the load's error, though
// it never ran. A load that fails otherwise still fails the call, which
// is sent once.
func TestFailedLoadSendsTheCallAgain(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		testserver.Unreachable(t, "redis-server", "PATH", err)
	}
	addr := ownServer(t) // a server of its own: no library loaded
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, tc := range []struct {
		name     string
		err      error
		fails    int // loads that fail
		ok       bool
		fcalls   int
		maxRetry int
	}{
		{name: "pool timeout", err: redis.ErrPoolTimeout, fails: 2, ok: true, fcalls: 4, maxRetry: 3},
		{name: "pool timeout, no tries left", err: redis.ErrPoolTimeout, fails: 2, fcalls: 2, maxRetry: 1},
		{name: "other error", err: errors.New("the load broke"), fails: 1, fcalls: 1, maxRetry: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: tc.maxRetry})
			t.Cleanup(func() { c.Close() })
			require.NoError(t, c.FunctionFlush(ctx).Err())
			h := &failLoads{err: tc.err, n: tc.fails}
			c.AddHook(h)
			lim, err := ratelimit.New(newStore(c, uniquePrefix(t, c)), limits)
			require.NoError(t, err)
			_, err = lim.Limit(ctx, "l", "k")
			h.mu.Lock()
			defer h.mu.Unlock()
			if tc.ok {
				require.NoError(t, err, "a call that never ran failed with the library's load")
				require.Equal(t, 1, h.loads, "loads sent")
			} else {
				require.ErrorIs(t, err, tc.err)
				require.ErrorContains(t, err, "loading the function library")
			}
			require.Equal(t, tc.fcalls, h.fcalls, "FCALLs sent")
		})
	}
}
