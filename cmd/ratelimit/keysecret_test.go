package main

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// With the application's secret, by --key-secret or RATELIMIT_KEY_SECRET,
// inspect and reset find the records of a clear key that the application
// hashes; without it they see another record. A short secret is refused.
func TestKeySecret(t *testing.T) {
	clk := clock.NewMock() // the time of every call and command: the answers stay put however long the test takes
	clk.Set(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	ctx := context.Background()
	const secret = "cli test secret, of 32 bytes...."
	path := filepath.Join(t.TempDir(), "limits.db")
	store, err := boltstore.Open(path)
	require.NoError(t, err)
	lim, err := ratelimit.New(store, ratelimit.Limits{"cli": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Hour}},
		ratelimit.WithKeyHash([]byte(secret)), ratelimit.WithClock(clk))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "cli", "user-42", ratelimit.Count(7))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, store.Close())

	args := func(cmd string, extra ...string) []string {
		return append([]string{cmd, "--store", "bolt://" + path, "--kind", "token bucket", "--rate", "10", "--period", "1h",
			"--name", "cli", "--key", "user-42"}, extra...)
	}
	code, out, errOut := execAt(clk, args("inspect")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 10 of capacity 10", "without the secret: another record")

	code, out, errOut = execAt(clk, args("inspect", "--key-secret", secret)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 3 of capacity 10")
	require.Contains(t, out, `key "user-42"`)

	t.Setenv(keySecretEnv, secret)
	code, out, errOut = execAt(clk, args("inspect")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 3 of capacity 10")
	code, _, errOut = execAt(clk, args("reset")...)
	require.Equal(t, 0, code, errOut)
	code, out, errOut = execAt(clk, args("inspect")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 10 of capacity 10")
	require.Contains(t, out, "false", "reset dropped the record")

	code, _, errOut = execAt(clk, args("inspect", "--key-secret", "short")...)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "at least 16 random bytes")
}

// A --key-secret that WithKeyHash refuses is a usage error before the
// store is opened: behind a store that could not be reached, it was told
// as that failure (status 1), and a bbolt file was opened first.
func TestKeySecretRefusedFirst(t *testing.T) {
	unsetenv(t, keySecretEnv)
	for _, secret := range []string{"short", strings.Repeat("\x00", 32)} {
		for _, cmd := range []string{"inspect", "limit", "reset", "bench"} {
			args := append([]string{cmd, "--store", "redis://127.0.0.1:1/0", "--key-secret", secret}, tokenBucket...)
			code, _, errOut := exec(args...)
			require.Equal(t, 2, code, "%q: %s", args, errOut)
			require.Contains(t, errOut, "WithKeyHash: the secret", "%q", args)
			require.NotContains(t, errOut, "connection refused", "%q", args)
		}
	}
}

// An empty secret, --key-secret "" or $RATELIMIT_KEY_SECRET set and
// empty, is a usage error, before the store is opened, as WithKeyHash
// refuses it and as $RATELIMIT_TOKEN_KEY set and empty is: either meant
// no secret (--key-secret "" the environment's), and keys were read in the
// clear.
func TestKeySecretEmpty(t *testing.T) {
	const (
		flag = `ratelimit: --key-secret "": the secret is empty, and ratelimit.WithKeyHash refuses a secret of fewer than 16 bytes: ` +
			"give the application's secret, or leave --key-secret out where the application does not hash keys (with $RATELIMIT_KEY_SECRET unset)\n"
		env = "ratelimit: $RATELIMIT_KEY_SECRET is set and empty, and ratelimit.WithKeyHash refuses a secret of fewer than 16 bytes: " +
			"give it the application's secret, or unset it where the application does not hash keys\n"
	)
	const secret = "cli test secret, of 32 bytes...."
	for _, tc := range []struct {
		env   *string
		flags []string
		want  string
	}{
		{nil, []string{"--key-secret", ""}, flag},
		{ptr(secret), []string{"--key-secret", ""}, flag},
		{ptr(""), []string{"--key-secret", ""}, flag},
		{ptr(""), nil, env},
	} {
		if tc.env == nil {
			unsetenv(t, keySecretEnv)
		} else {
			t.Setenv(keySecretEnv, *tc.env)
		}
		for _, cmd := range []string{"inspect", "limit", "reset", "bench"} {
			args := append(append([]string{cmd, "--store", "redis://127.0.0.1:1/0"}, tc.flags...), tokenBucket...)
			code, out, errOut := exec(args...)
			require.Equal(t, 2, code, "%q: %s%s", args, out, errOut)
			require.True(t, strings.HasPrefix(errOut, tc.want), "%q: %s", args, errOut)
		}
		args := append(append([]string{"token", "inspect", "--key", "user-42"}, tc.flags...), "x")
		code, out, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s%s", args, out, errOut)
		require.True(t, strings.HasPrefix(errOut, tc.want), "%q: %s", args, errOut)
	}
	// The commands that take no secret do not read it.
	t.Setenv(keySecretEnv, "")
	code, _, errOut := exec(append([]string{"simulate", "--at", "0s=1"}, tokenBucket...)...)
	require.Equal(t, 0, code, errOut)
	code, _, errOut = exec(append([]string{"token", "refund", "--store", "mem:", "x"}, tokenBucket...)...)
	require.NotContains(t, errOut, keySecretEnv)
	require.NotEqual(t, 2, code, errOut)
}

// inspect and reset find the record of a key longer than 256 bytes, which
// the application's store knows by its digest form, by the key as given.
func TestLongKey(t *testing.T) {
	clk := clock.NewMock() // the time of every call and command: the answers stay put however long the test takes
	clk.Set(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	ctx := context.Background()
	key := strings.Repeat("k", 4096)
	path := filepath.Join(t.TempDir(), "limits.db")
	store, err := boltstore.Open(path)
	require.NoError(t, err)
	lim, err := ratelimit.New(store, ratelimit.Limits{"cli": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Hour}}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "cli", key, ratelimit.Count(7))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, store.Close())

	args := func(cmd, key string) []string {
		return []string{cmd, "--store", "bolt://" + path, "--kind", "token bucket", "--rate", "10", "--period", "1h", "--name", "cli", "--key", key}
	}
	code, out, errOut := execAt(clk, args("inspect", key)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 3 of capacity 10")
	code, out, errOut = execAt(clk, args("inspect", key[1:]+"j")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 10 of capacity 10", "another long key")
	code, _, errOut = execAt(clk, args("reset", key)...)
	require.Equal(t, 0, code, errOut)
	code, out, errOut = execAt(clk, args("inspect", key)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 10 of capacity 10")
	require.Contains(t, out, "false", "reset dropped the record")
}

// inspect shows the key as the store knows it, when the store is not
// given the key itself: the digest of a key longer than 256 bytes, or the
// keyed hash of --key-secret. It showed the key alone, so that what to
// look for in redis-cli, psql or a bbolt file was nowhere.
func TestInspectStoreKey(t *testing.T) {
	clk := clock.NewMock() // the time of every call and command: the answers stay put however long the test takes
	clk.Set(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	ctx := context.Background()
	const secret = "cli test secret, of 32 bytes...."
	long := strings.Repeat("k", 4096)
	alike := "sha256:" + strings.Repeat("A", 43) // spelt as a digest form
	path := filepath.Join(t.TempDir(), "limits.db")
	store, err := boltstore.Open(path)
	require.NoError(t, err)
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Hour}
	plain, err := ratelimit.New(store, ratelimit.Limits{"long": cfg, "short": cfg, "alike": cfg}, ratelimit.WithClock(clk))
	require.NoError(t, err)
	hashed, err := ratelimit.New(store, ratelimit.Limits{"hashed": cfg}, ratelimit.WithKeyHash([]byte(secret)), ratelimit.WithClock(clk))
	require.NoError(t, err)
	for _, call := range []struct {
		lim       *ratelimit.Limiter
		name, key string
	}{{plain, "long", long}, {plain, "short", "user-42"}, {hashed, "hashed", "user-42"}, {plain, "alike", alike}} {
		_, err := call.lim.Limit(ctx, call.name, call.key)
		require.NoError(t, err)
	}
	require.NoError(t, store.Close())

	// The keys the store holds, by limit: a record's bbolt key is a tag
	// byte and driver.RecordID.AppendKey, which ends with the key.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	require.NoError(t, err)
	stored := map[string]string{}
	require.NoError(t, db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte(boltstore.DefaultBucket)).ForEach(func(k, _ []byte) error {
			k = k[1:]
			n, w := binary.Uvarint(k)
			name := string(k[w : w+int(n)])
			_, w2 := binary.Uvarint(k[w+int(n):])
			stored[name] = string(k[w+int(n)+w2:])
			return nil
		})
	}))
	require.NoError(t, db.Close())
	require.Len(t, stored, 4)
	require.True(t, strings.HasPrefix(stored["long"], "sha256:"), stored["long"])
	require.True(t, strings.HasPrefix(stored["alike"], "sha256:"), stored["alike"])
	require.NotEqual(t, alike, stored["alike"], "a key spelt as a digest form is stored as its own digest")

	inspect := func(name, key string, extra ...string) (string, map[string]any) {
		args := append([]string{"inspect", "--store", "bolt://" + path, "--kind", "token bucket", "--rate", "10", "--period", "1h",
			"--name", name, "--key", key}, extra...)
		code, out, errOut := execAt(clk, args...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "tokens now 9 of capacity 10", "the record the application wrote")
		code, js, errOut := execAt(clk, append(args, "-o", "json")...)
		require.Equal(t, 0, code, errOut)
		return out, decode(t, js, &statusJSON{})
	}
	out, js := inspect("long", long)
	require.Contains(t, out, fmt.Sprintf("stored as %q, its digest: the key has 4096 bytes, more than 256\n", stored["long"]))
	require.Equal(t, stored["long"], js["store_key"])
	require.Equal(t, long, js["key"])

	// A key spelt as a digest form: the Limiter stores its digest, which
	// inspect reads.
	out, js = inspect("alike", alike)
	require.Contains(t, out, fmt.Sprintf("stored as %q, its digest: the key is spelt as a digest form", stored["alike"]))
	require.Equal(t, stored["alike"], js["store_key"])

	out, js = inspect("hashed", "user-42", "--key-secret", secret)
	// The text and the JSON come from two runs, a second apart at times:
	// the time of the text's own.
	require.Regexp(t, regexp.MustCompile(fmt.Sprintf("\nkey \"user-42\" at [0-9T:-]{19}Z\nstored as %s, its keyed hash \\(--key-secret\\)\n\n", regexp.QuoteMeta(strconv.Quote(stored["hashed"])))), out)
	require.Equal(t, stored["hashed"], js["store_key"])

	out, js = inspect("short", "user-42")
	require.NotContains(t, out, "stored as")
	require.Equal(t, "user-42", js["store_key"])
}

// A key is any bytes, and JSON text is UTF-8: encoding/json writes each
// byte of a key that is not valid UTF-8 as U+FFFD, so that the keys
// "\xff", "\xfe" and "\uFFFD" itself all read "key": "\ufffd". The
// reports of inspect and limit also give the key's bytes exactly, in
// key_base64, and their text quotes the key as Go does ("\xff").
func TestKeysNotUTF8(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	keys := []string{"\xff", "\xfe", "\uFFFD", "user-\xc3\x28", "203.0.113.9"}
	seen := map[string]string{}
	for i, key := range keys {
		args := func(cmd string, extra ...string) []string {
			return append([]string{cmd, "--store", "bolt://" + path, "--kind", "token bucket", "--rate", "10", "--period", "1h",
				"--name", "cli", "--key", key}, extra...)
		}
		// Each key its own record: key i has taken i+1 tokens.
		code, out, errOut := exec(args("limit", "-o", "json", "--count", fmt.Sprint(i+1))...)
		require.Equal(t, 0, code, errOut)
		var d decisionJSON
		m := decode(t, out, &d)
		require.Contains(t, m, "key_base64")
		require.Equal(t, base64.StdEncoding.EncodeToString([]byte(key)), d.KeyBase64, "%q", key)
		require.Equal(t, strings.ToValidUTF8(key, "\uFFFD"), d.Key, "%q: the key as text", key)

		code, out, errOut = exec(args("inspect", "-o", "json")...)
		require.Equal(t, 0, code, errOut)
		var s statusJSON
		m = decode(t, out, &s)
		require.Contains(t, m, "key_base64")
		got, err := base64.StdEncoding.DecodeString(s.KeyBase64)
		require.NoError(t, err)
		require.Equal(t, key, string(got))
		require.InDelta(t, float64(10-(i+1)), s.Tokens, 0.01, "%q: its own record", key)
		prev, dup := seen[s.KeyBase64]
		require.False(t, dup, "%q and %q read alike", key, prev)
		seen[s.KeyBase64] = key

		code, out, errOut = exec(args("inspect")...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, fmt.Sprintf("key %q at ", key))
	}
}

// token refund, use and settle refuse --key-secret, which the Stores
// table lists for every store command, saying why they need none: it was
// refused as an unknown flag.
func TestKeySecretRefusedBySettling(t *testing.T) {
	const secret = "cli test secret, of 32 bytes...."
	for _, action := range []string{"refund", "use", "settle"} {
		args := append([]string{"token", action, "--store", "mem:", "--key-secret", secret, "AQ"}, tokenBucket...)
		if action == "settle" {
			args = append(args, "--used", "1")
		}
		code, out, errOut := exec(args...)
		require.Equal(t, 2, code, "%q: %s%s", args, out, errOut)
		require.Equal(t, "ratelimit: --key-secret: token "+action+" takes no key secret: a token holds its key as the store knows it, a keyed hash where the application hashes keys; leave --key-secret out\n"+
			"Run 'ratelimit token "+action+" --help' for usage.\n", errOut, "%q", args)
	}
}
