package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
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
	testserver.LockServer(t, "redis-failover") // it stops and starts the server
	testserver.RequireReachable(t, "failover", failoverAddr)
	opt, err := redis.ParseURL(failoverURL())
	require.NoError(t, err)
	// Time enough for the first calls, which load the function library,
	// on a loaded machine; a stopped server refuses connections at once.
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 2*time.Second, 2*time.Second, 2*time.Second
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() }) // last: the test's keys are deleted first
	t.Cleanup(func() { startFailover(t) })
	storetest.StoreFailure(t, newStore(c, uniquePrefix(t, c)), stopFailover, startFailover)
}

// sentHook signals each FCALL as the client sends it.
type sentHook struct{ sent chan string }

func (h sentHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h sentHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "fcall" {
			select {
			case h.sent <- cmd.Name():
			default:
			}
		}
		return next(ctx, cmd)
	}
}

func (h sentHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestStalledServer stalls the server (CLIENT PAUSE) and requires every
// call to return when its context ends, by deadline or by cancel, alone
// or queued behind a call in flight, with coalescing on or off, on a
// client built with go-redis's defaults as docs/stores/redis.md shows.
func TestStalledServer(t *testing.T) {
	testserver.RequireReachable(t, "failover", failoverAddr)
	ctx := context.Background()
	hook := sentHook{sent: make(chan string, 1)}
	c := redis.NewClient(&redis.Options{Addr: failoverAddr})
	c.AddHook(hook)
	t.Cleanup(func() { c.Close() }) // last: the test's keys are deleted first
	prefix := uniquePrefix(t, c)
	newLimiter := func(opts ...redisstore.Option) *ratelimit.Limiter {
		store := newStore(c, prefix, opts...)
		lim, err := ratelimit.New(store, ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute}},
			ratelimit.WithBreaker(0, 0))
		require.NoError(t, err)
		_, err = lim.Limit(ctx, "l", "warm-up") // the library is loaded
		require.NoError(t, err)
		return lim
	}
	type call struct {
		name   string
		lim    *ratelimit.Limiter
		cancel bool // cancel the call rather than give it a deadline
	}
	queue := newLimiter()
	calls := []call{
		{"alone, deadline", newLimiter(), false},
		{"alone, canceled", newLimiter(), true},
		{"uncoalesced, deadline", newLimiter(redisstore.WithMaxBatch(1)), false},
		{"uncoalesced, canceled", newLimiter(redisstore.WithMaxBatch(1)), true},
		{"queued, deadline", queue, false},
		{"queued, canceled", queue, true},
	}
	for len(hook.sent) > 0 {
		<-hook.sent
	}

	// The pause ends well before go-redis's default read timeout (3 s),
	// so that the call held in flight is answered rather than timed out.
	const pause, wait = 2 * time.Second, 200 * time.Millisecond
	require.NoError(t, c.Do(ctx, "client", "pause", pause.Milliseconds(), "all").Err())
	// A call that holds the queue's round trip in flight, stalled with the
	// server: the queued calls wait behind it.
	blocked := make(chan error, 1)
	go func() {
		_, err := queue.Limit(ctx, "l", "k")
		blocked <- err
	}()
	<-hook.sent

	var wg sync.WaitGroup
	for _, cl := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Hour)
			if !cl.cancel {
				cctx, cancel = context.WithTimeout(ctx, wait)
			} else {
				time.AfterFunc(wait, cancel)
			}
			defer cancel()
			start := time.Now()
			_, err := cl.lim.Limit(cctx, "l", "k")
			took := time.Since(start)
			want := context.DeadlineExceeded
			if cl.cancel {
				want = context.Canceled
			}
			assert.ErrorIs(t, err, want, cl.name)
			assert.Less(t, took, pause-time.Second, "%s: returned after %v, not when its context ended", cl.name, took)
		}()
	}
	wg.Wait()

	// Once the server answers again, so does the store.
	require.NoError(t, <-blocked)
	for _, cl := range calls {
		res, err := cl.lim.Limit(ctx, "l", "after")
		require.NoError(t, err, cl.name)
		require.True(t, res.OK, cl.name)
	}
}

