package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
)

func newBench() *cobra.Command {
	var (
		t          target
		keys       int
		goroutines int
		duration   time.Duration
		count      float64
		quiet      bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Drive a store with load, then report throughput and latency and check that no window granted more than the limit",
		Long: `Bench calls the limit from many goroutines for a while, on keys of its own, then prints
decisions per second, allowed and denied counts and latency percentiles, and checks every key's
grants against the limit: no fixed window grants more than what the bucket could hold plus what
the windows since granted, and no token bucket more than its capacity plus its refill. It exits
with status 1 if a check fails. Run it alone against its keys: calls from elsewhere on the same
keys would spend tokens it cannot see.`,
		Example: `  ratelimit bench --store redis://127.0.0.1:6379/0 --kind "fixed window" --rate 1000 --period 1s --keys 100 --goroutines 64 --duration 10s`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keys < 1 || goroutines < 1 || duration <= 0 {
				return usagef("--keys and --goroutines must be at least 1, --duration above 0")
			}
			lim, name, closeStore, err := t.limiter(cmd)
			if err != nil {
				return err
			}
			defer closeStore()
			cfg, _ := lim.Config(name)
			show := !quiet && isTerminal(os.Stderr)
			rep, err := bench(cmd.Context(), lim, name, cfg, keys, goroutines, duration, count, show, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			rep.print(cmd.OutOrStdout())
			if rep.violation != "" {
				return fmt.Errorf("check failed: %s", rep.violation)
			}
			return nil
		},
	}
	t.register(cmd)
	cmd.Flags().IntVar(&keys, "keys", 1, "how many keys to spread the calls over")
	cmd.Flags().IntVar(&goroutines, "goroutines", 16, "how many goroutines call at once")
	cmd.Flags().DurationVar(&duration, "duration", 5*time.Second, "how long to run")
	cmd.Flags().Float64Var(&count, "count", 1, "tokens per call")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no progress bar")
	return cmd
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// grant is an allowed call: judged by the store at some moment between
// from and to, when the call was made and when it was answered.
type grant struct {
	key      int
	from, to time.Time
}

type report struct {
	calls, allowed, denied int
	elapsed                time.Duration
	latency                []time.Duration
	keys                   int
	violation              string
}

func bench(ctx context.Context, lim *ratelimit.Limiter, name string, cfg ratelimit.Config, keys, goroutines int,
	duration time.Duration, count float64, show bool, progress io.Writer) (*report, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	run := time.Now().UnixNano()
	keyNames := make([]string, keys)
	for i := range keyNames {
		keyNames[i] = fmt.Sprintf("bench-%d-%d", run, i)
	}
	var (
		mu       sync.Mutex
		grants   []grant
		latency  []time.Duration
		rep      = &report{keys: keys}
		firstErr error
		done     atomic.Bool
		wg       sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(duration)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var (
				myGrants []grant
				myLat    []time.Duration
				allowed  int
				denied   int
			)
			for i := g; !done.Load() && time.Now().Before(deadline); i += goroutines {
				k := i % keys
				t0 := time.Now()
				res, err := lim.Limit(ctx, name, keyNames[k], ratelimit.Count(count))
				t1 := time.Now()
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					done.Store(true)
					break
				}
				myLat = append(myLat, t1.Sub(t0))
				if res.OK {
					allowed++
					myGrants = append(myGrants, grant{key: k, from: t0, to: t1})
				} else {
					denied++
				}
			}
			mu.Lock()
			grants = append(grants, myGrants...)
			latency = append(latency, myLat...)
			rep.allowed += allowed
			rep.denied += denied
			mu.Unlock()
		}()
	}
	if show {
		bar := progressbar.NewOptions64(duration.Milliseconds(), progressbar.OptionSetWriter(progress),
			progressbar.OptionSetDescription("bench"), progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionSetPredictTime(false), progressbar.OptionClearOnFinish())
		tick := time.NewTicker(100 * time.Millisecond)
		for time.Now().Before(deadline) && !done.Load() {
			<-tick.C
			_ = bar.Set64(min(time.Since(start).Milliseconds(), duration.Milliseconds()))
		}
		tick.Stop()
		_ = bar.Finish()
	}
	wg.Wait()
	rep.elapsed = time.Since(start)
	if firstErr != nil {
		return nil, firstErr
	}
	rep.calls = rep.allowed + rep.denied
	slices.Sort(latency)
	rep.latency = latency
	rep.violation = verify(cfg, grants, count, keys)
	return rep, nil
}

// verify checks every key's grants against the most the limit allows,
// and returns a description of the first excess, or "".
func verify(cfg ratelimit.Config, grants []grant, count float64, keys int) string {
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = cfg.Rate
	}
	per := make([][]grant, keys)
	for _, g := range grants {
		per[g.key] = append(per[g.key], g)
	}
	period := cfg.Period.Milliseconds()
	for k, gs := range per {
		if len(gs) == 0 {
			continue
		}
		// The first i+1 grants by start time were all judged between the
		// first start and the latest answer among them: a span no shorter
		// than the true one, so the bound below never errs against the
		// store.
		slices.SortFunc(gs, func(a, b grant) int { return a.from.Compare(b.from) })
		first := gs[0].from.UnixMilli()
		var last int64
		for i, g := range gs {
			granted := float64(i+1) * count
			last = max(last, g.to.UnixMilli()+1)
			span := last - first
			var most float64
			if cfg.Kind == ratelimit.FixedWindow {
				// Windows of any phase: at most span/period + 1 window
				// starts fall after the first grant, up to this one.
				starts := math.Floor(float64(span)/float64(period)) + 1
				most = capacity + cfg.Rate*starts
			} else {
				most = capacity + cfg.Rate*float64(span)/float64(period)
			}
			if granted > most+1e-9 {
				return fmt.Sprintf("key %d: %v tokens granted within %v, but the limit allows at most %v",
					k, granted, time.Duration(span)*time.Millisecond, most)
			}
		}
	}
	return ""
}

func (r *report) print(out io.Writer) {
	secs := r.elapsed.Seconds()
	fmt.Fprintf(out, "decisions  %d in %v: %.0f/s\n", r.calls, r.elapsed.Round(time.Millisecond), float64(r.calls)/secs)
	fmt.Fprintf(out, "allowed    %d (%.0f/s)\n", r.allowed, float64(r.allowed)/secs)
	fmt.Fprintf(out, "denied     %d\n", r.denied)
	if len(r.latency) > 0 {
		q := func(p float64) time.Duration {
			return r.latency[min(len(r.latency)-1, int(p*float64(len(r.latency))))].Round(time.Microsecond)
		}
		fmt.Fprintf(out, "latency    p50 %v  p90 %v  p99 %v  max %v\n", q(0.50), q(0.90), q(0.99), r.latency[len(r.latency)-1].Round(time.Microsecond))
	}
	if r.violation == "" {
		fmt.Fprintf(out, "check      ok: no key was granted more than the limit allows (%d keys)\n", r.keys)
	} else {
		fmt.Fprintf(out, "check      FAILED: %s\n", r.violation)
	}
}
