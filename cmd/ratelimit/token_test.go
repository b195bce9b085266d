package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/stretchr/testify/require"
)

// execIn runs the command line with stdin as standard input.
func execIn(stdin string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := runWith(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

const (
	tokenKeyA = "token key A of the cli tests, 32b"
	tokenKeyB = "token key B of the cli tests, 32b"
)

// signupLimits are the limits of the tokens of these tests, as a limits
// file declares them.
var signupLimits = ratelimit.Limits{
	"signup": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour, Shards: 2},
	"llm":    {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
}

const signupLimitsYAML = `signup:
  kind: fixed window
  rate: 100
  period: 1h
  shards: 2
llm:
  kind: token bucket
  rate: 10
  period: 1m
`

// writeFile writes data to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
	return path
}

// receipt charges count of name to key through lim, with a receipt, and
// returns its token's text.
func receipt(t *testing.T, lim *ratelimit.Limiter, name, key string, count float64) string {
	t.Helper()
	res, err := lim.Limit(context.Background(), name, key, ratelimit.Count(count), ratelimit.WithReceipt())
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NotNil(t, res.Token)
	return res.Token.String()
}

// expiredToken returns the text of a token charged on a clock of
// 2024-01-01, with a settle window of a minute: long expired now.
func expiredToken(t *testing.T, opts ...ratelimit.Option) string {
	mock := clock.NewMock()
	mock.Set(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC))
	lim := must(ratelimit.New(must(memstore.New()), signupLimits,
		append(opts, ratelimit.WithClock(mock), ratelimit.WithSettleWindow(time.Minute))...))
	return receipt(t, lim, "llm", "user-42", 1)
}

// token inspect prints what a token says without a store: its ID, store
// key, times, tag and carried use, and each shard charged; with the token
// key, whether the tag is valid under it; with --key, whether the token
// is of that key.
func TestTokenInspect(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	keyA := writeFile(t, dir, "a.key", tokenKeyA+"\n")
	keyB := writeFile(t, dir, "b.key", tokenKeyB)
	unsetenv(t, tokenKeyEnv)
	unsetenv(t, keySecretEnv)

	signed := must(ratelimit.New(must(memstore.New()), signupLimits, ratelimit.WithTokenKey([]byte(tokenKeyA))))
	r, err := signed.Reserve(ctx, "signup", "user-42", ratelimit.Count(150), ratelimit.WithReceipt())
	require.NoError(t, err)
	require.True(t, r.OK())
	tok := r.Token()
	text := tok.String()

	code, out, errOut := exec("token", "inspect", text)
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)
	require.Contains(t, out, "token "+tokenID(tok)+"\n")
	require.Contains(t, out, "store key    \"user-42\"\n")
	require.Contains(t, out, "charged at   "+timeText(tok.ChargedAt())+"\n")
	require.Contains(t, out, "job runs at  "+timeText(tok.RunAt())+"\n")
	require.Contains(t, out, "expires at   "+timeText(tok.Expires())+", in ")
	require.Contains(t, out, "signed       yes, not checked: give the token key to check it (--token-key-file, or $RATELIMIT_TOKEN_KEY)\n")
	require.Contains(t, out, "carries use  no\n")
	var sum float64
	for _, row := range tok.Items() {
		require.Regexp(t, fmt.Sprintf(`\n +signup +%d +%s\n`, row.Shard, num(row.Amount)), out)
		sum += row.Amount
	}
	require.Equal(t, 150.0, sum)

	// The key, from a file (its final line break is not part of it) or
	// from the environment; and a rotation's keys, the right one second.
	code, out, errOut = exec("token", "inspect", "--token-key-file", keyA, text)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "signed       yes, and the tag is valid under the token key of "+keyA+"\n")
	code, out, errOut = exec("token", "inspect", "--token-key-file", keyB, "--token-key-file", keyA, text)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "valid under the token key of "+keyA)
	t.Setenv(tokenKeyEnv, tokenKeyA)
	code, out, errOut = exec("token", "inspect", text)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "valid under the token key of $RATELIMIT_TOKEN_KEY")

	// Another key: the tag is not valid, a failure; the flag is taken
	// before the environment.
	code, out, errOut = exec("token", "inspect", "--token-key-file", keyB, text)
	require.Equal(t, 1, code)
	require.Contains(t, out, "signed       yes, and the tag is NOT valid under the token key given")
	require.Equal(t, fmt.Sprintf("ratelimit: token %s: its tag is not valid under the key given: it was forged or altered, or signed with another key: invalid token\n", tokenID(tok)[:8]), errOut)

	// JSON.
	code, out, errOut = exec("token", "inspect", "-o", "json", text)
	require.Equal(t, 0, code, errOut)
	var js inspectJSON
	m := decode(t, out, &js)
	require.Equal(t, []string{"at", "carries_use", "charged_at", "error", "expired", "expires_at", "id", "items", "key_matches", "outcome",
		"run_at", "signed", "store_key", "store_key_base64", "store_key_form", "token", "verified", "verified_by"}, keysOf(m))
	require.Equal(t, text, js.Token)
	require.Equal(t, outRead, js.Outcome)
	require.Equal(t, tokenID(tok), js.ID)
	require.Equal(t, "user-42", js.StoreKey)
	require.Equal(t, "key", js.StoreKeyForm)
	require.Nil(t, js.KeyMatches)
	require.Equal(t, timeText(tok.RunAt()), *js.RunAt)
	require.Equal(t, timeText(tok.Expires()), *js.ExpiresAt)
	require.False(t, js.Expired)
	require.True(t, js.Signed)
	require.True(t, *js.Verified)
	require.Equal(t, "$RATELIMIT_TOKEN_KEY", js.VerifiedBy)
	require.Len(t, js.Items, 2)
	require.Equal(t, "signup", js.Items[0].Limit)
	require.Equal(t, 150.0, js.Items[0].Amount+js.Items[1].Amount)

	// An unsigned token: refused under a key, as a Limiter with it
	// refuses it.
	plain := must(ratelimit.New(must(memstore.New()), signupLimits))
	unsigned := receipt(t, plain, "llm", "user-42", 2)
	code, out, errOut = exec("token", "inspect", unsigned)
	require.Equal(t, 1, code)
	require.Contains(t, out, "signed       no: a Limiter with a token key refuses it (unless WithUnsignedTokensAccepted: --unsigned-tokens-accepted)\n")
	require.Contains(t, errOut, "carries no tag")
	os.Unsetenv(tokenKeyEnv)
	code, out, errOut = exec("token", "inspect", unsigned)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "signed       no\n")
	utok := must(ratelimit.ParseToken(unsigned))
	require.Contains(t, out, "charged at   "+timeText(utok.ChargedAt())+"\njob runs at  "+timeText(utok.ChargedAt())+"\n", "a plain charge's job may run at once")

	// Expired, on this machine's clock.
	code, out, errOut = exec("token", "inspect", expiredToken(t))
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "charged at   2024-01-01T00:00:00.000Z\n")
	require.Contains(t, out, ": expired (on this machine's clock)\n")
	code, out, errOut = exec("token", "inspect", "-o", "json", expiredToken(t))
	require.Equal(t, 0, code, errOut)
	decode(t, out, &js)
	require.True(t, js.Expired)

	// A hashed key: the store key is its keyed hash, and --key with the
	// secret tells whose token it is.
	const secret = "cli test secret, of 32 bytes...."
	hashed := must(ratelimit.New(must(memstore.New()), signupLimits, ratelimit.WithKeyHash([]byte(secret))))
	htext := receipt(t, hashed, "llm", "user-42", 1)
	htok := must(ratelimit.ParseToken(htext))
	code, out, errOut = exec("token", "inspect", htext)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, fmt.Sprintf("store key    %q, which has the form of a keyed hash", htok.Key()))
	code, out, errOut = exec("token", "inspect", "--key-secret", secret, "--key", "user-42", htext)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, fmt.Sprintf("store key    %q, the keyed hash of a key (--key-secret)\n", htok.Key()))
	require.Contains(t, out, "key          \"user-42\": the token's (by its keyed hash, --key-secret)\n")
	t.Setenv(keySecretEnv, secret)
	code, out, errOut = exec("token", "inspect", "--key", "user-43", "-o", "json", htext)
	require.Equal(t, 0, code, errOut)
	decode(t, out, &js)
	require.False(t, *js.KeyMatches)
	require.Equal(t, "keyed hash", js.StoreKeyForm)
	code, out, errOut = exec("token", "inspect", "--key", "user-43", htext)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "key          \"user-43\": not the token's: the store knows it as ")
	os.Unsetenv(keySecretEnv)

	// A long key: its digest form.
	long := receipt(t, plain, "llm", strings.Repeat("k", 300), 1)
	code, out, errOut = exec("token", "inspect", "--key", strings.Repeat("k", 300), long)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "the digest form of a key longer than 256 bytes, or of one spelt as a digest form\n")
	require.Contains(t, out, "the token's (by its digest form)\n")

	// A token taken after its job was let run carries its use.
	r, err = plain.Reserve(ctx, "llm", "user-42", ratelimit.Count(1))
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	code, out, errOut = exec("token", "inspect", r.Token().String())
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "carries use  yes: taken after its job was let run; settling it does nothing\n")
}

