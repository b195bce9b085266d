package boltstore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// waitStack waits until some goroutine's stack holds every one of frames,
// in that order from the innermost; should none come to, the test fails
// after a while rather than hangs.
func waitStack(t *testing.T, what string, frames ...string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			rest, ok := g, true
			for _, f := range frames {
				i := strings.Index(rest, f)
				if i < 0 {
					ok = false
					break
				}
				rest = rest[i+len(f):]
			}
			if ok {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never came to pass (did bbolt's locking change? the test looks for %q)", what, frames)
		}
		runtime.Gosched()
	}
}

// remapBehindReader holds a read transaction of the application on s's
// database and starts a write that grows the file past its map: bbolt
// remaps it under its mmap lock, which waits for every read transaction,
// and meanwhile every new read transaction waits for the remap. It returns
// once the write waits, and a function that ends the read transaction and
// waits for the write.
func remapBehindReader(t *testing.T, s *boltstore.Store) (release func()) {
	t.Helper()
	rtx, err := s.DB().Begin(false) // a long read: a backup, say
	require.NoError(t, err)
	wrote := make(chan error, 1)
	go func() {
		wrote <- s.DB().Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("app"))
			if err != nil {
				return err
			}
			return b.Put([]byte("big"), make([]byte, 4<<20)) // past the map of a new file
		})
	}()
	waitStack(t, "the write waiting for the remap", "sync.(*RWMutex).Lock", "go.etcd.io/bbolt.(*DB).mmap")
	var done bool
	release = func() {
		if done {
			return
		}
		done = true
		require.NoError(t, rtx.Rollback())
		require.NoError(t, <-wrote)
	}
	t.Cleanup(release)
	return release
}

// A call that reads (a check, Load, DeleteExpired's scan) waiting to begin
// its read transaction, behind a remap that waits for a long read
// transaction of the application, returns when its context ends; one whose
// context has ended does not start.
func TestReadLeavesWhenContextEnds(t *testing.T) {
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 60_000, Capacity: 10}
	now := t0.UnixMilli()
	id := driver.RecordID{Name: "l", Key: "k"}
	calls := map[string]func(ctx context.Context, s *boltstore.Store) error{
		"Check": func(ctx context.Context, s *boltstore.Store) error {
			op := &driver.Op{Mode: driver.ModeCheck, Now: now, Items: []driver.Item{{Name: "l", Key: "k", Count: 1, Shards: []driver.Shard{{Params: p}}}}}
			return s.Apply(ctx, op, make([]driver.Decision, 1))
		},
		"Load": func(ctx context.Context, s *boltstore.Store) error {
			return s.Load(ctx, []driver.RecordID{id}, make([]driver.Record, 1))
		},
		"DeleteExpired": func(ctx context.Context, s *boltstore.Store) error {
			_, err := s.DeleteExpired(ctx, t0)
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			s := open(t, filepath.Join(t.TempDir(), "limits.db"))
			op := &driver.Op{Now: now, Items: []driver.Item{{Name: "l", Key: "k", Count: 1, Shards: []driver.Shard{{Params: p}}}}}
			require.NoError(t, s.Apply(context.Background(), op, make([]driver.Decision, 1)))
			canceled, cancelNow := context.WithCancel(context.Background())
			cancelNow()
			require.ErrorIs(t, call(canceled, s), context.Canceled, "a call whose context has ended does not start")
			release := remapBehindReader(t, s)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			res := make(chan error, 1)
			go func() { res <- call(ctx, s) }()
			waitStack(t, "the call waiting to begin its read transaction", "go.etcd.io/bbolt.(*DB).beginTx")
			requireLeft(t, cancel, res, release, name, "the remap")
			release()
			require.NoError(t, call(context.Background(), s), "the store serves reads again once the remap is done")
		})
	}
}

