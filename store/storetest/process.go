package storetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/require"
)

// childEnv carries a child's orders from MultiProcess to the re-run test
// binary.
const childEnv = "RATELIMIT_STORETEST_CHILD"

// grantedLine prefixes the line a child prints with its count.
const grantedLine = "storetest-granted "

type childOrders struct {
	Key        string `json:"key"`
	NowMS      int64  `json:"now"`
	Goroutines int    `json:"goroutines"`
	Calls      int    `json:"calls"`
	StartAtNS  int64  `json:"startAt"` // wall clock, so that the children overlap
	// Reserve runs reserveRun instead of Hammer, with calls StepUS
	// microseconds apart.
	Reserve bool  `json:"reserve,omitempty"`
	StepUS  int64 `json:"step,omitempty"`
	// Tokens, when set, are settled by every goroutine of the child, each
	// by Refund or Use (by its index), and the child prints those it won.
	Tokens []string `json:"tokens,omitempty"`
}

// settledLine prefixes the line a settling child prints with the indexes
// of the tokens it settled and how (JSON: index → "cancel" or "use").
const settledLine = "storetest-settled "

// jobsLine prefixes the line a reserving child prints with its jobs per
// window, as JSON.
const jobsLine = "storetest-jobs "

// multiProcessLimits is the limit every process of MultiProcess calls.
var multiProcessLimits = ratelimit.Limits{
	"mp": {Kind: ratelimit.FixedWindow, Rate: 50, Period: time.Second, Capacity: 80, Start: time.UnixMilli(0)},
}

// MultiProcess checks exactness across OS processes: procs copies of the
// test binary, each with 16 goroutines, hammer one key of a shared store
// (a server) at once, over three windows, and together must grant exactly
// what the math allows: the capacity in the first window, the rate in each
// later one.
//
// open must return a store on the same shared data every time it is
// called, in this process and in the children (same server, same prefix
// or table). Call MultiProcess from the test that t names: the children
// re-run exactly that test (with -test.run), find their orders in the
// environment, hammer, print their count and return.
func MultiProcess(t *testing.T, open NewStore, procs int) {
	if orders := os.Getenv(childEnv); orders != "" {
		runChild(t, open, orders)
		return
	}
	ctx := context.Background()
	key := fmt.Sprintf("multiprocess-%d", time.Now().UnixNano())
	pattern := runPattern(t.Name())
	for w := range 3 {
		now := epoch.Add(time.Duration(w) * time.Second)
		orders := childOrders{Key: key, NowMS: now.UnixMilli(), Goroutines: 16, Calls: 3,
			StartAtNS: time.Now().Add(700 * time.Millisecond).UnixNano()}
		children, outs := startChildren(t, ctx, pattern, orders, procs)
		granted := 0
		for i, cmd := range children {
			err := cmd.Wait()
			require.NoError(t, err, "child %d failed:\n%s", i, outs[i])
			n, ok := parseGranted(outs[i].Bytes())
			require.True(t, ok, "child %d printed no count:\n%s", i, outs[i])
			granted += n
		}
		want := 50
		if w == 0 {
			want = 80
		}
		require.Equal(t, want, granted, "window %d: %d processes together", w, procs)
	}
	// The record holds what the processes left: nothing, in the last window.
	lim, err := ratelimit.New(open(t), multiProcessLimits, ratelimit.WithClock(newMock(epoch.Add(2*time.Second))))
	require.NoError(t, err)
	st, err := lim.Value(ctx, "mp", key)
	require.NoError(t, err)
	require.Equal(t, 0.0, st.Remaining)

	// Sharded reservations from every process: no window may have more
	// jobs scheduled into it than the limit grants.
	// 160 calls a second together (the limit grants 100), for 12 s.
	orders := childOrders{Key: key + "-reserve", NowMS: epoch.UnixMilli(), Goroutines: 8, Calls: 240 / procs,
		StartAtNS: time.Now().Add(700 * time.Millisecond).UnixNano(), Reserve: true, StepUS: 6250 * int64(procs)}
	children, outs := startChildren(t, ctx, pattern, orders, procs)
	jobs := map[int64]int{}
	for i, cmd := range children {
		require.NoError(t, cmd.Wait(), "child %d failed:\n%s", i, outs[i])
		got, ok := parseJobs(outs[i].Bytes())
		require.True(t, ok, "child %d printed no jobs:\n%s", i, outs[i])
		for w, n := range got {
			jobs[w] += n
		}
	}
	checkJobs(t, jobs, fmt.Sprintf("%d processes", procs))

	multiProcessSettle(t, open, procs, key+"-settle", pattern)
}

