package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// boltStore writes a bbolt file at path whose bucket ratelimit holds n
// records (of keys of its own), and returns its page size.
func boltStore(t *testing.T, path string, n int) int {
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("ratelimit"))
		if err != nil {
			return err
		}
		for i := range n {
			if err := b.Put(fmt.Appendf(nil, "record-%06d", i), make([]byte, 24)); err != nil {
				return err
			}
		}
		return nil
	}))
	return db.Info().PageSize
}

// inspect, reset and limit refuse a bbolt file that is not a store, or a
// damaged one, with status 1 and what is wrong, and never end the process:
// a file cut short made bbolt read past the end of its mapping, a fault
// that ended it (SIGBUS), a damaged page made it panic, and an empty file
// read "bad file descriptor".
func TestBoltFileNotAStore(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, data, 0o600))
		return path
	}
	whole := filepath.Join(dir, "whole.db")
	pageSize := boltStore(t, whole, 2000)
	data, err := os.ReadFile(whole)
	require.NoError(t, err)
	// The pages of the bucket's records (leaf pages of more than one
	// element; the root's holds the bucket alone) name other pages.
	damaged := append([]byte(nil), data...)
	var leaves int
	for off := 0; off+16 <= len(damaged); off += pageSize {
		flags, count := binary.LittleEndian.Uint16(damaged[off+8:]), binary.LittleEndian.Uint16(damaged[off+10:])
		if flags == 0x02 && count > 1 {
			binary.LittleEndian.PutUint64(damaged[off:], 0xdead_beef)
			leaves++
		}
	}
	require.Positive(t, leaves)

	for _, tc := range []struct {
		name, path string
		inspect    string // inspect's and reset's error
		limit      string // limit's error; "" when it opens the file
	}{
		{"an empty file", file("empty.db", nil), "is empty: no store was opened on it: check the path in --store", ""},
		{"a directory", dir, "is a directory, not a file: check the path in --store", "is a directory, not a file"},
		{"a text file", file("text.db", []byte("not a bbolt file, only some text that is long enough")),
			"is not a bbolt file, or a damaged one (invalid database): check the path in --store", "is not a bbolt file"},
		{"a file cut short", file("short.db", data[:len(data)/2]),
			fmt.Sprintf("is damaged (cut short: it has %d bytes, and its pages reach ", len(data)/2), "is damaged (cut short"},
		{"damaged pages", file("damaged.db", damaged), "is damaged (", "is damaged ("},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit := []string{"--store", "bolt://" + tc.path, "--kind", "token bucket", "--rate", "10", "--period", "1h", "--key", "k"}
			for _, cmd := range []string{"inspect", "reset"} {
				code, out, errOut := exec(append([]string{cmd}, limit...)...)
				require.Equal(t, 1, code, "%s:\n%s%s", cmd, out, errOut)
				require.Contains(t, errOut, tc.inspect, cmd)
				require.Equal(t, 1, strings.Count(errOut, "\n"), "%s: one line: %s", cmd, errOut)
			}
			code, out, errOut := exec(append([]string{"limit"}, limit...)...)
			if tc.limit == "" {
				require.Equal(t, 0, code, errOut)
				require.Contains(t, out, "allowed 1 of limit")
				return
			}
			require.Equal(t, 1, code, "limit:\n%s%s", out, errOut)
			require.Contains(t, errOut, tc.limit)
		})
	}

	// A file another process holds: refused once the wait ends.
	defer func(d time.Duration) { boltTimeout = d }(boltTimeout)
	boltTimeout = 100 * time.Millisecond
	db, err := bolt.Open(whole, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	// Every command on a store names the file and says what to do.
	const token = "AQF41jIorYZ933idKUC59kxmjoPDqMFoAPD6Ogd1c2VyLTQyAQtzZW5kTWVzc2FnZQAAAAAAAADwP2mNvyWyQfQ0kun0WxyWK-g"
	for _, cmd := range [][]string{{"inspect"}, {"limit"}, {"reset"}, {"bench", "--quiet", "--duration", "10ms"},
		{"token", "refund", token}, {"token", "use", token}, {"token", "settle", "--used", "1", token}} {
		args := append(cmd[:len(cmd):len(cmd)], "--store", "bolt://"+whole, "--kind", "token bucket", "--rate", "10", "--period", "1h", "--name", "sendMessage")
		code, out, errOut := exec(args...)
		require.Equal(t, 1, code, "%s:\n%s%s", cmd, out, errOut)
		require.Equal(t, "ratelimit: bbolt file "+whole+": another process holds the file, and the wait for it ended after 100ms; "+
			"a bbolt file serves one process at a time: stop the process that holds it (the application, or another ratelimit command), "+
			"then run the command again: timeout\n", errOut, cmd)
	}
}

