package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --start is an RFC 3339 time, as in a limits file: an offset of 24 hours
// (+24:00) or of 60 minutes, an hour of one digit or a comma before the
// fraction of a second, which time.Parse reads, is a usage error; a
// lower-case t or z, which RFC 3339 allows and time.Parse refused, is not.
func TestStartFlagRFC3339(t *testing.T) {
	for _, bad := range []string{"2024-01-01T00:00:00+24:00", "2024-01-01T00:00:00+00:60", "2024-01-01T0:00:00Z", "2024-01-01T00:00:00,5Z"} {
		code, _, errOut := exec("simulate", "--kind", "fixed window", "--rate", "10", "--period", "1h", "--start", bad, "--at", "0s=1")
		require.Equal(t, 2, code, "%s: %s", bad, errOut)
		assert.Contains(t, errOut, "write an RFC 3339 time such as 2024-01-01T00:00:00Z", bad)
	}
	for _, good := range []string{"2024-01-01T00:00:00-23:59", "2024-01-01t00:00:00z"} {
		code, _, errOut := exec("simulate", "--kind", "fixed window", "--rate", "10", "--period", "1h", "--start", good, "--at", "0s=1")
		require.Equal(t, 0, code, "%s: %s", good, errOut)
	}
}

// --limits without --name is told to give --name: it was told that the
// limit "" is not in the file, a name it had not asked for. A file that
// declares the limit "" still gives it.
func TestLimitsFileWithoutName(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.yaml")
	require.NoError(t, os.WriteFile(path, []byte("api:\n  kind: token bucket\n  rate: 5\n  period: 1m\nsignup:\n  kind: fixed window\n  rate: 5\n  period: 1h\n"), 0o600))
	code, _, errOut := exec("simulate", "--limits", path, "--at", "0s=1")
	require.Equal(t, 2, code, errOut)
	assert.Contains(t, errOut, `ratelimit: --limits without --name: pass --name, the limit of `+path+` to use, one of ["api" "signup"]`+"\n")

	code, _, errOut = exec("simulate", "--limits", path, "--name", "", "--at", "0s=1")
	require.Equal(t, 2, code, errOut)
	assert.Contains(t, errOut, `ratelimit: limit "" is not in `+path+`: pass --name, one of ["api" "signup"]`+"\n")

	require.NoError(t, os.WriteFile(path, []byte("\"\":\n  kind: token bucket\n  rate: 5\n  period: 1m\n"), 0o600))
	code, out, errOut := exec("simulate", "--limits", path, "--at", "0s=1")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "allowed")
}
