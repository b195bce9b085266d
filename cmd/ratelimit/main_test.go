package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// exec runs the command line and returns its exit code and output.
func exec(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// execAt runs the command line args as exec does, on the time of clk:
// the commands on a store read it rather than the machine's clock, so
// that what they answer does not move while a slow machine runs the test.
func execAt(clk clock.Clock, args ...string) (int, string, string) {
	return execContext(context.WithValue(context.Background(), clockKey{}, clk), args...)
}

// rows returns the table rows of out, each split into its columns.
func rows(out string) [][]string {
	var rs [][]string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.Count(f[0], ":") == 2 {
			rs = append(rs, f)
		}
	}
	return rs
}

func TestSimulateRollover(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "rollover.svg")
	code, out, errOut := exec("simulate", "--kind", "fixed window", "--rate", "100", "--period", "1h", "--capacity", "150",
		"--at", "00:30=15,00:45=15,01:30=30,01:40=125,01:50=1", "--svg", svg)
	require.Equal(t, 0, code, errOut)
	// time, window, before, count, result, after, retry after
	require.Equal(t, [][]string{
		{"00:30:00", "00:00:00-01:00:00", "150", "15", "allowed", "135", "0s"},
		{"00:45:00", "00:00:00-01:00:00", "135", "15", "allowed", "120", "0s"},
		// A new window granted 100, capped at 150: unused tokens rolled over.
		{"01:30:00", "01:00:00-02:00:00", "150", "30", "allowed", "120", "0s"},
		{"01:40:00", "01:00:00-02:00:00", "120", "125", "denied", "120", "20m0s"},
		{"01:50:00", "01:00:00-02:00:00", "120", "1", "allowed", "119", "0s"},
	}, rows(out), out)

	// The chart is well-formed SVG with the expected parts.
	f, err := os.Open(svg)
	require.NoError(t, err)
	defer f.Close()
	counts := map[string]int{}
	dec := xml.NewDecoder(f)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
			for _, a := range se.Attr {
				if a.Name.Local == "class" {
					counts["."+a.Value]++
				}
			}
		}
	}
	require.Equal(t, 1, counts["svg"])
	require.Equal(t, 1, counts[".tokens"])
	require.Equal(t, 1, counts[".capacity"])
	require.Equal(t, 5, counts[".request"])
	require.Equal(t, 2, counts[".window"], "boundaries at 01:00 and 02:00 within the chart")
}

// A window that began before the simulation's start is shown with its
// start in parentheses, so that its minus is not taken for the dash
// between the bounds: it read -00:40:00-00:20:00.
func TestSimulateWindowBeforeStart(t *testing.T) {
	for _, start := range []string{"2024-01-01T00:20:00Z", "1969-06-01T00:20:00Z", "2025-03-01T00:20:00.5Z"} {
		code, out, errOut := exec("simulate", "--kind", "fixed window", "--rate", "10", "--period", "1h", "--start", start, "--at", "0s=1,30m=1")
		require.Equal(t, 0, code, errOut)
		want := [][]string{
			{"00:00:00", "(-00:40:00)-00:20:00", "10", "1", "allowed", "9", "0s"},
			{"00:30:00", "00:20:00-01:20:00", "10", "1", "allowed", "9", "0s"},
		}
		if strings.HasSuffix(start, ".5Z") {
			want[0][1], want[1][1] = "(-00:39:59.500)-00:20:00.500", "00:20:00.500-01:20:00.500"
		}
		require.Equal(t, want, rows(out), "--start %s:\n%s", start, out)
	}
}

func TestSimulateTokenBucketAndReserve(t *testing.T) {
	code, out, errOut := exec("simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--capacity", "3",
		"--max-reserved", "6", "--at", "0s=3,1s=1,2s=5r,3s=2r")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, [][]string{
		{"00:00:00", "-", "3", "3", "allowed", "0", "0s"},
		{"00:00:01", "-", "0.167", "1", "denied", "0.167", "5s"},
		{"00:00:02", "-", "0.333", "5", "(reserve)", "reserved", "-4.667", "28s"},
		{"00:00:03", "-", "-4.5", "2", "(reserve)", "denied", "-4.5", "3s"},
	}, rows(out), out)
}

func TestSimulateSteadyPattern(t *testing.T) {
	code, out, errOut := exec("simulate", "--kind", "fixed window", "--rate", "2", "--period", "10s", "--every", "4s", "--for", "20s")
	require.Equal(t, 0, code, errOut)
	var results []string
	for _, r := range rows(out) {
		results = append(results, r[4])
	}
	// Windows 0-10s, 10-20s, 20-30s: two calls each, a third denied.
	require.Equal(t, []string{"allowed", "allowed", "denied", "allowed", "allowed", "allowed"}, results, out)
}

func TestLimitsFiles(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "limits.json")
	require.NoError(t, os.WriteFile(js, []byte(`{"send": {"kind": "token bucket", "rate": 10, "period": "1m", "capacity": 3}}`), 0o600))
	yml := filepath.Join(dir, "limits.yaml")
	require.NoError(t, os.WriteFile(yml, []byte("send:\n  kind: token bucket\n  rate: 10\n  period: 1m\n  capacity: 3\n"), 0o600))
	var outs []string
	for _, f := range []string{js, yml} {
		code, out, errOut := exec("simulate", "--limits", f, "--name", "send", "--at", "0s=1,0s=1,0s=1,0s=1")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "send: token bucket, rate 10 per 1m0s, capacity 3")
		require.Contains(t, out, "denied")
		outs = append(outs, out)
	}
	require.Equal(t, outs[0], outs[1], "JSON and YAML describe the same limit")

	code, _, errOut := exec("simulate", "--limits", js, "--name", "nope", "--at", "0s=1")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `limit "nope" is not in`)
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("x:\n  kind: fixed window\n  rate: 0\n  period: 1m\n"), 0o600))
	code, _, errOut = exec("simulate", "--limits", bad, "--name", "x", "--at", "0s=1")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `limit "x": rate is 0`)
}

// A .json limits file is read by JSON's rules, with JSON's errors, which
// name the line and the column: read as YAML, a comma after the last
// member passed, and a trailing NUL got "yaml: control characters are not
// allowed". A .yaml file is YAML, of which such JSON is.
func TestLimitsFileJSONRules(t *testing.T) {
	dir := t.TempDir()
	const limits = "{\n  \"send\": {\"kind\": \"token bucket\", \"rate\": 10, \"period\": \"1m\"},\n}\n"
	js := writeFile(t, dir, "limits.json", limits)
	code, out, errOut := exec("simulate", "--limits", js, "--name", "send", "--at", "0s=1")
	require.Equal(t, 1, code, out)
	assert.Equal(t, "ratelimit: --limits "+js+": limits file: line 3, column 1: not JSON: a comma before }: JSON allows none after the last member of an object or an array; remove it\n", errOut)

	nul := writeFile(t, dir, "nul.json", `{"send": {"kind": "token bucket", "rate": 10, "period": "1m"}}`+"\x00")
	code, out, errOut = exec("simulate", "--limits", nul, "--name", "send", "--at", "0s=1")
	require.Equal(t, 1, code, out)
	assert.Equal(t, "ratelimit: --limits "+nul+": limits file: line 1, column 63: not JSON: byte 0x00 after the JSON value: write one JSON object, with nothing after it but white space\n", errOut)

	yml := writeFile(t, dir, "limits.yaml", limits)
	code, _, errOut = exec("simulate", "--limits", yml, "--name", "send", "--at", "0s=1")
	require.Equal(t, 0, code, errOut)
}

// A limits file larger than maxLimitsFile is refused, before it is read
// whole: one given by mistake (a log, a dump, a link to /dev/zero) was read
// into memory, all of it, before the parser could say it is no limits
// file. A file of maxLimitsFile bytes is read.
func TestLimitsFileTooLarge(t *testing.T) {
	dir := t.TempDir()
	limit := []byte("api:\n  kind: token bucket\n  rate: 10\n  period: 1m\n")
	fits := filepath.Join(dir, "fits.yaml")
	require.NoError(t, os.WriteFile(fits, append(limit, bytes.Repeat([]byte("#"), maxLimitsFile-len(limit))...), 0o600))
	code, _, errOut := exec("simulate", "--limits", fits, "--name", "api", "--at", "0s=1")
	require.Equal(t, 0, code, errOut)

	// A byte more: a sparse file, of its size alone.
	big := filepath.Join(dir, "big.yaml")
	f, err := os.Create(big)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(maxLimitsFile+1))
	require.NoError(t, f.Close())
	code, out, errOut := exec("simulate", "--limits", big, "--name", "api", "--at", "0s=1")
	require.Equal(t, 1, code, "%s%s", out, errOut)
	assert.Equal(t, "ratelimit: --limits "+big+": larger than 4 MiB, the most a limits file may be: is it the limits file? a limits file declares limits, a few lines each\n", errOut)
}

// A --name the limits file does not declare lists at most 20 of its
// limits, and names the one that differs by case alone, if one does: a
// file of thousands of limits made the error a line of megabytes.
func TestLimitsFileNameNotIn(t *testing.T) {
	var file strings.Builder
	for i := range 30 {
		fmt.Fprintf(&file, "l%02d: {kind: token bucket, rate: 1, period: 1s}\n", i)
	}
	file.WriteString("signup: {kind: token bucket, rate: 1, period: 1s}\n")
	path := filepath.Join(t.TempDir(), "limits.yaml")
	require.NoError(t, os.WriteFile(path, []byte(file.String()), 0o600))

	code, _, errOut := exec("simulate", "--limits", path, "--name", "nope", "--at", "0s=1")
	require.Equal(t, 2, code, errOut)
	require.Equal(t, `ratelimit: limit "nope" is not in `+path+`: pass --name, one of ["l00" "l01" "l02" "l03" "l04" "l05" "l06" "l07" "l08" "l09" `+
		`"l10" "l11" "l12" "l13" "l14" "l15" "l16" "l17" "l18" "l19"] and 11 more`+"\nRun 'ratelimit simulate --help' for usage.\n", errOut)

	code, _, errOut = exec("simulate", "--limits", path, "--name", "SignUp", "--at", "0s=1")
	require.Equal(t, 2, code, errOut)
	require.Equal(t, `ratelimit: limit "SignUp" is not in `+path+`: did you mean "signup"? (names are matched as written)`+
		"\nRun 'ratelimit simulate --help' for usage.\n", errOut)

	// A file of no limits said "one of []".
	empty := filepath.Join(t.TempDir(), "limits.json")
	require.NoError(t, os.WriteFile(empty, []byte("{}"), 0o600))
	code, _, errOut = exec("simulate", "--limits", empty, "--name", "signup", "--at", "0s=1")
	require.Equal(t, 2, code, errOut)
	require.Equal(t, `ratelimit: limit "signup" is not in `+empty+`, which declares no limit: give the limits file that declares it`+
		"\nRun 'ratelimit simulate --help' for usage.\n", errOut)
}