// A file another process holds is given up on at --timeout when it is
// shorter than bbolt's wait for the lock: the wait was 5 s whatever
// --timeout said. A process that only reads the file (another inspect)
// makes limit's open to write wait, within --timeout too.
func TestBoltLockWaitWithinTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	boltStore(t, path, 1)
	limit := []string{"--store", "bolt://" + path, "--kind", "token bucket", "--rate", "10", "--period", "1h", "--key", "k", "--timeout", "300ms"}
	for _, readOnly := range []bool{false, true} {
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: readOnly})
		require.NoError(t, err)
		cmds := []string{"inspect", "reset", "limit"}
		if readOnly {
			cmds = []string{"limit"}
		}
		for _, cmd := range cmds {
			start := time.Now()
			code, out, errOut := exec(append([]string{cmd}, limit...)...)
			elapsed := time.Since(start)
			require.Equal(t, 1, code, "%s:\n%s%s", cmd, out, errOut)
			require.Contains(t, errOut, "another process holds the file", cmd)
			require.Less(t, elapsed, 2*time.Second, "%s, the file held read-only %v: the wait ends at --timeout 300ms", cmd, readOnly)
		}
		require.NoError(t, db.Close())
	}
	// Released, the file opens.
	code, out, errOut := exec(append([]string{"limit"}, limit...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "allowed 1 of limit")

	// The wait is bbolt's 5 s at most, and never none, which bbolt takes
	// for no bound.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	require.Equal(t, boltTimeout, boltWait(ctx))
	require.Equal(t, boltTimeout, boltWait(context.Background()))
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	require.InDelta(t, time.Second, boltWait(ctx), float64(100*time.Millisecond))
	ended, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	require.Positive(t, boltWait(ended))
}

// A command waiting for a bbolt file that another opener holds stops
// waiting when its context ends (Ctrl-C), and says that the file is held
// and what to do: it waited out bbolt's wait (5 s) whatever ended the
// context, as boltstore.Open does. bench, stopped so, exits 130.
func TestBoltLockWaitEndsWithContext(t *testing.T) {
	defer func(d time.Duration) { boltTimeout = d }(boltTimeout)
	boltTimeout = time.Hour // only the context can end the wait
	defer func() { boltWaiting = nil }()
	path := filepath.Join(t.TempDir(), "limits.db")
	boltStore(t, path, 1)
	limit := []string{"--store", "bolt://" + path, "--kind", "token bucket", "--rate", "10", "--period", "1h", "--timeout", "1h"}
	holders := []struct {
		name string
		open func() (io.Closer, error)
	}{
		{"bbolt", func() (io.Closer, error) { return bolt.Open(path, 0o600, nil) }},
		{"boltstore", func() (io.Closer, error) { return boltstore.Open(path) }},
	}
	for _, h := range holders {
		held, err := h.open()
		require.NoError(t, err, h.name)
		for _, cmd := range []string{"inspect", "reset", "limit", "bench"} {
			args := append([]string{cmd}, limit...)
			if cmd == "bench" {
				args = append(args, "--quiet", "--duration", "1s")
			} else {
				args = append(args, "--key", "k")
			}
			ctx, cancel := context.WithCancel(context.Background())
			waited := false
			boltWaiting = func() { waited = true; cancel() }
			type result struct {
				code        int
				out, errOut string
			}
			done := make(chan result, 1)
			go func() {
				code, out, errOut := execContext(ctx, args...)
				done <- result{code, out, errOut}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(time.Minute):
				t.Fatalf("%s, the file held by %s: still waiting a minute after its context was cancelled", cmd, h.name)
			}
			cancel()
			require.True(t, waited, "%s, held by %s: %s", cmd, h.name, r.errOut)
			require.Empty(t, r.out, cmd)
			if cmd == "bench" {
				require.Equal(t, 130, r.code, "%s, held by %s: %s", cmd, h.name, r.errOut)
				require.Equal(t, "ratelimit: bench interrupted while it opened the store: no call was made\n", r.errOut)
				continue
			}
			require.Equal(t, 1, r.code, "%s, held by %s: %s", cmd, h.name, r.errOut)
			require.Equal(t, "ratelimit: bbolt file "+path+": another process holds the file, and the command was stopped while it waited for it; "+
				"a bbolt file serves one process at a time: stop the process that holds it (the application, or another ratelimit command), "+
				"then run the command again: context canceled (timeout)\n", r.errOut, "%s, held by %s", cmd, h.name)
		}
		require.NoError(t, held.Close())
	}
}

