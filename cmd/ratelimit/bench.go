package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
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
		countFlag  = givenFloat{v: &count}
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Drive a store with load, then report throughput and latency and check that no window granted more than the limit",
		Long: `Bench calls the limit from many goroutines for a while, on keys of its own, then prints
decisions per second, allowed and denied counts and latency percentiles, and checks every key's
grants against the limit. Each grant is placed between its call and its answer on this machine's
clock. No run of grants may exceed the capacity plus the refill over its span (a token bucket), or
plus the rate for every window start the span can hold (a fixed window); an unsharded fixed window
is also checked window by window at its own phase. Bench exits with status 1 if a check fails.
Run it alone against its keys: calls from elsewhere on the same keys would spend tokens it cannot
see.

Ctrl-C stops the run early: bench reports and checks the calls made until then, removes its keys,
and exits with status 130 (1 if the check failed).`,
		Example: `  ratelimit bench --store redis://127.0.0.1:6379/0 --kind "fixed window" --rate 1000 --period 1s --keys 100 --goroutines 64 --duration 10s`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case keys < 1 || keys > maxKeys:
				return usagef("--keys %d: give from 1 to %d keys", keys, maxKeys)
			case goroutines < 1 || goroutines > maxGoroutines:
				return usagef("--goroutines %d: give from 1 to %d goroutines", goroutines, maxGoroutines)
			case duration <= 0:
				return usagef("--duration %v: give a time above 0, such as 10s", duration)
			case duration < minBenchDuration:
				// The run ended before its goroutines had made a call,
				// and reported 0 decisions and a check of nothing "ok".
				return usagef("--duration %v is too short to measure: give %v or more, such as 10s", duration, minBenchDuration)
			case count == 0: // -0 too
				return usagef("--count %s: a call of 0 tokens takes none, and is allowed every time, which loads the store but checks nothing: give a count above 0, such as 1", &countFlag)
			}
			if err := t.sf.check(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			// After the first Ctrl-C, a second one ends the command at once,
			// even while the keys are being removed.
			context.AfterFunc(ctx, stop)
			opening, cancel := context.WithTimeoutCause(ctx, t.sf.timeout, errTimeout)
			defer cancel()
			lim, name, closeStore, err := t.limiter(opening, mayCreate)
			if err != nil {
				var u usageError
				if ctx.Err() != nil && !errors.As(err, &u) {
					// Ctrl-C before the run, as during it: status 130,
					// not the client's "context canceled" and 1.
					return exitError{exitInterrupted, errors.New("bench interrupted while it opened the store: no call was made")}
				}
				return t.sf.timedOut(opening, err)
			}
			defer closeStore()
			cfg, _ := lim.Config(name)
			show := !quiet && isTerminal(os.Stderr)
			// The windows' phase is known in this machine's time unless the
			// store judges by its own clock.
			ts, ok := t.store.(driver.TimeSource)
			localClock := !ok || !ts.OwnClock()
			rep, err := bench(ctx, lim, name, cfg, keys, goroutines, duration, t.sf.timeout, count, localClock, show, cmd.ErrOrStderr())
			if err != nil {
				return t.lf.countUsage("--count "+countFlag.String(), "", err)
			}
			if t.output == jsonOutput {
				if err := writeJSON(cmd.OutOrStdout(), rep.json(name, cfg, goroutines, count)); err != nil {
					return err
				}
			} else {
				rep.print(cmd.OutOrStdout())
			}
			switch {
			case rep.violation != "":
				return fmt.Errorf("check failed: %s", rep.violation)
			case rep.interrupted:
				return exitError{exitInterrupted, errors.New("bench interrupted: the report covers the calls made until then; its keys are removed")}
			}
			return nil
		},
	}
	t.register(cmd, false)
	t.output.register(cmd.Flags())
	t.precheck = func(name string, cfg ratelimit.Config) error {
		return t.lf.countUsage("--count "+countFlag.String(), "", checkCount(name, cfg, count, false))
	}
	keys, goroutines = 1, 16
	cmd.Flags().Var((*decimalInt)(&keys), "keys", "how many keys to spread the calls over")
	cmd.Flags().Var((*decimalInt)(&goroutines), "goroutines", "how many goroutines call at once")
	duration = 5 * time.Second
	cmd.Flags().Var((*exactDuration)(&duration), "duration", "how long to run")
	count = 1
	cmd.Flags().Var(&countFlag, "count", "tokens per call")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no progress bar")
	return cmd
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// The most keys and goroutines bench takes: each key costs a name and,
// after the run, a read and a reset, and each goroutine a histogram of
// 30 KB; --keys 2000000000 ran out of memory.
const (
	maxKeys       = 1_000_000
	maxGoroutines = 10_000
)