// token inspect - reads tokens from standard input, one per line: each
// token is reported in turn, one that does not read on standard error with
// its line, and the command ends with a summary and the worst status.
func TestTokenInspectStdin(t *testing.T) {
	unsetenv(t, tokenKeyEnv)
	plain := must(ratelimit.New(must(memstore.New()), signupLimits))
	a, b := receipt(t, plain, "llm", "a", 1), receipt(t, plain, "llm", "b", 2)
	stdin := a + "\n\n  " + b + "  \nnot-a-token\n"
	code, out, errOut := execIn(stdin, "token", "inspect", "-")
	require.Equal(t, 1, code)
	require.Equal(t, 2, strings.Count(out, "token "), out)
	require.Contains(t, out, "\n\ntoken ", "a blank line between reports")
	require.Contains(t, out, `store key    "a"`)
	require.Contains(t, out, `store key    "b"`)
	require.Equal(t, "ratelimit: line 4: not a token of this library: its first byte, a token's version, is 158, which no release writes (this one writes 1): give the whole text of a token, as Token.String writes it: invalid token\nratelimit: 3 tokens: 2 read, 1 invalid\n", errOut)

	code, out, errOut = execIn(a+"\n"+b+"\n", "token", "inspect", "-", "-o", "json")
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)
	dec := jsonStream(t, out)
	require.Len(t, dec, 2)
	require.Equal(t, "a", dec[0].StoreKey)
	require.Equal(t, "b", dec[1].StoreKey)

	// Several arguments too; an invalid one in JSON is a report of its
	// own.
	code, out, errOut = exec("token", "inspect", "-o", "json", a, "AQ")
	require.Equal(t, 1, code)
	require.Equal(t, "ratelimit: token 2: not a token of this library: it holds 1 byte, fewer than any token's 33: give the whole text of a token, as Token.String writes it: invalid token\nratelimit: 2 tokens: 1 read, 1 invalid\n", errOut)
	dec = jsonStream(t, out)
	require.Len(t, dec, 2)
	require.Equal(t, outInvalid, dec[1].Outcome)
	require.Equal(t, "ratelimit: not a token of this library: it holds 1 byte, fewer than any token's 33: give the whole text of a token, as Token.String writes it: invalid token", dec[1].Error)
	require.Empty(t, dec[1].ID)
	require.Nil(t, dec[1].ExpiresAt)
	require.NotNil(t, dec[1].Items)

	code, _, errOut = execIn("\n \n", "token", "inspect", "-")
	require.Equal(t, 1, code)
	require.Equal(t, "ratelimit: no token on standard input: give one token per line\n", errOut)
	code, _, errOut = execIn(strings.Repeat("A", maxTokenLine+1), "token", "inspect", "-")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "ratelimit: line 1: longer than 131072 bytes")
}

