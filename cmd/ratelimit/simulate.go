package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/duration"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/spf13/cobra"
	bolt "go.etcd.io/bbolt"
)

// simStart is the simulation's time zero.
var simStart = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// request is one call of a simulation.
type request struct {
	at      time.Duration
	count   float64
	reserve bool
	steady  bool   // of the steady pattern (--every), not of --at
	given   string // as the command line wrote it: the --at request (01:30=30r), or the --count
	n       string // the --at request's count as written (30)
}

// counted returns r's count as the command line gave it, for an error
// about it ("--count 4", "--at \"1s=4\": count 4"), and how to reserve
// it there: "" for the steady pattern, which cannot. It quotes what was
// written, not the numbers read from it: --at 00:30=1e300 was told as
// --at 30m0s=1e+300, which the command line never held.
func (r request) counted() (what, reserve string) {
	if r.steady {
		return "--count " + r.given, ""
	}
	what = fmt.Sprintf("--at %q: count %s", r.given, r.n)
	if r.reserve {
		return what, ""
	}
	return what, fmt.Sprintf("--at %q", r.given+"r")
}

// step is what became of one request.
type step struct {
	request
	before, after float64
	window        [2]time.Duration // fixed window: the window the call fell in
	res           ratelimit.Result
}

func newSimulate() *cobra.Command {
	var (
		lf          limitFlags
		at, svg     string
		every, span time.Duration
		count       float64
		countFlag   = givenFloat{v: &count}
		seed        uint64
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Run a limit on a timeline of requests and print what it decides",
		Long: `Simulate runs a limit on the default store (an embedded bbolt file, in a temporary
directory) with a simulated clock starting at 00:00:00, and prints, for each request, the
window it falls in, the tokens before and after, and the decision.

A fixed window without --start is aligned to 00:00:00 so that windows read plainly.
A sharded limit chooses the shards of each call at random, from --seed: the same
seed gives the same output.`,
		Example: `  ratelimit simulate --kind "fixed window" --rate 100 --period 1h --capacity 150 --at 00:30=15,00:45=15,01:30=30
  ratelimit simulate --kind "token bucket" --rate 10 --period 1m --capacity 3 --every 5s --count 1 --for 1m
  ratelimit simulate --limits limits.yaml --name llm --at 0s=30000,10s=20000r --svg llm.svg`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			name, cfg, err := lf.limit()
			if err != nil {
				return err
			}
			if cfg.Kind == ratelimit.FixedWindow && cfg.Start.IsZero() {
				cfg.Start = simStart
			}
			flags := cmd.Flags()
			if flags.Changed("seed") && cfg.Shards <= 1 {
				// It draws the shards of a sharded limit's calls, and
				// nothing else: every seed printed the same table.
				return usagef("--seed draws the shards each call of a sharded limit evaluates, and this limit has one record: leave --seed out")
			}
			if flags.Changed("svg") && svg == "" {
				// An empty path is no chart: the run printed its table
				// and drew nothing, silently.
				return usagef("--svg \"\": give the chart's file, such as --svg chart.svg, or leave --svg out for the table alone")
			}
			reqs, err := parsePattern(at)
			if err != nil {
				return err
			}
			switch {
			case flags.Changed("every") && every <= 0:
				return usagef("--every %v: the steady pattern needs a time between requests above 0", every)
			case flags.Changed("every") && every < time.Millisecond:
				// wholeMillis would offer 0s, which the case above refuses.
				return usagef("--every is %v: the limiter's clock counts whole milliseconds: give 1ms or more", every)
			case flags.Changed("every") && wholeMillis("--every", every) != nil:
				return wholeMillis("--every", every)
			case every == 0 && (flags.Changed("for") || flags.Changed("count")):
				return usagef("--for and --count are of the steady pattern: give --every too, or give each --at request its count (TIME=COUNT)")
			case span > maxOffset:
				return tooLate(fmt.Sprintf("--for %v", span))
			}
			if every > 0 {
				if flags.Changed("for") && span <= 0 {
					return usagef("--for %v: give the steady pattern a length above 0", span)
				}
				if span <= 0 {
					return usagef("--every needs --for, the length of the steady pattern")
				}
				// Counted before any is made: --every 1ms --for 100y
				// would be some 3·10¹² requests.
				if n := int64(span/every) + 1 + int64(len(reqs)); n > maxRequests {
					what := fmt.Sprintf("--every %v --for %v", every, span)
					if len(reqs) > 0 {
						what += " and --at"
					}
					return tooMany(what, n, "make --every longer or --for shorter")
				}
				for t := time.Duration(0); t <= span; t += every {
					reqs = append(reqs, request{at: t, count: count, steady: true, given: countFlag.String()})
				}
			}
			if len(reqs) > maxRequests {
				return tooMany("--at", int64(len(reqs)), "give fewer")
			}
			if len(reqs) == 0 {
				return usagef("give requests: --at 00:30=15,01:30=30 or --every 1m --for 1h")
			}
			if svg != "" && len(reqs) > maxChartRequests {
				return usagef("--svg: %d requests, and a chart draws at most %d, a marker each: give fewer (a longer --every, a shorter --for, or fewer --at), or leave out --svg for the table alone",
					len(reqs), maxChartRequests)
			}
			// cmp.Compare, not int(a.at - b.at): an int of 32 bits cuts the
			// difference, and the requests ran out of order.
			slices.SortStableFunc(reqs, func(a, b request) int { return cmp.Compare(a.at, b.at) })
			// Ctrl-C ends the run, which then removes its temporary store
			// and the chart it began; a second one ends the command at once.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			context.AfterFunc(ctx, stop)
			err = simulate(ctx, cmd.OutOrStdout(), &lf, name, cfg, reqs, svg, seed)
			if err != nil && ctx.Err() != nil {
				return exitError{exitInterrupted, errors.New("simulate interrupted: nothing printed, no chart written")}
			}
			return err
		},
	}
	lf.register(cmd.Flags())
	lf.simulated = true
	cmd.Flags().StringVar(&at, "at", "", "requests: TIME=COUNT[,...], TIME as hh:mm (01:30 is 1h30m), hh:mm:ss or a duration (90s), in whole milliseconds; a trailing r reserves (01:30=30r)")
	cmd.Flags().Var((*exactDuration)(&every), "every", "a steady pattern: one request every so often, in whole milliseconds")
	cmd.Flags().Var((*exactDuration)(&span), "for", "a steady pattern: for so long")
	count = 1
	cmd.Flags().Var(&countFlag, "count", "a steady pattern: tokens per request")
	cmd.Flags().StringVar(&svg, "svg", "", "also draw the timeline as an SVG chart in this file")
	seed = 1
	cmd.Flags().Var((*decimalUint64)(&seed), "seed", "a sharded limit: the seed of the random choice of shards, in decimal; the same seed, the same output")
	return cmd
}

