package ratelimitgrpc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	refusedLine      = "ratelimitgrpc: call refused: the store is unavailable and the limits fail closed"
	refusalsOverLine = "ratelimitgrpc: calls refused while the store was unavailable were not all logged"
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
	assert.Equal(t, []string{refusedLine + " suppressed=0", refusedLine + " suppressed=149", refusalsOverLine + " suppressed=29"}, logLines(t, logs))
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
	assert.Equal(t, []string{refusedLine + " suppressed=0", refusalsOverLine + " suppressed=9"}, logLines(t, logs))
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

const (
	notDecidedLine   = "ratelimitgrpc: call not decided"
	deadlineOverLine = "ratelimitgrpc: calls whose deadline passed while they were decided were not all logged"
	internalOverLine = "ratelimitgrpc: calls not decided for an internal error were not all logged"
)

// brokenKey marks the calls whose KeyFunc fails.
type brokenKey struct{}

// The contexts of the calls of TestNotDecidedLoggedOnceASecond: a caller
// whose deadline passed, one that went away, one the KeyFunc cannot key.
var (
	expired = func() context.Context {
		ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
		cancel() // its error stays DeadlineExceeded
		return ctx
	}()
	canceled = func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}()
	broken = context.WithValue(context.Background(), brokenKey{}, true)
)

// notDecided returns a function that makes a call with a context, to an
// interceptor whose KeyFunc fails for the broken ones and which logs at
// level as JSON, the interceptor's log clock and its log.
func notDecided(t *testing.T, level slog.Level) (call func(ctx context.Context) codes.Code, mock *clock.Mock, logs *bytes.Buffer) {
	t.Helper()
	mock = clock.NewMock()
	lim := newLimiter(t, nil, mock, ratelimit.Limits{"api": {Kind: ratelimit.TokenBucket, Rate: 1e6, Period: time.Second}})
	logs = new(bytes.Buffer)
	ic, err := ratelimitgrpc.New(lim, []string{"api"},
		ratelimitgrpc.WithLogger(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: level}))),
		ratelimitgrpc.WithKey(func(ctx context.Context) (string, error) {
			if ctx.Value(brokenKey{}) != nil {
				return "", errors.New("tenant lookup: dial 10.1.2.3:5432: connection refused")
			}
			return "svc", nil
		}))
	require.NoError(t, err)
	ratelimitgrpc.SetLogClock(ic, mock)
	unary := ic.Unary()
	return func(ctx context.Context) codes.Code {
		_, err := unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod},
			func(context.Context, any) (any, error) { return "ok", nil })
		return status.Code(err)
	}, mock, logs
}

// A flood of callers whose deadline passes, or of calls a broken KeyFunc
// cannot key, was logged a line a call, at Warn and at Error. Each kind
// is logged as the refusals of an unavailable store are: the first line,
// then one a second at most with the count of those not logged, and a
// last count once the flood is over; a flood of one kind never holds
// back the other's first line.
func TestNotDecidedLoggedOnceASecond(t *testing.T) {
	call, mock, logs := notDecided(t, slog.LevelInfo)
	calls := func(n int, ctx context.Context, want codes.Code) {
		t.Helper()
		for range n {
			require.Equal(t, want, call(ctx))
		}
	}
	ok := context.Background()

	calls(100, expired, codes.DeadlineExceeded) // t0
	calls(100, broken, codes.Internal)
	assert.Equal(t, []string{notDecidedLine + " suppressed=0", notDecidedLine + " suppressed=0"}, logLines(t, logs),
		"the first of each kind only")
	assert.Contains(t, logs.String(), `"level":"WARN","msg":"`+notDecidedLine+`","method":"`+checkMethod+`","code":"DeadlineExceeded"`)
	assert.Contains(t, logs.String(), `"level":"ERROR","msg":"`+notDecidedLine+`","method":"`+checkMethod+`","code":"Internal"`)
	assert.Contains(t, logs.String(), "connection refused", "the error is logged")
	mock.Add(999 * time.Millisecond)
	calls(50, expired, codes.DeadlineExceeded)
	calls(50, broken, codes.Internal)
	calls(5, ok, codes.OK) // the floods go on: no last count yet
	assert.Len(t, logLines(t, logs), 2, "no line within a second")
	mock.Add(time.Millisecond)
	calls(30, expired, codes.DeadlineExceeded) // t1 s
	calls(20, broken, codes.Internal)
	assert.Equal(t, []string{notDecidedLine + " suppressed=0", notDecidedLine + " suppressed=0",
		notDecidedLine + " suppressed=149", notDecidedLine + " suppressed=149"}, logLines(t, logs))

	// The floods are over: a second after the last line not written, the
	// count of their end is written, once.
	mock.Add(999 * time.Millisecond)
	calls(3, ok, codes.OK)
	assert.Len(t, logLines(t, logs), 4, "a line not written less than a second ago")
	mock.Add(time.Millisecond)
	calls(3, ok, codes.OK)
	assert.Equal(t, []string{deadlineOverLine + " suppressed=29", internalOverLine + " suppressed=19"}, logLines(t, logs)[4:])
	mock.Add(time.Hour)
	calls(3, ok, codes.OK)
	assert.Len(t, logLines(t, logs), 6, "nothing more to count")

	// The next flood's first line is written at once.
	calls(10, expired, codes.DeadlineExceeded)
	assert.Equal(t, []string{notDecidedLine + " suppressed=0"}, logLines(t, logs)[6:])
	assert.Len(t, logLines(t, logs), 7)
}