// --limits "" is a usage error: it was taken for no --limits, so that
// --limits "$LIMITS" with $LIMITS unset ran the inline limit beside it,
// which --limits refuses, or asked for a limit, as if none was given.
func TestLimitsFileEmptyPath(t *testing.T) {
	const want = `ratelimit: --limits "": give the limits file, such as --limits limits.yaml, or leave --limits out for an inline limit (--kind, --rate, --period)` + "\n"
	for _, args := range [][]string{
		append([]string{"simulate", "--limits", "", "--at", "0s=1"}, tokenBucket...),
		{"simulate", "--limits", "", "--name", "signup", "--at", "0s=1"},
		append([]string{"inspect", "--store", "mem:", "--limits", ""}, tokenBucket...),
		{"token", "refund", "--store", "mem:", "--limits", "", "AQ"},
	} {
		code, out, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s%s", args, out, errOut)
		require.True(t, strings.HasPrefix(errOut, want), "%q: %s", args, errOut)
	}
}

// --limits with any flag of an inline limit is refused: --capacity,
// --shards, --max-reserved and --start were silently ignored (only
// --kind, --rate and --period were refused), even given as their zero.
func TestLimitsFileWithInlineFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	require.NoError(t, os.WriteFile(path, []byte("api:\n  kind: token bucket\n  rate: 10\n  period: 1m\n"), 0o600))
	for _, extra := range [][]string{
		{"--kind", "token bucket"},
		{"--rate", "5"},
		{"--period", "1s"},
		{"--capacity", "100"},
		{"--capacity", "0"},
		{"--shards", "4"},
		{"--max-reserved", "5"},
		{"--start", "2024-01-01T00:00:00Z"},
	} {
		args := append([]string{"simulate", "--limits", path, "--name", "api", "--at", "0s=1"}, extra...)
		code, out, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: exit %d\n%s%s", extra, code, out, errOut)
		assert.Contains(t, errOut, "not both: "+extra[0]+" with --limits", "%q", extra)
	}
	code, _, errOut := exec("inspect", "--store", "mem:", "--limits", path, "--name", "api", "--key", "k", "--shards", "2", "--start", "2024-01-01T00:00:00Z")
	require.Equal(t, 2, code, errOut)
	assert.Contains(t, errOut, "not both: --shards, --start with --limits")
}

// An invalid inline limit is told in the flags' names, the ones to
// change: the library's message named the config's fields ("invalid
// config: Rate is NaN", "set Capacity to at least 1"), which the command
// line has not.
func TestInlineLimitErrorsNameFlags(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--kind", "fixed window", "--rate", "NaN", "--period", "1s"}, "ratelimit: --rate is NaN: it must be a number of tokens from 1e-9 to 1000000000000000\n"},
		{[]string{"--kind", "fixed window", "--rate", "0.5", "--period", "1s"}, "ratelimit: --rate is 0.5 and --capacity is unset (so also 0.5): one call can take at most 0.5 tokens, " +
			"so no call of the default count 1 can ever pass: set --capacity to at least 1 (a bucket may hold more than one period's --rate), or explicitly below 1 for calls of fractional counts\n"},
		{[]string{"--kind", "fixed window", "--rate", "1", "--period", "1500us"}, "ratelimit: --period is 1.5ms: it must be a whole number of milliseconds\n"},
		{[]string{"--kind", "fixed window", "--rate", "1", "--period", "1s", "--capacity", "-1"}, "ratelimit: --capacity is -1: it must be a number of tokens > 0"},
		{[]string{"--kind", "fixed window", "--rate", "1", "--period", "1s", "--max-reserved", "Inf"}, "ratelimit: --max-reserved is +Inf: it must be"},
		{[]string{"--kind", "fixed window", "--rate", "1", "--period", "1s", "--shards", "5000"}, "ratelimit: --shards is 5000: at most 1024 shards are supported\n"},
		{[]string{"--kind", "token bucket", "--rate", "1", "--period", "1s", "--start", "2024-01-01T00:00:00Z"}, "ratelimit: --start is set on a token bucket, which has no windows: remove --start\n"},
		// It was taken for no --start. In simulate, that is windows
		// aligned to the simulation's start (inspect's is below).
		{[]string{"--kind", "fixed window", "--rate", "1", "--period", "1s", "--start", ""},
			"ratelimit: --start \"\": give the RFC 3339 time the windows are aligned to, such as 2024-01-01T00:00:00Z, or leave --start out for windows aligned to the simulation's start, 00:00:00\n"},
		{[]string{"--kind", "token bucket", "--rate", "1.5", "--period", "1s", "--capacity", "1.5", "--max-reserved", "8388607"},
			"ratelimit: --max-reserved is 8388607 and --capacity 1.5: above 8388608 tokens together, a fraction of a token is finer than a decision resolves, and a reservation of --capacity plus --max-reserved would be refused forever"},
	} {
		args := append(append([]string{"simulate"}, tc.flags...), "--at", "0s=1")
		code, _, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s", args, errOut)
		require.True(t, strings.HasPrefix(errOut, tc.want), "%q: got %q, want it to start with %q", args, errOut, tc.want)
	}
	// Elsewhere, no --start is windows at a phase of each key.
	for _, start := range []string{"", "0001-01-01T00:00:00Z"} {
		code, _, errOut := exec("inspect", "--store", "mem:", "--key", "k", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--start", start)
		require.Equal(t, 2, code, errOut)
		require.Contains(t, errOut, "windows at a phase of each key", "--start %q", start)
	}
	err := inFlags(ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: math.NaN(), Period: time.Second}.Validate())
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	require.EqualError(t, err, "--rate is NaN: it must be a number of tokens from 1e-9 to 1000000000000000")

	// A limit of a limits file is named by its fields, as the file writes
	// them, its problem too: the library names the Config's (Rate,
	// Capacity, MaxReserved). A limit's name that reads as a field is
	// left as it is.
	dir := t.TempDir()
	for _, tc := range []struct{ file, want string }{
		// The name "" as any other: it was "invalid config: Rate is 0".
		{"\"\":\n  kind: fixed window\n  rate: 0\n  period: 1s\n", `limits file: line 1: limit "": rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000` + "\n"},
		{"x:\n  kind: fixed window\n  rate: .nan\n  period: 1s\n", `limits file: line 1: limit "x": rate is NaN: it must be a number of tokens from 1e-9 to 1000000000000000` + "\n"},
		{"Capacity:\n  kind: fixed window\n  rate: 1\n  period: 1s\n  capacity: -1\n",
			`limits file: line 1: limit "Capacity": capacity is -1: it must be a number of tokens > 0 and at most 1000000000000000, or 0 for rate` + "\n"},
		{"x:\n  kind: token bucket\n  rate: 1.5\n  period: 1s\n  capacity: 1.5\n  maxReserved: 8388607\n",
			`limits file: line 1: limit "x": maxReserved is 8388607 and capacity 1.5: above 8388608 tokens together, a fraction of a token is finer than a decision resolves, and a reservation of capacity plus maxReserved would be refused forever`},
		{"x:\n  kind: token bucket\n  rate: 1\n  period: 1s\n  start: 2024-01-01T00:00:00Z\n", `limits file: line 1: limit "x": start is set on a token bucket, which has no windows: remove start` + "\n"},
	} {
		path := filepath.Join(dir, "limits.yaml")
		require.NoError(t, os.WriteFile(path, []byte(tc.file), 0o600))
		code, _, errOut := exec("simulate", "--limits", path, "--name", "x", "--at", "0s=1")
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, "ratelimit: --limits "+path+": "+tc.want, tc.file)
	}
	_, err = loadLimits(filepath.Join(dir, "limits.yaml"))
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	var ce *ratelimit.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Start", ce.Field)
}

// The error of a limit's config in a limits file names the limit as the
// library's does, cut to its first 256 bytes and its length when it is
// longer: a name of megabytes was written whole, on one line, in the
// file's words.
func TestLimitsFileLongNameInError(t *testing.T) {
	long := strings.Repeat("n", 10000)
	path := filepath.Join(t.TempDir(), "limits.yaml")
	require.NoError(t, os.WriteFile(path, []byte("? "+long+"\n:\n  kind: fixed window\n  rate: 0\n  period: 1s\n"), 0o600))
	code, _, errOut := exec("simulate", "--limits", path, "--name", "x", "--at", "0s=1")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "ratelimit: --limits "+path+`: limits file: line 1: limit "`+long[:256]+`"… (10000 bytes): rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000`+"\n")
	require.Less(t, len(errOut), 1000)
	_, err := loadLimits(path)
	var ce *ratelimit.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, long, ce.Name)
	require.Equal(t, "Rate", ce.Field)
}

// A count the limit refuses is told in the flags' names, as an invalid
// inline limit is: the count's flag (--count, or the --at request) and
// the limit's (--capacity, --max-reserved), and the way to reserve of the
// command, if it has one. The library's message named the Config's fields
// and its call option: "--count: limit "limit": count 4 exceeds 3, ...:
// raise Capacity, split the call, or ask with WithReserve()". A limit of a
// limits file is told in the names of its fields, as the file writes them
// (capacity), as its other errors are.
func TestCountErrorsNameFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	require.NoError(t, os.WriteFile(path, []byte("x:\n  kind: token bucket\n  rate: 10\n  period: 1m\n  capacity: 3\n"), 0o600))
	reserving := []string{"--kind", "token bucket", "--rate", "10", "--period", "1m", "--capacity", "3", "--max-reserved", "2"}
	sharded := []string{"--kind", "token bucket", "--rate", "10", "--period", "1m", "--capacity", "4", "--shards", "4"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append([]string{"limit", "--store", "mem:", "--count", "4"}, tokenBucket...),
			"--count 4 exceeds 3, the most the limit can grant at once: raise --capacity, split the call, or ask with --reserve"},
		{append([]string{"limit", "--store", "mem:", "--count", "-1"}, tokenBucket...), "--count -1 is negative: a count is a number from 0 to 1000000000000000"},
		{append([]string{"limit", "--store", "mem:", "--count", "Inf", "--reserve"}, tokenBucket...), "--count Inf is infinite: a count is a number from 0 to 1000000000000000"},
		{append([]string{"limit", "--store", "mem:", "--count", "6", "--reserve"}, reserving...),
			"--count 6 exceeds 5, --capacity plus --max-reserved: the limit can never grant it; raise --max-reserved or split the call"},
		{append([]string{"limit", "--store", "mem:", "--count", "6"}, reserving...),
			"--count 6 exceeds 3, the most the limit can grant at once: raise --capacity, or split the call"},
		{append([]string{"limit", "--store", "mem:", "--count", "3"}, sharded...),
			"--count 3 exceeds 2, the most the limit can grant at once (two of its 4 shards together): give --shards 2 or fewer, raise --capacity to 6, split the call, or ask with --reserve"},
		{[]string{"limit", "--store", "mem:", "--limits", path, "--name", "x", "--count", "4"},
			"--count 4 exceeds 3, the most the limit can grant at once: raise capacity, split the call, or ask with --reserve"},
		// bench and the steady pattern of simulate cannot reserve.
		{append([]string{"bench", "--store", "mem:", "--count", "4", "--duration", "1h"}, tokenBucket...),
			"--count 4 exceeds 3, the most the limit can grant at once: raise --capacity, or split the call"},
		{append([]string{"simulate", "--every", "1s", "--for", "2s", "--count", "4"}, tokenBucket...),
			"--count 4 exceeds 3, the most the limit can grant at once: raise --capacity, or split the call"},
		{append([]string{"simulate", "--at", "0s=1,1s=4"}, tokenBucket...),
			`--at "1s=4": count 4 exceeds 3, the most the limit can grant at once: raise --capacity, split the call, or ask with --at "1s=4r"`},
		{append([]string{"simulate", "--at", "0s=6r"}, reserving...),
			`--at "0s=6r": count 6 exceeds 5, --capacity plus --max-reserved: the limit can never grant it; raise --max-reserved or split the call`},
		{append([]string{"simulate", "--at", "0s=-1"}, tokenBucket...), `--at "0s=-1": count -1 is negative: a count is a number from 0 to 1000000000000000`},
	} {
		code, out, errOut := exec(tc.args...)
		require.Equal(t, 2, code, "%q: %s%s", tc.args, out, errOut)
		require.Equal(t, "ratelimit: "+tc.want+"\n", strings.SplitAfter(errOut, "\n")[0], "%q", tc.args)
	}
	// It still matches the library's error.
	err := (&limitFlags{}).countUsage("--count 4", "", &ratelimit.CountError{Name: "x", Count: 4, Max: 3, Problem: "exceeds 3"})
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount)
	var ce *ratelimit.CountError
	require.ErrorAs(t, err, &ce)
	require.EqualError(t, err, "--count 4 exceeds 3")
	other := errors.New("store down")
	require.Equal(t, other, (&limitFlags{}).countUsage("--count 4", "", other))
}

