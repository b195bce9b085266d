package redisstore_test

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// failLoads fails the first n FUNCTION LOADs with err, before they are
// sent, and counts the FCALLs and the loads sent.
type failLoads struct {
	err error
	ran bool // the failed loads are sent, and their answers replaced by err

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
				if h.ran {
					h.loads++
				}
				h.mu.Unlock()
				if h.ran {
					_ = next(ctx, cmd)
				}
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
		ran      bool
	}{
		{name: "pool timeout", err: redis.ErrPoolTimeout, fails: 2, ok: true, fcalls: 4, maxRetry: 3},
		{name: "pool timeout, no tries left", err: redis.ErrPoolTimeout, fails: 2, fcalls: 2, maxRetry: 1},
		{name: "refused", err: refusal("ERR the load broke"), fails: 1, fcalls: 1, maxRetry: 3},
		{name: "client closed", err: redis.ErrClosed, fails: 1, fcalls: 1, maxRetry: 3},
		// A read timeout leaves the load run or not: either way the call,
		// which Redis refused, goes again, and finds the library or loads
		// it once more.
		{name: "read timeout, load lost", err: readTimeout, fails: 1, ok: true, fcalls: 3, maxRetry: 3},
		{name: "read timeout, load ran", err: readTimeout, ran: true, fails: 1, ok: true, fcalls: 2, maxRetry: 3},
		{name: "read timeout, no tries left", err: readTimeout, fails: 2, fcalls: 2, maxRetry: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: tc.maxRetry})
			t.Cleanup(func() { c.Close() })
			require.NoError(t, c.FunctionFlush(ctx).Err())
			h := &failLoads{err: tc.err, n: tc.fails, ran: tc.ran}
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

// readTimeout is the error of a read that timed out, as go-redis gives it.
var readTimeout error = &net.OpError{Op: "read", Net: "tcp", Err: timeoutError{}}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// refusal is an answer of Redis's that refuses a command for what it is.
type refusal string

func (e refusal) Error() string { return string(e) }
func (refusal) RedisError()     {}

// killOnBusy kills the script the server is busy with (SCRIPT KILL, by
// killer) once a function call has been refused for it (BUSY), and counts
// the function calls and the refusals.
type killOnBusy struct {
	killer *redis.Client

	mu            sync.Mutex
	fcalls, busys int
}

func (h *killOnBusy) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *killOnBusy) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if strings.EqualFold(cmd.Name(), "fcall") {
			h.mu.Lock()
			h.fcalls++
			if redis.HasErrorPrefix(err, "BUSY ") {
				h.busys++
				if e := h.killer.ScriptKill(ctx).Err(); e != nil {
					panic(e)
				}
			}
			h.mu.Unlock()
		}
		return err
	}
}

func (h *killOnBusy) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A call that Redis refuses with BUSY, while it runs another's script past
// busy-reply-threshold, did not run: Redis answers BUSY before it runs a
// command. It goes again after a pause, as a call refused for the server's
// state does, within MaxRetries, and is charged once; it failed with BUSY.
func TestBusyServerSendsTheCallAgain(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		testserver.Unreachable(t, "redis-server", "PATH", err)
	}
	addr := ownServer(t, "--busy-reply-threshold", "10")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 3})
	t.Cleanup(func() { c.Close() })
	other := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: -1})
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}}
	mock := clock.NewMock()
	mock.Set(t0)
	lim, err := ratelimit.New(newStore(c, uniquePrefix(t, c)), limits, ratelimit.WithClock(mock))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "l", "k") // loads the library
	require.NoError(t, err)

	h := &killOnBusy{killer: redis.NewClient(&redis.Options{Addr: addr})}
	t.Cleanup(func() { h.killer.Close() })
	done := make(chan error, 1)
	go func() { done <- other.Eval(ctx, "while true do end", nil).Err() }()
	var evalErr error
	t.Cleanup(func() {
		h.killer.ScriptKill(context.Background()) // on a failure
		if done != nil {
			evalErr = <-done
		}
		other.Close()
	})
	for { // until the server is busy with it
		err := c.Ping(ctx).Err()
		if redis.HasErrorPrefix(err, "BUSY ") {
			break
		}
		require.NoError(t, err)
	}
	c.AddHook(h)
	d, err := lim.Limit(ctx, "l", "k")
	require.NoError(t, err, "a call Redis refused with BUSY failed, though it never ran")
	require.True(t, d.OK)
	require.Equal(t, 8.0, d.Remaining, "charged once for each of the two calls")
	evalErr, done = <-done, nil
	require.ErrorContains(t, evalErr, "killed")
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, 1, h.busys, "calls refused with BUSY")
	require.Equal(t, 2, h.fcalls, "FCALLs sent")
}