// grant is an allowed call: judged by the store at some moment between
// from and to, when the call was made and when it was answered.
type grant struct {
	key      int
	from, to time.Time
}

type report struct {
	calls, allowed, denied int
	elapsed                time.Duration
	latency                *histogram
	keys                   int
	windows                bool // checked window by window
	violation              string
	interrupted            bool // the context ended the run before its duration
}

// minBenchDuration is the shortest run bench takes: a run of some
// microseconds ends before its goroutines have made a call.
const minBenchDuration = time.Millisecond

// errNoCalls is the error of a run that ended before any call was made.
var errNoCalls = errors.New("no call was made before the run's end, so that there is nothing to report or check: give a longer --duration, such as 1s")

// cleanupTimeout bounds the removal of bench's keys, which goes on after
// the run's context has ended, when bench is given no timeout.
const cleanupTimeout = 30 * time.Second

// bench runs the calls of the command bench for duration, and checks them.
// A call the store has not answered timeout after the run's end fails it,
// and the reads and the removal of the keys after the run end within
// timeout (0: no bound on the calls, and cleanupTimeout on the rest).
func bench(ctx context.Context, lim *ratelimit.Limiter, name string, cfg ratelimit.Config, keys, goroutines int,
	duration, timeout time.Duration, count float64, localClock bool, show bool, progress io.Writer) (*report, error) {
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
		latency  = new(histogram)
		rep      = &report{keys: keys}
		firstErr error
		done     atomic.Bool
		calls    atomic.Int64 // for the progress bar's rate
		wg       sync.WaitGroup
	)
	// The calls stop when ctx ends (Ctrl-C); what they did until then is
	// reported and checked, and the keys are removed, on a context of
	// their own.
	stopOnCancel := context.AfterFunc(ctx, func() { done.Store(true) })
	defer stopOnCancel()
	// The reads and the removal after the run have timeout from its end:
	// made at the start, the context ended before a run longer than
	// timeout (--duration 1m, the default --timeout 30s) did, and every
	// such run failed, saying that the store did not answer.
	var cleanup context.Context
	// The keys a call was made on: only those are read and removed after
	// the run, by the bench's goroutines at once.
	touched := make([]atomic.Bool, keys)
	eachTouched := func(f func(k int) error) error {
		var (
			next  atomic.Int64
			wg    sync.WaitGroup
			errMu sync.Mutex
			first error
		)
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := int(next.Add(1) - 1); k < keys; k = int(next.Add(1) - 1) {
					if !touched[k].Load() {
						continue
					}
					if err := f(k); err != nil {
						errMu.Lock()
						if first == nil {
							first = err
						}
						errMu.Unlock()
						next.Store(int64(keys)) // the others stop too
						return
					}
				}
			}()
		}
		wg.Wait()
		return first
	}
	removeKeys := func() error {
		err := eachTouched(func(k int) error { return lim.Reset(cleanup, name, keyNames[k]) })
		if err != nil {
			return fmt.Errorf("removing the bench's keys: %w", err)
		}
		return nil
	}
	start := time.Now()
	deadline := start.Add(duration)
	// The calls end at the latest timeout after the run's: a store that
	// stops answering fails the run, rather than hold it for ever.
	callCtx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithDeadlineCause(ctx, deadline.Add(timeout), errTimeout)
		defer cancel()
	}
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var (
				myGrants []grant
				myLat    = new(histogram)
				allowed  int
				denied   int
			)
			for i := g; !done.Load() && time.Now().Before(deadline); i += goroutines {
				k := i % keys
				touched[k].Store(true)
				t0 := time.Now()
				res, err := lim.Limit(callCtx, name, keyNames[k], ratelimit.Count(count))
				t1 := time.Now()
				if err != nil && ctx.Err() != nil {
					break // interrupted: the call may or may not have been decided
				}
				if show {
					calls.Add(1)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					done.Store(true)
					break
				}
				myLat.add(t1.Sub(t0))
				if res.OK {
					allowed++
					myGrants = append(myGrants, grant{key: k, from: t0, to: t1})
				} else {
					denied++
				}
			}
			mu.Lock()
			grants = append(grants, myGrants...)
			latency.merge(myLat)
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
		var meter rateMeter
		for time.Now().Before(deadline) && !done.Load() {
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
			now := time.Now()
			bar.Describe(fmt.Sprintf("bench %8.0f decisions/s", meter.rate(now, calls.Load())))
			_ = bar.Set64(min(now.Sub(start).Milliseconds(), duration.Milliseconds()))
		}
		tick.Stop()
		_ = bar.Finish()
	}
	wg.Wait()
	rep.elapsed = time.Since(start)
	cleanup, cancelCleanup := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(timeout, cleanupTimeout))
	defer cancelCleanup()
	rep.interrupted = ctx.Err() != nil
	if firstErr != nil {
		_ = removeKeys() // the store failed: this may fail too
		if errors.Is(causeAfter(callCtx, firstErr), errTimeout) {
			return nil, fmt.Errorf("no answer from the store within --timeout %v of the run's end: %w", timeout, firstErr)
		}
		return nil, firstErr
	}
	rep.calls = rep.allowed + rep.denied
	if rep.calls == 0 && !rep.interrupted {
		return nil, fmt.Errorf("bench --duration %v: %w", duration, errNoCalls)
	}
	rep.latency = latency
	// An unsharded fixed window on this machine's clock: its windows are
	// known, and each is checked on its own.
	var phases []int64
	if localClock && cfg.Kind == ratelimit.FixedWindow && cfg.Shards <= 1 {
		phases = make([]int64, keys)
		err := eachTouched(func(k int) error {
			st, err := lim.Value(cleanup, name, keyNames[k])
			phases[k] = st.WindowStart.UnixMilli()
			return err
		})
		if err != nil {
			_ = removeKeys()
			return nil, err
		}
	}
	rep.violation = verify(cfg, grants, count, keys, phases)
	rep.windows = phases != nil
	// Leave the store as it was.
	if err := removeKeys(); err != nil {
		return nil, err
	}
	return rep, nil
}