// A duration written as one but beyond time.Duration's range is told as
// out of range, as the limits file tells it: "time: invalid duration
// \"9999999h\"" sent the reader looking for a typo, and an --at time of
// that size was told to be written as hh:mm or a duration, which it is.
func TestFlagsDurationOutOfRange(t *testing.T) {
	fixed := []string{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "9999999h", "--at", "0s=1"},
			`ratelimit: invalid argument "9999999h" for "--period" flag: the duration is out of range: a duration is at most 2562047h47m16.854775807s, some 292 years`},
		{append(slices.Clone(fixed), "--every", "1s", "--for", "9999999h"),
			`ratelimit: invalid argument "9999999h" for "--for" flag: the duration is out of range: a duration is at most 2562047h47m16.854775807s, some 292 years`},
		{append(slices.Clone(fixed), "--at", "9999999h=1"), `ratelimit: --at "9999999h=1": the time "9999999h": requests come at most 876576h0m0s (100 years) after the start`},
		{append(slices.Clone(fixed), "--at", "-9999999h=1"), `ratelimit: --at "-9999999h=1": the time "-9999999h": requests come at or after the start, 0s`},
	} {
		code, out, errOut := exec(tc.args...)
		require.Equal(t, 2, code, "%q: %s%s", tc.args, out, errOut)
		require.Equal(t, tc.want+"\nRun 'ratelimit simulate --help' for usage.\n", errOut, "%q", tc.args)
	}
	// --timeout and bench's --duration, read by pflag's Duration, told the
	// same "invalid duration".
	for flag, args := range map[string][]string{
		"--timeout":  append([]string{"inspect", "--store", "mem:", "--key", "k", "--timeout", "9999999h"}, tokenBucket...),
		"--duration": append([]string{"bench", "--store", "mem:", "--duration", "9999999h"}, tokenBucket...),
	} {
		code, out, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s%s", args, out, errOut)
		require.Contains(t, errOut, `"9999999h" for "`+flag+`" flag: the duration is out of range`, "%q", args)
	}
}

// --for given, but not above 0, is told as such: it was told "--every
// needs --for", which was given.
func TestSimulateForNotAboveZero(t *testing.T) {
	for span, want := range map[string]string{
		"0s":  "ratelimit: --for 0s: give the steady pattern a length above 0\n",
		"-1s": "ratelimit: --for -1s: give the steady pattern a length above 0\n",
		"":    "ratelimit: --every needs --for, the length of the steady pattern\n",
	} {
		args := []string{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--every", "1s"}
		if span != "" {
			args = append(args, "--for", span)
		}
		code, _, errOut := exec(args...)
		require.Equal(t, 2, code, errOut)
		require.Equal(t, want+"Run 'ratelimit simulate --help' for usage.\n", errOut, span)
	}
}

// The command reads its times exactly, as the limits file does, and
// refuses what it would take for another: a --period, --every or --at
// time finer than a nanosecond was truncated (--period 1.0000005ms was a
// period of 1ms, --at 00:00:00.0000000001 a request at 0), and a --start
// at the zero time read as no --start.
func TestFlagsReadExactly(t *testing.T) {
	fixed := []string{"--kind", "fixed window", "--rate", "1", "--period", "1s"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kind", "fixed window", "--rate", "1", "--period", "1.0000005ms", "--at", "0s=1"},
			`invalid argument "1.0000005ms" for "--period" flag: the duration is not a whole number of nanoseconds`},
		{append(fixed, "--every", "1.0000005ms", "--for", "1s"), `invalid argument "1.0000005ms" for "--every" flag: the duration is not a whole number of nanoseconds`},
		{append(fixed, "--every", "1s", "--for", "1.00000000000000000001s"), `invalid argument "1.00000000000000000001s" for "--for" flag: the duration is not a whole number of nanoseconds`},
		{append(fixed, "--at", "1.0000005ms=1"), `--at "1.0000005ms=1": the time "1.0000005ms" is not a whole number of nanoseconds: the limiter's clock counts whole milliseconds`},
		{append(fixed, "--at", "00:00:00.0000000001=1"), `--at "00:00:00.0000000001=1": the time "00:00:00.0000000001" is not a whole number of nanoseconds: the limiter's clock counts whole milliseconds`},
		{append(fixed, "--at", "00:00.00000000001=1"), `--at "00:00.00000000001=1": the time "00:00.00000000001" is not a whole number of nanoseconds`},
		{append(fixed, "--at", "99999999999999999999:00=1"), `--at "99999999999999999999:00=1": the time "99999999999999999999:00": requests come at most 876576h0m0s (100 years) after the start`},
		{append(fixed, "--at", "0s=1", "--start", "0001-01-01T00:00:00Z"), `--start "0001-01-01T00:00:00Z" is the zero time, which means no --start (windows aligned to the simulation's start, 00:00:00)`},
	} {
		args := append([]string{"simulate"}, tc.args...)
		code, _, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, tc.want, "%q", args)
	}
	// Exact, they read as they did.
	code, out, errOut := exec(append([]string{"simulate"}, append(fixed, "--at", "00:00:01.5=1,0.0025h=1,00:01.5=1", "--every", "1.5s", "--for", "3s")...)...)
	require.Equal(t, 0, code, errOut)
	var times []string
	for _, r := range rows(out) {
		times = append(times, r[0])
	}
	require.Equal(t, []string{"00:00:00", "00:00:01.500", "00:00:01.500", "00:00:03", "00:00:09", "00:01:30"}, times, out)

	// The help gives no default of 0, as for pflag's Duration.
	code, out, errOut = exec("simulate", "--help")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "--period duration ")
	require.NotContains(t, out, "(default 0")
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"simulate", "--at", "0s=1"},
		{"simulate", "--kind", "sliding", "--rate", "1", "--period", "1s", "--at", "0s=1"},
		{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--at", "soon=1"},
		{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s"},
		{"simulate", "--bogus"},
		// The steady pattern's flags were ignored when they could not make
		// one: --every of 0 or less, --for or --count without --every.
		{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--at", "0s=1", "--every", "-1s", "--for", "10s"},
		{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--at", "0s=1", "--every", "0s", "--for", "10s"},
		{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--at", "0s=1", "--for", "10s"},
		{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--at", "0s=1", "--count", "2"},
		{"simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--every", "1000h", "--for", "876577h"},
		{"inspect", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--store", "ftp://x"},
		{"bench", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--store", "mem:", "--keys", "0"},
	} {
		code, _, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s", args, errOut)
		require.Contains(t, errOut, "ratelimit:")
	}
}

// inspectReset checks inspect and reset against a store given by URL.
func inspectReset(t *testing.T, notThere string, storeArgs ...string) {
	clk := clock.NewMock() // the time of every call and command: the answers stay put however long the test takes
	clk.Set(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	ctx := context.Background()
	key := fmt.Sprint("cli-", time.Now().UnixNano())
	limit := []string{"--kind", "fixed window", "--rate", "10", "--period", "1h", "--shards", "2", "--name", "cli"}
	args := func(cmd string) []string {
		return append(append(append([]string{cmd}, storeArgs...), limit...), "--key", key)
	}
	// inspect and reset refuse a store that is not there: a file, a
	// table, a prefix with nothing yet.
	for _, cmd := range []string{"inspect", "reset"} {
		code, out, errOut := execAt(clk, args(cmd)...)
		require.Equal(t, 1, code, errOut)
		require.Empty(t, out)
		require.Contains(t, errOut, notThere, cmd)
		require.Equal(t, 1, strings.Count(errOut, "ratelimit:"), errOut)
	}

	// Spend through the library on the same store, then look.
	sf := storeFlagsOf(storeArgs)
	store, closeStore, err := sf.open(ctx, mayCreate)
	require.NoError(t, err)
	lim, err := ratelimit.New(store, ratelimit.Limits{"cli": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour, Shards: 2}}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "cli", key, ratelimit.Count(7))
	require.NoError(t, err)
	require.True(t, res.OK)
	// Another key, which reset leaves alone.
	res, err = lim.Limit(ctx, "cli", key+"-other", ratelimit.Count(4))
	require.NoError(t, err)
	require.True(t, res.OK)
	closeStore()

	code, out, errOut := execAt(clk, args("inspect")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 3 of capacity 10")
	require.Contains(t, out, "true", "a shard is stored")

	// Take tokens through the command.
	code, out, errOut = execAt(clk, append(args("limit"), "--count", "2", "--check")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "allowed 2 of cli")
	code, out, errOut = execAt(clk, append(args("limit"), "--count", "2")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "allowed 2 of cli")
	code, out, errOut = execAt(clk, append(args("limit"), "--count", "2")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "denied 2 of cli")
	code, out, _ = execAt(clk, args("inspect")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "tokens now 1 of capacity 10")

	code, out, errOut = execAt(clk, args("reset")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "reset cli")
	code, out, _ = execAt(clk, args("inspect")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "tokens now 10 of capacity 10")
	code, out, errOut = execAt(clk, append(args("inspect"), "--key", key+"-other")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 6 of capacity 10")
}

func TestInspectResetBolt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	inspectReset(t, "limits.db does not exist: check the path in --store", "--store", "bolt://"+path)
	// Another bucket of the file is not there either, and is not created.
	code, _, errOut := exec("inspect", "--store", "bolt://"+path, "--bucket", "other", "--kind", "token bucket", "--rate", "1", "--period", "1s")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `has no bucket "other": check --bucket`)
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		assert.Nil(t, tx.Bucket([]byte("other")))
		return nil
	}))
}

func TestInspectResetRedis(t *testing.T) {
	url, prefix, _ := testRedis(t)
	inspectReset(t, "no key starts with prefix", "--store", url, "--prefix", prefix)
}

// testRedis returns the test server's URL, a key prefix of the test's own
// and a client of the server, whose keys under the prefix are deleted
// when the test ends.
func testRedis(t *testing.T) (url, prefix string, c *redis.Client) {
	url = testserver.RedisURL(t)
	prefix = fmt.Sprintf("ratelimit-cli-test-%d:", time.Now().UnixNano())
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	c = redis.NewClient(opt)
	cleanRedis(t, c, prefix)
	return url, prefix, c
}

func TestInspectResetRedisCluster(t *testing.T) {
	addrs := testserver.ClusterAddrs(t)
	prefix := fmt.Sprintf("ratelimit-cli-test-%d:", time.Now().UnixNano())
	cleanRedis(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")}), prefix)
	inspectReset(t, "no key starts with prefix", "--store", "redis+cluster://"+addrs, "--prefix", prefix)
}

// cleanRedis deletes the test's keys when it ends, and closes the client.
func cleanRedis(t *testing.T, c redis.UniversalClient, prefix string) {
	t.Cleanup(func() {
		defer c.Close()
		ctx := context.Background()
		del := func(ctx context.Context, node *redis.Client) error {
			iter := node.Scan(ctx, 0, prefix+"*", 100).Iterator()
			for iter.Next(ctx) {
				if err := node.Del(ctx, iter.Val()).Err(); err != nil {
					return err
				}
			}
			return iter.Err()
		}
		switch c := c.(type) {
		case *redis.ClusterClient:
			assert.NoError(t, c.ForEachMaster(ctx, del))
		case *redis.Client:
			assert.NoError(t, del(ctx, c))
		}
	})
}

func TestInspectResetPostgres(t *testing.T) {
	url, table := postgresTable(t, "ratelimit_cli_test_")
	inspectReset(t, fmt.Sprintf("table %q does not exist in this database: check --table", table), "--store", url, "--table", table)
}

// postgresTable returns the local PostgreSQL server's URL and a fresh
// table name of prefix, whose table and functions are dropped when the
// test ends.
func postgresTable(t *testing.T, prefix string) (url, table string) {
	url = testserver.PostgresURL(t)
	table = fmt.Sprint(prefix, time.Now().UnixNano())
	t.Cleanup(func() {
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		defer pool.Close()
		dropTable(t, pool, table)
	})
	return url, table
}

// dropTable drops a store's table and functions.
func dropTable(t *testing.T, pool *pgxpool.Pool, table string) {
	assert.NoError(t, testserver.DropPostgresTable(context.Background(), pool, table))
}

func TestSchema(t *testing.T) {
	// With no --table, the SQL is that of the store's default table in
	// public, with its schema: the SQL of a name without one makes
	// functions that pgstore.New WithoutDDL refuses, and the default
	// printed it.
	code, out, errOut := exec("schema")
	require.Equal(t, 0, code, errOut)
	want, err := pgstore.Schema("public." + pgstore.DefaultTable)
	require.NoError(t, err)
	require.Equal(t, want, out)

	code, _, errOut = exec("schema", "--table", strings.Repeat("x", 58))
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "ratelimit: --table: pgstore: table name")
	require.Contains(t, errOut, "use at most 57 bytes")
	require.Contains(t, errOut, "Run 'ratelimit schema --help' for usage.")

	// What it prints is what a migration tool applies: then the store
	// needs no DDL of its own. The name has its schema, as the store's
	// statements name the table.
	ctx := context.Background()
	url := testserver.PostgresURL(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	table := fmt.Sprintf("ratelimit_cli_test_%d", time.Now().UnixNano())
	t.Cleanup(func() {
		defer pool.Close()
		dropTable(t, pool, table)
	})
	code, out, errOut = exec("schema", "--table", "public."+table)
	require.Equal(t, 0, code, errOut)
	_, err = pool.Exec(ctx, out)
	require.NoError(t, err)
	store, err := pgstore.New(ctx, pool, pgstore.WithTable(table), pgstore.WithoutDDL())
	require.NoError(t, err)
	lim, err := ratelimit.New(store, ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour}})
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK)
}

func TestBench(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bench.db")
	for _, store := range []string{"mem:", "bolt://" + path} {
		code, out, errOut := exec("bench", "--store", store, "--kind", "fixed window", "--rate", "50", "--period", "100ms",
			"--keys", "3", "--goroutines", "8", "--duration", "300ms", "--quiet")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "decisions")
		require.Contains(t, out, "latency    p50")
		require.Contains(t, out, "check      ok")
	}
}

