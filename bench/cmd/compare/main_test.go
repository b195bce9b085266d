package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestUsageErrors requires every bad command line to exit with status 2
// before anything runs, with one line that names what is wrong.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		// Parsing stops at "extra": the flags after it were dropped and
		// the run went ahead, and exited 0.
		{[]string{"-medium", "memory", "-match", "nothing", "extra", "-rounds", "0"},
			`compare: unexpected argument "extra": every setting is a flag (see -h)` + "\n"},
		// The package's errors name it; the command named it again, and
		// gave the time the run took though none ran.
		{[]string{"-rounds", "0"},
			"compare: 0 rounds of 200ms: choose at least one round of a positive slice\n"},
		{[]string{"-medium", "mongo"},
			`compare: unknown medium "mongo": choose among [memory bolt redis cluster pg]` + "\n"},
		{[]string{"-goroutines", "1,x"}, `compare: -goroutines: "x" is not a whole number` + "\n"},
		{[]string{"-fail", "some"}, `compare: -fail: "some": choose "any" or "library"` + "\n"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		assert.Equal(t, 2, code, "%q", tc.args)
		assert.Equal(t, tc.want, stderr.String(), "%q", tc.args)
		assert.Empty(t, stdout.String(), "%q", tc.args)
	}
}
