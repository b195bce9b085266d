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
	"testing"
	"time"

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
}

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
	require.Equal(t, 0.0, st.Tokens)
}

func runChild(t *testing.T, open NewStore, js string) {
	var o childOrders
	require.NoError(t, json.Unmarshal([]byte(js), &o))
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
