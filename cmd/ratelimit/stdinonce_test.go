package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Standard input is read once: a command that is given two readers of it
// (the tokens of -, a limits file or a token key's file named
// /dev/stdin) is a usage error that says so, in every token command. The
// token key's file read the tokens as the key, and then "no token on
// standard input" was said of a list of tokens; a limits file read
// first left a token key of 0 bytes.
func TestStdinReadOnce(t *testing.T) {
	const store = "redis://127.0.0.1:1"
	inline := []string{"--kind", "token bucket", "--rate", "1", "--period", "1s", "--name", "a"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"token", "inspect", "--token-key-file", "/dev/stdin", "-"},
			"ratelimit: --token-key-file /dev/stdin with -: both read standard input: give the token key's file by its name, or the tokens as arguments\n"},
		{append([]string{"token", "use", "--store", store, "--token-key-file", "/dev/fd/0", "-"}, inline...),
			"ratelimit: --token-key-file /dev/fd/0 with -: both read standard input: give the token key's file by its name, or the tokens as arguments\n"},
		{[]string{"token", "use", "--store", store, "--limits", "/dev/stdin", "-"},
			"ratelimit: --limits /dev/stdin with -: both read standard input: give the limits file by its name, or the tokens as arguments\n"},
		{[]string{"token", "settle", "--store", store, "--used", "1", "--limits", "/proc/self/fd/0", "-"},
			"ratelimit: --limits /proc/self/fd/0 with -: both read standard input: give the limits file by its name, or the tokens as arguments\n"},
		{[]string{"token", "refund", "--store", store, "--limits", "/dev/stdin", "--token-key-file", "/dev/stdin", "AQ"},
			"ratelimit: --limits /dev/stdin with --token-key-file /dev/stdin: both read standard input: give one of the files by its name\n"},
		{[]string{"token", "inspect", "--token-key-file", "/dev/stdin", "--token-key-file", "/dev/stdin", "AQ"},
			"ratelimit: --token-key-file /dev/stdin with --token-key-file /dev/stdin: both read standard input: give one of the files by its name\n"},
	} {
		code, _, errOut := execIn("AQ\nBQ\nCQ\nDQ\nEQ\nFQ\nGQ\nHQ\nIQ\n", c.args...)
		assert.Equal(t, 2, code, "%q: %s", c.args, errOut)
		assert.Equal(t, c.want+"Run 'ratelimit "+c.args[0]+" "+c.args[1]+" --help' for usage.\n", errOut, "%q", c.args)
	}
}