// TestBenchLongerThanTimeout runs a bench longer than its --timeout: the
// reads and the removal of the keys after the run have --timeout from the
// run's end, not from its start, which every run longer than --timeout
// (--duration 1m with the default 30s) had passed, failing it with no
// answer from the store.
func TestBenchLongerThanTimeout(t *testing.T) {
	for _, kind := range []string{"fixed window", "token bucket"} {
		code, out, errOut := exec("bench", "--store", "mem:", "--kind", kind, "--rate", "50", "--period", "100ms",
			"--keys", "3", "--goroutines", "4", "--duration", "600ms", "--timeout", "200ms", "--quiet")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "check      ok")
	}
}

func TestVerifyCatchesExcess(t *testing.T) {
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Second}
	at := time.UnixMilli(1_000_000)
	var gs []grant
	for i := range 5 { // 5 grants within 100 ms: at most 2 + 2 allowed
		g := at.Add(time.Duration(i) * 20 * time.Millisecond)
		gs = append(gs, grant{from: g, to: g})
	}
	require.Contains(t, verify(cfg, gs, 1, 1, nil), "5 tokens granted")
	require.Empty(t, verify(cfg, gs[:4], 1, 1, nil))
	tb := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Second}
	require.Contains(t, verify(tb, gs[:3], 1, 1, nil), "3 tokens granted")

	// Windows known: 3 grants in one window of capacity 2 is too many,
	// though a window start of unknown phase could have been among them.
	require.Contains(t, verify(cfg, gs[:3], 1, 1, []int64{at.UnixMilli()}), "3 tokens granted in the windows from 00:16:40.000 to 00:16:41.000, but the limit allows at most 2")
	// A grant whose call and answer straddle a window start counts in
	// neither window.
	straddle := []grant{gs[0], gs[1], {from: at.Add(990 * time.Millisecond), to: at.Add(1010 * time.Millisecond)}}
	require.Empty(t, verify(cfg, straddle, 1, 1, []int64{at.UnixMilli()}))
	// Rollover: capacity 3, rate 2 per window, windows full of grants.
	roll := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 2, Capacity: 3, Period: time.Second}
	grantsAt := func(ms ...int) []grant {
		var gs []grant
		for _, m := range ms {
			g := at.Add(time.Duration(m) * time.Millisecond)
			gs = append(gs, grant{from: g, to: g})
		}
		return gs
	}
	require.Empty(t, verify(roll, grantsAt(0, 1, 2, 1000, 1001, 2000, 2001), 1, 1, []int64{at.UnixMilli()}))
	require.Contains(t, verify(roll, grantsAt(0, 1, 2, 1000, 1001, 2000, 2001, 2002), 1, 1, []int64{at.UnixMilli()}),
		"8 tokens granted in the windows from 00:16:40.000 to 00:16:43.000, but the limit allows at most 7")

	// Idle hours do not pile up: a burst late in the run is judged
	// against the bucket's capacity, not the refill since the first grant.
	late := append(grantsAt(0), grantsAt(10_000, 10_001, 10_002, 10_003, 10_004)...)
	require.Empty(t, verify(tb, late[:3], 1, 1, nil))
	require.Contains(t, verify(tb, late, 1, 1, nil), "a run of grants")
}

// forgetful is a broken store: every tenth Apply first forgets the records
// it touches, so their buckets start full again.
type forgetful struct {
	*memstore.Store
	calls atomic.Int64
}

func (f *forgetful) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if f.calls.Add(1)%10 == 0 {
		for _, it := range op.Items {
			for _, sh := range it.Shards {
				if err := f.Delete(ctx, []driver.RecordID{{Name: it.Name, Key: it.Key, Shard: sh.Index}}); err != nil {
					return err
				}
			}
		}
	}
	return f.Store.Apply(ctx, op, out)
}

func TestBenchCatchesBrokenStore(t *testing.T) {
	for _, cfg := range []ratelimit.Config{
		{Kind: ratelimit.FixedWindow, Rate: 20, Period: time.Second},
		{Kind: ratelimit.FixedWindow, Rate: 20, Period: time.Second, Shards: 2},
		{Kind: ratelimit.TokenBucket, Rate: 20, Period: time.Second},
	} {
		lim, err := ratelimit.New(&forgetful{Store: must(memstore.New())}, ratelimit.Limits{"x": cfg})
		require.NoError(t, err)
		// A run needs a few hundred calls for the store to break the
		// limit: on a slow machine, run again until one had them.
		var rep *report
		for rep == nil || rep.calls < 300 {
			rep, err = bench(context.Background(), lim, "x", cfg, 2, 4, 100*time.Millisecond, 0, 1, true, false, io.Discard)
			require.NoError(t, err)
		}
		require.NotEmpty(t, rep.violation, "%+v", cfg)
		var out bytes.Buffer
		rep.print(&out)
		require.Contains(t, out.String(), "check      FAILED: key")
	}
}

// BenchmarkSimulate runs the rollover story end to end on the default
// store: a temporary bbolt file, the table and the chart's samples.
func BenchmarkSimulate(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if code, _, errOut := exec("simulate", "--kind", "fixed window", "--rate", "100", "--period", "1h", "--capacity", "150",
			"--at", "00:30=15,00:45=15,01:30=30"); code != 0 {
			b.Fatal(errOut)
		}
	}
}

// BenchmarkVerify checks 100,000 grants on one key against a fixed window.
func BenchmarkVerify(b *testing.B) {
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10_000, Period: time.Second}
	at := time.UnixMilli(1_000_000)
	gs := make([]grant, 100_000)
	for i := range gs {
		t := at.Add(time.Duration(i) * 100 * time.Microsecond)
		gs[i] = grant{from: t, to: t.Add(50 * time.Microsecond)}
	}
	b.ReportAllocs()
	for b.Loop() {
		if v := verify(cfg, gs, 1, 1, nil); v != "" {
			b.Fatal(v)
		}
	}
}

// A request of --at that is empty, after a trailing comma or between two,
// is a usage error: "0s=1," ran the one request, the empty one dropped,
// as of a list cut short ("0s=1,$MORE" with $MORE unset).
func TestSimulateAtEmptyRequest(t *testing.T) {
	for _, at := range []string{"0s=1,", ",0s=1", "0s=1,,1s=1", "0s=1, "} {
		code, out, errOut := exec("simulate", "--kind", "token bucket", "--rate", "1", "--period", "1s", "--at", at)
		require.Equal(t, 2, code, "%q: %s", at, out)
		assert.Equal(t, fmt.Sprintf("ratelimit: --at %q: an empty request, before, between or after the commas: write TIME=COUNT,TIME=COUNT, e.g. 00:00=1,00:30=15", at)+
			"\nRun 'ratelimit simulate --help' for usage.\n", errOut)
	}
}

// A blank --at, or a request of --at without a time, says how to write
// the requests: --at " " was "an empty request, before, between or after
// the commas", of a value that has no comma, and "=1" was time "".
func TestSimulateAtBlank(t *testing.T) {
	const format = "write TIME=COUNT[,TIME=COUNT...], TIME as hh:mm, hh:mm:ss or a duration such as 90s, from the start, 0s, e.g. 00:00=1,00:30=15"
	for _, c := range []struct{ at, want string }{
		{" ", `--at " " is blank: ` + format + ", or leave --at out"},
		{"\t \t", `--at "\t \t" is blank: ` + format + ", or leave --at out"},
		{"=1", `--at "=1": the request has no time before its =: ` + format},
		{"0s=1, =2", `--at "=2": the request has no time before its =: ` + format},
	} {
		code, out, errOut := exec("simulate", "--kind", "token bucket", "--rate", "1", "--period", "1s", "--at", c.at)
		require.Equal(t, 2, code, "%q: %s", c.at, out)
		assert.Equal(t, "ratelimit: "+c.want+"\nRun 'ratelimit simulate --help' for usage.\n", errOut, "%q", c.at)
	}
}

