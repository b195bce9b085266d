//go:build linux

package boltstore_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// syncFault makes one fdatasync of a bbolt file fail: that after the
// commit's pages (data), or the last, after the commit's meta page (meta).
// bbolt writes the pages through a function of its DB (ops.writeAt), then
// flushes with fdatasync on the file's descriptor; once armed, the write
// that precedes the flush chosen points the descriptor at /dev/null, on
// which fdatasync fails with EINVAL (the writes themselves go to the file
// through a duplicate descriptor, which also keeps the file and its lock),
// and bbolt's log of the failure, made right after it, points the
// descriptor back at the file.
type syncFault struct {
	fd, file, null int // the DB's descriptor, a duplicate of it, /dev/null
	pageSize       int64

	mu      sync.Mutex
	armed   string // "data" or "meta": the next commit's flush to fail
	swapped bool
	failed  int // flushes failed
}

// bolt.Logger: Errorf is bbolt's log of the failed flush, the first
// thing it does after it.
type faultLogger struct {
	bolt.DefaultLogger
	f *syncFault
}

func (l *faultLogger) Errorf(string, ...any) { l.f.restore() }
func (l *faultLogger) Error(...any)          { l.f.restore() }

// openSyncFault opens path with bbolt, with the options Open uses, and
// returns the DB and its fault.
func openSyncFault(t *testing.T, path string) (*bolt.DB, *syncFault) {
	t.Helper()
	f := &syncFault{}
	lg := &faultLogger{DefaultLogger: bolt.DefaultLogger{Logger: log.New(io.Discard, "", 0)}, f: f}
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true, Logger: lg})
	require.NoError(t, err)
	f.pageSize = int64(db.Info().PageSize)
	fdv := reflect.ValueOf(db).Elem().FieldByName("file")
	wv := reflect.ValueOf(db).Elem().FieldByName("ops").FieldByName("writeAt")
	require.True(t, fdv.IsValid() && wv.IsValid(), "bbolt's DB has no file, or no ops.writeAt: update syncFault to this bbolt")
	file := reflect.NewAt(fdv.Type(), unsafe.Pointer(fdv.UnsafeAddr())).Elem().Interface().(*os.File)
	f.fd = int(file.Fd())
	f.file, err = syscall.Dup(f.fd)
	require.NoError(t, err)
	f.null, err = syscall.Open(os.DevNull, syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() {
		f.restore()
		syscall.Close(f.file)
		syscall.Close(f.null)
	})
	writeAt := reflect.NewAt(wv.Type(), unsafe.Pointer(wv.UnsafeAddr())).Interface().(*func([]byte, int64) (int, error))
	*writeAt = f.writeAt
	return db, f
}

// writeAt writes b at off to the file, then, armed for the flush that
// follows this write, points the DB's descriptor at /dev/null. The meta
// pages are the file's first two; a commit writes one of them, last.
func (f *syncFault) writeAt(b []byte, off int64) (int, error) {
	n, err := syscall.Pwrite(f.file, b, off)
	if err != nil {
		return n, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	meta := off < 2*f.pageSize
	if (f.armed == "meta" && meta) || (f.armed == "data" && !meta) {
		f.armed = ""
		if err := syscall.Dup3(f.null, f.fd, syscall.O_CLOEXEC); err != nil {
			panic(err)
		}
		f.swapped = true
	}
	return n, nil
}

// restore points the DB's descriptor back at the file.
func (f *syncFault) restore() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.swapped {
		return
	}
	if err := syscall.Dup3(f.file, f.fd, syscall.O_CLOEXEC); err != nil {
		panic(err)
	}
	f.swapped = false
	f.failed++
}

func (f *syncFault) arm(which string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed = which
}

func (f *syncFault) failures() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// A commit whose flush fails: every call of its batch, 12 goroutines
// queued behind a first call (half with contexts that can end, so that
// some run detached), fails with the flush's error, and none is told it
// was granted. After the flush of its pages, before bbolt writes its meta
// page, nothing of the batch takes effect (the store's documented
// "charges none of them"). After the last flush, that of the meta page,
// the batch may have taken effect (Apply's doc): it did, as a whole, as
// bbolt reads that page from then on, in this process and after a
// reopen; the store goes on, and what the store reads, a reopen of the
// file reads too, equal to the model with the batch applied in its order
// of arrival.
func TestCommitFailsInFlush(t *testing.T) {
	for _, which := range []string{"data", "meta"} {
		t.Run(which, func(t *testing.T) { testCommitFailsInFlush(t, which) })
	}
}

