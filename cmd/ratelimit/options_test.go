package main

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// --phase-seed gives the Limiter the application's WithPhaseSeed: the
// windows of a fixed window without --start start where the
// application's do. Without it, inspect showed the windows of seed 0,
// and limit decided by them, where the application's fall elsewhere.
func TestPhaseSeedFlag(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "limits.db")
	hourly := []string{"--store", "bolt://" + path, "--kind", "fixed window", "--rate", "10", "--period", "1h", "--name", "hourly", "--key", "user-42"}
	code, _, errOut := exec(append([]string{"limit", "--check"}, hourly...)...)
	require.Equal(t, 0, code, errOut)
	// The phase of the windows: a window's start, modulo the period.
	phaseOf := func(opts ...ratelimit.Option) int64 {
		lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{"hourly": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Hour}}, opts...))
		st, err := lim.Value(ctx, "hourly", "user-42")
		require.NoError(t, err)
		return st.WindowStart.UnixMilli() % time.Hour.Milliseconds()
	}
	inspected := func(extra ...string) int64 {
		code, out, errOut := exec(append(append([]string{"inspect", "-o", "json"}, hourly...), extra...)...)
		require.Equal(t, 0, code, errOut)
		var s statusJSON
		decode(t, out, &s)
		start, err := time.Parse(time.RFC3339, *s.WindowStart)
		require.NoError(t, err)
		return start.UnixMilli() % time.Hour.Milliseconds()
	}
	require.NotEqual(t, phaseOf(), phaseOf(ratelimit.WithPhaseSeed(7)), "the seed moves the phase")
	require.Equal(t, phaseOf(), inspected())
	require.Equal(t, phaseOf(ratelimit.WithPhaseSeed(7)), inspected("--phase-seed", "7"))
	require.Equal(t, phaseOf(ratelimit.WithPhaseSeed(18446744073709551615)), inspected("--phase-seed", "18446744073709551615"))

	for _, tc := range []struct {
		args []string
		want string
	}{
		{append([]string{"inspect", "--phase-seed", "0x7"}, hourly...), `invalid argument "0x7" for "--phase-seed" flag: write a whole number in decimal`},
		{append([]string{"inspect", "--phase-seed", "-1"}, hourly...), `invalid argument "-1" for "--phase-seed" flag: give a whole number from 0 to 18446744073709551615`},
		{[]string{"token", "refund", "--store", "mem:", "--kind", "token bucket", "--rate", "1", "--period", "1s", "--phase-seed", "07", "AQ"}, `invalid argument "07" for "--phase-seed" flag: "07" has a leading zero`},
	} {
		code, _, errOut := exec(tc.args...)
		require.Equal(t, 2, code, "%q: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%q", tc.args)
	}
}

// --server-time opens a Redis or PostgreSQL store with its WithServerTime,
// as the application's, so that a token's expiry and the windows are
// judged at the server's time; bbolt and the in-memory store have no
// clock of their own, and refuse it.
func TestServerTimeFlag(t *testing.T) {
	ctx := context.Background()
	url, prefix, _ := testRedis(t)
	pgURL, table := postgresTable(t, "ratelimit_cli_servertime_")
	for _, args := range [][]string{{"--store", url, "--prefix", prefix}, {"--store", pgURL, "--table", table}} {
		sf := storeFlagsOf(args)
		sf.serverTime = true
		store, closeStore, err := sf.open(ctx, mayCreate)
		require.NoError(t, err, args)
		ts, ok := store.(driver.TimeSource)
		require.True(t, ok && ts.OwnClock(), "%q: the store judges at its own time", args)
		closeStore()
		sf.serverTime = false
		store, closeStore, err = sf.open(ctx, mayCreate)
		require.NoError(t, err, args)
		require.False(t, store.(driver.TimeSource).OwnClock(), "%q", args)
		closeStore()

		code, out, errOut := exec(append([]string{"limit", "--server-time", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--key", "k"}, args...)...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "allowed 1 of limit")
	}
	path := filepath.Join(t.TempDir(), "limits.db")
	for _, store := range []string{"mem:", "bolt://" + path} {
		code, _, errOut := exec("limit", "--store", store, "--server-time", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--key", "k")
		require.Equal(t, 2, code, errOut)
		require.Contains(t, errOut, "--server-time: the store of "+store+" has no clock of its own: the application's Redis or PostgreSQL store takes WithServerTime; leave --server-time out")
	}
}

// --unsigned-tokens-accepted settles unsigned tokens under a token key,
// as a Limiter given WithUnsignedTokensAccepted does during a move to
// signed tokens, and still checks the tags of the signed ones: without
// it, a batch of both could only be settled with no key at all, every
// tag unchecked.
func TestUnsignedTokensAcceptedFlag(t *testing.T) {
	unsetenv(t, tokenKeyEnv)
	dir := t.TempDir()
	limits := writeFile(t, dir, "limits.yaml", signupLimitsYAML)
	keyA := writeFile(t, dir, "a.key", tokenKeyA)
	unsigned := receipt(t, must(ratelimit.New(must(memstore.New()), signupLimits)), "llm", "user-42", 1)
	signed := receipt(t, must(ratelimit.New(must(memstore.New()), signupLimits, ratelimit.WithTokenKey([]byte(tokenKeyA)))), "llm", "user-42", 1)
	forged := receipt(t, must(ratelimit.New(must(memstore.New()), signupLimits, ratelimit.WithTokenKey([]byte(tokenKeyB)))), "llm", "user-42", 1)
	stdin := unsigned + "\n" + signed + "\n"

	settle := []string{"token", "use", "--store", "mem:", "--limits", limits, "--token-key-file", keyA}
	code, _, errOut := execIn(stdin, append(settle, "-")...)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "ratelimit: 2 tokens: 1 settled, 1 invalid\n")
	code, out, errOut := execIn(stdin, append(settle, "--unsigned-tokens-accepted", "-")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "used token "+tokenID(must(ratelimit.ParseToken(unsigned))))
	require.Contains(t, out, "used token "+tokenID(must(ratelimit.ParseToken(signed))))
	code, _, errOut = execIn(forged, append(settle, "--unsigned-tokens-accepted", "-")...)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "its tag is not valid under the key given")

	// inspect takes it the same.
	code, out, errOut = exec("token", "inspect", "--token-key-file", keyA, "--unsigned-tokens-accepted", unsigned)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "signed       no: taken unchecked (--unsigned-tokens-accepted), as a Limiter given WithUnsignedTokensAccepted takes it\n")

	// Without a token key, every token is taken unchecked: the flag
	// would say nothing.
	code, _, errOut = exec("token", "refund", "--store", "mem:", "--limits", limits, "--unsigned-tokens-accepted", unsigned)
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, "--unsigned-tokens-accepted without a token key: without one, every token is taken unchecked, signed or not; give the token key (--token-key-file, or $RATELIMIT_TOKEN_KEY), or leave the flag out")
}