// stallProxy forwards loopback connections to the local Redis server and,
// once stalled, holds back every reply until unstalled: a server that
// stops answering, for the test's own connections only.
type stallProxy struct {
	ln      net.Listener
	target  string
	stalled atomic.Bool
	mu      sync.Mutex
	release chan struct{}
}

func newStallProxy(t *testing.T) *stallProxy {
	opt, err := redis.ParseURL(testserver.RedisURL(t))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{ln: ln, target: opt.Addr, release: make(chan struct{})}
	t.Cleanup(func() { p.unstall(); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

func (p *stallProxy) stall() {
	p.mu.Lock()
	p.release = make(chan struct{})
	p.mu.Unlock()
	p.stalled.Store(true)
}

func (p *stallProxy) unstall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled.CompareAndSwap(true, false) {
		close(p.release)
	}
}

func (p *stallProxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	defer c.Close()
	defer s.Close()
	go func() { _, _ = io.Copy(s, c) }()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if p.stalled.Load() {
				p.mu.Lock()
				rel := p.release
				p.mu.Unlock()
				<-rel
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestStalledServerValueAndReset: Value (Load), Reset (Delete) and the
// server's time (Now) return when their context ends from a server that
// stopped answering, on a client built with go-redis's defaults, as Limit
// does (TestStalledServer); go-redis alone would hold them until its read
// timeout (3 s).
func TestStalledServerValueAndReset(t *testing.T) {
	p := newStallProxy(t)
	c := redis.NewClient(&redis.Options{Addr: p.addr()})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.unstall) // first: the calls left in flight end, then the client closes
	store := newStore(c, uniquePrefix(t, client(t)))
	lim, err := ratelimit.New(store, ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Minute}},
		ratelimit.WithBreaker(0, 0))
	require.NoError(t, err)
	ctx := context.Background()
	_, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	_, err = lim.Value(ctx, "l", "k")
	require.NoError(t, err)

	p.stall()
	const wait = 200 * time.Millisecond
	var wg sync.WaitGroup
	for _, name := range []string{"Value", "Reset", "Now", "Limit"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			start := time.Now()
			var err error
			switch name {
			case "Value":
				_, err = lim.Value(cctx, "l", "k")
			case "Reset":
				err = lim.Reset(cctx, "l", "k")
			case "Now":
				_, err = store.Now(cctx)
			case "Limit":
				_, err = lim.Limit(cctx, "l", "k")
			}
			took := time.Since(start)
			assert.ErrorIs(t, err, context.DeadlineExceeded, name)
			assert.Less(t, took, time.Second, "%s with a %v deadline returned after %v, not when its context ended", name, wait, took)
		}()
	}
	wg.Wait()
}

// afterFcall calls fn once the client has sent a call of the function
// and read its reply.
type afterFcall struct{ fn func() }

func (h afterFcall) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h afterFcall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "fcall" {
			h.fn()
		}
		return err
	}
}