// verify checks every key's grants against the most the limit allows,
// and returns a description of the first excess, or "". A grant was
// judged at some moment between its call and its answer; every bound
// below holds whatever that moment was, so the check never errs against
// the store. phases, when not nil, holds a window start of each key of an
// unsharded fixed window on this machine's clock.
func verify(cfg ratelimit.Config, grants []grant, count float64, keys int, phases []int64) string {
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = cfg.Rate
	}
	per := make([][]grant, keys)
	for _, g := range grants {
		per[g.key] = append(per[g.key], g)
	}
	period := cfg.Period.Milliseconds()
	perMs := cfg.Rate / float64(period) // tokens granted per millisecond, on average
	const eps = 1e-9
	for k, gs := range per {
		if len(gs) == 0 {
			continue
		}
		slices.SortFunc(gs, func(a, b grant) int { return a.from.Compare(b.from) })

		// From the first grant: the first i+1 grants by call time were all
		// judged between the first call and the latest answer among them.
		first := gs[0].from.UnixMilli()
		var last, latency int64
		for i, g := range gs {
			granted := float64(i+1) * count
			last = max(last, g.to.UnixMilli()+1)
			latency = max(latency, g.to.UnixMilli()+1-g.from.UnixMilli())
			span := last - first
			var most float64
			if cfg.Kind == ratelimit.FixedWindow {
				// Windows of any phase (shards have their own): at most
				// span/period + 1 window starts fall within the span.
				most = capacity + cfg.Rate*math.Floor(float64(span)/float64(period)+1)
			} else {
				most = capacity + perMs*float64(span)
			}
			if granted > most+eps {
				return fmt.Sprintf("key %d: %s tokens granted within %v, but the limit allows at most %s",
					k, numtext.Format(granted), time.Duration(span)*time.Millisecond, numtext.Format(most))
			}
		}

		// Between any two grants: grants i..j were judged within
		// from[j] - from[i] plus the slowest answer. Kadane's scan finds
		// the worst i for every j: best = max over i of
		// (j-i+1)·count - perMs·(from[j] - from[i]).
		slack := capacity + perMs*float64(latency)
		if cfg.Kind == ratelimit.FixedWindow {
			slack += cfg.Rate // one window start more than the span's share
		}
		best := 0.0
		for j, g := range gs {
			if j > 0 {
				best -= perMs * float64(g.from.UnixMilli()-gs[j-1].from.UnixMilli())
			}
			best = max(best, 0) + count
			if best > slack+eps {
				return fmt.Sprintf("key %d: a run of grants up to %s exceeds the limit's refill: %s tokens over what it allows",
					k, clockOf(g.from.UnixMilli()), numtext.Format(best-slack+capacity))
			}
		}

		if phases == nil {
			continue
		}
		// Window by window: a window grants at most what its bucket held
		// when it began (at most the capacity), and windows j..m together
		// at most the capacity plus the rate for every start after j.
		// A grant whose call and answer fall in different windows is
		// counted in neither.
		phase := phases[k]
		window := func(t time.Time) int64 { return floorDiv(t.UnixMilli()-phase, period) }
		var (
			prev, from int64   // the last window with grants; where the worst run starts
			run        float64 // max over j of windows j..prev's grants less Rate per start after j
			tokens     float64 // the grants of that run
			started    bool
		)
		for _, g := range gs {
			w := window(g.from)
			if window(g.to) != w {
				continue
			}
			switch {
			case !started:
				started, from = true, w
			case w != prev:
				run -= cfg.Rate * float64(w-prev)
				if run <= 0 {
					run, tokens, from = 0, 0, w
				}
			}
			prev = w
			run += count
			tokens += count
			if run > capacity+eps {
				return fmt.Sprintf("key %d: %s tokens granted in the windows from %s to %s, but the limit allows at most %s",
					k, numtext.Format(tokens), clockOf(phase+from*period), clockOf(phase+(w+1)*period), numtext.Format(capacity+cfg.Rate*float64(w-from)))
			}
		}
	}
	return ""
}