// A limits file whose top level is an array, or a limit that is not an
// object, says what a .json file must hold in JSON's words, a JSON
// object: it said "mapping", YAML's. A .yaml file still says mapping.
func TestLimitsFileNotObject(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ name, data, want string }{
		{"array.json", `[{"x": {"kind": "token bucket", "rate": 1, "period": "1s"}}]`, "limits file: write a JSON object of limit names to their fields"},
		{"limit.json", `{"x": [1]}`, `limits file: limit "x": line 1: a limit is a JSON object of fields (kind, rate`},
		{"array.yaml", "- x\n", "limits file: write a mapping of limit names to their fields"},
	} {
		path := filepath.Join(dir, c.name)
		require.NoError(t, os.WriteFile(path, []byte(c.data), 0o600))
		code, out, errOut := exec("simulate", "--limits", path, "--name", "x", "--at", "0s=1")
		require.Equal(t, 1, code, "%s: %s", c.name, out)
		require.Contains(t, errOut, "ratelimit: --limits "+path+": "+c.want, c.name)
	}
}

// Every error of an --at request's time names --at and the request, as
// its count's errors do: it named the time alone ("time \"soon\": write
// hh:mm, ..."), which said neither which flag nor which of the requests.
func TestSimulateAtTimeErrorsNameTheFlag(t *testing.T) {
	for _, c := range []struct{ at, want string }{
		{"0s=1,soon=2", `--at "soon=2": the time "soon": write hh:mm, hh:mm:ss or a duration such as 90s`},
		{"1:2:3:4=1", `--at "1:2:3:4=1": the time "1:2:3:4": write hh:mm, hh:mm:ss or a duration such as 90s`},
		{"00:75=1", `--at "00:75=1": the time "00:75": minutes and seconds run from 00 to 59: for 1h15m0s, write 01:15:00`},
		{"-5s=1", `--at "-5s=1": the time "-5s": requests come at or after the start, 0s`},
		{"-9999999h=1", `--at "-9999999h=1": the time "-9999999h": requests come at or after the start, 0s`},
		{"876577h=1", `--at "876577h=1": the time "876577h": requests come at most 876576h0m0s (100 years) after the start`},
		{"9999999h=1", `--at "9999999h=1": the time "9999999h": requests come at most 876576h0m0s (100 years) after the start`},
		{"876577:00=1r", `--at "876577:00=1r": the time "876577:00": requests come at most 876576h0m0s (100 years) after the start`},
		{"1.0000005ms=1", `--at "1.0000005ms=1": the time "1.0000005ms" is not a whole number of nanoseconds: the limiter's clock counts whole milliseconds`},
		{"00:00.00000000001=1", `--at "00:00.00000000001=1": the time "00:00.00000000001" is not a whole number of nanoseconds: the limiter's clock counts whole milliseconds`},
		{"1.5ms=1", `--at "1.5ms=1": the time "1.5ms" is 1.5ms: the limiter's clock counts whole milliseconds: give 1ms or 2ms`},
		{"00:00:00.0001=1", `--at "00:00:00.0001=1": the time "00:00:00.0001" is 100µs: the limiter's clock counts whole milliseconds: give 0s or 1ms`},
	} {
		code, out, errOut := exec("simulate", "--kind", "token bucket", "--rate", "1", "--period", "1s", "--at", c.at)
		require.Equal(t, 2, code, "%q: %s", c.at, out)
		assert.Equal(t, "ratelimit: "+c.want+"\nRun 'ratelimit simulate --help' for usage.\n", errOut, "%q", c.at)
	}
}

func TestParsePattern(t *testing.T) {
	reqs, err := parsePattern("00:30=15, 01:30=30r,00:00:05=1,90s=2.5,1h2m=1")
	require.NoError(t, err)
	require.Equal(t, []request{
		{at: 30 * time.Minute, count: 15, given: "00:30=15", n: "15"},
		{at: 90 * time.Minute, count: 30, reserve: true, given: "01:30=30r", n: "30"},
		{at: 5 * time.Second, count: 1, given: "00:00:05=1", n: "1"},
		{at: 90 * time.Second, count: 2.5, given: "90s=2.5", n: "2.5"},
		{at: time.Hour + 2*time.Minute, count: 1, given: "1h2m=1", n: "1"},
	}, reqs)
	for _, bad := range []string{"00:30", "00:30=x", "1:2:3:4=1", "-1:00=1", "-5s=1",
		// Not a time, or past 100 years: these were taken, as a Duration
		// that overflowed, and printed as garbage times.
		"NaN:00=1", "00:NaN=1", "Inf:00=1", "00:00:+Inf=1", "1e12:00=1", "876577:00=1", "876577h=1",
		// Not hh:mm or hh:mm:ss, which ParseFloat read all the same, or
		// minutes and seconds of 60 and more.
		"0x1p4:00=1", "+1:00=1", "1_0:00=1", "1.5:00=1", "00:.5=1", "00:30.=1", "00:75=1", "00:30:60=1",
		// Not whole milliseconds, which ran as the millisecond before.
		"1ns=1", "1.5ms=1", "00:00:00.0001=1",
		// An empty request, as of a list cut short ("0s=1,$MORE"): the
		// others ran, the empty one dropped.
		"0s=1,", ",0s=1", "0s=1,,1s=1", " , "} {
		_, err := parsePattern(bad)
		var u usageError
		require.ErrorAs(t, err, &u, bad)
		require.True(t, strings.HasPrefix(err.Error(), `--at "`), "%q: %v", bad, err)
	}
	reqs, err = parsePattern("876576:00=1,876576h=1,00:00:01.5=1,00:00:01.001=1,00:59:59=1,00:01.5=1")
	require.NoError(t, err)
	for i := range reqs {
		reqs[i].given, reqs[i].n = "", "" // the text, as above
	}
	assert.Equal(t, []request{{at: ratelimit.MaxPeriod, count: 1}, {at: ratelimit.MaxPeriod, count: 1},
		{at: 1500 * time.Millisecond, count: 1}, {at: 1001 * time.Millisecond, count: 1},
		{at: time.Hour - time.Second, count: 1}, {at: 90 * time.Second, count: 1}}, reqs)

	_, err = parsePattern("00:75=1")
	require.EqualError(t, err, `--at "00:75=1": the time "00:75": minutes and seconds run from 00 to 59: for 1h15m0s, write 01:15:00`)
	_, err = parsePattern("1.5ms=1")
	require.EqualError(t, err, `--at "1.5ms=1": the time "1.5ms" is 1.5ms: the limiter's clock counts whole milliseconds: give 1ms or 2ms`)
	code, _, errOut := exec("simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--every", "1500us", "--for", "1s")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "--every is 1.5ms: the limiter's clock counts whole milliseconds: give 1ms or 2ms")
	// Under a millisecond, 1ms alone: --every 0s is refused, and was offered.
	code, _, errOut = exec("simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--every", "1ns", "--for", "1s")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "ratelimit: --every is 1ns: the limiter's clock counts whole milliseconds: give 1ms or more\n")
}

func TestHistogram(t *testing.T) {
	for i := range 1 << 16 {
		v := uint64(i)
		idx := histIndex(v)
		if v > histUpper(idx) || idx > 0 && v <= histUpper(idx-1) {
			t.Fatalf("bucket %d holds %d, but it ends at %d and the one before at %d", idx, v, histUpper(idx), histUpper(idx-1))
		}
	}
	require.Equal(t, uint64(math.MaxUint64), histUpper(histIndex(math.MaxUint64)))
	require.Less(t, histIndex(math.MaxUint64), len(histogram{}.counts))

	// Quantiles within 1/64 of the exact ones.
	var h, h2 histogram
	var exact []time.Duration
	for i := range 10_000 {
		d := time.Duration(i*i) * time.Nanosecond
		exact = append(exact, d)
		if i%2 == 0 {
			h.add(d)
		} else {
			h2.add(d)
		}
	}
	h.merge(&h2)
	require.Equal(t, uint64(10_000), h.n)
	require.Equal(t, exact[len(exact)-1], h.max)
	for _, p := range []float64{0, 0.5, 0.9, 0.99, 1} {
		want := exact[min(len(exact)-1, int(p*float64(len(exact))))]
		got := h.quantile(p)
		require.GreaterOrEqual(t, got, want, "p%v", p)
		require.LessOrEqual(t, float64(got), float64(want)*(1+1.0/64)+1, "p%v", p)
	}
}

// A fixed window of many windows is sampled evenly, as a token bucket is:
// every window boundary was sampled besides, one move of the mock clock
// each, and a run with a 1s period and a request at 3h took half a minute
// (at 100 years, it would not end).
// The chart of a fixed window whose --start is off the simulation's start
// draws its window boundaries, and the steps of its grants, at Start +
// k·Period: they were drawn at k·Period, where nothing happens.
func TestChartWindowsAtStart(t *testing.T) {
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Second, Start: simStart.Add(-750 * time.Millisecond)}
	assert.Equal(t, []time.Duration{0, 249 * time.Millisecond, 250 * time.Millisecond, 1249 * time.Millisecond, 1250 * time.Millisecond,
		2249 * time.Millisecond, 2250 * time.Millisecond, 3 * time.Second}, sampleTimes(cfg, 3*time.Second))
	cfg.Start = time.UnixMilli(math.MinInt64) // a phase computed without overflow
	assert.Equal(t, 192*time.Millisecond, windowPhase(cfg))

	svg := filepath.Join(t.TempDir(), "start.svg")
	code, _, errOut := exec("simulate", "--kind", "fixed window", "--rate", "10", "--period", "1h", "--start", "2024-01-01T00:20:00Z",
		"--at", "0s=1,90m=5", "--svg", svg)
	require.Equal(t, 0, code, errOut)
	chart, err := os.ReadFile(svg)
	require.NoError(t, err)
	var lines []string
	for _, m := range regexp.MustCompile(`class="window" x1="([^"]*)"`).FindAllStringSubmatch(string(chart), -1) {
		lines = append(lines, m[1])
	}
	// The chart runs to 02:00; windows begin at 00:20 and 01:20.
	x := func(d time.Duration) string { return fmt.Sprintf("%.1f", padL+plotW*float64(d)/float64(2*time.Hour)) }
	require.Equal(t, []string{x(20 * time.Minute), x(80 * time.Minute)}, lines)
}

func TestSampleTimes(t *testing.T) {
	fixed := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Second}
	times := sampleTimes(fixed, 10*time.Second)
	assert.Len(t, times, 22) // both sides of 10 boundaries, 0 and the end
	assert.Equal(t, []time.Duration{0, 999 * time.Millisecond, time.Second}, times[:3])
	for _, end := range []time.Duration{201 * time.Second, 10 * time.Hour, ratelimit.MaxPeriod + ratelimit.MaxPeriod/10} {
		times := sampleTimes(fixed, end)
		assert.Len(t, times, 151, end)
		assert.True(t, slices.IsSorted(times))
		assert.Equal(t, end, times[len(times)-1])
	}
	code, _, errOut := exec("simulate", "--kind", "fixed window", "--rate", "1", "--period", "1s", "--at", "876576h=1")
	require.Equal(t, 0, code, errOut)
}