func (h afterFcall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestStalledServerApplyBatchAndCheckServer: docs/stores/redis.md promises
// that every call of the store returns when its context ends, whatever the
// client's settings. ApplyBatch and CheckServer must then return from a
// server that stopped answering when their context ends, not when
// go-redis's read timeout passes (never, on this client, which has none).
// The server is let go after 5 s whatever happens; each call must have
// returned while it was still stalled.
func TestStalledServerApplyBatchAndCheckServer(t *testing.T) {
	p := newStallProxy(t)
	c := redis.NewClient(&redis.Options{Addr: p.addr(), ReadTimeout: -1})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.unstall)
	store := newStore(c, uniquePrefix(t, client(t)))
	ctx := context.Background()
	p0 := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: 60_000, Capacity: 10}
	op := func() *driver.Op {
		return &driver.Op{Mode: driver.ModeLimit, Now: 1_700_000_000_000, Items: []driver.Item{
			{Name: "l", Key: "k", Count: 1, Shards: []driver.Shard{{Index: 0, Params: p0}}}}}
	}
	require.NoError(t, store.ApplyBatch(ctx, []*driver.Op{op()}, [][]driver.Decision{make([]driver.Decision, 1)}))

	for _, name := range []string{"CheckServer", "ApplyBatch"} {
		p.stall()
		release := time.AfterFunc(5*time.Second, p.unstall)
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		var err error
		switch name {
		case "ApplyBatch":
			err = store.ApplyBatch(cctx, []*driver.Op{op()}, [][]driver.Decision{make([]driver.Decision, 1)})
		case "CheckServer":
			_, err = store.CheckServer(cctx)
		}
		stalled := p.stalled.Load()
		cancel()
		release.Stop()
		p.unstall()
		require.True(t, stalled, "%s returned only once the server answered again (err %v)", name, err)
		require.ErrorIs(t, err, context.DeadlineExceeded, "%s on a stalled server", name)
	}
}

// TestStalledServerDenyCacheLearn: a Limit the store refuses, with the
// deny cache, reads the record back (Load) to keep it; a server that
// stalls right after the refusal must not keep the caller past its
// deadline.
func TestStalledServerDenyCacheLearn(t *testing.T) {
	p := newStallProxy(t)
	var armed atomic.Bool
	c := redis.NewClient(&redis.Options{Addr: p.addr()})
	c.AddHook(afterFcall{fn: func() {
		if armed.CompareAndSwap(true, false) {
			p.stall()
		}
	}})
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.unstall) // first: the calls left in flight end, then the client closes
	store := newStore(c, uniquePrefix(t, client(t)))
	lim, err := ratelimit.New(store, ratelimit.Limits{"l": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}},
		ratelimit.WithBreaker(0, 0), ratelimit.WithDenyCache(100))
	require.NoError(t, err)
	ctx := context.Background()
	res, err := lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	_, err = lim.Value(ctx, "l", "other") // a second pooled connection
	require.NoError(t, err)

	armed.Store(true)
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err = lim.Limit(cctx, "l", "k")
	took := time.Since(start)
	require.False(t, armed.Load(), "the call stalled the server")
	require.NoError(t, err)
	require.False(t, res.OK, "the store refused")
	require.Less(t, took, time.Second, "a refused Limit with a 200ms deadline returned after %v: the deny cache's read held it", took)
}

