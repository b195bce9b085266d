// Command ratelimit shows what a limit does and operates limits in real
// stores: simulate a limit on a timeline (and draw it), inspect or reset a
// (name, key) in a store, and drive a store with load while checking that
// no window grants more than its limit. See docs/cli.md.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError marks an error in how the command was called: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// run runs the command line args and returns the exit code: 0, 1 for a
// failure, 2 for a usage error.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "ratelimit:", err)
	var u usageError
	if errors.As(err, &u) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return 2
	}
	return 1
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:               "ratelimit",
		Short:             "Simulate, inspect, reset and load-test rate limits",
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newSimulate(), newInspect(), newReset(), newLimit(), newBench(), newSchema())
	for _, c := range root.Commands() {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("%s takes no arguments, only flags: got %q", cmd.Name(), args)
			}
			return nil
		}
	}
	return root
}