// parsePattern reads "00:30=15,00:45=15,01:30=30r".
func parsePattern(s string) ([]request, error) {
	var reqs []request
	if s == "" {
		return nil, nil // no --at
	}
	if strings.TrimSpace(s) == "" {
		// Taken for a request with nothing before or after its commas,
		// which --at " " has none of.
		return nil, usagef("--at %q is blank: %s, or leave --at out", s, atFormat)
	}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			// A list cut short (--at "0s=1,$MORE" with $MORE unset) ran
			// the requests before the cut alone, without a word.
			return nil, usagef("--at %q: an empty request, before, between or after the commas: write TIME=COUNT,TIME=COUNT, e.g. 00:00=1,00:30=15", s)
		}
		at, n, ok := strings.Cut(part, "=")
		if !ok {
			return nil, usagef("--at %q: write TIME=COUNT, e.g. 00:30=15", part)
		}
		if strings.TrimSpace(at) == "" {
			// parseClock said: the time "": write hh:mm, ...
			return nil, usagef("--at %q: the request has no time before its =: %s", part, atFormat)
		}
		// Spaces around the = (--at "00:30 = 15") are read as in a
		// limits file: the time "00:30 " was refused as no time at all.
		at, n = strings.TrimSpace(at), strings.TrimSpace(n)
		r := request{given: part}
		var err error
		if r.at, err = parseOffset(at); err != nil {
			return nil, usagef("--at %q: %w", part, err)
		}
		if strings.HasSuffix(n, "r") {
			r.reserve, n = true, strings.TrimSpace(strings.TrimSuffix(n, "r"))
		}
		r.n = n
		if r.count, err = parseDecimalFloat(n); err != nil {
			if errors.Is(err, errNotDecimal) {
				return nil, usagef("--at %q: the count %q is not a number in decimal, such as 10, 0.5 or 1e3", part, n)
			}
			return nil, usagef("--at %q: the count %v", part, err)
		}
		reqs = append(reqs, r)
	}
	return reqs, nil
}