// jsonStream decodes a stream of token inspect's JSON reports.
func jsonStream(t *testing.T, out string) []inspectJSON { return reports[inspectJSON](t, out) }

// reports decodes a stream of the token commands' JSON reports, each R.
func reports[R any](t *testing.T, out string) []R {
	t.Helper()
	var rs []R
	for _, part := range strings.SplitAfter(out, "\n}\n") {
		if part == "" {
			continue
		}
		var r R
		decode(t, part, &r)
		rs = append(rs, r)
	}
	return rs
}

// The token commands' usage errors: status 2, and where to read the
// usage.
func TestTokenUsageErrors(t *testing.T) {
	dir := t.TempDir()
	short := writeFile(t, dir, "short.key", "fifteen bytes!!\n")
	a := writeFile(t, dir, "a.key", tokenKeyA)
	a2 := writeFile(t, dir, "a2.key", tokenKeyA+"\r\n")
	zero := writeFile(t, dir, "zero.key", strings.Repeat("\x00", 32))
	padded := writeFile(t, dir, "padded.key", tokenKeyA+"\x00")
	// A file given by mistake is refused, not read whole.
	huge := writeFile(t, dir, "huge.key", strings.Repeat("k", maxTokenKeyFile+1))
	limits := writeFile(t, dir, "limits.yaml", signupLimitsYAML)
	unsetenv(t, tokenKeyEnv)
	store := []string{"--store", "mem:", "--limits", limits}
	for _, tc := range []struct {
		args []string
		env  *string
		want string
	}{
		{[]string{"token", "inspect"}, nil, "give a token (its text form, as Token.String writes it), or - to read tokens from standard input, one per line"},
		{[]string{"token", "inspect", "-", "AQ"}, nil, "- reads the tokens from standard input: give it alone, not beside tokens"},
		{[]string{"token", "inspect", "--token-key-file", short, "AQ"}, nil, "the token key of " + short + " has 15 bytes, fewer than 16"},
		{[]string{"token", "inspect", "--token-key-file", a, "--token-key-file", a2, "AQ"}, nil, "the token key of " + a2 + " is the same as that of " + a},
		{[]string{"token", "inspect", "--token-key-file", zero, "AQ"}, nil, "the token keys (" + zero + "): WithTokenKey: the key is 32 zero bytes"},
		{[]string{"token", "inspect", "--token-key-file", a, "--token-key-file", padded, "AQ"}, nil, "the token keys (" + a + ", " + padded + "): WithTokenKey: accepted key 1 is the same as the signing key"},
		{[]string{"token", "inspect", "--token-key-file", "", "AQ"}, nil, `invalid argument "" for "--token-key-file" flag: give a file's path`},
		{[]string{"token", "inspect", "--token-key-file", huge, "AQ"}, nil, "--token-key-file " + huge + ": larger than 64 KiB: is it the token key? give the file that holds the key alone"},
		{[]string{"token", "inspect", "AQ"}, ptr(""), "$RATELIMIT_TOKEN_KEY is set and empty"},
		{[]string{"token", "inspect", "AQ"}, ptr("short"), "the token key of $RATELIMIT_TOKEN_KEY has 5 bytes"},
		{[]string{"token", "inspect", "--key-secret", "short", "AQ"}, nil, "the key secret (--key-secret, or $RATELIMIT_KEY_SECRET) has 5 bytes"},
		{[]string{"token", "refund", "--store", "mem:"}, nil, "give a token"},
		{append([]string{"token", "refund", "AQ"}, store...), ptr(""), "$RATELIMIT_TOKEN_KEY is set and empty"},
		// Not "--limits FILE --name NAME", which the line below refuses.
		{[]string{"token", "refund", "--store", "mem:", "AQ"}, nil, "give the application's limits: --limits FILE, every limit of which is declared, or one limit inline, named as the token names it: --kind, --rate, --period and --name"},
		{append([]string{"token", "refund", "--name", "signup", "AQ"}, store...), nil, "--name with --limits: a token names the limits it charged"},
		{append([]string{"token", "refund", "--rate", "3", "AQ"}, store...), nil, "not both: --rate with --limits"},
		{append([]string{"token", "use", "--settler", "abc", "AQ"}, store...), nil, `invalid argument "abc" for "--settler" flag: write 16 bytes as 32 hex digits, or a UUID`},
		{append([]string{"token", "use", "--settler", strings.Repeat("0", 32), "AQ"}, store...), nil, "an all-zero ID names no settler"},
		{append([]string{"token", "use", "--timeout", "0s", "AQ"}, store...), nil, "--timeout 0s: give a time above 0"},
		{append([]string{"token", "settle", "AQ"}, store...), nil, "give --used N: the tokens the job used of each limit the token charged (0 hands them all back, as token refund does)"},
		{append([]string{"token", "settle", "--used", "-1", "AQ"}, store...), nil, "--used -1: give the tokens used, a finite number ≥ 0"},
		{append([]string{"token", "settle", "--used", "NaN", "AQ"}, store...), nil, "--used NaN: give the tokens used, a finite number ≥ 0"},
		{append([]string{"token", "settle", "--used", "1_0", "AQ"}, store...), nil, `invalid argument "1_0" for "--used" flag: write a number in decimal`},
		{append([]string{"token", "refund", "--used", "1", "AQ"}, store...), nil, "unknown flag: --used"},
		// A --store that names no store is refused before any token is
		// read: it was told only at the first token that read, after the
		// others were reported invalid (status 1 without one).
		{[]string{"token", "refund", "--limits", limits, "AQ"}, nil, "give a store: --store bolt://PATH"},
		{[]string{"token", "use", "--store", "redis:127.0.0.1:1", "--limits", limits, "AQ"}, nil, "write redis://HOST:PORT/DB"},
		{[]string{"token", "settle", "--used", "1", "--store", "reddis://127.0.0.1:1", "--limits", limits, "AQ"}, nil, `unknown kind of store "reddis"`},
		{[]string{"token", "refund", "--store", "mem:", "--server-time", "--limits", limits, "AQ"}, nil, "--server-time: the store of mem: has no clock of its own"},
		{[]string{"token", "refund", "--store", "postgres://app@127.0.0.1:x/db", "--limits", limits, "AQ"}, nil, `--store "postgres://app@127.0.0.1:x/db"`},
		{[]string{"token", "refnd"}, nil, `unknown command "refnd" for "ratelimit token": did you mean "refund"?`},
		{[]string{"token", "bogus"}, nil, `unknown command "bogus" for "ratelimit token": run 'ratelimit token --help' for its commands`},
	} {
		if tc.env != nil {
			t.Setenv(tokenKeyEnv, *tc.env)
		}
		code, out, errOut := exec(tc.args...)
		os.Unsetenv(tokenKeyEnv)
		require.Equal(t, 2, code, "%q: %s", tc.args, errOut)
		require.Empty(t, out, "%q", tc.args)
		require.Contains(t, errOut, tc.want, "%q", tc.args)
		require.Contains(t, errOut, "--help' for usage.", "%q", tc.args)
		require.Equal(t, 1, strings.Count(errOut, "ratelimit:"), "%q: %s", tc.args, errOut)
	}

	// Without a command: the help.
	code, out, errOut := exec("token")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "Available Commands:")
	// A key file that cannot be read: a failure, as a limits file's.
	code, _, errOut = exec("token", "inspect", "--token-key-file", filepath.Join(dir, "missing.key"), "AQ")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "--token-key-file: open "+filepath.Join(dir, "missing.key")+": no such file or directory")
	// A settler as a UUID is the same ID.
	var s settlerFlag
	require.NoError(t, s.Set("6f1c2d3e-4a5b-46c7-d8e9-f0a1b2c3d4e5"))
	require.Equal(t, "6f1c2d3e4a5b46c7d8e9f0a1b2c3d4e5", s.String())
}