// --phase-seed moves the windows of a fixed window without a start, and
// nothing else: given for a token bucket, or a fixed window aligned to
// its start, it was taken and changed nothing, as if the application's
// seed had been applied. It is refused there, as simulate --seed is for a
// limit of one record; reset takes it whatever the limit, so that
// inspect's flags run it as they are.
func TestPhaseSeedUnused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "limits.db")
	limits := writeFile(t, dir, "limits.yaml", signupLimitsYAML)
	aligned := writeFile(t, dir, "aligned.yaml", "daily:\n  kind: fixed window\n  rate: 10\n  period: 24h\n  start: 2024-01-01T00:00:00Z\n")
	store := []string{"--store", "bolt://" + path, "--key", "user-42", "--phase-seed", "7"}
	bucket := []string{"--kind", "token bucket", "--rate", "10", "--period", "1m"}
	const moves = "ratelimit: --phase-seed moves the windows of a fixed window without a start, which fall at a phase of each key, and "
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(append([]string{"limit"}, store...), bucket...), `limit limit is a token bucket, which has no windows`},
		{append(append([]string{"inspect"}, store...), "--limits", limits, "--name", "llm"), `limit llm is a token bucket, which has no windows`},
		{append(append([]string{"limit", "--name", "a b"}, store...), "--kind", "fixed window", "--rate", "10", "--period", "1h", "--start", "2024-01-01T00:00:00Z"),
			`the windows of limit "a b" are aligned to its start`},
		{append(append([]string{"bench", "--duration", "1s"}, store[:2]...), append([]string{"--phase-seed", "0"}, bucket...)...), `limit limit is a token bucket, which has no windows`},
		{[]string{"token", "refund", "--store", "mem:", "--phase-seed", "7", "--limits", aligned, "AQ"}, `limit daily are aligned to its start`},
		{[]string{"token", "use", "--store", "mem:", "--phase-seed", "7", "--limits", writeFile(t, dir, "two.yaml", "a:\n  kind: token bucket\n  rate: 1\n  period: 1s\nb:\n  kind: token bucket\n  rate: 1\n  period: 1s\n"), "AQ"},
			"no limit of " + filepath.Join(dir, "two.yaml") + " is one"},
	} {
		code, out, errOut := exec(tc.args...)
		require.Equal(t, 2, code, "%q: %s%s", tc.args, out, errOut)
		require.Contains(t, errOut, moves, "%q", tc.args)
		require.Contains(t, errOut, tc.want+": it would change nothing; leave --phase-seed out\n", "%q", tc.args)
		_, err := os.Stat(path)
		require.ErrorIs(t, err, os.ErrNotExist, "%q: refused before the store is opened", tc.args)
	}

	// Where a limit has windows at a phase of each key, it is taken: a
	// limits file of such a limit among others, too.
	code, _, errOut := exec(append(append([]string{"limit"}, store...), "--kind", "fixed window", "--rate", "10", "--period", "1h")...)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = exec("token", "refund", "--store", "bolt://"+path, "--phase-seed", "7", "--limits", limits, "AQ")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "invalid token")
	// reset takes it whatever the limit.
	code, _, errOut = exec(append(append([]string{"reset"}, store...), bucket...)...)
	require.Equal(t, 0, code, errOut)
}

