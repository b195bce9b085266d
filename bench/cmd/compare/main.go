// Command compare runs ratelimit beside other Go rate limiters and bare
// baselines, interleaved in one run on the local servers, prints Markdown
// tables of decisions per second, latencies and the library's ratios, and
// checks that no contender granted more than its algorithm allows. It
// exits with status 1 when a check fails (with -fail library, only when
// one of ratelimit's does), 2 on a usage or setup error or when every
// medium was skipped (its server could not be reached), 3 when the checks
// passed but it could not remove what it made (its keys, schema or files
// may be left; a failed check's 1 comes first). Interrupted
// (Ctrl-C) or terminated (SIGTERM), it removes what it made, reports the
// cells that finished and exits as shells report a command the signal
// ended: 130 for SIGINT, 143 for SIGTERM (128 + the signal's number); a
// second signal while it cleans up ends it at once with the same status
// for that signal, leaving what it has not removed yet.
//
//	cd bench && go run ./cmd/compare -medium redis,pg,bolt,memory -goroutines 1,8,64 -keys 1,10000 -rounds 5 -slice 200ms
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ratelimit-go/ratelimit/bench/compare"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, notify()))
}

// notify returns a channel that receives SIGINT and SIGTERM, in place of
// their default action, for the rest of the process.
func notify() <-chan os.Signal {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	return sigs
}

// run runs the command with args, the report on stdout and progress and
// errors on stderr, and returns its exit status. A signal on sigs ends
// the run as an interrupt.
func run(args []string, stdout, stderr io.Writer, sigs <-chan os.Signal) int {
	o := compare.DefaultOptions()
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: compare [flags]\n\n"+
			"Runs ratelimit beside other Go rate limiters and bare baselines on the local servers,\n"+
			"prints Markdown tables, and checks every grant against each limiter's own bound.\n\n")
		fs.PrintDefaults()
	}
	var (
		mediaFlag  = fs.String("medium", strings.Join(o.Media, ","), "media to run, comma-separated: "+strings.Join(compare.AllMedia, ", "))
		goroutines = fs.String("goroutines", "1,8,64", "goroutine counts, comma-separated")
		keys       = fs.String("keys", "1,10000", fmt.Sprintf("key counts, comma-separated, each from 1 to %d", compare.MaxKeys))
		kind       = fs.String("kind", "token bucket", `the library's kind of limit: "token bucket" or "fixed window"`)
		match      = fs.String("match", "", "run only the contenders whose name matches this regular expression")
		cluster    = fs.String("cluster", strings.Join(o.ClusterAddrs, ","), "Redis Cluster nodes, comma-separated")
	)
	fs.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds counted per cell, after one warm-up round")
	fs.DurationVar(&o.Slice, "slice", o.Slice, "how long each contender runs in each round")
	fs.IntVar(&o.Limit.Rate, "rate", o.Limit.Rate, "tokens per period per key, and the burst")
	fs.DurationVar(&o.Limit.Period, "period", o.Limit.Period, "the limit's period")
	fs.StringVar(&o.RedisAddr, "redis", o.RedisAddr, "Redis server (host:port, loopback)")
	fs.StringVar(&o.PostgresURL, "pg", o.PostgresURL, "PostgreSQL URL (loopback)")
	fs.IntVar(&o.RedisPool, "redis-pool", 0, "connections per Redis node (0: go-redis's default, 10 per CPU)")
	fs.IntVar(&o.PGConns, "pg-conns", 20, "connections in the PostgreSQL pool")
	quiet := fs.Bool("quiet", false, "no progress on standard error, nor warnings about a Redis server's settings; errors still go there")
	fail := fs.String("fail", "any", `exit with status 1 when "any" contender's check fails, or only when "library" (ratelimit's) does`)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0 // asked for: the usage went to stderr
		}
		return 2
	}
	var err error
	usage := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "compare: "+format+"\n", args...)
		return 2
	}
	// Parsing stops at the first argument that is not a flag: the flags
	// after it would be dropped without a word.
	if fs.NArg() > 0 {
		return usage("unexpected argument %q: every setting is a flag (see -h)", fs.Arg(0))
	}
	o.Media = split(*mediaFlag)
	if o.Goroutines, err = ints(*goroutines); err != nil {
		return usage("-goroutines: %v", err)
	}
	if o.Keys, err = ints(*keys); err != nil {
		return usage("-keys: %v", err)
	}
	if err := o.Limit.Kind.UnmarshalText([]byte(*kind)); err != nil {
		return usage("-kind: %v", err)
	}
	if *match != "" {
		if o.Match, err = regexp.Compile(*match); err != nil {
			return usage("-match: %v", err)
		}
	}
	if *fail != "any" && *fail != "library" {
		return usage(`-fail: %q: choose "any" or "library"`, *fail)
	}
	o.ClusterAddrs = split(*cluster)
	if !*quiet {
		o.Progress = stderr
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(stderr, err) // it names the package: "compare: …"
		return 2
	}

	// A run cleans up what it made when it is interrupted or told to
	// terminate (as by kill or timeout); a second signal, while it
	// cleans up (a server slow to answer, a lock in the way), ends the
	// process at once.
	ctx, stop := interrupts(sigs, stderr)
	defer stop()
	start := time.Now()
	rep, err := runCompare(ctx, o)
	if rep != nil {
		if werr := rep.WriteMarkdown(stdout); werr != nil && err == nil {
			err = werr
		}
	}
	// The checks of the cells that finished stand, also in a run that
	// ended early.
	failed := 0
	if rep != nil {
		for _, v := range rep.Violations() {
			fmt.Fprintf(stderr, "compare: check FAILED: %s (%s, %s) granted more than its bound allows\n", v.Contender.Name, v.Medium, v.Cell)
			if *fail == "any" || v.Contender.Role == compare.Library {
				failed++
			}
		}
	}
	// What a run could not remove is said on stderr too, which a script
	// keeps where it drops the report.
	var cleanup error
	if rep != nil {
		if cleanup = rep.CleanupErr(); cleanup != nil {
			fmt.Fprintf(stderr, "compare: cleaning up failed: %v; %s\n", strings.ReplaceAll(cleanup.Error(), "\n", "; "), leftBehind())
		}
	}
	// A run ended by a signal exits as shells report a command the signal
	// ended, whatever error its end caused.
	if sig, ok := context.Cause(ctx).(interrupted); ok {
		took := time.Since(start).Round(time.Millisecond)
		if err != nil {
			fmt.Fprintf(stderr, "compare: %v: %v (after %v); the report holds the cells that finished\n", sig, err, took)
		} else {
			fmt.Fprintf(stderr, "compare: %v (after %v)\n", sig, took)
		}
		return sig.status()
	}
	if err != nil {
		return usage("%v (after %v)", err, time.Since(start).Round(time.Millisecond))
	}
	if failed > 0 {
		return 1
	}
	if cleanup != nil {
		return exitCleanup
	}
	// A run that measured nothing did not do what it was asked: the
	// servers it was to run on could not be reached, or -match matched
	// none of their contenders.
	ran := false
	for _, m := range rep.Media {
		ran = ran || m.Skipped == ""
	}
	if !ran {
		return usage("no medium ran: every one was skipped")
	}
	return 0
}

