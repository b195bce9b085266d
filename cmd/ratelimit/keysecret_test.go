package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
)

// With the application's secret, by --key-secret or RATELIMIT_KEY_SECRET,
// inspect and reset find the records of a clear key that the application
// hashes; without it they see another record. A short secret is refused.
func TestKeySecret(t *testing.T) {
	ctx := context.Background()
	const secret = "cli test secret, of 32 bytes...."
	path := filepath.Join(t.TempDir(), "limits.db")
	store, err := boltstore.Open(path)
	require.NoError(t, err)
	lim, err := ratelimit.New(store, ratelimit.Limits{"cli": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Hour}},
		ratelimit.WithKeyHash([]byte(secret)))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "cli", "user-42", ratelimit.Count(7))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, store.Close())

	args := func(cmd string, extra ...string) []string {
		return append([]string{cmd, "--store", "bolt://" + path, "--kind", "token bucket", "--rate", "10", "--period", "1h",
			"--name", "cli", "--key", "user-42"}, extra...)
	}
	code, out, errOut := exec(args("inspect")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 10 of capacity 10", "without the secret: another record")

	code, out, errOut = exec(args("inspect", "--key-secret", secret)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 3 of capacity 10")
	require.Contains(t, out, `key "user-42"`)

	t.Setenv(keySecretEnv, secret)
	code, out, errOut = exec(args("inspect")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 3 of capacity 10")
	code, _, errOut = exec(args("reset")...)
	require.Equal(t, 0, code, errOut)
	code, out, errOut = exec(args("inspect")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 10 of capacity 10")
	require.Contains(t, out, "false", "reset dropped the record")

	code, _, errOut = exec(args("inspect", "--key-secret", "short")...)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "at least 16 random bytes")
}

// inspect and reset find the record of a key longer than 256 bytes, which
// the application's store knows by its digest form, by the key as given.
func TestLongKey(t *testing.T) {
	ctx := context.Background()
	key := strings.Repeat("k", 4096)
	path := filepath.Join(t.TempDir(), "limits.db")
	store, err := boltstore.Open(path)
	require.NoError(t, err)
	lim, err := ratelimit.New(store, ratelimit.Limits{"cli": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Hour}})
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "cli", key, ratelimit.Count(7))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, store.Close())

	args := func(cmd, key string) []string {
		return []string{cmd, "--store", "bolt://" + path, "--kind", "token bucket", "--rate", "10", "--period", "1h", "--name", "cli", "--key", key}
	}
	code, out, errOut := exec(args("inspect", key)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 3 of capacity 10")
	code, out, errOut = exec(args("inspect", key[1:]+"j")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 10 of capacity 10", "another long key")
	code, _, errOut = exec(args("reset", key)...)
	require.Equal(t, 0, code, errOut)
	code, out, errOut = exec(args("inspect", key)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tokens now 10 of capacity 10")
	require.Contains(t, out, "false", "reset dropped the record")
}