// Keys and limit names are bytes, as the library takes them: the command
// line passes --key and --name as given, and normalises neither. "café"
// with a precomposed é (NFC) and with e and a combining accent (NFD) are
// two keys with two records, as they are two keys in the application's
// calls, and two limit names.
func TestKeysAndNamesNotNormalised(t *testing.T) {
	const nfc, nfd = "caf\u00e9", "cafe\u0301"
	dir := t.TempDir()
	store := []string{"--store", "bolt://" + filepath.Join(dir, "limits.db"), "--kind", "token bucket", "--rate", "10", "--period", "1m", "--name", nfc}
	code, out, errOut := exec(append([]string{"limit", "--count", "4", "--key", nfc, "-o", "json"}, store...)...)
	require.Equal(t, 0, code, errOut)
	var d decisionJSON
	decode(t, out, &d)
	require.Equal(t, base64.StdEncoding.EncodeToString([]byte(nfc)), d.KeyBase64)
	require.Equal(t, base64.StdEncoding.EncodeToString([]byte(nfc)), d.Limit.NameBase64)
	tokens := func(key string) float64 {
		code, out, errOut := exec(append([]string{"inspect", "--key", key, "-o", "json"}, store...)...)
		require.Equal(t, 0, code, errOut)
		var s statusJSON
		decode(t, out, &s)
		require.Equal(t, base64.StdEncoding.EncodeToString([]byte(key)), s.KeyBase64)
		return s.Tokens
	}
	require.InDelta(t, 6, tokens(nfc), 0.5)
	require.Equal(t, 10.0, tokens(nfd), "the key in another normal form is another key")

	limits := writeFile(t, dir, "limits.yaml", nfc+":\n  kind: token bucket\n  rate: 10\n  period: 1m\n")
	code, _, errOut = exec("inspect", "--store", "mem:", "--limits", limits, "--name", nfd, "--key", nfc)
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, `ratelimit: limit "cafe\u0301" is not in `+limits+`: pass --name, one of ["caf\u00e9"] (written with the characters beyond ASCII escaped: names are matched byte for byte, and the same letters in another Unicode form, NFC or NFD, are another name)`+"\n")
}

// The error of a --name the limits file lacks escapes the characters
// beyond ASCII of every name it writes, whichever holds them: it did so
// only for a --name beyond ASCII, so that --name cafe, in a file of
// "café" in either normal form, listed ["café" "café"], and the names
// that differ by case alone were written as they are, so that --name
// Kelvin, in a file of "Kelvin" with a Kelvin sign (U+212A, which folds to
// k), asked "did you mean "Kelvin"?".
func TestLimitNotInEscapesListedNames(t *testing.T) {
	const nfc, nfd, kelvin = "caf\u00e9", "cafe\u0301", "\u212aelvin"
	dir := t.TempDir()
	limits := writeFile(t, dir, "limits.yaml", nfc+": {kind: token bucket, rate: 1, period: 1s}\n"+
		nfd+": {kind: token bucket, rate: 1, period: 1s}\n"+kelvin+": {kind: token bucket, rate: 1, period: 1s}\n")
	for _, tc := range []struct{ name, want string }{
		{"cafe", `ratelimit: limit "cafe" is not in ` + limits + `: pass --name, one of ["cafe\u0301" "caf\u00e9" "\u212aelvin"] ` +
			`(written with the characters beyond ASCII escaped: names are matched byte for byte, and the same letters in another Unicode form, NFC or NFD, are another name)`},
		{"Kelvin", `ratelimit: limit "Kelvin" is not in ` + limits + `: did you mean "\u212aelvin"? (names are matched as written, byte for byte: ` +
			`written with the characters beyond ASCII escaped, and the same letters in another Unicode form, NFC or NFD, are another name)`},
		{"CAF\u00c9", `ratelimit: limit "CAF\u00c9" is not in ` + limits + `: did you mean "caf\u00e9"? (names are matched as written, byte for byte: ` +
			`written with the characters beyond ASCII escaped, and the same letters in another Unicode form, NFC or NFD, are another name)`},
	} {
		code, _, errOut := exec("simulate", "--limits", limits, "--name", tc.name, "--at", "0s=1")
		require.Equal(t, 2, code, errOut)
		require.Equal(t, tc.want+"\nRun 'ratelimit simulate --help' for usage.\n", errOut, "--name %+q", tc.name)
	}
}