// multiProcessSettle has procs processes race to settle the same tokens:
// each token must be settled by exactly one goroutine of one process, and
// the limit must hold what the canceled ones gave back, once each.
func multiProcessSettle(t *testing.T, open NewStore, procs int, key, pattern string) {
	ctx := context.Background()
	lim, err := ratelimit.New(open(t), settleLimits, ratelimit.WithClock(newMock(epoch)))
	require.NoError(t, err)
	var tokens []string
	for range 30 {
		r, err := lim.Reserve(ctx, "jobs", key, ratelimit.Count(2))
		require.NoError(t, err)
		require.True(t, r.OK())
		tokens = append(tokens, r.Token().String())
	}
	before, err := lim.Value(ctx, "jobs", key)
	require.NoError(t, err)
	orders := childOrders{Key: key, NowMS: epoch.UnixMilli(), Goroutines: 8, Tokens: tokens,
		StartAtNS: time.Now().Add(700 * time.Millisecond).UnixNano()}
	children, outs := startChildren(t, ctx, pattern, orders, procs)
	wins := make(map[int]int)
	back := 0.0
	for i, cmd := range children {
		require.NoError(t, cmd.Wait(), "child %d failed:\n%s", i, outs[i])
		got, ok := parseSettled(outs[i].Bytes())
		require.True(t, ok, "child %d printed no settlements:\n%s", i, outs[i])
		for idx, how := range got {
			wins[idx]++
			if how == "cancel" {
				back += 2
			}
		}
	}
	for i := range tokens {
		require.Equal(t, 1, wins[i], "token %d settled %d times by %d processes", i, wins[i], procs)
	}
	after, err := lim.Value(ctx, "jobs", key)
	require.NoError(t, err)
	require.Equal(t, before.Remaining+back, after.Remaining, "the canceled tokens came back once each")
}

// settleRun settles every token from goroutines goroutines of one
// Limiter, and returns those this process won, and how.
func settleRun(ctx context.Context, store ratelimit.Store, now time.Time, goroutines int, texts []string) (map[int]string, error) {
	lim, err := ratelimit.New(store, settleLimits, ratelimit.WithClock(newMock(now)))
	if err != nil {
		return nil, err
	}
	tokens := make([]*ratelimit.Token, len(texts))
	for i, s := range texts {
		if tokens[i], err = ratelimit.ParseToken(s); err != nil {
			return nil, err
		}
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		won  = map[int]string{}
		errs []error
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, tok := range tokens {
				how, err := "use", error(nil)
				if (i+g)%2 == 0 {
					how, err = "cancel", lim.Refund(ctx, tok)
				} else {
					err = lim.Use(ctx, tok)
				}
				mu.Lock()
				switch {
				case err == nil:
					if _, dup := won[i]; dup {
						errs = append(errs, fmt.Errorf("token %d settled twice in one process", i))
					}
					won[i] = how
				case !isAlreadySettled(err):
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return won, errs[0]
	}
	return won, nil
}

func parseSettled(out []byte) (map[int]string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), settledLine); ok {
			var got map[int]string
			return got, json.Unmarshal([]byte(rest), &got) == nil
		}
	}
	return nil, false
}

// reservationLimits is the limit of the sharded reservation tests: 100
// per second over 4 shards of 25, up to 200 owed.
var reservationLimits = ratelimit.Limits{
	"res": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Second, Shards: 4, MaxReserved: 200, Start: time.UnixMilli(0)},
}