// ownServer starts a redis-server of the test's own on a free loopback
// port, keeping nothing on disk, with the further arguments given; it
// returns its address once it answers, and stops it at the test's end.
// Without redis-server on the PATH, the test is skipped (or fails, as
// testserver.Unreachable says).
func ownServer(t *testing.T, args ...string) (addr string) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		testserver.Unreachable(t, "redis-server", "PATH", err)
	}
	// A free port, at most 55535: a server of a Cluster listens on its
	// port + 10000 too (its bus), and refuses to start above that. Where
	// the system hands out ports above it (a range of 49152–65535, say),
	// another is asked for.
	var port string
	for try := 0; ; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr = l.Addr().String()
		require.NoError(t, l.Close())
		_, port, _ = net.SplitHostPort(addr)
		if n, _ := strconv.Atoi(port); n <= 55535 {
			break
		}
		require.Less(t, try, 100, "the system gave no free port up to 55535 in 100 tries")
	}
	args = append([]string{"--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args...)
	server := exec.Command("redis-server", args...)
	require.NoError(t, server.Start())
	t.Cleanup(func() {
		_ = server.Process.Kill()
		_ = server.Wait()
	})
	testserver.WaitReachable(t, addr, true)
	return addr
}

// TestWithoutFunctions runs the store on a server without Redis Functions,
// as Redis before 7 is (FCALL and FUNCTION unknown), started for the test:
// the store sends the same code as a script (EVALSHA), passes the
// conformance suite there, and fails only the op of a bad record in a
// batch (oneBadRecord).
func TestWithoutFunctions(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		testserver.Unreachable(t, "redis-server", "PATH", err)
	}
	addr := ownServer(t, "--rename-command", "FCALL", "", "--rename-command", "FCALL_RO", "", "--rename-command", "FUNCTION", "")

	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	storetest.Run(t, func(t *testing.T) ratelimit.Store { return newStore(c, uniquePrefix(t, c)) }, storetest.DifferentialRuns(5, 60))

	cnt := &counter{}
	c.AddHook(cnt)
	s := newStore(c, uniquePrefix(t, c))
	lim, err := ratelimit.New(s, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = lim.Limit(ctx, "l", "k") // finds out, FCALL then EVALSHA
	require.NoError(t, err)
	cnt.names = nil
	_, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.Equal(t, []string{"evalsha"}, cnt.names)

	oneBadRecord(t, c, newStore(c, uniquePrefix(t, c)), "good", "bad")
}

// cutter loses, once armed, the reply to the next call of the function a
// connection sends: the server runs the call, the client sees the
// connection drop, as when a network fails at the worst moment.
type cutter struct{ armed atomic.Bool }

func (c *cutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	return &cutConn{Conn: conn, c: c}, err
}

type cutConn struct {
	net.Conn
	c   *cutter
	cut bool
}

func (cc *cutConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("fcall")) && cc.c.armed.CompareAndSwap(true, false) {
		cc.cut = true
	}
	return cc.Conn.Write(b)
}

func (cc *cutConn) Read(b []byte) (int, error) {
	if !cc.cut {
		return cc.Conn.Read(b)
	}
	_, _ = cc.Conn.Read(b) // the server has run the call: drop its reply
	cc.Conn.Close()
	return 0, io.EOF
}

// TestRefundIsNeverSentTwice: go-redis sends a command again after a
// network error (MaxRetries), when it may have run already. A refund that
// ran twice would hand its tokens back twice, and a limit that ran twice
// would charge twice (and was sent again by each retry on a slow server),
// so the store forbids sending either again: the call fails, and may have
// been applied, once.
func TestRefundIsNeverSentTwice(t *testing.T) {
	ctx := context.Background()
	opt, err := redis.ParseURL(testserver.RedisURL(t))
	require.NoError(t, err)
	cut := &cutter{}
	opt.Dialer = cut.dial
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	s := newStore(c, uniquePrefix(t, c))
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour.Milliseconds(), Capacity: 100}
	now := t0.UnixMilli()
	apply := func(mode driver.Mode, count float64) (driver.Decision, error) {
		op := &driver.Op{Mode: mode, Now: now, Items: []driver.Item{{Name: "l", Key: "k", Count: count, At: now, Shards: []driver.Shard{{Params: p}}}}}
		out := make([]driver.Decision, 1)
		err := s.Apply(ctx, op, out)
		return out[0], err
	}
	value := func() float64 {
		recs := make([]driver.Record, 1)
		require.NoError(t, s.Load(ctx, []driver.RecordID{{Name: "l", Key: "k"}}, recs))
		return recs[0].State.Remaining
	}
	d, err := apply(driver.ModeLimit, 10)
	require.NoError(t, err)
	require.Equal(t, 90.0, d.Remaining)

	cut.armed.Store(true)
	_, err = apply(driver.ModeRefund, 5)
	require.Error(t, err, "the refund's reply was lost, and it was not sent again")
	require.False(t, cut.armed.Load(), "the cut happened")
	require.Equal(t, 95.0, value(), "the refund ran once")

	cut.armed.Store(true)
	_, err = apply(driver.ModeLimit, 1)
	require.Error(t, err, "the limit's reply was lost, and it was not sent again")
	require.False(t, cut.armed.Load(), "the cut happened")
	require.Equal(t, 94.0, value(), "the limit ran once")
}