// A store without a server (a bbolt file, mem:) that runs out of
// --timeout is not asked about its server, which it has none of: a
// context's deadline reads as a network timeout, and the error added "is
// the server up?". An answer that the deadline did not cause (a file that
// is not there) is not told as the store's silence either, though the
// deadline passed before it was reported.
func TestTimeoutOfLocalStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	limit := []string{"--kind", "token bucket", "--rate", "10", "--period", "1h", "--timeout", "1ns"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"limit", "--store", "bolt://" + path}, "ratelimit: no answer from the store within --timeout 1ns: bbolt file " + path + ": not opened: --timeout\n"},
		{[]string{"inspect", "--store", "bolt://" + path}, "ratelimit: bbolt file " + path + " does not exist: check the path in --store (the application's boltstore.Open path): no such store\n"},
		{[]string{"limit", "--store", "mem:"}, "ratelimit: no answer from the store within --timeout 1ns: value of limit \"limit\": store: context deadline exceeded\n"},
		{[]string{"reset", "--store", "mem:"}, "ratelimit: no answer from the store within --timeout 1ns: reset limit \"limit\": store: context deadline exceeded\n"},
	} {
		code, out, errOut := exec(append(c.args, limit...)...)
		require.Equal(t, 1, code, "%q: %s", c.args, out)
		require.Equal(t, c.want, errOut, "%q", c.args)
	}
}

// A bbolt file that limit or bench would create in a directory
// that is not there says so and what to check, as inspect does of a file
// that is not there: it was bbolt's "open ...: no such file or
// directory", which did not say which was missing.
func TestBoltFileDirectoryMissing(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(notDir, nil, 0o600))
	const check = "check the path in --store (the application's boltstore.Open path)"
	for _, c := range []struct{ path, want string }{
		{filepath.Join(dir, "none", "limits.db"), "bbolt file " + filepath.Join(dir, "none", "limits.db") + ": its directory " + filepath.Join(dir, "none") + " does not exist: " + check + ": no such store"},
		{filepath.Join(notDir, "limits.db"), "bbolt file " + filepath.Join(notDir, "limits.db") + ": " + notDir + " is not a directory: " + check},
	} {
		for _, cmd := range [][]string{{"limit", "--key", "k"}, {"bench", "--quiet", "--duration", "1s"}} {
			code, out, errOut := exec(append(cmd, "--store", "bolt://"+c.path, "--kind", "token bucket", "--rate", "10", "--period", "1h")...)
			require.Equal(t, 1, code, "%s %s: %s", cmd, c.path, out)
			require.Equal(t, "ratelimit: "+c.want+"\n", errOut, "%s %s", cmd, c.path)
		}
	}
}