// atFormat says how to write --at's requests.
const atFormat = "write TIME=COUNT[,TIME=COUNT...], TIME as hh:mm, hh:mm:ss or a duration such as 90s, from the start, 0s, e.g. 00:00=1,00:30=15"

// maxOffset is the latest a simulated request can come: 100 years after
// the start, as the longest period.
const maxOffset = ratelimit.MaxPeriod

// tooLate is the usage error of a request time, named by what, past
// maxOffset.
func tooLate(what string) error {
	return usagef("%s: requests come at most %v (100 years) after the start", what, maxOffset)
}

// maxRequests is the most requests a simulation runs: far more than any
// timeline a person reads, and a bound on the memory and time it takes.
const maxRequests = 1_000_000

// maxChartRequests is the most requests a simulation draws (--svg): a
// marker each, some 150 bytes, so that a million made a chart of some
// 150 MB, which viewers choke on, and 20,000 (3 MB) already overlap in
// its 900 pixels.
const maxChartRequests = 20_000

// tooMany is the usage error of n requests, given by what, above
// maxRequests; hint says how to give fewer.
func tooMany(what string, n int64, hint string) error {
	return usagef("%s: %d requests, and a simulation runs at most %d: %s", what, n, maxRequests, hint)
}

// parseOffset reads hh:mm, hh:mm:ss or a Go duration, from 0 to maxOffset,
// in whole milliseconds. Its errors name the time s ("the time \"90\": ..."),
// for the caller to say where it was given.
func parseOffset(s string) (time.Duration, error) {
	d, err := duration.Parse(s)
	switch {
	case errors.Is(err, duration.ErrNotWhole):
		return 0, notWhole(s)
	case errors.Is(err, duration.ErrRange) && strings.HasPrefix(s, "-"):
		return 0, usagef("the time %q: requests come at or after the start, 0s", s)
	case errors.Is(err, duration.ErrRange):
		return 0, tooLate(fmt.Sprintf("the time %q", s))
	}
	if err == nil {
		if d < 0 {
			return 0, usagef("the time %q: requests come at or after the start, 0s", s)
		}
		if d > maxOffset {
			return 0, tooLate(fmt.Sprintf("the time %q", s))
		}
	} else if d, err = parseClock(s); err != nil {
		return 0, err
	}
	if err := wholeMillis(fmt.Sprintf("the time %q", s), d); err != nil {
		return 0, err
	}
	return d, nil
}

// parseClock reads hh:mm or hh:mm:ss: hours of any number of digits,
// minutes and seconds from 00 to 59, the last part with decimals if any
// (00:00:01.5), up to maxOffset, exactly. ParseFloat alone read what is no
// clock time (0x1p4:00, +1:00, 1_0:00, NaN:00) and minutes of 60 or
// more, and a sum in float64 took 00:00:00.0000000001 for 0.
func parseClock(s string) (time.Duration, error) {
	bad := usagef("the time %q: write hh:mm, hh:mm:ss or a duration such as 90s", s)
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, bad
	}
	units := []string{"h", "m", "s"}
	var written strings.Builder // as a Go duration: 1h30m0.5s
	sixty := false
	for i, p := range parts {
		digits, decimals, dot := strings.Cut(p, ".")
		if !allDigits(digits) || dot && (i < len(parts)-1 || !allDigits(decimals)) {
			return 0, bad
		}
		n, err := strconv.ParseFloat(p, 64)
		if err != nil {
			return 0, bad
		}
		sixty = sixty || i > 0 && n >= 60
		written.WriteString(p + units[i])
	}
	d, err := duration.Parse(written.String())
	switch {
	case errors.Is(err, duration.ErrNotWhole):
		return 0, notWhole(s)
	case err != nil || d > maxOffset: // of digits alone, an error is one of range
		return 0, tooLate(fmt.Sprintf("the time %q", s))
	case sixty:
		return 0, usagef("the time %q: minutes and seconds run from 00 to 59: for %v, write %s", s, d, clockTime(d))
	}
	return d, nil
}