// refuser answers, once armed, the next calls of the function (as many
// as armed says) the connections send with reply, in place of the server,
// which never sees them: as a server answers a write it does not run
// (LOADING, READONLY).
type refuser struct {
	armed atomic.Int32
	reply string
}

func (r *refuser) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	return &refuseConn{Conn: conn, r: r}, err
}

// take reports whether the refuser is armed, and arms it for one call
// fewer.
func (r *refuser) take() bool {
	for {
		n := r.armed.Load()
		if n <= 0 {
			return false
		}
		if r.armed.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

type refuseConn struct {
	net.Conn
	r       *refuser
	pending []byte
}

func (rc *refuseConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("fcall")) && rc.r.take() {
		rc.pending = []byte(rc.r.reply)
		return len(b), nil
	}
	return rc.Conn.Write(b)
}

func (rc *refuseConn) Read(b []byte) (int, error) {
	if len(rc.pending) > 0 {
		n := copy(b, rc.pending)
		rc.pending = rc.pending[n:]
		return n, nil
	}
	return rc.Conn.Read(b)
}

// TestUnsentCallGoesAgain: a call that Redis answered without running it
// (a dataset loading, a replica) goes again, as go-redis would send it,
// although go-redis sends no call of the store's again: it runs once.
func TestUnsentCallGoesAgain(t *testing.T) {
	ctx := context.Background()
	for _, reply := range []string{"-LOADING Redis is loading the dataset in memory\r\n", "-READONLY You can't write against a read only replica.\r\n"} {
		opt, err := redis.ParseURL(testserver.RedisURL(t))
		require.NoError(t, err)
		ref := &refuser{reply: reply}
		opt.Dialer = ref.dial
		c := redis.NewClient(opt)
		t.Cleanup(func() { c.Close() })
		lim, err := ratelimit.New(newStore(c, uniquePrefix(t, c)), ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}})
		require.NoError(t, err)
		ref.armed.Store(1)
		res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(3))
		require.NoError(t, err, reply)
		require.Zero(t, ref.armed.Load(), "the refusal happened")
		require.Equal(t, 7.0, res.Remaining, "%s: the call ran once", reply)
	}

	// On a Cluster, as often as MaxRedirects allow.
	ref := &refuser{reply: "-TRYAGAIN Multiple keys request during rehashing of slot\r\n"}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ","), Dialer: ref.dial})
	t.Cleanup(func() { c.Close() })
	lim, err := ratelimit.New(newStore(c, uniquePrefix(t, c)), ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}})
	require.NoError(t, err)
	ref.armed.Store(1)
	res, err := lim.Limit(ctx, "l", "k", ratelimit.Count(3))
	require.NoError(t, err, "TRYAGAIN")
	require.Zero(t, ref.armed.Load(), "the refusal happened")
	require.Equal(t, 7.0, res.Remaining, "TRYAGAIN: the call ran once")
}

// panicHook panics in every command and pipeline the client sends while
// armed, as an application's hook might.
type panicHook struct{ armed *atomic.Bool }

func (h panicHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h panicHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() {
			panic("hook failed")
		}
		return next(ctx, cmd)
	}
}

func (h panicHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.Load() {
			panic("hook failed")
		}
		return next(ctx, cmds)
	}
}