// clockOf formats Unix milliseconds as a UTC time of day.
func clockOf(ms int64) string { return time.UnixMilli(ms).UTC().Format("15:04:05.000") }

// floorDiv returns a/b rounded down.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// perSecond returns n over the run's time.
func (r *report) perSecond(n int) float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(n) / r.elapsed.Seconds()
}

func (r *report) print(out io.Writer) {
	if r.interrupted {
		fmt.Fprintln(out, "interrupted: the calls until then")
	}
	fmt.Fprintf(out, "decisions  %d in %s: %.0f/s\n", r.calls, roundText(r.elapsed, time.Millisecond, "ms"), r.perSecond(r.calls))
	fmt.Fprintf(out, "allowed    %d (%.0f/s)\n", r.allowed, r.perSecond(r.allowed))
	fmt.Fprintf(out, "denied     %d\n", r.denied)
	if h := r.latency; h != nil && h.n > 0 {
		q := func(p float64) string { return roundText(h.quantile(p), time.Microsecond, "µs") }
		fmt.Fprintf(out, "latency    p50 %s  p90 %s  p99 %s  max %s\n", q(0.50), q(0.90), q(0.99), roundText(h.max, time.Microsecond, "µs"))
	}
	if r.violation == "" {
		how := ""
		if r.windows {
			how = ", window by window"
		}
		keys := "keys"
		if r.keys == 1 {
			keys = "key"
		}
		fmt.Fprintf(out, "check      ok: no key was granted more than the limit allows (%d %s%s)\n", r.keys, keys, how)
	} else {
		fmt.Fprintf(out, "check      FAILED: %s\n", r.violation)
	}
}

// roundText returns d rounded to unit, as a Duration writes it (410µs,
// 1.425ms, 5.001s), and one that rounds to 0 in unit, whose symbol is
// symbol (0µs): a Duration writes 0 as 0s, which beside the others read
// as a unit of its own, and a memory store's answers, under half a
// microsecond, made the line "p50 0s  p90 0s  p99 0s  max 50.291ms".
func roundText(d, unit time.Duration, symbol string) string {
	if d = d.Round(unit); d == 0 {
		return "0" + symbol
	}
	return d.String()
}