// notWhole is the usage error of a time s finer than a nanosecond.
func notWhole(s string) error {
	return usagef("the time %q %v: the limiter's clock counts whole milliseconds", s, duration.ErrNotWhole)
}

// allDigits reports whether s is one or more decimal digits.
func allDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// wholeMillis is the usage error of d, a time given by what, that is not
// a whole number of milliseconds: the Limiter's clock counts them, so
// that 1.5ms would run as 1ms.
func wholeMillis(what string, d time.Duration) error {
	if d%time.Millisecond == 0 {
		return nil
	}
	return usagef("%s is %v: the limiter's clock counts whole milliseconds: give %v or %v", what, d,
		d.Truncate(time.Millisecond), d.Truncate(time.Millisecond)+time.Millisecond)
}

// simClock is simulate's clock: it reads the time it was last set to.
// clock.Mock's Set sleeps a millisecond, for the goroutines its timers
// wake, at every move, and simulate moves it three times a request or
// more: a simulation of a million requests took over an hour. A
// simulation sets no timer (its calls never wait), so the Mock embedded
// for the Clock's other methods is never moved.
type simClock struct {
	clock.Clock
	mu  sync.Mutex
	now time.Time
}

// newSimClock returns a simClock set to simStart.
func newSimClock() *simClock { return &simClock{Clock: clock.NewMock(), now: simStart} }