// reserveRun makes calls reservations of one token from each of
// goroutines goroutines, and returns how many jobs were scheduled into each
// window (by the time the job may run). Each goroutine is a client with a
// clock of its own; every call takes a ticket, and is made at start plus
// its ticket times every, so that the calls' times advance together, a
// little out of order as concurrent callers' are.
func reserveRun(ctx context.Context, store ratelimit.Store, key string, start time.Time, goroutines, calls int, every time.Duration) (map[int64]int, error) {
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		errs    []error
		tickets atomic.Int64
		jobs    = map[int64]int{}
	)
	for range goroutines {
		clk := &stepClock{Mock: clock.NewMock(), now: start}
		lim, err := ratelimit.New(store, reservationLimits, ratelimit.WithClock(clk))
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := map[int64]int{}
			for range calls {
				clk.now = start.Add(time.Duration(tickets.Add(1)) * every)
				r, err := lim.Reserve(ctx, "res", key)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				if r.OK() {
					mine[r.Time().UnixMilli()/1000]++
				}
			}
			mu.Lock()
			for w, n := range mine {
				jobs[w] += n
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return jobs, errs[0]
	}
	return jobs, nil
}

// checkJobs requires every window to hold at most the limit's 100 jobs,
// and the run to have scheduled enough to mean something.
func checkJobs(t *testing.T, jobs map[int64]int, who string) {
	t.Helper()
	total := 0
	for w, n := range jobs {
		require.LessOrEqual(t, n, 100, "window %d: %d jobs scheduled into a window of a limit of 100 (%s)", w, n, who)
		total += n
	}
	require.Greater(t, total, 500, "too few jobs to mean anything (%s)", who)
}

func parseJobs(out []byte) (map[int64]int, bool) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), jobsLine); ok {
			var jobs map[int64]int
			return jobs, json.Unmarshal([]byte(rest), &jobs) == nil
		}
	}
	return nil, false
}

func runChild(t *testing.T, open NewStore, js string) {
	var o childOrders
	require.NoError(t, json.Unmarshal([]byte(js), &o))
	if len(o.Tokens) > 0 {
		store := open(t)
		time.Sleep(time.Until(time.Unix(0, o.StartAtNS)))
		won, err := settleRun(context.Background(), store, time.UnixMilli(o.NowMS), o.Goroutines, o.Tokens)
		require.NoError(t, err)
		b, err := json.Marshal(won)
		require.NoError(t, err)
		fmt.Printf("\n%s%s\n", settledLine, b)
		return
	}
	if o.Reserve {
		store := open(t)
		time.Sleep(time.Until(time.Unix(0, o.StartAtNS)))
		jobs, err := reserveRun(context.Background(), store, o.Key, time.UnixMilli(o.NowMS), o.Goroutines, o.Calls, time.Duration(o.StepUS)*time.Microsecond)
		require.NoError(t, err)
		b, err := json.Marshal(jobs)
		require.NoError(t, err)
		fmt.Printf("\n%s%s\n", jobsLine, b)
		return
	}
	lim, err := ratelimit.New(open(t), multiProcessLimits, ratelimit.WithClock(newMock(time.UnixMilli(o.NowMS))))
	require.NoError(t, err)
	time.Sleep(time.Until(time.Unix(0, o.StartAtNS))) // start together with the other children
	granted, err := Hammer(context.Background(), lim, "mp", o.Key, o.Goroutines, o.Calls)
	require.NoError(t, err)
	fmt.Printf("\n%s%d\n", grantedLine, granted)
}

// runPattern returns a -test.run pattern that matches exactly the test
// named name (subtests separated by slashes).
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

func parseGranted(out []byte) (int, bool) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), grantedLine); ok {
			n, err := strconv.Atoi(strings.TrimSpace(rest))
			return n, err == nil
		}
	}
	return 0, false
}

// startChildren starts procs copies of the test binary, running the test
// that pattern selects as children under orders, each writing to its own
// buffer.
func startChildren(t *testing.T, ctx context.Context, pattern string, orders childOrders, procs int) ([]*exec.Cmd, []*bytes.Buffer) {
	t.Helper()
	js, err := json.Marshal(orders)
	require.NoError(t, err)
	children := make([]*exec.Cmd, procs)
	outs := make([]*bytes.Buffer, procs)
	for i := range children {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+pattern, "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), childEnv+"="+string(js))
		outs[i] = new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		require.NoError(t, cmd.Start())
		children[i] = cmd
	}
	return children, outs
}