func ptr[T any](v T) *T { return &v }

// tokenSettle checks token refund and use against a store given by URL
// (and its flags), on tokens a Limiter of the application charged there.
func tokenSettle(t *testing.T, storeArgs ...string) {
	ctx := context.Background()
	unsetenv(t, tokenKeyEnv)
	dir := t.TempDir()
	limits := writeFile(t, dir, "limits.yaml", signupLimitsYAML)
	keyA := writeFile(t, dir, "a.key", tokenKeyA)
	keyB := writeFile(t, dir, "b.key", tokenKeyB)
	key := fmt.Sprint("cli-token-", time.Now().UnixNano())

	sf := storeFlagsOf(storeArgs)
	store, closeStore, err := sf.open(ctx, mayCreate)
	require.NoError(t, err)
	lim := must(ratelimit.New(store, signupLimits, ratelimit.WithTokenKey([]byte(tokenKeyA))))
	var toks []string
	for range 5 {
		toks = append(toks, receipt(t, lim, "signup", key, 10))
	}
	r, err := lim.Reserve(ctx, "llm", key, ratelimit.Count(5), ratelimit.WithReceipt())
	require.NoError(t, err)
	reserved := r.Token()
	st, err := lim.Value(ctx, "signup", key)
	require.NoError(t, err)
	require.Equal(t, 50.0, st.Remaining)
	closeStore()
	value := func() float64 { return signupTokens(t, limits, key, storeArgs) }
	settle := func(action, tok string, extra ...string) (int, string, string) {
		return execIn(tok, append(append([]string{"token", action, "--limits", limits, tok}, storeArgs...), extra...)...)
	}
	id := func(tok string) string { return tokenID(must(ratelimit.ParseToken(tok))) }

	// Refund: the tokens come back, once.
	code, out, errOut := settle("refund", toks[0], "--token-key-file", keyA)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, fmt.Sprintf("refunded token %s: signup 10 for store key %q\n", id(toks[0]), key), out)
	require.Equal(t, 60.0, value())
	code, out, errOut = settle("refund", toks[0], "--token-key-file", keyA)
	require.Equal(t, exitSettled, code, errOut)
	require.Empty(t, out)
	require.Equal(t, fmt.Sprintf("ratelimit: token %s was already settled (canceled): nothing done\n", id(toks[0])[:8]), errOut)
	code, _, errOut = settle("use", toks[0])
	require.Equal(t, exitSettled, code, errOut)
	require.Contains(t, errOut, "already settled (canceled)")
	require.Equal(t, 60.0, value())

	// Use: the job may run, its tokens spent; a refund after does nothing.
	code, out, errOut = settle("use", reserved.String())
	require.Equal(t, 0, code, errOut)
	require.Equal(t, fmt.Sprintf("used token %s: llm 5 for store key %q; its job may run at %s\n", tokenID(reserved), key, timeText(reserved.RunAt())), out)
	code, out, errOut = settle("refund", reserved.String(), "-o", "json")
	require.Equal(t, exitSettled, code, errOut)
	var js settleJSON
	m := decode(t, out, &js)
	require.Equal(t, []string{"action", "error", "expires_at", "id", "items", "outcome", "run_at", "settled_as", "store_key", "store_key_base64", "token", "used"}, keysOf(m))
	require.Equal(t, settleJSON{Token: reserved.String(), Action: "refund", Outcome: outAlreadySettled, SettledAs: ptr("used"),
		Error: fmt.Sprintf("ratelimit: token %s was already settled (used): nothing done", tokenID(reserved)[:8]), ID: tokenID(reserved),
		StoreKey: key, StoreKeyBase64: keyBase64(key), RunAt: timeJSON(reserved.RunAt()), ExpiresAt: timeJSON(reserved.Expires()),
		Items: []itemJSON{{Limit: "llm", LimitBase64: "bGxt", Shard: 0, Amount: 5}}}, js)

	// Signed: under another key, invalid, and nothing settled; under the
	// right one among a rotation's, settled.
	code, out, errOut = settle("refund", toks[1], "--token-key-file", keyB)
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Equal(t, fmt.Sprintf("ratelimit: token %s: its tag is not valid under the key given: it was forged or altered, or signed with another key: invalid token\n", id(toks[1])[:8]), errOut)
	require.Equal(t, 60.0, value())
	code, out, errOut = settle("refund", toks[1], "--token-key-file", keyB, "--token-key-file", keyA, "-o", "json")
	require.Equal(t, 0, code, errOut)
	decode(t, out, &js)
	require.Equal(t, outSettled, js.Outcome)
	require.Nil(t, js.SettledAs)
	require.Empty(t, js.Error)
	require.Equal(t, 70.0, value())

	// A settler: its retry finds its own settlement, another's does not.
	const settler = "6f1c2d3e4a5b46c7d8e9f0a1b2c3d4e5"
	code, _, errOut = settle("use", toks[2], "--settler", settler)
	require.Equal(t, 0, code, errOut)
	code, out, errOut = settle("use", toks[2], "--settler", settler)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "used token "+id(toks[2]))
	code, _, errOut = settle("use", toks[2], "--settler", "6f1c2d3e4a5b46c7d8e9f0a1b2c3d4e6")
	require.Equal(t, exitSettled, code, errOut)

	// Expired: nothing done, status 4.
	code, out, errOut = settle("refund", expiredToken(t))
	require.Equal(t, exitExpired, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, ": it expired at 2024-01-")
	require.Contains(t, errOut, ": token expired\n")
	// Settled in part, it says as much: nothing handed back, and no
	// refund, which it said was asked.
	expired := expiredToken(t)
	code, out, errOut = settle("settle", expired, "--used", "0.5")
	require.Equal(t, exitExpired, code, errOut)
	require.Empty(t, out)
	// The expiry is RFC 3339, as the command writes times, not %v's
	// "2024-01-01 00:00:02 +0000 UTC".
	require.Equal(t, fmt.Sprintf("ratelimit: settle token %s: it expired at %s; nothing was handed back (past its expiry a token hands nothing back), and nothing is left to do: token expired\n", id(expired)[:8], must(ratelimit.ParseToken(expired)).Expires().UTC().Format(time.RFC3339Nano)), errOut)
	require.Regexp(t, `: it expired at 2024-01-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z; `, errOut)

	// A limit the command was not given: nothing settled, and what to
	// give.
	code, _, errOut = execIn("", append([]string{"token", "refund", "--kind", "fixed window", "--rate", "100", "--period", "1h", toks[3]}, storeArgs...)...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `the token charges limit "signup", and the inline limit is named "limit": give the limit inline with --name "signup" and its --kind, --rate, --period, or --limits with the application's limits file; nothing was settled: unknown limit`)
	llmOnly := writeFile(t, dir, "llm.yaml", "llm:\n  kind: token bucket\n  rate: 10\n  period: 1m\n")
	code, _, errOut = execIn("", append([]string{"token", "refund", "--limits", llmOnly, toks[3]}, storeArgs...)...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `the token charges limit "signup", which `+llmOnly+` does not declare: give --limits the application's limits file`)
	code, _, errOut = execIn("", append([]string{"token", "refund", "--kind", "fixed window", "--rate", "100", "--period", "1h", "--name", "signup", toks[3]}, storeArgs...)...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `the token charges shard 1 of limit "signup", which is declared here with --shards 1: give --shards as the application declares the limit, at least 2 to settle this token (its shards may have been lowered since the charge); nothing was settled: unknown limit`)
	// A limits file's limit, in the file's words.
	unsharded := writeFile(t, dir, "unsharded.yaml", "signup:\n  kind: fixed window\n  rate: 100\n  period: 1h\n")
	code, _, errOut = execIn("", append([]string{"token", "refund", "--limits", unsharded, toks[3]}, storeArgs...)...)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `the token charges shard 1 of limit "signup", which `+unsharded+` declares with shards 1: give --limits the application's limits file, with the limit's shards at least 2 to settle this token (its shards may have been lowered since the charge); nothing was settled: unknown limit`)
	require.Equal(t, 70.0, value())
	code, out, errOut = execIn("", append([]string{"token", "refund", "--kind", "fixed window", "--rate", "100", "--period", "1h", "--name", "signup", "--shards", "2", toks[3]}, storeArgs...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "refunded token "+id(toks[3]))
	require.Equal(t, 80.0, value())

	// Many, from standard input: each reported, the worst status, and a
	// summary.
	stdin := strings.Join([]string{toks[4], toks[0], "", expiredToken(t), toks[4]}, "\n")
	code, out, errOut = execIn(stdin, append([]string{"token", "refund", "--limits", limits, "-"}, storeArgs...)...)
	require.Equal(t, exitExpired, code, errOut)
	require.Equal(t, fmt.Sprintf("refunded token %s: signup 10 for store key %q\n", id(toks[4]), key), out)
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	require.Len(t, lines, 4, errOut)
	require.Equal(t, fmt.Sprintf("ratelimit: line 2: token %s was already settled (canceled): nothing done", id(toks[0])[:8]), lines[0])
	require.True(t, strings.HasPrefix(lines[1], "ratelimit: line 4: settle token "), lines[1])
	require.Equal(t, fmt.Sprintf("ratelimit: line 5: token %s was already settled (canceled): nothing done", id(toks[4])[:8]), lines[2])
	require.Equal(t, "ratelimit: 4 tokens: 1 settled, 2 already settled, 1 expired", lines[3])
	require.Equal(t, 90.0, value())
	code, _, errOut = execIn(toks[0]+"\nAQ\n", append([]string{"token", "use", "--limits", limits, "-"}, storeArgs...)...)
	require.Equal(t, 1, code, "an invalid token is worse than one settled before")
	require.Contains(t, errOut, "ratelimit: 2 tokens: 1 already settled, 1 invalid\n")

	tokenSettleUsed(t, limits, keyA, storeArgs)
}

