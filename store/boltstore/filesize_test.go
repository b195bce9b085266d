//go:build linux

package boltstore_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
)

// Commits that fail midway on the disk: a child process lowers its file
// size limit (RLIMIT_FSIZE, which applies to the whole process, hence the
// child) to a quarter, a half, three quarters and all of the file's size,
// so that bbolt's growth of the file or its writes of pages past the limit
// fail in the middle of commits, under 16 goroutines, half of them with
// contexts that end at random points; then it lifts the limit, commits 50
// more calls and closes the store. It prints every call's outcome. Every
// call that failed must have heard why (file too large), and the file,
// opened again, must hold every grant the child heard of, and no charge of
// a call that failed: a write past the limit fails before bbolt writes the
// commit's meta page, so nothing of the commit takes effect.
const fileSizeEnv = "BOLTSTORE_FILESIZE_CHILD" // "limit path": the child's role

const (
	fsGoroutines = 16
	fsCalls      = 30   // per goroutine, under the limit
	fsAfter      = 50   // calls once the limit is lifted
	fsFill       = 1000 // records written before the child starts
)

// fsParams: each call takes 1 or 2 tokens of a key of its own, or asks
// for 3 and is refused.
var fsParams = driver.Params{Kind: ratelimit.FixedWindow, Rate: 2, Period: 3_600_000, Capacity: 2}

var fsNow = t0.UnixMilli() / 3_600_000 * 3_600_000

// fsKey pads a call's key so that the calls need more pages than the file
// has free, and the file must grow, at every limit.
func fsKey(name string) string { return name + fsPad }

var fsPad = "-" + strings.Repeat("k", 400)

// fsFillKey is the key of a record written before the child starts.
func fsFillKey(i int) string { return fmt.Sprint("fill", i) }

func fsOp(key string, count float64) *driver.Op {
	return &driver.Op{Now: fsNow, Items: []driver.Item{{Name: "l", Key: key, Count: count, Shards: []driver.Shard{{Params: fsParams}}}}}
}

func TestCommitFailsPastFileSizeLimit(t *testing.T) {
	if env := os.Getenv(fileSizeEnv); env != "" {
		limit, path, _ := strings.Cut(env, " ")
		n, err := strconv.ParseInt(limit, 10, 64)
		require.NoError(t, err)
		fileSizeChild(t, path, n)
		return
	}
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for quarters := 1; quarters <= 4; quarters++ {
		t.Run(fmt.Sprintf("%d/4", quarters), func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "limits.db")
			s := open(t, path)
			fill := make([]*driver.Op, fsFill)
			outs := make([][]driver.Decision, fsFill)
			for i := range fill {
				fill[i], outs[i] = fsOp(fsFillKey(i), 1), make([]driver.Decision, 1)
			}
			// In commits of 100, which leave free pages all over the file:
			// a commit of the child may then write some of its pages below
			// the limit before one past it fails.
			for i := 0; i < fsFill; i += 100 {
				require.NoError(t, s.ApplyBatch(context.Background(), fill[i:i+100], outs[i:i+100]))
			}
			// Delete every other record: its pages, freed, are reused
			// below the limit.
			var gone []driver.RecordID
			for i := 1; i < fsFill; i += 2 {
				gone = append(gone, driver.RecordID{Name: "l", Key: fsFillKey(i)})
			}
			require.NoError(t, s.Delete(context.Background(), gone))
			require.NoError(t, s.Close())
			fi, err := os.Stat(path)
			require.NoError(t, err)
			limit := fi.Size() * int64(quarters) / 4

			calls := runFileSizeChild(t, path, limit)

			s = open(t, path)
			ids := make([]driver.RecordID, 0, len(calls)+fsFill)
			for _, c := range calls {
				ids = append(ids, driver.RecordID{Name: "l", Key: c.key})
			}
			for i := 0; i < fsFill; i += 2 {
				ids = append(ids, driver.RecordID{Name: "l", Key: fsFillKey(i)})
			}
			recs := make([]driver.Record, len(ids))
			require.NoError(t, s.Load(context.Background(), ids, recs))
			count := map[string]int{}
			for i, c := range calls {
				rec, name := recs[i], strings.TrimSuffix(c.key, fsPad)
				count[c.outcome]++
				switch c.outcome {
				case "granted":
					require.True(t, rec.Found, "%s: granted %v, missing after reopen", name, c.count)
					require.Equal(t, fsParams.Capacity-c.count, rec.State.Remaining, "%s: granted %v", name, c.count)
				case "refused":
					require.True(t, !rec.Found || rec.State.Remaining == fsParams.Capacity, "%s: refused, charged: %+v", name, rec)
				case "failed":
					require.Contains(t, c.err, "file too large", "%s", name)
					require.True(t, !rec.Found || rec.State.Remaining == fsParams.Capacity, "%s: failed (%s), charged: %+v", name, c.err, rec)
				case "canceled":
					// Its commit may have taken effect after its caller left.
					require.True(t, !rec.Found || rec.State.Remaining >= fsParams.Capacity-c.count, "%s: %+v", name, rec)
				default:
					t.Fatalf("%s: %s: %s", name, c.outcome, c.err)
				}
				if strings.HasPrefix(name, "after") {
					require.Equal(t, "granted", c.outcome, "%s, once the limit is lifted: %s", name, c.err)
				}
			}
			for i, rec := range recs[len(calls):] {
				require.True(t, rec.Found, "record %d written before the child is missing", 2*i)
				require.Equal(t, 1.0, rec.State.Remaining)
			}
			t.Logf("limit %d of %d bytes: %v", limit, fi.Size(), count)
			require.Equal(t, fsGoroutines*fsCalls+fsAfter, len(calls))
			require.NotZero(t, count["failed"], "no commit failed: the limit did not bite")
		})
	}
}

