package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// badRecords are states no release of the library writes, as a store
// holds them when something else wrote them or they are damaged.
var badRecords = []struct {
	name   string
	tokens float64
	ts     int64
}{
	{"NaN tokens", math.NaN(), time.Now().UnixMilli()},
	{"infinite debt", math.Inf(-1), time.Now().UnixMilli()},
	{"a debt of 1e300", -1e300, time.Now().UnixMilli()},
	{"a time 2^60 ms away", 5, 1 << 60},
	{"a time 2^60 ms before 1970", 5, -1 << 60},
}

// inspectBadRecords writes a record of (cli, key) through the command,
// makes it each of badRecords with corrupt, and checks that inspect
// refuses it, with status 1 and what to do, rather than print what the
// Limiter makes of it (NaN tokens, debts of 10^16, windows that start
// hundreds of millions of years away), that limit refuses to decide on
// it, and that reset clears it.
func inspectBadRecords(t *testing.T, corrupt func(tokens float64, ts int64), storeArgs ...string) {
	key := fmt.Sprint("cli-bad-", time.Now().UnixNano())
	for _, kind := range []string{"fixed window", "token bucket"} {
		args := func(cmd string) []string {
			return append(append([]string{cmd}, storeArgs...),
				"--kind", kind, "--rate", "10", "--period", "1h", "--name", "cli", "--key", key)
		}
		for _, bad := range badRecords {
			code, _, errOut := exec(args("limit")...)
			require.Equal(t, 0, code, errOut)
			corrupt(bad.tokens, bad.ts)
			code, out, errOut := exec(args("inspect")...)
			require.Equal(t, 1, code, "%s, %s:\n%s%s", kind, bad.name, out, errOut)
			require.Empty(t, out, "%s, %s", kind, bad.name)
			require.Contains(t, errOut, " is not one this library writes: ", "%s, %s", kind, bad.name)
			require.Contains(t, errOut, "reset the key (ratelimit reset, with the same flags)", "%s, %s", kind, bad.name)
			code, out, errOut = exec(append(args("inspect"), "-o", "json")...)
			require.Equal(t, 1, code, "%s, %s:\n%s%s", kind, bad.name, out, errOut)
			require.Empty(t, out)
			// limit refuses to decide on it too.
			for _, extra := range [][]string{nil, {"--check"}, {"--reserve", "-o", "json"}} {
				code, out, errOut = exec(append(args("limit"), extra...)...)
				require.Equal(t, 1, code, "%s, %s, limit %q:\n%s%s", kind, bad.name, extra, out, errOut)
				require.Empty(t, out)
				require.Contains(t, errOut, "is not one this library writes")
			}

			code, _, errOut = exec(args("reset")...)
			require.Equal(t, 0, code, errOut)
			// A full bucket again.
			code, out, errOut = exec(append(args("limit"), "--check", "--count", "10")...)
			require.Equal(t, 0, code, errOut)
			require.Contains(t, out, "allowed 10 of cli")
		}
	}
}

func TestInspectBadRecordBolt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	inspectBadRecords(t, func(tokens float64, ts int64) {
		db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
		require.NoError(t, err)
		defer db.Close()
		require.NoError(t, db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("ratelimit"))
			return b.ForEach(func(k, _ []byte) error {
				v := binary.BigEndian.AppendUint64(nil, math.Float64bits(tokens))
				v = binary.BigEndian.AppendUint64(v, uint64(ts))
				v = binary.BigEndian.AppendUint64(v, math.MaxInt64) // expires: never
				return b.Put(k, v)
			})
		}))
	}, "--store", "bolt://"+path)
}

func TestInspectBadRecordRedis(t *testing.T) {
	url, prefix, c := testRedis(t)
	inspectBadRecords(t, func(tokens float64, ts int64) {
		ctx := context.Background()
		keys, err := c.Keys(ctx, globEscape(prefix)+"*").Result()
		require.NoError(t, err)
		require.NotEmpty(t, keys)
		for _, k := range keys {
			// The text of earlier releases, "<value> <ts>".
			v := strconv.FormatFloat(tokens, 'g', -1, 64) + " " + strconv.FormatInt(ts, 10)
			require.NoError(t, c.Set(ctx, k, v, time.Hour).Err())
		}
	}, "--store", url, "--prefix", prefix)
}

func TestInspectBadRecordPostgres(t *testing.T) {
	ctx := context.Background()
	url := testserver.PostgresURL(t)
	table := fmt.Sprintf("ratelimit_cli_test_%d", time.Now().UnixNano())
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() {
		defer pool.Close()
		dropTable(t, pool, table)
	})
	inspectBadRecords(t, func(tokens float64, ts int64) {
		tag, err := pool.Exec(ctx, fmt.Sprintf("UPDATE %q SET value = $1, ts = $2, expires = $3", table), tokens, ts, int64(math.MaxInt64))
		require.NoError(t, err)
		require.Positive(t, tag.RowsAffected())
	}, "--store", url, "--table", table)
}

// Where a record of the Redis store belongs, a key of another type or a
// string that is no record is refused by the store (ErrBadRecord), which
// names the key and what to do; inspect and limit report it with status 1.
func TestInspectRedisNotARecord(t *testing.T) {
	ctx := context.Background()
	url, prefix, c := testRedis(t)
	args := func(cmd string) []string {
		return []string{cmd, "--store", url, "--prefix", prefix, "--kind", "token bucket", "--rate", "10", "--period", "1h",
			"--name", "cli", "--key", "k"}
	}
	code, _, errOut := exec(args("limit")...)
	require.Equal(t, 0, code, errOut)
	keys, err := c.Keys(ctx, globEscape(prefix)+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	for what, write := range map[string]func() error{
		`holds "garbage"`: func() error { return c.Set(ctx, keys[0], "garbage", time.Hour).Err() },
		"holds a hash, not a string": func() error {
			if err := c.Del(ctx, keys[0]).Err(); err != nil {
				return err
			}
			return c.HSet(ctx, keys[0], "a", "b").Err()
		},
	} {
		require.NoError(t, write())
		for _, cmd := range []string{"inspect", "limit"} {
			code, out, errOut := exec(args(cmd)...)
			require.Equal(t, 1, code, "%s, %s:\n%s%s", what, cmd, out, errOut)
			require.Empty(t, out)
			require.Contains(t, errOut, "not a record of this store: key ")
			require.Contains(t, errOut, what)
			require.Contains(t, errOut, "delete the key (its limit starts full again)")
		}
	}
}
