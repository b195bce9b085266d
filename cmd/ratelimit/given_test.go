package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAtSpacesAroundEquals requires --at to read spaces around a
// request's = as the requests without them: "00:30 = 15" was refused as
// the time "00:30 ", which the message said to write as hh:mm, as it was.
func TestAtSpacesAroundEquals(t *testing.T) {
	code, want, errOut := exec(append([]string{"simulate", "--at", "0s=1,00:01=2r,90s=1"}, tokenBucket...)...)
	require.Equal(t, 0, code, errOut)
	for _, at := range []string{"0s = 1, 00:01 = 2r, 90s= 1", "0s =1,00:01= 2r,90s =1", "0s = 1,00:01 = 2 r,90s=1"} {
		code, out, errOut := exec(append([]string{"simulate", "--at", at}, tokenBucket...)...)
		require.Equal(t, 0, code, "%q: %s", at, errOut)
		require.Equal(t, want, out, at)
	}
	// A request with no time before its = is told as before.
	code, _, errOut = exec(append([]string{"simulate", "--at", " = 1"}, tokenBucket...)...)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `--at "= 1": the request has no time before its =`)
}

// TestNumbersEchoedAsGiven requires an error about a count to quote it as
// the command line wrote it: --at 00:30=1e300 was told as "--at
// 30m0s=1e+300: count 1e+300", neither of which the user wrote, and
// unquoted where the other errors of --at quote the request.
func TestNumbersEchoedAsGiven(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append([]string{"simulate", "--at", "00:30=1e300"}, tokenBucket...),
			`--at "00:30=1e300": count 1e300 exceeds 1000000000000000, the most tokens one call may ask for: split the call`},
		{append([]string{"simulate", "--at", "00:30 = 4"}, tokenBucket...),
			`--at "00:30 = 4": count 4 exceeds 3, the most the limit can grant at once: raise --capacity, split the call, or ask with --at "00:30 = 4r"`},
		{append([]string{"simulate", "--at", "1s=-1E300r"}, tokenBucket...), `--at "1s=-1E300r": count -1E300 is negative: a count is a number from 0 to 1000000000000000`},
		{append([]string{"simulate", "--every", "1s", "--for", "2s", "--count", "1e300"}, tokenBucket...),
			"--count 1e300 exceeds 1000000000000000, the most tokens one call may ask for: split the call"},
		{append([]string{"limit", "--store", "mem:", "--count", "1e300"}, tokenBucket...),
			"--count 1e300 exceeds 1000000000000000, the most tokens one call may ask for: split the call"},
		{append([]string{"limit", "--store", "mem:", "--count", "4.0"}, tokenBucket...),
			"--count 4.0 exceeds 3, the most the limit can grant at once: raise --capacity, split the call, or ask with --reserve"},
		{append([]string{"bench", "--store", "mem:", "--count", "1e300"}, tokenBucket...),
			"--count 1e300 exceeds 1000000000000000, the most tokens one call may ask for: split the call"},
		{append([]string{"bench", "--store", "mem:", "--count", "0e5"}, tokenBucket...),
			"--count 0e5: a call of 0 tokens takes none, and is allowed every time, which loads the store but checks nothing: give a count above 0, such as 1"},
		{append([]string{"token", "settle", "--store", "mem:", "--name", "limit", "--used", "-1e300", "AQ"}, tokenBucket...),
			"--used -1e300: give the tokens used, a finite number ≥ 0 (0 hands them all back)"},
		// The bound of a float64 was written 1.7976931348623157e+308.
		{append([]string{"simulate", "--at", "0s=1e400"}, tokenBucket...),
			`--at "0s=1e400": the count "1e400" is out of range: a float64 holds numbers up to about 1.8e308 in size: write a smaller one`},
	} {
		code, out, errOut := exec(tc.args...)
		require.Equal(t, 2, code, "%q: %s%s", tc.args, out, errOut)
		require.Equal(t, "ratelimit: "+tc.want+"\n", strings.SplitAfter(errOut, "\n")[0], "%q", tc.args)
	}
}

// TestTokenArgumentTrimmed requires a token given as an argument to be
// read with spaces around it, as a line of standard input is: "$TOKEN "
// was refused as "illegal base64 data at input byte 99".
func TestTokenArgumentTrimmed(t *testing.T) {
	const token = "AQF41jIorYZ933idKUC59kxmjoPDqMFoAPD6Ogd1c2VyLTQyAQtzZW5kTWVzc2FnZQAAAAAAAADwP2mNvyWyQfQ0kun0WxyWK-g"
	code, want, errOut := exec("token", "inspect", token)
	require.Equal(t, 0, code, errOut)
	for _, arg := range []string{" " + token, token + " ", "\t" + token + "\r\n"} {
		code, out, errOut := exec("token", "inspect", arg)
		require.Equal(t, 0, code, "%q: %s", arg, errOut)
		require.Equal(t, want, out, "%q", arg)
	}
	code, _, errOut = exec("token", "inspect", "  ")
	require.Equal(t, 1, code)
	require.Equal(t, "ratelimit: token is empty: give the text of a token (Token.String): invalid token\n", errOut)
}