// tokenSettleUsed checks token settle --used against the store of
// storeArgs: a charge settled by its outcome, the tokens used spent and
// the rest handed back, once. The application's tokens are signed with
// the key of keyFile.
func tokenSettleUsed(t *testing.T, limits, keyFile string, storeArgs []string) {
	key := fmt.Sprint("cli-settle-", time.Now().UnixNano())
	sf := storeFlagsOf(storeArgs)
	store, closeStore, err := sf.open(context.Background(), mayCreate)
	require.NoError(t, err)
	app := must(ratelimit.New(store, signupLimits, ratelimit.WithTokenKey([]byte(tokenKeyA))))
	var toks []string
	for range 4 {
		toks = append(toks, receipt(t, app, "signup", key, 10))
	}
	closeStore()
	value := func() float64 { return signupTokens(t, limits, key, storeArgs) }
	settle := func(tok string, extra ...string) (int, string, string) {
		return execIn("", append(append([]string{"token", "settle", "--limits", limits, "--token-key-file", keyFile, tok}, storeArgs...), extra...)...)
	}
	id := func(tok string) string { return tokenID(must(ratelimit.ParseToken(tok))) }
	require.InDelta(t, 60.0, value(), 1e-9)

	// 4 of the 10 used: 6 handed back, once.
	code, out, errOut := settle(toks[0], "--used", "4")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, fmt.Sprintf("settled token %s: signup 10 for store key %q; used 4 of each limit's charge, the rest handed back\n", id(toks[0]), key), out)
	require.InDelta(t, 66.0, value(), 1e-9)
	code, out, errOut = settle(toks[0], "--used", "4")
	require.Equal(t, exitSettled, code, errOut)
	require.Empty(t, out)
	require.Equal(t, fmt.Sprintf("ratelimit: token %s was already settled (used): nothing done\n", id(toks[0])[:8]), errOut)
	code, _, errOut = execIn("", append([]string{"token", "refund", "--limits", limits, toks[0]}, storeArgs...)...)
	require.Equal(t, exitSettled, code, errOut)
	require.InDelta(t, 66.0, value(), 1e-9)

	// 0 used is a refund; all used, or more, is a use.
	code, out, errOut = settle(toks[1], "--used", "0", "-o", "json")
	require.Equal(t, 0, code, errOut)
	var js settleJSON
	m := decode(t, out, &js)
	require.Equal(t, []string{"action", "error", "expires_at", "id", "items", "outcome", "run_at", "settled_as", "store_key", "store_key_base64", "token", "used"}, keysOf(m))
	require.Equal(t, "settle", js.Action)
	require.Equal(t, outSettled, js.Outcome)
	require.Equal(t, 0.0, *js.Used)
	require.InDelta(t, 76.0, value(), 1e-9)
	code, _, errOut = settle(toks[1], "--used", "0")
	require.Equal(t, exitSettled, code, errOut)
	require.Contains(t, errOut, "already settled (canceled)")

	// A settler's retry finds its own settlement only with the same
	// outcome: 10 and 15 used hand back as much (nothing), 4 does not.
	const settler = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
	code, _, errOut = settle(toks[2], "--used", "15", "--settler", settler)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = settle(toks[2], "--used", "10", "--settler", settler)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = settle(toks[2], "--used", "4", "--settler", settler)
	require.Equal(t, exitSettled, code, errOut)
	require.InDelta(t, 76.0, value(), 1e-9)

	// From standard input, as refund and use read them.
	code, out, errOut = execIn(toks[3]+"\r\n"+toks[0]+"\r\n", append([]string{"token", "settle", "--limits", limits, "--used", "2.5", "-"}, storeArgs...)...)
	require.Equal(t, exitSettled, code, errOut)
	require.Equal(t, fmt.Sprintf("settled token %s: signup 10 for store key %q; used 2.5 of each limit's charge, the rest handed back\n", id(toks[3]), key), out)
	require.Contains(t, errOut, "ratelimit: 2 tokens: 1 settled, 1 already settled\n")
	require.InDelta(t, 83.5, value(), 1e-9)
}

