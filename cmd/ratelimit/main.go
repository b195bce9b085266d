// Command ratelimit shows what a limit does and operates limits in real
// stores: simulate a limit on a timeline (and draw it), inspect or reset a
// (name, key) in a store, drive a store with load while checking that no
// window grants more than its limit, and look into a reservation's or a
// receipt's token or settle it by hand. See docs/cli.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/benbjohnson/clock"
	"github.com/spf13/cobra"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// usageError marks an error in how the command was called: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// usageOf is a usage error of the command cmd, whose --help the hint
// names, where the command run is another: help's, for help token nope,
// whose error is token's.
type usageOf struct {
	cmd *cobra.Command
	err error
}

func (e usageOf) Error() string { return e.err.Error() }
func (e usageOf) Unwrap() error { return usageError{e.err} }

// exitError ends the command with an exit code of its own.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// Exit codes.
const (
	exitFailure     = 1
	exitUsage       = 2
	exitSettled     = 3   // token refund, use or settle: a token was settled before, and nothing was done
	exitExpired     = 4   // token refund, use or settle: a token had expired, and nothing was done
	exitInterrupted = 130 // 128 + SIGINT, as shells report a command that Ctrl-C ended
)

// run runs the command line args and returns the exit code: 0, 1 for a
// failure, 2 for a usage error, 3 and 4 for a token settled before or
// expired, 130 for a bench interrupted. Cancelling ctx is what Ctrl-C
// does to a bench.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, args, os.Stdin, stdout, stderr)
}

// runWith is run with stdin for standard input, which the token commands
// read tokens from.
func runWith(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetIn(stdin)
	out := &outWriter{w: stdout}
	root.SetOut(out)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if out.err != nil {
		lost := fmt.Errorf("writing the output: %w", out.err)
		switch {
		case err == nil || errors.Is(err, out.err):
			err = lost
		default: // said before the command's own error, which sets the status
			fmt.Fprintln(stderr, message(lost))
		}
	}
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, message(err))
	var (
		u usageError
		x exitError
	)
	switch {
	case errors.As(err, &u):
		if uo := (usageOf{}); errors.As(err, &uo) {
			cmd = uo.cmd
		}
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	case errors.As(err, &x):
		return x.code
	}
	return exitFailure
}

// clockKey is the key of the context value that gives the commands on a
// store (inspect, limit, reset) the clock to read the time from. Tests
// put a mock there, so that what a command answers does not move with
// the time the machine takes to run it; the commands read the machine's
// clock otherwise.
type clockKey struct{}

// testClock returns the clock of ctx, and whether it has one.
func testClock(ctx context.Context) (clock.Clock, bool) {
	clk, ok := ctx.Value(clockKey{}).(clock.Clock)
	return clk, ok
}

// now returns the time of the clock of ctx, or the machine's.
func now(ctx context.Context) time.Time {
	if clk, ok := testClock(ctx); ok {
		return clk.Now()
	}
	return time.Now()
}

// outWriter is standard output, which keeps the first error of a write:
// the reports print as they go and do not look at each write's error, and
// a command whose output was lost (a full disk, a closed standard output)
// exited 0, such as ratelimit schema > migration.sql, which left a file
// cut short, or none, for the migration to apply.
type outWriter struct {
	w   io.Writer
	err error
}

func (o *outWriter) Write(p []byte) (int, error) {
	if o.err != nil {
		return 0, o.err
	}
	n, err := o.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	o.err = err
	return n, err
}

// prefix starts every error message of the command, once.
const prefix = "ratelimit: "

// message returns the line that reports err: the library's and the
// command's own "ratelimit: " once, at the start, and a hint to check the
// server when err is a failure to reach it.
func message(err error) string {
	s := err.Error()
	for strings.HasPrefix(s, prefix) {
		s = strings.TrimPrefix(s, prefix)
	}
	// Errors wrapped in errors, and the sentinels at their end, repeat it.
	s = strings.ReplaceAll(s, ": "+prefix, ": ")
	if isConnError(err) {
		s += " (is the server up? check --store)"
	}
	return prefix + escapeControls(s)
}