// fsCall is one call's outcome, as the child printed it.
type fsCall struct {
	key     string
	count   float64
	outcome string // granted, refused, failed (err), canceled
	err     string
}

// runFileSizeChild runs the child on path with the file size limit, and
// returns the outcomes it printed, once it has closed the store.
func runFileSizeChild(t *testing.T, path string, limit int64) []fsCall {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCommitFailsPastFileSizeLimit$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s", fileSizeEnv, limit, path))
	// A child that hangs prints its goroutines.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "the child hung:\n%s\n%s", stdout.String(), stderr.String())
	require.NoError(t, err, "the child failed:\n%s\n%s", stdout.String(), stderr.String())
	var calls []fsCall
	closed := false
	for line := range strings.Lines(stdout.String()) {
		f := strings.SplitN(strings.TrimSpace(line), " ", 5) // call key outcome count [error]
		switch {
		case f[0] == "closed":
			closed = true
		case f[0] == "call" && len(f) >= 4:
			c := fsCall{key: f[1], outcome: f[2]}
			c.count, err = strconv.ParseFloat(f[3], 64)
			require.NoError(t, err, "%q", line)
			if len(f) == 5 {
				c.err = f[4]
			}
			calls = append(calls, c)
		}
	}
	require.True(t, closed, "the child did not close the store:\n%s\n%s", stdout.String(), stderr.String())
	return calls
}

func fileSizeChild(t *testing.T, path string, limit int64) {
	s, err := boltstore.Open(path)
	require.NoError(t, err)
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	report := func(key string, count float64, err error, dec driver.Decision) {
		outcome := "granted"
		switch {
		case errors.Is(err, context.Canceled):
			outcome = "canceled"
		case err != nil:
			outcome = "failed"
		case !dec.OK:
			outcome = "refused"
		}
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "call %s %s %v", key, outcome, count)
		if err != nil {
			fmt.Fprintf(out, " %s", strings.ReplaceAll(err.Error(), "\n", " "))
		}
		out.WriteString("\n")
		out.Flush()
	}

	// Past the limit, a write fails with EFBIG, and the kernel sends
	// SIGXFSZ, whose default action ends the process.
	signal.Ignore(syscall.SIGXFSZ)
	var was syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_FSIZE, &was))
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: uint64(limit), Max: was.Max}))
	var wg sync.WaitGroup
	for g := range fsGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(limit)))
			for i := range fsCalls {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if g%2 == 1 {
					ctx, cancel = context.WithCancel(context.Background())
					cancelSoon(rng, cancel)
				}
				// Half of the goroutines send their calls two by two, in
				// ApplyBatch.
				if g%4 >= 2 && i%2 == 0 {
					keys := [2]string{fsKey(fmt.Sprintf("g%d-%d", g, i)), fsKey(fmt.Sprintf("g%d-%d", g, i+1))}
					counts := [2]float64{float64(1 + rng.IntN(3)), float64(1 + rng.IntN(3))}
					ops := []*driver.Op{fsOp(keys[0], counts[0]), fsOp(keys[1], counts[1])}
					outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
					err := s.ApplyBatch(ctx, ops, outs)
					report(keys[0], counts[0], err, outs[0][0])
					report(keys[1], counts[1], err, outs[1][0])
				} else if g%4 < 2 {
					key, count := fsKey(fmt.Sprintf("g%d-%d", g, i)), float64(1+rng.IntN(3))
					dec := make([]driver.Decision, 1)
					err := s.Apply(ctx, fsOp(key, count), dec)
					report(key, count, err, dec[0])
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &was))
	for i := range fsAfter {
		key := fsKey(fmt.Sprint("after", i))
		dec := make([]driver.Decision, 1)
		err := s.Apply(context.Background(), fsOp(key, 1), dec)
		report(key, 1, err, dec[0])
	}
	require.NoError(t, s.Close())
	fmt.Fprintln(out, "closed")
	require.NoError(t, out.Flush())
}