func TestTokenSettleBolt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	tokenSettle(t, "--store", "bolt://"+path)

	// A store that is not there is not created, and nothing is settled.
	limits := writeFile(t, t.TempDir(), "limits.yaml", signupLimitsYAML)
	other := filepath.Join(t.TempDir(), "typo.db")
	code, _, errOut := exec("token", "refund", "--store", "bolt://"+other, "--limits", limits, expiredToken(t))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "does not exist: check the path in --store")
	_, err := os.Stat(other)
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestTokenSettleRedis(t *testing.T) {
	url, prefix, _ := testRedis(t)
	tokenSettle(t, "--store", url, "--prefix", prefix)
}

func TestTokenSettlePostgres(t *testing.T) {
	url, table := postgresTable(t, "ratelimit_cli_token_")
	tokenSettle(t, "--store", url, "--table", table)
}

// On the in-memory store, within one run: a token given twice is settled
// once, the second time already settled (status 3); a token that carries
// its use is settled before any store is asked; JSON reports each.
func TestTokenSettleMemory(t *testing.T) {
	ctx := context.Background()
	unsetenv(t, tokenKeyEnv)
	limits := writeFile(t, t.TempDir(), "limits.yaml", signupLimitsYAML)
	app := must(ratelimit.New(must(memstore.New()), signupLimits))
	tok := receipt(t, app, "llm", "user-42", 3)
	code, out, errOut := execIn(tok+"\n"+tok+"\n", "token", "refund", "--store", "mem:", "--limits", limits, "-o", "json", "-")
	require.Equal(t, exitSettled, code, errOut)
	rs := reports[settleJSON](t, out)
	require.Len(t, rs, 2)
	require.Equal(t, outSettled, rs[0].Outcome)
	require.Equal(t, outAlreadySettled, rs[1].Outcome)
	require.Equal(t, "canceled", *rs[1].SettledAs)
	require.Equal(t, rs[0].ID, rs[1].ID)
	require.Contains(t, errOut, "ratelimit: 2 tokens: 1 settled, 1 already settled\n")

	r, err := app.Reserve(ctx, "llm", "user-42", ratelimit.Count(1))
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	code, out, errOut = exec("token", "refund", "--store", "mem:", "--limits", limits, r.Token().String())
	require.Equal(t, exitSettled, code, errOut)
	require.Empty(t, out)
	require.Equal(t, fmt.Sprintf("ratelimit: the token carries its use, taken after its job was let run: token %s was already settled (used): nothing done\n", tokenID(r.Token())[:8]), errOut)

	// An unsigned token under a token key: refused, as the application's
	// Limiters with the key refuse it, and how to settle it unchecked.
	t.Setenv(tokenKeyEnv, tokenKeyA)
	code, _, errOut = exec("token", "use", "--store", "mem:", "--limits", limits, tok)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "ratelimit: to settle it unchecked, if the application takes unsigned tokens, give --unsigned-tokens-accepted: token ")
	require.Contains(t, errOut, " carries no tag")
	os.Unsetenv(tokenKeyEnv)

	// The inline limit, named as the token names it.
	code, out, errOut = exec("token", "use", "--store", "mem:", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--name", "llm", tok)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "used token ")

	// A store that cannot be reached: a failure, with the hint.
	code, _, errOut = exec("token", "use", "--store", "redis://127.0.0.1:1/0", "--limits", limits, tok)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "connection refused (is the server up? check --store)")
	// An invalid token asks no store.
	code, _, errOut = exec("token", "use", "--store", "redis://127.0.0.1:1/0", "--limits", limits, "AQ")
	require.Equal(t, 1, code)
	require.Equal(t, "ratelimit: not a token of this library: it holds 1 byte, fewer than any token's 33: give the whole text of a token, as Token.String writes it: invalid token\n", errOut)
}