// TestSchemaDoc: the example of docs/cli.md's schema section shows the
// lines that `ratelimit schema --table limits.records` prints, the
// version's digest included, so that the page follows each change of the
// SQL.
func TestSchemaDoc(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	require.NoError(t, err)
	const grep = "$ grep -E '^(CREATE|DROP|ALTER|COMMENT)|COMMENT ON TABLE' migrations/0042_ratelimit.up.sql\n"
	_, rest, ok := strings.Cut(string(doc), grep)
	require.True(t, ok, "docs/cli.md has no schema example")
	shown, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	code, out, errOut := exec("schema", "--table", "limits.records")
	require.Equal(t, 0, code, errOut)
	var want strings.Builder
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "CREATE") || strings.HasPrefix(line, "DROP") ||
			strings.HasPrefix(line, "ALTER") || strings.HasPrefix(line, "COMMENT") || strings.Contains(line, "COMMENT ON TABLE") {
			want.WriteString(line)
		}
	}
	require.Equal(t, want.String(), shown, "docs/cli.md's schema example")
	head := strings.Join(strings.SplitAfter(out, "\n")[:6], "")
	require.Contains(t, string(doc), head, "docs/cli.md's head -6 of the schema")
}

// A simulation of many requests ends in seconds: clock.Mock's Set sleeps
// a millisecond at every move, and the temporary file was synced at every
// commit, so 20,000 requests took over a minute and the 1,000,000 that
// simulate allows over an hour.
func TestSimulateManyRequestsIsQuick(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	code, out, errOut := execContext(ctx, "simulate", "--kind", "token bucket", "--rate", "3", "--period", "1ms",
		"--every", "1ms", "--for", "19999ms", "--svg", filepath.Join(t.TempDir(), "many.svg"))
	require.Equal(t, 0, code, "after %v: %s", time.Since(start), errOut)
	require.Len(t, rows(out), 20_000)
}

// Amounts below 1 show with three significant digits: a limit of
// rate 1e-9 printed 0 for every count, before and after, and labelled
// every tick of its chart 0. Their exponents are written as numtext
// writes them, and the limit's line above the table: Go's 1e-08 stood
// under "rate 1e-8".
func TestNumSmallAmounts(t *testing.T) {
	for x, want := range map[float64]string{
		0: "0", math.Copysign(0, -1): "0", 1: "1", 0.1666666: "0.167", -4.66666: "-4.667", 2.5: "2.5",
		1e15: "1000000000000000", -1e15: "-1000000000000000", 0.0004: "0.0004", 1e-9: "1e-9",
		-2.346e-7: "-2.35e-7", 0.0005: "0.0005", math.NaN(): "NaN", math.Inf(-1): "-Inf", 1e300: "1e300", -1e16: "-1e16",
	} {
		assert.Equal(t, want, num(x), "%v", x)
	}

	svg := filepath.Join(t.TempDir(), "tiny.svg")
	code, out, errOut := exec("simulate", "--kind", "token bucket", "--rate", "1e-8", "--capacity", "1e-8", "--period", "1ms",
		"--at", "0s=1e-8,0s=1e-8", "--svg", svg)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, [][]string{
		{"00:00:00", "-", "1e-8", "1e-8", "allowed", "0", "0s"},
		{"00:00:00", "-", "0", "1e-8", "denied", "0", "1ms"},
	}, rows(out), out)
	require.True(t, strings.HasPrefix(out, "limit: token bucket, rate 1e-8 per 1ms, capacity 1e-8\n"), out)
	chart, err := os.ReadFile(svg)
	require.NoError(t, err)
	var labels []string
	for _, m := range regexp.MustCompile(`text-anchor="end">([^<]*)<`).FindAllStringSubmatch(string(chart), -1) {
		labels = append(labels, m[1])
	}
	require.Equal(t, []string{"0", "2e-9", "4e-9", "6e-9", "8e-9", "1e-8", "capacity 1e-8"}, labels)
}

// A relation named by --table that is not the store's table, a view or
// the table of another program, is refused by every command with what it
// is, and left as it was: inspect and reset said it had "the schema of an
// earlier release" and to apply the store's SQL, and limit let pgstore.New
// mark it as the store's table, after which every call failed on a
// column it lacks. The commands apply pgstore.New's rules, not a looser
// copy of their own, which took a table with the store's columns and one
// more, or without a primary key, for the store's.
func TestPostgresTableNotAStore(t *testing.T) {
	ctx := context.Background()
	url := testserver.PostgresURL(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	base := fmt.Sprintf("ratelimit_cli_test_%d", time.Now().UnixNano())
	other, view, more, nokey := base+"_other", base+"_view", base+"_more", base+"_nokey"
	t.Cleanup(func() {
		defer pool.Close()
		_, err := pool.Exec(ctx, "DROP VIEW IF EXISTS "+pgx.Identifier{view}.Sanitize())
		assert.NoError(t, err)
		for _, table := range []string{other, view, more, nokey} {
			dropTable(t, pool, table)
		}
	})
	const columns = "id bytea, name bytea, key bytea, shard integer, value double precision, ts bigint, expires bigint"
	for _, create := range []string{
		fmt.Sprintf("CREATE TABLE %s (a integer, id text)", pgx.Identifier{other}.Sanitize()),
		fmt.Sprintf("CREATE VIEW %s AS SELECT 1 AS x", pgx.Identifier{view}.Sanitize()),
		fmt.Sprintf("CREATE TABLE %s (%s, owner text, PRIMARY KEY (id))", pgx.Identifier{more}.Sanitize(), columns),
		fmt.Sprintf("CREATE TABLE %s (%s)", pgx.Identifier{nokey}.Sanitize(), columns),
	} {
		_, err = pool.Exec(ctx, create)
		require.NoError(t, err)
	}
	const check = "postgres: check --table (the application's pgstore.WithTable) and the database in --store: pgstore: "
	for table, want := range map[string]string{
		other: fmt.Sprintf(`"public".%q exists and is not the store's table: it has the columns a integer, id text, where the store's has the columns %s`, other, columns),
		view:  fmt.Sprintf(`"public".%q exists and is not the store's table: it is a view`, view),
		more:  fmt.Sprintf(`"public".%q exists and is not the store's table: it has the columns expires bigint, id bytea, key bytea, name bytea, owner text, shard integer, ts bigint, value double precision`, more),
		nokey: fmt.Sprintf(`"public".%q exists and is not the store's table: it has no primary key`, nokey),
	} {
		for _, cmd := range []string{"inspect", "reset", "limit", "bench"} {
			code, out, errOut := exec(append([]string{cmd, "--store", url, "--table", table}, tokenBucket...)...)
			require.Equal(t, 1, code, "%s %s:\n%s%s", cmd, table, out, errOut)
			require.Contains(t, errOut, check+want, cmd)
			require.Contains(t, errOut, "pgstore: the table is not the store's\n", cmd)
		}
		var comment *string
		require.NoError(t, pool.QueryRow(ctx, "SELECT obj_description(to_regclass($1), 'pg_class')", pgx.Identifier{table}.Sanitize()).Scan(&comment))
		require.Nil(t, comment, "%s is not marked as a store's table", table)
		var fns int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_proc WHERE starts_with(proname, $1)", table+"_").Scan(&fns))
		require.Zero(t, fns, "no function of the store was made for %s", table)
	}
}

// A function of the application's that bears the name of one of the
// store's functions (here beside the store's table, so that inspect and
// reset, which need one, get as far) is refused by every command, as
// pgstore.New refuses it, and left as it was: limit and bench let New
// replace it, or make the store's beside it.
func TestPostgresFunctionNotAStores(t *testing.T) {
	ctx := context.Background()
	url := testserver.PostgresURL(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	for _, tc := range []struct{ name, create, sig string }{
		{"the store's arguments", `DROP FUNCTION "%s_del"(bytea[]); CREATE FUNCTION "%[1]s_del"(ids bytea[]) RETURNS text LANGUAGE sql AS $$SELECT 'the application''s'$$`, "%s_del(bytea[])"},
		{"other arguments", `CREATE FUNCTION "%s_read"(id integer) RETURNS text LANGUAGE sql AS $$SELECT 'the application''s'$$`, "%s_read(integer)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := fmt.Sprintf("ratelimit_cli_test_%d", time.Now().UnixNano())
			t.Cleanup(func() { dropTable(t, pool, table) })
			_, err := pgstore.New(ctx, pool, pgstore.WithTable(table))
			require.NoError(t, err)
			_, err = pool.Exec(ctx, fmt.Sprintf("COMMENT ON TABLE %s IS NULL", pgx.Identifier{table}.Sanitize())) // to upgrade
			require.NoError(t, err)
			_, err = pool.Exec(ctx, fmt.Sprintf(tc.create, table))
			require.NoError(t, err)
			state := func() []string {
				rows, err := pool.Query(ctx, "SELECT oid::regprocedure::text || ' ' || prosrc FROM pg_proc WHERE starts_with(proname, $1) ORDER BY 1", table+"_")
				require.NoError(t, err)
				fns, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(t, err)
				return fns
			}
			before := state()
			want := fmt.Sprintf("postgres: check --table (the application's pgstore.WithTable) and the database in --store: pgstore: function public.%s: not the store's", fmt.Sprintf(tc.sig, table))
			for _, cmd := range []string{"inspect", "reset", "limit", "bench"} {
				code, out, errOut := exec(append([]string{cmd, "--store", url, "--table", table}, tokenBucket...)...)
				require.Equal(t, 1, code, "%s:\n%s%s", cmd, out, errOut)
				require.Contains(t, errOut, want, cmd)
				require.Contains(t, errOut, "give it a table of another name with WithTable", cmd)
				require.Equal(t, before, state(), "%s left the functions as they were", cmd)
			}
		})
	}
}

// bench's flags out of range are usage errors that name the flag and say
// what to give: --keys 2000000000 ran out of memory, and the three flags
// shared one message; --count 0 ran, and reported every call allowed.
func TestBenchFlags(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--keys", "0"}, "--keys 0: give from 1 to 1000000 keys"},
		{[]string{"--goroutines", "-1"}, "--goroutines -1: give from 1 to 10000 goroutines"},
		{[]string{"--duration", "0s"}, "--duration 0s: give a time above 0, such as 10s"},
		{[]string{"--keys", "2000000000"}, "--keys 2000000000: give from 1 to 1000000 keys"},
		{[]string{"--goroutines", "10000000"}, "--goroutines 10000000: give from 1 to 10000 goroutines"},
		// A count of 0 is allowed every time and takes nothing: the run
		// reported every call allowed, and its check passed, checking
		// nothing.
		{[]string{"--count", "0"}, "--count 0: a call of 0 tokens takes none, and is allowed every time, which loads the store but checks nothing: give a count above 0, such as 1"},
		{[]string{"--count", "-0"}, "--count -0: a call of 0 tokens"},
		{[]string{"--count", "-1"}, "--count -1 is negative: a count is a number from 0 to 1000000000000000"},
	} {
		code, out, errOut := exec(append(append([]string{"bench", "--store", "mem:"}, tokenBucket...), tc.flags...)...)
		require.Equal(t, 2, code, "%q: %s%s", tc.flags, out, errOut)
		require.Contains(t, errOut, tc.want, "%q", tc.flags)
	}
}