// benchJSON is the report of bench --output json.
type benchJSON struct {
	Limit              limitJSON    `json:"limit"`
	Keys               int          `json:"keys"`
	Goroutines         int          `json:"goroutines"`
	Count              float64      `json:"count"`
	Interrupted        bool         `json:"interrupted"`
	ElapsedMS          float64      `json:"elapsed_ms"`
	Decisions          int          `json:"decisions"`
	DecisionsPerSecond float64      `json:"decisions_per_second"`
	Allowed            int          `json:"allowed"`
	AllowedPerSecond   float64      `json:"allowed_per_second"`
	Denied             int          `json:"denied"`
	LatencyMS          *latencyJSON `json:"latency_ms"` // null without calls
	Check              checkJSON    `json:"check"`
}

// latencyJSON holds latency percentiles in milliseconds.
type latencyJSON struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// checkJSON is the outcome of the check of the grants.
type checkJSON struct {
	OK             bool   `json:"ok"`
	WindowByWindow bool   `json:"window_by_window"`
	Violation      string `json:"violation"` // empty when ok
}

func (r *report) json(name string, cfg ratelimit.Config, goroutines int, count float64) benchJSON {
	j := benchJSON{Limit: limitOf(name, cfg), Keys: r.keys, Goroutines: goroutines, Count: count, Interrupted: r.interrupted,
		ElapsedMS: ms(r.elapsed), Decisions: r.calls, DecisionsPerSecond: r.perSecond(r.calls), Allowed: r.allowed,
		AllowedPerSecond: r.perSecond(r.allowed), Denied: r.denied,
		Check: checkJSON{OK: r.violation == "", WindowByWindow: r.windows, Violation: r.violation}}
	if h := r.latency; h != nil && h.n > 0 {
		j.LatencyMS = &latencyJSON{P50: ms(h.quantile(0.50)), P90: ms(h.quantile(0.90)), P99: ms(h.quantile(0.99)), Max: ms(h.max)}
	}
	return j
}

// rateMeter turns a running count of calls into a rate over about the
// last second, for the progress bar.
type rateMeter struct {
	samples []rateSample
}

type rateSample struct {
	at    time.Time
	calls int64
}

// rateWindow is the span a rateMeter averages over.
const rateWindow = time.Second

// rate records that calls were made by now and returns the calls per
// second since the oldest sample within rateWindow (0 for the first).
func (m *rateMeter) rate(now time.Time, calls int64) float64 {
	m.samples = append(m.samples, rateSample{now, calls})
	// Keep one sample at or before the window's start, as its base.
	i := 0
	for i+1 < len(m.samples) && !m.samples[i+1].at.After(now.Add(-rateWindow)) {
		i++
	}
	m.samples = m.samples[i:]
	base := m.samples[0]
	span := now.Sub(base.at)
	if span <= 0 {
		return 0
	}
	return float64(calls-base.calls) / span.Seconds()
}

// histogram counts latencies in buckets 1/64 of a power of two wide, so
// that a long run on a fast store keeps 30 KB rather than every sample;
// a quantile is within 1.6% of the exact one.
type histogram struct {
	counts [(64 - histSub + 1) << histSub]uint64
	n      uint64
	max    time.Duration
}

const histSub = 6 // 2^histSub buckets per power of two

func histIndex(v uint64) int {
	if v < 1<<histSub {
		return int(v)
	}
	k := bits.Len64(v) - histSub // at least 1
	return k<<histSub + int(v>>(k-1)) - 1<<histSub
}

// histUpper returns the largest value of bucket i.
func histUpper(i int) uint64 {
	k := i >> histSub
	if k == 0 {
		return uint64(i)
	}
	m := uint64(i&(1<<histSub-1) + 1<<histSub)
	return (m+1)<<(k-1) - 1
}

func (h *histogram) add(d time.Duration) {
	h.counts[histIndex(uint64(max(d, 0)))]++
	h.n++
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the upper end of the bucket holding the p quantile, at
// most the largest latency seen.
func (h *histogram) quantile(p float64) time.Duration {
	rank := min(h.n-1, uint64(p*float64(h.n)))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > rank {
			return min(time.Duration(histUpper(i)), h.max)
		}
	}
	return h.max
}