// TestDetachedPanicGoesToItsCaller: ApplyBatch, Load and CheckServer make
// their round trips on another goroutine when their context can end. A
// panic there (in a hook of the application's) must go on to the caller,
// as it does when the round trip runs on the caller's goroutine
// (context.Background()), rather than end the process where nobody can
// recover it.
func TestDetachedPanicGoesToItsCaller(t *testing.T) {
	c := client(t)
	armed := new(atomic.Bool)
	c.AddHook(panicHook{armed: armed})
	store := newStore(c, uniquePrefix(t, c))
	p0 := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: 60_000, Capacity: 10}
	op := &driver.Op{Mode: driver.ModeLimit, Now: t0.UnixMilli(), Items: []driver.Item{
		{Name: "l", Key: "k", Count: 1, Shards: []driver.Shard{{Index: 0, Params: p0}}}}}
	calls := map[string]func(ctx context.Context) error{
		"ApplyBatch": func(ctx context.Context) error {
			return store.ApplyBatch(ctx, []*driver.Op{op}, [][]driver.Decision{make([]driver.Decision, 1)})
		},
		"Load": func(ctx context.Context) error {
			return store.Load(ctx, []driver.RecordID{{Name: "l", Key: "k"}}, make([]driver.Record, 1))
		},
		"CheckServer": func(ctx context.Context) error {
			_, err := store.CheckServer(ctx)
			return err
		},
	}
	for name, call := range calls {
		for _, canEnd := range []bool{false, true} {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if canEnd {
				ctx, cancel = context.WithCancel(ctx)
			}
			armed.Store(true)
			assert.PanicsWithValue(t, "hook failed", func() { _ = call(ctx) }, "%s, context can end: %v", name, canEnd)
			armed.Store(false)
			cancel()
			require.NoError(t, call(context.Background()), "%s after a panic", name)
		}
	}
}

// flakyDialer fails, once armed, the next dial and loses the replies of
// the calls of the function the next connection it makes sends in one
// write: the server runs them, the client sees the connection drop. The
// connections it made before arming are reported dead to the pool, which
// then dials anew.
type flakyDialer struct {
	mu    sync.Mutex
	gen   int  // connections of an earlier generation are dead
	fail  bool // fail the next dial
	cut   bool // cut the next connection made
	dials int  // dials failed
}

func (d *flakyDialer) arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	d.fail, d.cut = true, true
}

func (d *flakyDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail {
		d.fail = false
		d.dials++
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	fc := &flakyConn{Conn: conn, d: d, gen: d.gen, cut: d.cut}
	d.cut = false
	return fc, nil
}

type flakyConn struct {
	net.Conn
	d       *flakyDialer
	gen     int
	cut     bool
	pending int    // replies to read before the connection drops
	got     []byte // what the server answered meanwhile
}

// SyscallConn lets the pool check the connection's health, as it does
// a TCP connection's: one of an earlier generation than the dialer's is
// dead.
func (fc *flakyConn) SyscallConn() (syscall.RawConn, error) {
	fc.d.mu.Lock()
	dead := fc.gen < fc.d.gen
	fc.d.mu.Unlock()
	if dead {
		return nil, net.ErrClosed
	}
	return fc.Conn.(*net.TCPConn).SyscallConn()
}

func (fc *flakyConn) Write(b []byte) (int, error) {
	if fc.cut {
		fc.pending += bytes.Count(bytes.ToLower(b), []byte("$5\r\nfcall\r\n"))
	}
	return fc.Conn.Write(b)
}

func (fc *flakyConn) Read(b []byte) (int, error) {
	if fc.pending == 0 {
		return fc.Conn.Read(b)
	}
	// Read every reply, so that the server has surely run every call,
	// then drop them all.
	buf := make([]byte, 4096)
	for replies(fc.got) < fc.pending {
		n, err := fc.Conn.Read(buf)
		fc.got = append(fc.got, buf[:n]...)
		if err != nil {
			break
		}
	}
	fc.Conn.Close()
	return 0, io.EOF
}

// replies counts the whole RESP2 replies in b: errors, simple strings,
// integers and bulk strings, which are all the function answers.
func replies(b []byte) int {
	n := 0
	for len(b) > 0 {
		line := bytes.Index(b, []byte("\r\n"))
		if line < 0 {
			return n
		}
		next := line + 2
		if b[0] == '$' {
			size, err := strconv.Atoi(string(b[1:line]))
			if err != nil {
				return n
			}
			if size >= 0 {
				next += size + 2
			}
		}
		if next > len(b) {
			return n
		}
		b = b[next:]
		n++
	}
	return n
}

// armOnBadRecord calls arm (a dialer's) once, when a call of the function
// first fails on a bad record.
type armOnBadRecord struct {
	arm  func()
	once sync.Once
}

func (h *armOnBadRecord) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *armOnBadRecord) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "fcall" && err != nil && strings.Contains(err.Error(), "BADRECORD") {
			h.once.Do(h.arm)
		}
		return err
	}
}

