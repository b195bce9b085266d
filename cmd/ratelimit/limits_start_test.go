package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --start is an RFC 3339 time, as in a limits file: an offset of 24 hours
// (+24:00) or of 60 minutes, an hour of one digit or a comma before the
// fraction of a second, which time.Parse reads, is a usage error.
func TestStartFlagRFC3339(t *testing.T) {
	for _, bad := range []string{"2024-01-01T00:00:00+24:00", "2024-01-01T00:00:00+00:60", "2024-01-01T0:00:00Z", "2024-01-01T00:00:00,5Z"} {
		code, _, errOut := exec("simulate", "--kind", "fixed window", "--rate", "10", "--period", "1h", "--start", bad, "--at", "0s=1")
		require.Equal(t, 2, code, "%s: %s", bad, errOut)
		assert.Contains(t, errOut, "write an RFC 3339 time such as 2024-01-01T00:00:00Z", bad)
	}
	code, _, errOut := exec("simulate", "--kind", "fixed window", "--rate", "10", "--period", "1h", "--start", "2024-01-01T00:00:00-23:59", "--at", "0s=1")
	require.Equal(t, 0, code, errOut)
}
