package ratelimitgrpc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// logLines reads the JSON lines of a slog.JSONHandler: each line's
// message and, if it has one, its suppressed count.
func logLines(t *testing.T, buf *bytes.Buffer) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec struct {
			Msg        string `json:"msg"`
			Suppressed *int64 `json:"suppressed"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		if rec.Suppressed != nil {
			rec.Msg += fmt.Sprintf(" suppressed=%d", *rec.Suppressed)
		}
		out = append(out, rec.Msg)
	}
	return out
}

const (
	refusedLine  = "ratelimitgrpc: call refused: the store is unavailable and the limits fail closed"
	answeredLine = "ratelimitgrpc: the store answers again; calls refused while it was unavailable were not all logged"
)

// storeDown returns an interceptor of a fail-closed limit over a store
// that fails while its down is set, as it is at first; the mock clock of
// the Limiter, its breaker and the interceptor's log; and the log.
func storeDown(t *testing.T, opts ...ratelimit.Option) (*ratelimitgrpc.Interceptor, *flakyStore, *clock.Mock, *bytes.Buffer) {
	t.Helper()
	mock := clock.NewMock()
	store := &flakyStore{Store: must(memstore.New())}
	store.down.Store(true)
	lim, err := ratelimit.New(store, ratelimit.Limits{"api": {Kind: ratelimit.TokenBucket, Rate: 1000, Period: time.Second}},
		append([]ratelimit.Option{ratelimit.WithClock(mock), ratelimit.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
	require.NoError(t, err)
	var logs bytes.Buffer
	ic, err := ratelimitgrpc.New(lim, []string{"api"}, ratelimitgrpc.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	require.NoError(t, err)
	ratelimitgrpc.SetLogClock(ic, mock)
	return ic, store, mock, &logs
}

// With the store down and the breaker open, every call of a fail-closed
// limit is refused at once; each refusal was logged at Warn, a line a
// call. The first is logged, then one line a second at most, with the
// count of the refusals not logged since the line before, and the count
// of the end of the outage once the store answers again.
func TestStoreRefusalsLoggedOnceASecond(t *testing.T) {
	ic, store, mock, logs := storeDown(t)
	unary := ic.Unary()
	call := func() codes.Code {
		_, err := unary(withPeer(&net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 1}), nil, &grpc.UnaryServerInfo{FullMethod: checkMethod},
			func(context.Context, any) (any, error) { return "ok", nil })
		return status.Code(err)
	}
	calls := func(n int, want codes.Code) {
		t.Helper()
		for range n {
			require.Equal(t, want, call())
		}
	}

	calls(100, codes.Unavailable) // t0: the breaker opens after 5
	assert.Equal(t, []string{refusedLine + " suppressed=0"}, logLines(t, logs), "the first refusal only")
	mock.Add(999 * time.Millisecond)
	calls(50, codes.Unavailable)
	assert.Len(t, logLines(t, logs), 1, "no line within a second")
	mock.Add(time.Millisecond)
	calls(30, codes.Unavailable) // t1 s
	assert.Equal(t, []string{refusedLine + " suppressed=0", refusedLine + " suppressed=149"}, logLines(t, logs))
	assert.Contains(t, logs.String(), `"method":"`+checkMethod+`"`)
	assert.Contains(t, logs.String(), "connection refused", "the store's error is logged")

	// The store answers again: the 29 refusals not logged are counted,
	// once.
	store.down.Store(false)
	mock.Add(time.Second) // t2 s: the breaker's cool-down ends, a probe goes through
	calls(3, codes.OK)
	assert.Equal(t, []string{refusedLine + " suppressed=0", refusedLine + " suppressed=149", answeredLine + " suppressed=29"}, logLines(t, logs))
	mock.Add(time.Hour)
	calls(3, codes.OK)
	assert.Len(t, logLines(t, logs), 3, "nothing more to count")

	// The next outage's first refusal is logged at once, counting nothing
	// of the last.
	store.down.Store(true)
	calls(20, codes.Unavailable)
	assert.Equal(t, refusedLine+" suppressed=0", logLines(t, logs)[3])
	assert.Len(t, logLines(t, logs), 4)
}

// The store answers again less than a second after the last line: the
// count waits for the second to pass, then is written once.
func TestStoreRefusalsCountedAfterOutage(t *testing.T) {
	ic, store, mock, logs := storeDown(t, ratelimit.WithBreaker(0, 0)) // every call asks the store
	ctx := withPeer(&net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 1})
	for range 10 {
		require.Equal(t, codes.Unavailable, status.Code(ic.Limit(ctx)))
	}
	store.down.Store(false)
	for range 3 {
		mock.Add(333 * time.Millisecond)
		require.NoError(t, ic.Limit(ctx))
		assert.Equal(t, []string{refusedLine + " suppressed=0"}, logLines(t, logs), "at %v", mock.Now().Sub(time.Unix(0, 0)))
	}
	mock.Add(time.Millisecond)
	for range 3 {
		require.NoError(t, ic.Limit(ctx))
	}
	assert.Equal(t, []string{refusedLine + " suppressed=0", answeredLine + " suppressed=9"}, logLines(t, logs))
}

// Refusals from many goroutines at once are each logged or counted, once.
func TestStoreRefusalsCountedConcurrently(t *testing.T) {
	ic, store, mock, logs := storeDown(t)
	ctx := withPeer(&net.TCPAddr{IP: net.IPv4(203, 0, 113, 7), Port: 1})
	const goroutines, each = 8, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if g == 0 && i%50 == 0 {
					mock.Add(250 * time.Millisecond)
				}
				assert.Equal(t, codes.Unavailable, status.Code(ic.Limit(ctx)))
			}
		}()
	}
	wg.Wait()
	store.down.Store(false)
	mock.Add(time.Hour)
	require.NoError(t, ic.Limit(ctx))
	var logged, suppressed int64
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			Msg        string `json:"msg"`
			Suppressed int64  `json:"suppressed"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		if rec.Msg == refusedLine {
			logged++
		}
		suppressed += rec.Suppressed
	}
	assert.Equal(t, int64(goroutines*each), logged+suppressed, "every refusal logged or counted, once")
	assert.LessOrEqual(t, logged, int64(2), "the first line, and one a second of the mock time after (1 s)")
}