func (c *simClock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// Now returns the time the clock was last set to.
func (c *simClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Since returns the time from t to Now.
func (c *simClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Until returns the time from Now to t.
func (c *simClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// sample is the tokens of the limit at one moment, for the chart.
type sample struct {
	at     time.Duration
	tokens float64
}

// sampleTimes are the times from 0 to end at which simulate samples the
// tokens for the chart. A fixed window's tokens change only at the
// requests and the window boundaries: with 200 windows or fewer, both
// sides of every boundary are sampled, so that the grants show as steps.
// A token bucket refills continuously, and more windows would be too many
// samples: those are sampled evenly. Few samples keep the chart small
// and simulate fast.
func sampleTimes(cfg ratelimit.Config, end time.Duration) []time.Duration {
	var times []time.Duration
	if cfg.Kind == ratelimit.FixedWindow && end/cfg.Period <= 200 {
		times = append(times, 0)
		for w := windowPhase(cfg); w <= end; w += cfg.Period {
			if w > 0 {
				times = append(times, w-time.Millisecond, w)
			}
		}
	} else {
		for i := range 150 {
			times = append(times, end*time.Duration(i)/150)
		}
	}
	times = append(times, end)
	slices.Sort(times)
	return times
}

// windowPhase returns when, from the simulation's start, the first window
// of a fixed window begins at or after it: windows begin at Start +
// k·Period (Start is the simulation's start unless --start gives one).
func windowPhase(cfg ratelimit.Config) time.Duration {
	if cfg.Start.IsZero() {
		return 0
	}
	period := cfg.Period.Milliseconds()
	mod := func(ms int64) int64 { return (ms%period + period) % period } // without overflow, for any Start
	return time.Duration(mod(mod(cfg.Start.UnixMilli())-mod(simStart.UnixMilli()))) * time.Millisecond
}

func simulate(ctx context.Context, out io.Writer, lf *limitFlags, name string, cfg ratelimit.Config, reqs []request, svgPath string, seed uint64) error {
	if ctx == nil {
		ctx = context.Background()
	}
	var chart *os.File
	if svgPath != "" {
		// Before the run: a path that cannot be written fails the command
		// before it prints anything, not after the table. A chart already
		// there is kept until the new one is written: a run that fails
		// leaves it as it was, and one it made, none.
		f, err := os.OpenFile(svgPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
		made := err == nil
		if errors.Is(err, fs.ErrExist) {
			f, err = os.OpenFile(svgPath, os.O_WRONLY, 0)
		}
		if err != nil {
			return fmt.Errorf("--svg: %w", err)
		}
		chart = f
		defer func() {
			if chart != nil { // not written
				chart.Close()
				if made {
					os.Remove(svgPath)
				}
			}
		}()
	}
	dir, err := os.MkdirTemp("", "ratelimit-simulate-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// The file is thrown away at the end: no commit waits for the disk.
	db, err := bolt.Open(filepath.Join(dir, "simulate.db"), 0o600, &bolt.Options{NoSync: true, NoFreelistSync: true})
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := boltstore.New(db)
	if err != nil {
		return err
	}
	defer store.Close()
	clk := newSimClock()
	lim, err := ratelimit.New(store, ratelimit.Limits{name: cfg}, ratelimit.WithClock(clk),
		ratelimit.WithRand(rand.NewPCG(seed, 0)))
	if err != nil {
		return usageError{err}
	}
	const key = "simulated"
	value := func(at time.Duration) (ratelimit.Status, error) {
		clk.set(simStart.Add(at))
		return lim.Value(ctx, name, key)
	}

	end := reqs[len(reqs)-1].at
	end += max(end/10, cfg.Period/2)
	times := sampleTimes(cfg, end)

	var (
		steps   []step
		samples []sample
	)
	ti := 0
	for _, r := range reqs {
		if err := ctx.Err(); err != nil {
			return err
		}
		for ; ti < len(times) && times[ti] < r.at; ti++ {
			st, err := value(times[ti])
			if err != nil {
				return err
			}
			samples = append(samples, sample{times[ti], st.Remaining})
		}
		before, err := value(r.at)
		if err != nil {
			return err
		}
		opts := []ratelimit.CallOption{ratelimit.Count(r.count)}
		if r.reserve {
			opts = append(opts, ratelimit.WithReserve())
		}
		res, err := lim.Limit(ctx, name, key, opts...)
		if err != nil {
			what, reserve := r.counted()
			return lf.countUsage(what, reserve, err)
		}
		after, err := value(r.at)
		if err != nil {
			return err
		}
		s := step{request: r, before: before.Remaining, after: after.Remaining, res: res}
		if cfg.Kind == ratelimit.FixedWindow {
			s.window = [2]time.Duration{before.WindowStart.Sub(simStart), before.NextGrant.Sub(simStart)}
		}
		steps = append(steps, s)
		samples = append(samples, sample{r.at, before.Remaining}, sample{r.at, after.Remaining})
	}
	for ; ti < len(times); ti++ {
		st, err := value(times[ti])
		if err != nil {
			return err
		}
		samples = append(samples, sample{times[ti], st.Remaining})
	}

	printSteps(out, name, cfg, steps)
	if chart != nil {
		// A file already there is cut to the new chart. A pipe or a
		// device (/dev/stdout, a shell's >(gzip > chart.svgz)) has nothing
		// to cut, and refuses Truncate: it takes the chart as it comes.
		// Standard output itself (/dev/stdout, redirected to a file)
		// takes the chart after the table: opened anew, the file was cut
		// and written from its start, over the table.
		var w io.Writer = chart
		fi, err := chart.Stat()
		switch {
		case err == nil && isOutput(out, fi):
			w = out
		case err != nil || fi.Mode().IsRegular():
			if err := chart.Truncate(0); err != nil {
				return fmt.Errorf("--svg: %w", err)
			}
		}
		if err := writeSVG(w, name, cfg, steps, samples, end); err != nil {
			return fmt.Errorf("--svg: %w", err)
		}
		f := chart
		chart = nil
		if err := f.Close(); err != nil {
			return fmt.Errorf("--svg: %w", err)
		}
		// The path as given, its control characters escaped: a newline
		// in it wrote a line of its own into the report.
		fmt.Fprintf(out, "\nchart: %s\n", escapeControls(svgPath))
	}
	return nil
}

// isOutput reports whether fi is the file of out, the command's standard
// output, when that is a file.
func isOutput(out io.Writer, fi os.FileInfo) bool {
	if o, ok := out.(*outWriter); ok {
		out = o.w
	}
	f, ok := out.(*os.File)
	if !ok {
		return false
	}
	ofi, err := f.Stat()
	return err == nil && os.SameFile(fi, ofi)
}

// describe returns the line that names the limit and its fields, the
// name as nameText writes it: a limits file's names are any text, and
// --name any bytes, with a terminal's escapes among them.
func describe(name string, cfg ratelimit.Config) string {
	s := fmt.Sprintf("%s: %v, rate %s per %v", nameText(name), cfg.Kind, numtext.Format(cfg.Rate), cfg.Period)
	if cfg.Capacity != 0 {
		s += ", capacity " + numtext.Format(cfg.Capacity)
	}
	if cfg.MaxReserved != 0 {
		s += ", max reserved " + numtext.Format(cfg.MaxReserved)
	}
	if cfg.Shards > 1 {
		s += fmt.Sprintf(", %d shards", cfg.Shards)
	}
	return s
}

func printSteps(out io.Writer, name string, cfg ratelimit.Config, steps []step) {
	fmt.Fprintln(out, describe(name, cfg))
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "time\twindow\tbefore\tcount\tresult\tafter\tretry after\t")
	for _, s := range steps {
		window := "-"
		if cfg.Kind == ratelimit.FixedWindow {
			window = windowTime(s.window[0]) + "-" + windowTime(s.window[1])
		}
		count := num(s.count)
		if s.reserve {
			count += " (reserve)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%v\t\n", clockTime(s.at), window, num(s.before), count,
			outcome(s.res), num(s.after), s.res.RetryAfter)
	}
	tw.Flush()
}

func outcome(r ratelimit.Result) string {
	switch {
	case !r.OK:
		return "denied"
	case r.RetryAfter > 0:
		return "reserved"
	}
	return "allowed"
}

// clockTime formats an offset from the simulation's start as hh:mm:ss,
// with milliseconds when there are any.
func clockTime(d time.Duration) string {
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	// In int64: the seconds of 100 years overflow an int of 32 bits.
	s := fmt.Sprintf("%s%02d:%02d:%02d", neg, int64(d/time.Hour), int64(d/time.Minute)%60, int64(d/time.Second)%60)
	if ms := d % time.Second; ms != 0 {
		s += fmt.Sprintf(".%03d", int64(ms/time.Millisecond))
	}
	return s
}

// windowTime formats a bound of a window as clockTime does, one before
// the start (a window that began before the simulation) in parentheses, so
// that its minus is not taken for the dash between the bounds.
func windowTime(d time.Duration) string {
	if d < 0 {
		return "(" + clockTime(d) + ")"
	}
	return clockTime(d)
}

// num formats tokens: from 1 up with at most three decimals (1.667); an
// amount below 1 with three significant digits (0.167, 0.0007, 1e-9),
// which three decimals showed as 0.001 for 0.0007, beside a count of
// 0.0003, and as 0 for the tokens of a limit of rate 1e-9; one beyond
// the limits' 1e15, or not a number, as numtext writes it (1e300). An
// exponent is written as numtext and a user write it, without a plus
// sign or leading zeros: Go wrote 1e-09 and 1e+300, beside a limits
// file's and an error's 1e-9.
func num(x float64) string {
	switch {
	case x == 0:
		return "0"
	case !(math.Abs(x) < 1e16):
		return numtext.Format(x)
	case math.Abs(x) < 1:
		return plainExponent(strconv.FormatFloat(x, 'g', 3, 64))
	}
	return strconv.FormatFloat(math.Round(x*1000)/1000, 'f', -1, 64)
}

// plainExponent returns s, a number as strconv formats it, with its
// exponent, if any, as numtext writes one: 2e-06 as 2e-6, 1e+15 as 1e15.
func plainExponent(s string) string {
	mant, exp, ok := strings.Cut(s, "e")
	if !ok {
		return s
	}
	sign := ""
	if exp[0] == '-' {
		sign = "-"
	}
	return mant + "e" + sign + strings.TrimLeft(exp[1:], "+-0")
}
