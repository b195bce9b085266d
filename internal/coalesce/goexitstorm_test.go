package coalesce

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Sends that return, fail, panic or call runtime.Goexit, mixed at random
// among calls that leave at random, on every shape of Batcher: every call
// is answered once (or its goroutine ends with its own send), an answer
// that is no error is its own request's, and once the calls are done the
// Batcher holds nothing in flight or queued, its worker idle, and after
// Close no goroutine of its own is left.
func TestGoexitStorm(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	shapes := []Options{
		{}, {Detach: true}, {MaxBatch: 1, Detach: true}, {MaxBatch: 1},
		{MaxInFlight: 3, Detach: true}, {MaxInFlight: 2, Share: true, Detach: true},
		{MaxInFlight: 3, Overlap: 2, Detach: true}, {MaxBatch: 2, MaxInFlight: 2},
	}
	base := runtime.NumGoroutine()
	for round := range 40 {
		opts := shapes[round%len(shapes)]
		t.Run(fmt.Sprintf("%d/%+v", round, opts), func(t *testing.T) {
			stormOnce(t, opts, rng.Uint64())
		})
	}
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= base+2 }, 5*time.Second, 5*time.Millisecond,
		"goroutines left: %d, before %d", runtime.NumGoroutine(), base)
}

var errSend = errors.New("send failed")

func stormOnce(t *testing.T, opts Options, seed uint64) {
	b := New(func(ctx context.Context, reqs, res []int) error {
		for _, r := range reqs {
			switch r % 8 {
			case 0:
				runtime.Goexit()
			case 1:
				panic(fmt.Sprint("send ", r))
			case 2:
				return errSend
			case 3:
				runtime.Gosched()
			}
		}
		for i, r := range reqs {
			res[i] = r * 10
		}
		return nil
	}, opts)
	const calls = 300
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for g := range 6 {
		rng := rand.New(rand.NewPCG(seed, uint64(g)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls / 6 {
				req := 8*(g*calls+i) + rng.IntN(8)
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(4) == 0 {
					time.AfterFunc(time.Duration(rng.IntN(50))*time.Microsecond, cancel)
				}
				done := make(chan string, 1)
				go func() {
					answered := false
					defer func() {
						if !answered {
							if req%8 != 0 {
								done <- fmt.Sprintf("call %d: its goroutine ended without an answer", req)
								return
							}
							if r := recover(); r != nil {
								done <- fmt.Sprintf("call %d: panic on its caller %v", req, r)
								return
							}
						}
						close(done)
					}()
					defer func() {
						if !answered && req%8 == 1 {
							recover() // a lone call's panic goes on to its caller
							answered = true
						}
					}()
					res, err := b.Do(ctx, req)
					answered = true
					var pe *PanicError
					switch {
					case err == nil:
						if res != req*10 {
							done <- fmt.Sprintf("call %d: answered %d", req, res)
						}
					case errors.Is(err, context.Canceled), errors.Is(err, ErrGoexit), errors.Is(err, errSend), errors.As(err, &pe):
						if res != 0 {
							done <- fmt.Sprintf("call %d: answered %d with %v", req, res, err)
						}
					default:
						done <- fmt.Sprintf("call %d: %v", req, err)
					}
				}()
				select {
				case msg, ok := <-done:
					if ok {
						mu.Lock()
						bad = append(bad, msg)
						mu.Unlock()
					}
				case <-time.After(10 * time.Second):
					mu.Lock()
					bad = append(bad, fmt.Sprintf("call %d: no answer after 10s", req))
					mu.Unlock()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	require.Empty(t, bad)
	waitLocked(t, b, func() bool {
		return b.inflight == 0 && len(b.queue) == 0 && !b.busy &&
			(b.share == nil || b.share.sent.Load() == 0 && b.share.queued.Load() == 0)
	})
	b.Close()
	waitLocked(t, b, func() bool { return b.worker == nil })
}