// A write that goes alone (a lone Apply, ApplyBatch, Delete, a step of
// DeleteExpired), waiting for bbolt's writer lock behind a write of the
// application that waits for a remap, which waits for a long read
// transaction of the application, returns when its context ends. The
// write goes on in the background; once it begins, it finds its context
// ended and rolls back.
func TestWriteLeavesWhenContextEnds(t *testing.T) {
	now := t0.UnixMilli()
	calls := map[string]func(ctx context.Context, s *boltstore.Store) error{
		"Apply": func(ctx context.Context, s *boltstore.Store) error {
			return s.Apply(ctx, takeOp("l", "new", 1, now), make([]driver.Decision, 1))
		},
		"ApplyBatch": func(ctx context.Context, s *boltstore.Store) error {
			return s.ApplyBatch(ctx, []*driver.Op{takeOp("l", "new", 1, now)}, [][]driver.Decision{make([]driver.Decision, 1)})
		},
		"Delete": func(ctx context.Context, s *boltstore.Store) error {
			return s.Delete(ctx, []driver.RecordID{{Name: "l", Key: "k"}})
		},
		"DeleteExpired": func(ctx context.Context, s *boltstore.Store) error {
			_, err := s.DeleteExpired(ctx, t0.Add(time.Hour))
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			s := open(t, filepath.Join(t.TempDir(), "limits.db"))
			// DeleteExpired's scan, a read, would wait for the remap too
			// (TestReadLeavesWhenContextEnds): the remap starts once a
			// step has read its keys, before its write.
			scanned, remapping := make(chan struct{}), make(chan struct{})
			var once sync.Once
			if name == "DeleteExpired" {
				boltstore.SetHooks(s, boltstore.Hooks{Scanned: func() {
					once.Do(func() { close(scanned); <-remapping })
				}})
			}
			require.NoError(t, s.Apply(context.Background(), takeOp("l", "k", 1, now), make([]driver.Decision, 1)))

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			res := make(chan error, 1)
			var release func()
			if name == "DeleteExpired" {
				go func() { res <- call(ctx, s) }()
				select {
				case <-scanned:
				case err := <-res:
					t.Fatalf("DeleteExpired returned %v before its write", err)
				case <-time.After(10 * time.Second):
					t.Fatal("DeleteExpired found no expired record to remove")
				}
				release = remapBehindReader(t, s)
				close(remapping)
			} else {
				release = remapBehindReader(t, s)
				go func() { res <- call(ctx, s) }()
			}
			waitStack(t, "the store's write waiting for bbolt's writer lock",
				"go.etcd.io/bbolt.(*DB).beginRWTx", "ratelimit/store/boltstore.(*Store).")
			requireLeft(t, cancel, res, release, name, "the application's write")
			release()
			require.NoError(t, call(context.Background(), s), "the store serves writes again once the remap is done")
		})
	}
}

// A lone Apply whose own commit grows the file past its map waits in the
// commit for the remap, and so for a long read transaction of the
// application: its caller returns when its context ends, and the write,
// committed once the read ends, has taken effect (as a call over a
// network may have).
func TestRemappingWriteLeavesWhenContextEnds(t *testing.T) {
	now := t0.UnixMilli()
	s := open(t, filepath.Join(t.TempDir(), "limits.db"))
	rtx, err := s.DB().Begin(false) // a long read: a backup, say
	require.NoError(t, err)
	var once sync.Once
	release := func() { once.Do(func() { require.NoError(t, rtx.Rollback()) }) }
	t.Cleanup(release)

	// 2,000 records: past the map of a new file (32 KiB).
	op := &driver.Op{Mode: driver.ModeLimit, Now: now}
	for i := range 2000 {
		op.Items = append(op.Items, driver.Item{Name: fmt.Sprint("l", i), Key: "k", Count: 1, Shards: []driver.Shard{{Params: tb}}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- s.Apply(ctx, op, make([]driver.Decision, len(op.Items))) }()
	waitStack(t, "the store's commit waiting for the remap",
		"sync.(*RWMutex).Lock", "go.etcd.io/bbolt.(*DB).mmap", "ratelimit/store/boltstore.(*Store).send")
	requireLeft(t, cancel, res, release, "Apply", "the remap")
	release()
	// The next call goes after the write left behind, which commits.
	require.NoError(t, s.Apply(context.Background(), takeOp("l", "after", 1, now), make([]driver.Decision, 1)))
	require.True(t, stored(t, s, "l0", "k").Found, "the write whose caller left has committed")
	require.True(t, stored(t, s, "l1999", "k").Found)
}

// requireLeft cancels a call's context and requires the call, held by
// what, to return context.Canceled at once; should it not within 10 s, it
// lets what go (release) and fails with what the call returned then.
func requireLeft(t *testing.T, cancel func(), res <-chan error, release func(), name, what string) {
	t.Helper()
	cancel()
	select {
	case err := <-res:
		require.ErrorIs(t, err, context.Canceled, name)
		require.ErrorContains(t, err, "boltstore: ", "%s: a context ended during the call: the error names the store, as Redis's and PostgreSQL's do", name)
	case <-time.After(10 * time.Second):
		release()
		t.Fatalf("%s did not return when its context ended: it waited for %s (returned %v once it was done)", name, what, <-res)
	}
}