// A command given many tokens that stops when the store fails says where,
// and what to do with the tokens after.
func TestTokenBatchStops(t *testing.T) {
	var errOut bytes.Buffer
	b := newBatch([]string{"-"}, &errOut)
	b.add(givenToken{where: "line 1"}, outSettled, 0, nil)
	b.add(givenToken{where: "line 2"}, outFailed, exitFailure, errors.New("store: connection reset"))
	b.stop = "line 2"
	err := b.end(errStop)
	require.Equal(t, "ratelimit: line 2: store: connection reset\n", errOut.String())
	require.EqualError(t, err, "2 tokens: 1 settled, 1 failed; stopped at line 2, where the store failed: the tokens after it were not read: run the command again with them, once the store answers (a token settled since says already settled)")

	one := newBatch([]string{"AQ"}, &errOut)
	failed := errors.New("store: connection reset")
	one.add(givenToken{where: "token 1"}, outFailed, exitFailure, failed)
	require.Equal(t, failed, one.end(errStop))
}

// unsetenv unsets the environment variable name for the test, and
// restores it after.
func unsetenv(t *testing.T, name string) {
	t.Setenv(name, "")
	os.Unsetenv(name)
}

// A Redis store of an application given WithPrefix("") keeps its records
// at the database's top level: --prefix "" names it, and its tokens
// settle as any others. The test's keys are its own, and deleted after.
func TestTokenSettleRedisEmptyPrefix(t *testing.T) {
	ctx := context.Background()
	unsetenv(t, tokenKeyEnv)
	url, _, c := testRedis(t)
	key := fmt.Sprint("cli-empty-prefix-", time.Now().UnixNano())
	store := must(redisstore.New(c, redisstore.WithPrefix(""), redisstore.WithLogger(nil)))
	lim := must(ratelimit.New(store, signupLimits))
	tok := receipt(t, lim, "llm", key, 3)
	id := must(ratelimit.ParseToken(tok)).ID()
	t.Cleanup(func() {
		keys, err := c.Keys(ctx, "*"+globEscape(key)).Result()
		require.NoError(t, err)
		keys = append(keys, markKeyOf(store, key, id))
		require.NoError(t, c.Del(ctx, keys...).Err())
	})
	limits := writeFile(t, t.TempDir(), "limits.yaml", signupLimitsYAML)
	args := []string{"--store", url, "--prefix", "", "--limits", limits, tok}
	code, out, errOut := exec(append([]string{"token", "refund"}, args...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "refunded token ")
	st, err := lim.Value(ctx, "llm", key)
	require.NoError(t, err)
	require.Equal(t, 10.0, st.Remaining)
	code, _, errOut = exec(append([]string{"token", "use"}, args...)...)
	require.Equal(t, exitSettled, code, errOut)
	require.Contains(t, errOut, "already settled (canceled)")
}

// markKeyOf returns the Redis key of the mark of the settlement of the
// token id of limit llm for key, in store: beside its record, after the
// hash tag, "s:" and the ID in hex.
func markKeyOf(store *redisstore.Store, key string, id [16]byte) string {
	rec := store.Key(driver.RecordID{Name: "llm", Key: key})
	return rec[:strings.IndexByte(rec, '}')+1] + "s:" + hex.EncodeToString(id[:])
}

// Standard input as files and pipes give it: a line too long for any
// token is reported as an invalid token, and the lines after it are read
// (a bufio.Scanner stopped at it, and the tokens after it were left
// unsettled); a byte-order mark that an editor writes at the start of a
// file is not part of the first token; CRLF line ends, blank lines and
// spaces around a token are skipped.
func TestTokenStdinLines(t *testing.T) {
	unsetenv(t, tokenKeyEnv)
	limits := writeFile(t, t.TempDir(), "limits.yaml", signupLimitsYAML)
	app := must(ratelimit.New(must(memstore.New()), signupLimits))
	a, b := receipt(t, app, "llm", "a", 1), receipt(t, app, "llm", "b", 1)
	long := strings.Repeat("A", maxTokenLine+10)
	stdin := "\ufeff" + a + "\r\n\r\n" + long + "\r\n \t" + b + " \r\n"

	code, out, errOut := execIn(stdin, "token", "refund", "--store", "mem:", "--limits", limits, "-")
	require.Equal(t, 1, code, errOut)
	require.Equal(t, fmt.Sprintf("refunded token %s: llm 1 for store key \"a\"\nrefunded token %s: llm 1 for store key \"b\"\n",
		tokenID(must(ratelimit.ParseToken(a))), tokenID(must(ratelimit.ParseToken(b)))), out)
	require.Equal(t, "ratelimit: line 3: longer than 131072 bytes, and no token is that long: give one token per line: invalid token\n"+
		"ratelimit: 3 tokens: 2 settled, 1 invalid\n", errOut)

	code, out, errOut = execIn(stdin, "token", "settle", "--used", "1", "--store", "mem:", "--limits", limits, "-o", "json", "-")
	require.Equal(t, 1, code, errOut)
	rs := reports[settleJSON](t, out)
	require.Len(t, rs, 3)
	require.Equal(t, a, rs[0].Token)
	require.Equal(t, outInvalid, rs[1].Outcome)
	require.Len(t, rs[1].Token, 64, "the start of the line, not all of it")
	require.Equal(t, outSettled, rs[2].Outcome)

	code, out, errOut = execIn(stdin, "token", "inspect", "-")
	require.Equal(t, 1, code, errOut)
	require.Equal(t, 2, strings.Count(out, "token "), out)
	require.Contains(t, errOut, "ratelimit: 3 tokens: 2 read, 1 invalid\n")

	// A lone line too long is the command's error.
	code, _, errOut = execIn(long, "token", "inspect", "-")
	require.Equal(t, 1, code)
	require.Equal(t, "ratelimit: line 1: longer than 131072 bytes, and no token is that long: give one token per line: invalid token\nratelimit: 1 token: 1 invalid\n", errOut)
}

// A store that cannot be opened stops a batch as a store that fails
// does, at the token that needed it: with JSON, that token has its
// report ("failed"), as it has when the store fails later; the command
// says where it stopped.
func TestTokenStoreOpenFails(t *testing.T) {
	unsetenv(t, tokenKeyEnv)
	limits := writeFile(t, t.TempDir(), "limits.yaml", signupLimitsYAML)
	app := must(ratelimit.New(must(memstore.New()), signupLimits))
	a, b := receipt(t, app, "llm", "a", 1), receipt(t, app, "llm", "b", 1)
	code, out, errOut := execIn("AQ\n"+a+"\n"+b+"\n", "token", "use", "--store", "redis://127.0.0.1:1/0", "--limits", limits, "-o", "json", "-")
	require.Equal(t, 1, code, errOut)
	rs := strings.SplitAfter(out, "\n}\n")
	require.Len(t, rs, 3, out)
	require.Empty(t, rs[2])
	var r settleJSON
	decode(t, rs[1], &r)
	require.Equal(t, a, r.Token)
	require.Equal(t, outFailed, r.Outcome)
	require.Contains(t, r.Error, "connection refused")
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	require.Len(t, lines, 3, errOut)
	require.Contains(t, lines[1], "ratelimit: line 2: redis at 127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused (is the server up? check --store)")
	require.True(t, strings.HasPrefix(lines[2], "ratelimit: 2 tokens: 1 invalid, 1 failed; stopped at line 2, where the store failed: the tokens after it were not read"), lines[2])
}

// readLine tells a line too long from one of maxTokenLine bytes and its
// line break, at the end of the input or not.
func TestReadLine(t *testing.T) {
	fit, over := strings.Repeat("A", maxTokenLine), strings.Repeat("A", maxTokenLine+1)
	for _, tc := range []struct {
		in   string
		long []bool
	}{
		{fit + "\r\n" + fit + "\n" + fit, []bool{false, false, false}},
		{over + "\n" + fit + "\r\n", []bool{true, false}},
		{fit + "\n" + over, []bool{false, true}},
		{fit + "\r\r\n", []bool{true}},
		{strings.Repeat("A", 3*maxTokenLine) + "\nAQ", []bool{true, false}},
	} {
		rd := bufio.NewReaderSize(strings.NewReader(tc.in), 16)
		var got []bool
		for {
			line, long, err := readLine(rd)
			if len(line) > 0 {
				got = append(got, long)
				require.LessOrEqual(t, len(line), maxTokenLine+2)
			}
			if err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
		}
		require.Equal(t, tc.long, got)
	}
}

// signupTokens returns the tokens that ratelimit inspect says the limit
// "signup" of limits holds for key, on the store of storeArgs.
func signupTokens(t *testing.T, limits, key string, storeArgs []string) float64 {
	t.Helper()
	code, out, errOut := exec(append([]string{"inspect", "-o", "json", "--limits", limits, "--name", "signup", "--key", key}, storeArgs...)...)
	require.Equal(t, 0, code, errOut)
	var s statusJSON
	decode(t, out, &s)
	return s.Tokens
}

// The paths the reports on standard output quote, the chart's and the
// token key file's, are written with their control characters escaped,
// as an error's line writes them: a newline in a path wrote a line of
// its own, a forged line of the report, and an escape sequence reached
// the terminal.
func TestReportPathsEscaped(t *testing.T) {
	unsetenv(t, tokenKeyEnv)
	dir := t.TempDir()
	svg := filepath.Join(dir, "a\nchart: forged.svg\x1b[31m")
	code, out, errOut := exec("simulate", "--kind", "token bucket", "--rate", "10", "--period", "1m", "--at", "0s=1", "--svg", svg)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "\nchart: "+dir+`/a\nchart: forged.svg\x1b[31m`+"\n")
	require.NotContains(t, out, "\x1b")
	require.FileExists(t, svg)

	keyFile := writeFile(t, dir, "a\nsigned       no\x1b]0;title\a.key", tokenKeyA)
	signed := receipt(t, must(ratelimit.New(must(memstore.New()), signupLimits, ratelimit.WithTokenKey([]byte(tokenKeyA)))), "llm", "user-42", 1)
	code, out, errOut = exec("token", "inspect", "--token-key-file", keyFile, signed)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "signed       yes, and the tag is valid under the token key of "+dir+`/a\nsigned       no\x1b]0;title\a.key`+"\n")
	require.NotContains(t, out, "\x1b")
	require.NotContains(t, out, "\nsigned       no")
}