// --shards, --keys, --goroutines and --seed, the command's whole numbers,
// are read in decimal, and a leading zero is refused as in a limits file:
// pflag's Int reads 010 as the octal 8, so that --shards 010 split a limit
// into 8 shards, and 0x10 as 16; its Uint64 did the same to --seed, which
// then drew as seed 8.
func TestIntFlagsDecimal(t *testing.T) {
	for _, tc := range []struct {
		cmd   string
		flags []string
		want  string
	}{
		{"simulate", []string{"--shards", "010"}, `invalid argument "010" for "--shards" flag: "010" has a leading zero: write 10`},
		{"simulate", []string{"--shards", "-010"}, `invalid argument "-010" for "--shards" flag: "-010" has a leading zero: write -10`},
		{"simulate", []string{"--shards", "0x10"}, `invalid argument "0x10" for "--shards" flag: write a whole number in decimal, such as 4`},
		{"simulate", []string{"--shards", "1_0"}, `invalid argument "1_0" for "--shards" flag: write a whole number in decimal`},
		{"simulate", []string{"--shards", "99999999999999999999"}, `invalid argument "99999999999999999999" for "--shards" flag: out of range`},
		{"bench", []string{"--store", "mem:", "--keys", "010"}, `invalid argument "010" for "--keys" flag: "010" has a leading zero: write 10`},
		{"bench", []string{"--store", "mem:", "--goroutines", "0o10"}, `invalid argument "0o10" for "--goroutines" flag: write a whole number in decimal`},
		{"simulate", []string{"--seed", "010"}, `invalid argument "010" for "--seed" flag: "010" has a leading zero: write 10`},
		{"simulate", []string{"--seed", "0x10"}, `invalid argument "0x10" for "--seed" flag: write a whole number in decimal`},
		{"simulate", []string{"--seed", "0b1"}, `invalid argument "0b1" for "--seed" flag: write a whole number in decimal`},
		{"simulate", []string{"--seed", "1_0"}, `invalid argument "1_0" for "--seed" flag: write a whole number in decimal`},
		{"simulate", []string{"--seed", "-1"}, `invalid argument "-1" for "--seed" flag: give a whole number from 0 to 18446744073709551615`},
		{"simulate", []string{"--seed", "18446744073709551616"}, `invalid argument "18446744073709551616" for "--seed" flag: give a whole number from 0 to 18446744073709551615`},
	} {
		args := append(append([]string{tc.cmd}, tokenBucket...), tc.flags...)
		args = append(args, "--at", "0s=1")
		if tc.cmd == "bench" {
			args = append(args[:len(args)-2], "--duration", "1ms")
		}
		code, out, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s%s", args, out, errOut)
		require.Contains(t, errOut, tc.want, "%q", args)
	}
	for shards, want := range map[string]string{"4": "4 shards", "+2": "2 shards", "0": "capacity 3\n"} {
		code, out, errOut := exec(append(append([]string{"simulate"}, tokenBucket...), "--shards", shards, "--at", "0s=1")...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, want, shards)
	}
	// A seed draws as the same number in decimal: --seed 10 is seed 10,
	// and none of 0, -0, +10 and the largest is refused.
	sharded := []string{"simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--capacity", "8", "--shards", "4",
		"--every", "2s", "--for", "1m", "--count", "2"}
	draw := func(seed string) string {
		code, out, errOut := exec(append(slices.Clone(sharded), "--seed", seed)...)
		require.Equal(t, 0, code, "--seed %s: %s", seed, errOut)
		return out
	}
	require.Equal(t, draw("10"), draw("+10"))
	require.Equal(t, draw("0"), draw("-0"))
	draw("18446744073709551615")
	var seed decimalUint64
	require.NoError(t, seed.Set("10"))
	require.Equal(t, decimalUint64(10), seed)
	require.Equal(t, "10", seed.String())
}

// slow is a store of a round trip of a millisecond (and without the
// in-process calls of memstore's Bind).
type slow struct{ ratelimit.Store }

func (s slow) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	time.Sleep(time.Millisecond)
	return s.Store.Apply(ctx, op, out)
}

func (s slow) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	time.Sleep(time.Millisecond)
	return s.Store.Load(ctx, ids, out)
}

func (s slow) Delete(ctx context.Context, ids []driver.RecordID) error {
	time.Sleep(time.Millisecond)
	return s.Store.Delete(ctx, ids)
}

// After the run, bench reads and removes only the keys it called on, from
// all its goroutines: it read and removed every key of --keys one after
// the other, so that a run of many keys on a store a round trip away
// failed when its 30 s to remove them ran out.
func TestBenchManyKeys(t *testing.T) {
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second}
	mem := must(memstore.New())
	lim, err := ratelimit.New(slow{mem}, ratelimit.Limits{"x": cfg})
	require.NoError(t, err)
	start := time.Now()
	rep, err := bench(context.Background(), lim, "x", cfg, 100_000, 8, 50*time.Millisecond, 0, 1, true, false, io.Discard)
	require.NoError(t, err)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Positive(t, rep.calls)
	require.Empty(t, rep.violation)
	require.True(t, rep.windows)
	require.Zero(t, mem.Len(), "the keys are removed")
}

// Times of the simulation print as hh:mm:ss[.mmm], up to the 150 years a
// chart of a request at 100 years spans. (With an int of 32 bits, as on
// 386 and arm, the seconds of 100 years overflowed: 876576:00:-16.)
func TestClockTime(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "00:00:00", 90 * time.Minute: "01:30:00", 1500 * time.Millisecond: "00:00:01.500",
		-30 * time.Minute: "-00:30:00", ratelimit.MaxPeriod: "876576:00:00",
		ratelimit.MaxPeriod + ratelimit.MaxPeriod/2 + 59*time.Second + time.Millisecond: "1314864:00:59.001",
	} {
		assert.Equal(t, want, clockTime(d), "%v", d)
	}
}

// chartTicks returns the labels of the y axis of the chart at path.
func chartTicks(t *testing.T, path string) []string {
	chart, err := os.ReadFile(path)
	require.NoError(t, err)
	var labels []string
	for _, m := range regexp.MustCompile(`text-anchor="end">([^<]*)<`).FindAllStringSubmatch(string(chart), -1) {
		if !strings.HasPrefix(m[1], "capacity ") {
			labels = append(labels, m[1])
		}
	}
	return labels
}

// The y axis's labels fit its margin: those of a capacity of 1e15 were
// 16 digits long and ran off the chart's left edge.
func TestChartTicksFit(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "huge.svg")
	code, _, errOut := exec("simulate", "--kind", "token bucket", "--rate", "10", "--capacity", "1e15", "--period", "1h",
		"--at", "0s=1", "--svg", svg)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, []string{"0", "2e14", "4e14", "6e14", "8e14", "1e15"}, chartTicks(t, svg))
	code, _, errOut = exec("simulate", "--kind", "token bucket", "--rate", "100", "--capacity", "150", "--period", "1h",
		"--at", "0s=1,1s=1500000r", "--svg", svg)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, []string{"-1e6", "-500000", "0"}, chartTicks(t, svg))
}

// A chart that cannot be written fails the command before it prints the
// table: it printed the whole run, then failed.
func TestSimulateSVGUnwritable(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "missing", "chart.svg")
	code, out, errOut := exec("simulate", "--kind", "fixed window", "--rate", "100", "--period", "1h", "--at", "00:30=15", "--svg", svg)
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "--svg: open "+svg)
	// A run that fails after the file was made (here, its context ended)
	// leaves no empty chart.
	svg = filepath.Join(t.TempDir(), "chart.svg")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cfg := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour}
	err := simulate(ctx, io.Discard, &limitFlags{}, "limit", cfg, []request{{at: time.Minute, count: 1}}, svg, 1)
	require.ErrorIs(t, err, context.Canceled)
	require.NoFileExists(t, svg)
}

// storeFlagsOf returns the store flags that the command-line arguments
// storeArgs ("--store", URL, then "--prefix" or "--table" and a value)
// set, for a test to open the store the command opens.
func storeFlagsOf(storeArgs []string) storeFlags {
	sf := storeFlags{url: storeArgs[1], prefix: redisstore.DefaultPrefix, table: pgstore.DefaultTable, bucket: boltstore.DefaultBucket}
	for i := 2; i+1 < len(storeArgs); i += 2 {
		switch storeArgs[i] {
		case "--prefix":
			sf.prefix = storeArgs[i+1]
		case "--table":
			sf.table = storeArgs[i+1]
		}
	}
	return sf
}