// The lines of the client's doing, a call canceled or carrying no key,
// are at Debug: written for each call, when Debug is enabled.
func TestNotDecidedDebugEachCall(t *testing.T) {
	call, _, logs := notDecided(t, slog.LevelDebug)
	for range 3 {
		require.Equal(t, codes.Canceled, call(canceled))
	}
	assert.Equal(t, []string{notDecidedLine, notDecidedLine, notDecidedLine}, logLines(t, logs))
}

// A level the logger does not enable neither writes nor counts a line.
func TestNotDecidedLevelDisabled(t *testing.T) {
	call, mock, logs := notDecided(t, slog.LevelError)
	for range 3 {
		require.Equal(t, codes.DeadlineExceeded, call(expired))
	}
	mock.Add(time.Hour)
	require.Equal(t, codes.OK, call(context.Background()))
	assert.Empty(t, logLines(t, logs), "Warn is not enabled: no line, no count")
}

// The count of a flood's end was written by the first call decided a
// second after it: late, or never when no call came. It is written a
// second after the last line not written, call or none, each kind on its
// own time.
func TestFloodCountWrittenWithoutACall(t *testing.T) {
	call, mock, logs := notDecided(t, slog.LevelInfo)
	calls := func(n int, ctx context.Context, want codes.Code) {
		t.Helper()
		for range n {
			require.Equal(t, want, call(ctx))
		}
	}
	calls(10, expired, codes.DeadlineExceeded) // t0
	calls(5, broken, codes.Internal)
	mock.Add(500 * time.Millisecond)
	calls(10, expired, codes.DeadlineExceeded) // the deadlines' flood goes on
	require.Equal(t, []string{notDecidedLine + " suppressed=0", notDecidedLine + " suppressed=0"}, logLines(t, logs))

	mock.Add(499 * time.Millisecond)
	require.Len(t, logLines(t, logs), 2, "at 999 ms, within a second of both floods")
	mock.Add(time.Millisecond)
	require.Equal(t, []string{internalOverLine + " suppressed=4"}, logLines(t, logs)[2:], "at 1 s, a second after the internal errors'")
	mock.Add(499 * time.Millisecond)
	require.Len(t, logLines(t, logs), 3, "at 1.499 s, within a second of the last deadline")
	mock.Add(time.Millisecond)
	require.Equal(t, []string{deadlineOverLine + " suppressed=19"}, logLines(t, logs)[3:], "at 1.5 s")
	mock.Add(time.Hour)
	require.Len(t, logLines(t, logs), 4, "nothing more to count")

	// The next flood's first line is written at once, its count a second
	// after its last line not written.
	calls(3, expired, codes.DeadlineExceeded)
	require.Equal(t, []string{notDecidedLine + " suppressed=0"}, logLines(t, logs)[4:])
	mock.Add(time.Second)
	require.Equal(t, []string{notDecidedLine + " suppressed=0", deadlineOverLine + " suppressed=2"}, logLines(t, logs)[4:])
}