// runCompare runs the comparison (a run that fails to clean up, in tests).
var runCompare = compare.Run

// exitCleanup is the status of a run whose checks passed and that could
// not remove what it made: the report stands, and the keys, schema or
// files named on stderr may be left.
const exitCleanup = 3

// leftBehind says what a run may leave when it cannot clean up, and where.
func leftBehind() string {
	return fmt.Sprintf("the run's Redis keys (rlcompare-*), PostgreSQL schema (rlcompare_*) or bbolt directory (rlcompare-* in %s) may be left", os.TempDir())
}

// interrupted is the cause of a run's end by a signal.
type interrupted struct{ os.Signal }

func (i interrupted) Error() string { return i.Signal.String() }

// status is the exit status of a process the signal ended: 128 + its
// number, as shells report it (130 for SIGINT, 143 for SIGTERM).
func (i interrupted) status() int {
	if n, ok := i.Signal.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 128 + int(syscall.SIGINT)
}

// interrupts returns a context that ends at the first signal on sigs, its
// cause an interrupted; the second ends the process with 128 + its number,
// saying that what the run made may be left. stop stops listening.
func interrupts(sigs <-chan os.Signal, stderr io.Writer) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			cancel(interrupted{sig})
		case <-done:
			return
		}
		select {
		case sig := <-sigs:
			fmt.Fprintf(stderr, "compare: %v again while cleaning up: exiting at once; %s\n", sig, leftBehind())
			os.Exit(interrupted{sig}.status())
		case <-done:
		}
	}()
	return ctx, func() {
		close(done)
		cancel(nil)
	}
}

func split(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range split(s) {
		n, err := strconv.Atoi(strings.ReplaceAll(f, "_", ""))
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}