// --rate, --capacity, --max-reserved, --count and the counts of --at are
// read as plain decimal numbers, with an exponent if any: ParseFloat read
// Go's syntax, so that the typo --rate 1_0 was a rate of 10, and 0x1p3
// one of 8. A leading zero is refused, as the whole numbers refuse it.
// NaN and Inf are read, and refused by the limit's rules, in their words.
func TestFloatFlagsDecimal(t *testing.T) {
	limit := []string{"--kind", "token bucket", "--period", "1m"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append([]string{"simulate", "--rate", "1_0", "--at", "0s=1"}, limit...), `invalid argument "1_0" for "--rate" flag: write a number in decimal, such as 10, 0.5 or 1e3`},
		{append([]string{"simulate", "--rate", "0x1p3", "--at", "0s=1"}, limit...), `invalid argument "0x1p3" for "--rate" flag: write a number in decimal`},
		{append([]string{"simulate", "--rate", "0X10", "--at", "0s=1"}, limit...), `invalid argument "0X10" for "--rate" flag: write a number in decimal`},
		{append([]string{"simulate", "--rate", "010", "--at", "0s=1"}, limit...), `invalid argument "010" for "--rate" flag: "010" has a leading zero: write 10`},
		{append([]string{"simulate", "--rate", "10", "--capacity", "00.5", "--at", "0s=1"}, limit...), `invalid argument "00.5" for "--capacity" flag: "00.5" has a leading zero: write 0.5`},
		{append([]string{"simulate", "--rate", "10", "--capacity", "1e", "--at", "0s=1"}, limit...), `invalid argument "1e" for "--capacity" flag: write a number in decimal`},
		{append([]string{"simulate", "--rate", "10", "--max-reserved", "1_000", "--at", "0s=1"}, limit...), `invalid argument "1_000" for "--max-reserved" flag: write a number in decimal`},
		{append([]string{"simulate", "--rate", "10", "--every", "1s", "--for", "1s", "--count", "0x1"}, limit...), `invalid argument "0x1" for "--count" flag: write a number in decimal`},
		{append([]string{"limit", "--store", "mem:", "--rate", "10", "--count", "1_0"}, limit...), `invalid argument "1_0" for "--count" flag: write a number in decimal`},
		{append([]string{"bench", "--store", "mem:", "--rate", "10", "--count", "0x1p0", "--duration", "1ms"}, limit...), `invalid argument "0x1p0" for "--count" flag: write a number in decimal`},
		{append([]string{"simulate", "--rate", "10", "--at", "0s=1_0"}, limit...), `--at "0s=1_0": the count "1_0" is not a number in decimal, such as 10, 0.5 or 1e3`},
		{append([]string{"simulate", "--rate", "10", "--at", "0s=0x1p3r"}, limit...), `--at "0s=0x1p3r": the count "0x1p3" is not a number in decimal`},
		{append([]string{"simulate", "--rate", "10", "--at", "0s=01"}, limit...), `--at "0s=01": the count "01" has a leading zero: write 1`},
		// Spaces around the = are taken (TestAtSpacesAroundEquals); within
		// the count, they are not.
		{append([]string{"simulate", "--rate", "10", "--at", "0s= 1 0"}, limit...), `--at "0s= 1 0": the count "1 0" is not a number in decimal`},
		// Too close to 0 for a float64, as a limits file's numbers: it read
		// as 0, the default, so that --max-reserved 1e-400 bounded no debt
		// at all, --capacity 1e-400 was the rate, and a count of 1e-400 asked
		// for nothing.
		{append([]string{"simulate", "--rate", "10", "--max-reserved", "1e-400", "--at", "0s=1"}, limit...),
			`invalid argument "1e-400" for "--max-reserved" flag: "1e-400" is too close to 0 for a float64, which reads it as 0: write 0 if that is meant, or a number of at least 5e-324`},
		{append([]string{"simulate", "--rate", "10", "--capacity", "-2.5e-330", "--at", "0s=1"}, limit...), `invalid argument "-2.5e-330" for "--capacity" flag: "-2.5e-330" is too close to 0`},
		{append([]string{"limit", "--store", "mem:", "--rate", "10", "--count", "0.0001e-400"}, limit...), `invalid argument "0.0001e-400" for "--count" flag: "0.0001e-400" is too close to 0`},
		{append([]string{"simulate", "--rate", "10", "--at", "0s=1e-400"}, limit...), `--at "0s=1e-400": the count "1e-400" is too close to 0`},
	} {
		code, out, errOut := exec(tc.args...)
		require.Equal(t, 2, code, "%q: %s%s", tc.args, out, errOut)
		require.Contains(t, errOut, tc.want, "%q", tc.args)
	}
	for _, s := range []string{"10", "+10", "10.", "10.0", "1e1", "1E+1", "100e-1", ".1e2", "0.1e2"} {
		code, out, errOut := exec(append([]string{"simulate", "--rate", s, "--at", "0s=1"}, limit...)...)
		require.Equal(t, 0, code, "%s: %s", s, errOut)
		require.Contains(t, out, "rate 10 per 1m0s", s)
		reqs, err := parsePattern("0s=" + s)
		require.NoError(t, err, s)
		require.Equal(t, 10.0, reqs[0].count, s)
	}
	// Read, then judged by the limit's rules.
	for s, want := range map[string]string{"0.5": "--rate is 0.5 and --capacity is unset", "-1": "--rate is -1:", "NaN": "--rate is NaN:", "-inf": "--rate is -Inf:"} {
		code, _, errOut := exec(append([]string{"simulate", "--rate", s, "--at", "0s=1"}, limit...)...)
		require.Equal(t, 2, code, "%s: %s", s, errOut)
		require.Contains(t, errOut, want, s)
	}
	code, out, errOut := exec(append([]string{"simulate", "--rate", "1e1", "--capacity", "0.5e1", "--at", "0s=2.5e0"}, limit...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "rate 10 per 1m0s, capacity 5")
}

// A simulation that fails, or is interrupted, leaves a chart that was at
// --svg's path as it was: the file was truncated when the run began, and
// removed when it failed, so that a mistyped count lost the chart of an
// earlier run.
func TestSimulateSVGKeptOnFailure(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "old.svg")
	require.NoError(t, os.WriteFile(old, []byte("<svg>earlier</svg>\n"), 0o644))
	fresh := filepath.Join(dir, "fresh.svg")
	args := []string{"simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--capacity", "3", "--at", "0s=1,1s=4"}
	for _, svg := range []string{old, fresh} {
		code, out, errOut := exec(append(args, "--svg", svg)...)
		require.Equal(t, 2, code, errOut)
		require.Empty(t, out)
		require.Contains(t, errOut, "count 4 exceeds 3")
	}
	require.Equal(t, "<svg>earlier</svg>\n", string(must(os.ReadFile(old))))
	require.NoFileExists(t, fresh)

	// Ctrl-C (here, the command's context ended): status 130, nothing
	// printed, no chart written.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, svg := range []string{old, fresh} {
		code, out, errOut := execContext(ctx, "simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--every", "1s", "--for", "1h", "--svg", svg)
		require.Equal(t, 130, code, errOut)
		require.Empty(t, out)
		require.Contains(t, errOut, "simulate interrupted")
	}
	require.Equal(t, "<svg>earlier</svg>\n", string(must(os.ReadFile(old))))
	require.NoFileExists(t, fresh)

	// A run that succeeds replaces the chart.
	code, _, errOut := exec("simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--at", "0s=1", "--svg", old)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, string(must(os.ReadFile(old))), "<svg xmlns")
	require.True(t, strings.HasSuffix(string(must(os.ReadFile(old))), "</svg>\n"))
}

// A limit's name reaches the terminal quoted, as nameText writes it, when
// it holds what is not printable: a limits file's names are any text, and
// --name any bytes, and the terminal ran the escapes of one (ESC [31m
// turned the rest red; others move the cursor, or set the window's
// title).
func TestNameEscapedInText(t *testing.T) {
	const name = "a\x1b[31mb\rc"
	const quoted = `"a\x1b[31mb\rc"`
	inline := []string{"--kind", "token bucket", "--rate", "1", "--period", "1s", "--name", name}
	path := filepath.Join(t.TempDir(), "limits.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"a\u001b[31mb\rc": {"kind": "token bucket", "rate": 1, "period": "1s"}}`), 0o600))
	file := []string{"--limits", path, "--name", name}
	for _, args := range [][]string{
		append([]string{"simulate", "--at", "0s=1"}, inline...),
		append([]string{"simulate", "--at", "0s=1"}, file...),
		append([]string{"limit", "--store", "mem:", "--key", "k"}, inline...),
		append([]string{"reset", "--store", "mem:", "--key", "k"}, inline...),
		append([]string{"inspect", "--store", "mem:", "--key", "k"}, file...),
	} {
		code, out, errOut := exec(args...)
		require.Equal(t, 0, code, "%q: %s", args, errOut)
		assert.NotContains(t, out, "\x1b", "%q", args)
		assert.NotContains(t, out, "\r", "%q", args)
		assert.Contains(t, out, quoted, "%q", args)
	}
	// A plain name is written as it is.
	code, out, errOut := exec("simulate", "--at", "0s=1", "--kind", "token bucket", "--rate", "1", "--period", "1s", "--name", "send")
	require.Equal(t, 0, code, errOut)
	assert.True(t, strings.HasPrefix(out, "send: token bucket"), out)
}

// An error's line writes its control and format characters, and bytes
// that are not UTF-8, as Go escapes them: errors quote what they were
// given (a path, a store's user) and what a server says, and the terminal
// ran the escapes among them.
func TestErrorLineEscaped(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a\x1b[31mb\r\u202e\xff.yaml")
	code, out, errOut := exec("simulate", "--limits", path, "--name", "x", "--at", "0s=1")
	require.Equal(t, 1, code, out+errOut)
	require.Equal(t, "ratelimit: --limits "+dir+`/a\x1b[31mb\r\u202e\xff.yaml: no such file or directory: check the path of the limits file`+"\n", errOut)

	// A store's user, in the client's error (a closed port).
	code, out, errOut = exec("inspect", "--store", "host=127.0.0.1 port=1 user=a\x1b]0;title\x07 dbname=x", "--key", "k",
		"--kind", "token bucket", "--rate", "1", "--period", "1s")
	require.Equal(t, 1, code, out+errOut)
	require.Contains(t, errOut, `user=a\x1b]0;title\a database=x`)
	require.NotContains(t, errOut, "\x1b")
	require.NotContains(t, errOut, "\x07")

	assert.Equal(t, "plain, café 🚀", escapeControls("plain, café 🚀"))
	assert.Equal(t, `\t\n\x7f\u0085\u200b`, escapeControls("\t\n\x7f\u0085\u200b"))
}

// bench's text writes a latency or a time that rounds to 0 in the unit of
// its figures: a Duration writes 0 as 0s, and a memory store's answers,
// under half a microsecond, made the line "p50 0s  p90 0s  p99 0s  max
// 50.291ms".
func TestBenchReportZeroInItsUnit(t *testing.T) {
	h := new(histogram)
	for range 9 {
		h.add(100 * time.Nanosecond)
	}
	h.add(1500 * time.Microsecond)
	var out strings.Builder
	(&report{calls: 10, allowed: 10, elapsed: 400 * time.Microsecond, latency: h, keys: 1}).print(&out)
	require.Contains(t, out.String(), "decisions  10 in 0ms: ")
	require.Contains(t, out.String(), "latency    p50 0µs  p90 1.5ms  p99 1.5ms  max 1.5ms\n")

	out.Reset()
	(&report{calls: 3, allowed: 3, elapsed: 5001 * time.Millisecond, latency: h, keys: 1}).print(&out)
	require.Contains(t, out.String(), "decisions  3 in 5.001s: 1/s\n", "a time not 0 is written as before")
}

// --name "" names an inline limit "", as it does with --limits, and as the
// library and a limits file take the name "": it named the limit "limit",
// the name of one without --name, so that inspect and reset looked at
// another limit's records than the one named.
func TestInlineNameEmpty(t *testing.T) {
	store := []string{"--store", "bolt://" + filepath.Join(t.TempDir(), "limits.db"), "--key", "user-42"}
	code, out, errOut := exec(append(append([]string{"limit", "--name", "", "-o", "json"}, store...), tokenBucket...)...)
	require.Equal(t, 0, code, errOut)
	var d decisionJSON
	decode(t, out, &d)
	require.Equal(t, "", d.Limit.Name)

	tokens := func(name ...string) float64 {
		code, out, errOut := exec(append(append(append([]string{"inspect", "-o", "json"}, name...), store...), tokenBucket...)...)
		require.Equal(t, 0, code, errOut)
		var s statusJSON
		decode(t, out, &s)
		return s.Tokens
	}
	require.InDelta(t, 2, tokens("--name", ""), 0.1, "the limit named \"\" took a token")
	require.Equal(t, 3.0, tokens(), "the limit without --name, \"limit\", is another")

	code, out, errOut = exec(append([]string{"simulate", "--name", "", "--at", "0s=1"}, tokenBucket...)...)
	require.Equal(t, 0, code, errOut)
	require.True(t, strings.HasPrefix(out, `"": token bucket, rate 10 per 1m0s, capacity 3`+"\n"), out)
}

// A Redis --store whose port is no port (above 65535, or 0) is a usage
// error, as a PostgreSQL one is: it failed with status 1 and the hint to
// check that the server is up, which no server can be at such a port.
func TestStorePortOutOfRange(t *testing.T) {
	for _, store := range []string{"redis://127.0.0.1:99999/0", "redis://127.0.0.1:0/0", "rediss://127.0.0.1:65536/0",
		"redis+cluster://127.0.0.1:7000,127.0.0.1:99999", "redis+cluster://127.0.0.1:0"} {
		code, out, errOut := exec(append([]string{"inspect", "--store", store}, tokenBucket...)...)
		require.Equal(t, 2, code, "%s:\n%s%s", store, out, errOut)
		require.Contains(t, errOut, "is not a number from 1 to 65535", store)
		require.NotContains(t, errOut, "is the server up?", store)
	}
}