// escapeControls returns s with each control character (ESC, CR, a
// newline, DEL, the C1 controls), each format character (the
// right-to-left override) and each byte that is not UTF-8 written as Go
// escapes it in a string (\x1b, \r, \u202e, \xff): an error quotes what
// it was given, such as a path or a store's user, and a server's error
// what the server says, and a terminal ran the escapes among them, turned
// the line red, moved the cursor back over it, or set the window's title.
func escapeControls(s string) string {
	if strings.IndexFunc(s, needsEscape) < 0 && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case needsEscape(r):
			q := strconv.QuoteRune(r) // '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// needsEscape reports whether r is a control or format character.
func needsEscape(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }

// version returns the command's version, from the build's information:
// the main module's version ("(devel)" when built from a checkout without
// one) and the Go release that built it.
func version(info *debug.BuildInfo, ok bool) string {
	if !ok || info == nil {
		return "(devel) " + runtime.Version()
	}
	v := info.Main.Version
	if v == "" {
		v = "(devel)"
	}
	return v + " " + info.GoVersion
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:               "ratelimit",
		Short:             "Simulate, inspect, reset and load-test rate limits; look into and settle tokens",
		Version:           version(debug.ReadBuildInfo()),
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		// The root runs only to refuse a command it does not know, as a
		// usage error, or to print its help.
		Args: cobra.ArbitraryArgs,
		RunE: helpOrUnknown("", "run 'ratelimit --help' for the commands"),
	}
	root.SuggestionsMinimumDistance = 2
	root.SetVersionTemplate("ratelimit {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newSimulate(), newInspect(), newReset(), newLimit(), newBench(), newSchema(), newToken())
	root.SetHelpCommand(newHelp())
	// Cobra's help writes the error of its output to standard error, a
	// line without "ratelimit: " before run's own line of it.
	help := root.HelpFunc()
	root.SetHelpFunc(func(c *cobra.Command, args []string) {
		stderr := c.ErrOrStderr()
		c.SetErr(io.Discard)
		defer c.SetErr(stderr)
		help(c, args)
	})
	for _, c := range root.Commands() {
		if c.HasSubCommands() {
			continue // takes a command, or its help (token)
		}
		c.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("%s takes no arguments, only flags: got %q", cmd.Name(), args)
			}
			return nil
		}
	}
	return root
}

// helpOrUnknown is the RunE of a command that only groups others (the
// root, or of what, such as "token"): with no arguments it prints its
// help; given one it does not know, a usage error that suggests a near
// name, or hint.
func helpOrUnknown(of, hint string) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		why := hint
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 && args[0] != "" { // every name starts with ""
			why = fmt.Sprintf("did you mean %q?", s[0])
		}
		if of != "" {
			return usagef("unknown command %q for \"ratelimit %s\": %s", args[0], of, why)
		}
		return usagef("unknown command %q: %s", args[0], why)
	}
}

// newHelp returns the help command: the help of the command named, and
// for a command it does not know, the usage error that command would
// give. Cobra's own found the root for a word it does not know (the root
// takes words, to refuse them itself), and printed its help, with status
// 0.
func newHelp() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			// Its usage errors are of the command asked about, whose
			// --help they point at, not help's.
			cmd, rest, err := c.Root().Find(args)
			switch {
			case err != nil:
				return usageOf{c.Root(), err}
			case len(rest) > 0 && cmd.HasSubCommands():
				err := cmd.RunE(cmd, rest) // the root or token: an unknown command, and a near name
				if errors.As(err, new(usageError)) {
					err = usageOf{cmd, err}
				}
				return err
			case len(rest) > 0:
				return usageOf{cmd, fmt.Errorf("unknown command %q for %q, which has none: run '%s --help'", rest[0], cmd.CommandPath(), cmd.CommandPath())}
			}
			return cmd.Help()
		},
	}
}