func testCommitFailsInFlush(t *testing.T, which string) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "limits.db")
	db, fault := openSyncFault(t, path)
	s, err := boltstore.New(db)
	require.NoError(t, err)
	model := storetest.NewModel()
	now := t0.UnixMilli()
	keys := []string{"a", "b", "c"}
	apply := func(op *driver.Op) {
		out := make([]driver.Decision, 1)
		require.NoError(t, s.Apply(ctx, op, out))
		want := make([]driver.Decision, 1)
		require.NoError(t, model.Apply(ctx, op, want))
		require.Equal(t, want, out)
	}
	for _, k := range keys {
		apply(takeOp("l", k, 3, now))
	}

	// The first call's transaction holds on; 12 calls queue behind it, in
	// this order, and go together in the next, whose flush fails.
	inFirst, release := make(chan struct{}), make(chan struct{})
	var txs atomic.Int32
	boltstore.SetHooks(s, boltstore.Hooks{InWrite: func(*bolt.Tx) {
		switch txs.Add(1) {
		case 1:
			close(inFirst)
			<-release
		case 2:
			fault.arm(which) // the batch's
		}
	}})
	first := takeOp("l", "a", 1, now)
	firstErr := make(chan error, 1)
	go func() { firstErr <- s.Apply(ctx, first, make([]driver.Decision, 1)) }()
	<-inFirst
	var batch []*driver.Op
	var errs []chan error
	outs := make([][]driver.Decision, 12)
	for i := range 12 {
		op := takeOp("l", keys[i%len(keys)], float64(1+i%4), now)
		batch = append(batch, op)
		qctx := ctx
		if i%2 == 1 {
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			qctx = cctx
		}
		ch := make(chan error, 1)
		errs = append(errs, ch)
		outs[i] = make([]driver.Decision, 1)
		go func() { ch <- s.Apply(qctx, op, outs[i]) }()
		waitQueued(t, s, i+1)
	}
	close(release)
	require.NoError(t, <-firstErr)
	require.NoError(t, model.Apply(ctx, first, make([]driver.Decision, 1)))
	for i, ch := range errs {
		err := <-ch
		require.ErrorIs(t, err, syscall.EINVAL, "call %d of the batch", i)
		require.ErrorContains(t, err, "boltstore: ")
		require.Equal(t, driver.Decision{}, outs[i][0], "call %d: nothing reported", i)
	}
	require.Equal(t, 1, fault.failures(), "one flush failed")

	if which == "meta" {
		// bbolt wrote the meta page before its flush failed: it reads it
		// from then on, and the batch has taken effect.
		for _, op := range batch {
			require.NoError(t, model.Apply(ctx, op, make([]driver.Decision, 1)))
		}
	}
	ids := make([]driver.RecordID, len(keys))
	for i, k := range keys {
		ids[i] = driver.RecordID{Name: "l", Key: k}
	}
	want := make([]driver.Record, len(ids))
	require.NoError(t, model.Load(ctx, ids, want))
	got := make([]driver.Record, len(ids))
	require.NoError(t, s.Load(ctx, ids, got))
	require.Equal(t, want, got, "the records after the failed commit (%s)", which)

	// The store goes on, and commits after.
	apply(takeOp("l", "b", 1, now))
	apply(takeOp("l", "d", 2, now))
	require.NoError(t, s.Close())
	require.NoError(t, db.Close())

	s2 := open(t, path)
	ids = append(ids, driver.RecordID{Name: "l", Key: "d"})
	want, got = make([]driver.Record, len(ids)), make([]driver.Record, len(ids))
	require.NoError(t, model.Load(ctx, ids, want))
	require.NoError(t, s2.Load(ctx, ids, got))
	require.Equal(t, want, got, "the records after a reopen (%s)", which)
	check, err := s2.DB().Begin(false)
	require.NoError(t, err)
	defer check.Rollback()
	for err := range check.Check() {
		require.NoError(t, err, fmt.Sprintf("the file after a failed %s flush", which))
	}
}