func (h *armOnBadRecord) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestClusterPipelineCallNeverSentTwice: the Cluster client sends a
// pipeline again, within one Pipelined, to the calls it could not send
// (no connection) or that a node redirected (MOVED, ASK); when that second
// send loses its replies, a call keeps the error of the first, which says
// that it did not run, though it may have now. The store must not take
// such an error at its word and send the call once more: here the ops of
// a batch that failed on a bad record go again one per call, pipelined;
// the first send finds no connection, the second loses the replies of
// calls the server ran. Each op must be applied at most once.
func TestClusterPipelineCallNeverSentTwice(t *testing.T) {
	d := &flakyDialer{}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testserver.ClusterAddrs(t), ","),
		Dialer: d.dial, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	pipelineCallsNeverSentTwice(t, c, d.arm)
	d.mu.Lock()
	require.Equal(t, 1, d.dials, "a dial failed")
	d.mu.Unlock()
}

// pipelineCallsNeverSentTwice applies a batch of two ops on c (a client
// whose dialer arm makes the next connections fail as the test wants),
// then the same ops behind one on a bad record, which sends them again
// one per call, pipelined, once arm has been called: every op's answer is
// lost, and each op must have been applied once, by the batch that lost
// its reply, never twice. The batch's error says that the first may have
// been decided and charged, and is no *driver.OpError, which says that
// its op was not decided (it joined one for each op).
func pipelineCallsNeverSentTwice(t *testing.T, c redis.UniversalClient, arm func()) {
	t.Helper()
	ctx := context.Background()
	store := newStore(c, uniquePrefix(t, c))
	p := driver.Params{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour.Milliseconds(), Capacity: 100}
	now := t0.UnixMilli()
	ops := []*driver.Op{
		oneItemOp(driver.ModeLimit, now, "a", "k", 1, p),
		oneItemOp(driver.ModeLimit, now, "b", "k", 1, p),
	}
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1), make([]driver.Decision, 1)}
	require.NoError(t, store.ApplyBatch(ctx, ops, outs[:2])) // the library is loaded, a connection pooled
	require.NoError(t, c.Set(ctx, store.Key(driver.RecordID{Name: "bad", Key: "k"}), "garbage", 0).Err())
	c.AddHook(&armOnBadRecord{arm: arm})

	err := store.ApplyBatch(ctx, append([]*driver.Op{oneItemOp(driver.ModeLimit, now, "bad", "k", 1, p)}, ops...), outs)
	var oe *driver.OpError
	require.False(t, errors.As(err, &oe), "%v: every op's answer was lost, and an *OpError says that its op was not decided", err)
	require.ErrorContains(t, err, "redisstore: apply batch: op 0 of the batch: the op may have been decided and charged, its answer lost: ")
	recs := make([]driver.Record, 2)
	require.NoError(t, store.Load(ctx, []driver.RecordID{{Name: "a", Key: "k"}, {Name: "b", Key: "k"}}, recs))
	for i, r := range recs {
		require.Equal(t, 98.0, r.State.Remaining, "op %d was applied once by the batch that lost its reply (err: %v)", i, err)
	}
}
