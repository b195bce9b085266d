package coalesce

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGroupDropRacesCalls: callers to destinations that come and go (a
// new one every few calls, so the Group drops its Batchers often), some
// leaving while queued or in flight, each get their answer or their
// context's error, and none waits past the send's answer: a Batcher is
// dropped only idle, and a caller that took one since dropped sends
// through it alone. Once the calls are done and the Group closed, no
// worker of a dropped Batcher is left.
func TestGroupDropRacesCalls(t *testing.T) {
	g := NewGroup(func(ctx context.Context, dest int, reqs, res []int) error {
		if rand.IntN(4) == 0 {
			runtime.Gosched()
		}
		for i, r := range reqs {
			res[i] = dest*1000 + r
		}
		return nil
	}, Options{MaxInFlight: 3, Detach: true, Share: true})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				dest := (i / 8) + rand.IntN(3) // new destinations as the calls go on
				ctx, cancel := context.WithCancel(context.Background())
				if rand.IntN(8) == 0 {
					go cancel()
				}
				res, err := g.Do(ctx, dest, w)
				cancel()
				if err != nil {
					require.ErrorIs(t, err, context.Canceled)
					continue
				}
				require.Equal(t, dest*1000+w, res)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		buf := make([]byte, 1<<20)
		t.Fatalf("callers still waiting after a minute:\n%s", buf[:runtime.Stack(buf, true)])
	}
	require.LessOrEqual(t, g.Len(), 16*3, "batchers kept")
	g.Close()
	// Counted by their stacks: runtime.NumGoroutine counts the runtime's
	// cleanup goroutines too, which start as the Batchers are collected.
	var last string
	ours := func() int {
		buf := make([]byte, 1<<20)
		n := 0
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "coalesce.") && !strings.Contains(g, "coalesce.TestGroupDropRacesCalls") {
				n++
				last = g
			}
		}
		return n
	}
	if !assert.Eventually(t, func() bool { return ours() == 0 }, 5*time.Second, 5*time.Millisecond, "goroutines of package coalesce left") {
		t.Fatalf("%d left, one:\n%s", ours(), last)
	}
}
