package boltstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// A file that is no bbolt database, or a damaged one, is refused by Open
// with ErrDamagedFile, and the process goes on, with nothing left behind.
// A file cut short (a copy that did not finish, a full disk) ended the
// process: bbolt maps the file and read a page past its end (a bus error,
// which no recover catches); so did a page that names one past the end of
// the mapping (a segmentation fault); a damaged page panicked out of Open,
// leaving bbolt's memory map of the file and a goroutine of bbolt's behind
// at each try; and a page reached twice, a meta page in the tree, or keys
// out of order ended the process, from the check of the tree that bbolt
// runs on a goroutine of its own, where it panics.
func TestOpenRefusesDamagedFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	s := open(t, good)
	// Enough records for branch pages, in one transaction.
	ops, outs := make([]*driver.Op, 2000), make([][]driver.Decision, 2000)
	for i := range ops {
		ops[i], outs[i] = takeOp("l", fmt.Sprint("damaged-", i), 1, t0.UnixMilli()), make([]driver.Decision, 1)
	}
	require.NoError(t, s.ApplyBatch(context.Background(), ops, outs))
	require.NoError(t, s.Close())
	data, err := os.ReadFile(good)
	require.NoError(t, err)
	require.Greater(t, len(data), 3*os.Getpagesize())

	pageSize := os.Getpagesize()
	// A branch page (a page header's flags 0x01) whose first element
	// names a page far past the end of the file.
	farBranch := append([]byte(nil), data...)
	branches := 0
	for off := 0; off+32 <= len(farBranch); off += pageSize {
		if flags, count := binary.NativeEndian.Uint16(farBranch[off+8:]), binary.NativeEndian.Uint16(farBranch[off+10:]); flags == 0x01 && count > 1 {
			binary.NativeEndian.PutUint64(farBranch[off+16+8:], 1_000_000)
			branches++
		}
	}
	require.Positive(t, branches)
	// The same, for the other damages of branch pages and leaf pages.
	damageBranch := func(damage func(page []byte)) []byte {
		d := append([]byte(nil), data...)
		for off := 0; off+pageSize <= len(d); off += pageSize {
			if flags, count := binary.NativeEndian.Uint16(d[off+8:]), binary.NativeEndian.Uint16(d[off+10:]); flags == 0x01 && count > 1 {
				damage(d[off : off+pageSize])
				return d
			}
		}
		t.Fatal("no branch page")
		return nil
	}
	// A branch element is 16 bytes from 16: the key's position, the
	// key's size, the child's page. A leaf element: flags, the key's
	// position, the key's size, the value's.
	twice := damageBranch(func(p []byte) { copy(p[16+16+8:16+16+16], p[16+8:16+16]) })
	metaPage := damageBranch(func(p []byte) { binary.NativeEndian.PutUint64(p[16+8:], 1) })
	disordered := append([]byte(nil), data...)
	for off := 0; off+pageSize <= len(disordered); off += pageSize {
		if flags, count := binary.NativeEndian.Uint16(disordered[off+8:]), binary.NativeEndian.Uint16(disordered[off+10:]); flags == 0x02 && count > 1 {
			e := disordered[off+16+16:] // the second element
			pos, size := binary.NativeEndian.Uint32(e[4:]), binary.NativeEndian.Uint32(e[8:])
			clear(e[pos : pos+size]) // its key sorts before the first's
			break
		}
	}
	cases := map[string][]byte{
		"text":                  []byte("name,limit\napi,100\n"),
		"cut in page 0":         data[:100],
		"two pages":             data[:2*pageSize],
		"three pages":           data[:3*pageSize],
		"half":                  data[:len(data)/2],
		"page past the end":     farBranch,
		"page reached twice":    twice,
		"meta page in the tree": metaPage,
		"keys out of order":     disordered,
		"meta pages spoiled": func() []byte {
			d := append([]byte(nil), data...)
			for _, off := range []int{0, pageSize} {
				d[off+16+56] ^= 0xff // the meta page's checksum
			}
			return d
		}(),
		"damaged page": func() []byte {
			d := append([]byte(nil), data...)
			for i := 2 * pageSize; i < len(d); i++ {
				d[i] = 0xab
			}
			return d
		}(),
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "limits.db")
			require.NoError(t, os.WriteFile(path, content, 0o600))
			before := bboltGoroutines()
			s, err := boltstore.Open(path, boltstore.WithTimeout(time.Second))
			require.ErrorIs(t, err, boltstore.ErrDamagedFile, "got %v", err)
			require.Nil(t, s)
			t.Log(err)
			require.Equal(t, before, bboltGoroutines(), "a goroutine of bbolt's is left behind")
			require.Zero(t, mappings(t, path), "bbolt's memory map of the file is left behind")
			require.ErrorContains(t, err, "restore it from a backup, or move it aside", "says what to do")
			require.Equal(t, 1, strings.Count(err.Error(), "boltstore:"), "the package is named once: %v", err)
			require.Equal(t, 1, strings.Count(err.Error(), path), "the path is named once: %v", err)
			if name == "text" {
				require.ErrorIs(t, err, berrors.ErrInvalid, "bbolt's own error is kept")
				require.ErrorContains(t, err, "check the path", "a file of something else's may be named by mistake")
			}
			// Restored in place, the file opens: the refusal left no lock
			// and no entry in the process's registry behind.
			require.NoError(t, os.WriteFile(path, data, 0o600))
			s = open(t, path, boltstore.WithTimeout(time.Second))
			require.NoError(t, s.Close())
		})
	}
}

// bboltGoroutines counts the goroutines of bbolt's rebuilding of its list
// of free pages.
func bboltGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "bbolt.(*DB).freepages")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// mappings counts the memory maps of the file at path in this process,
// where the system lists them (/proc/self/maps); 0 elsewhere.
func mappings(t *testing.T, path string) int {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Logf("the memory maps are not checked: %v", err)
		return 0
	}
	return strings.Count(string(maps), path)
}

// A tree that reads as damaged because another process committed while
// Open read it (its commit may reuse pages of the one read) is no reason
// to refuse the file: Open leaves it to bbolt, which reads the new commit.
func TestOpenRereadsAFileCommittedMeanwhile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	s := open(t, path)
	require.NoError(t, s.Apply(context.Background(), takeOp("l", "k", 1, t0.UnixMilli()), make([]driver.Decision, 1)))
	require.NoError(t, s.Close())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	s = open(t, path)
	require.NoError(t, s.Apply(context.Background(), takeOp("l", "k2", 1, t0.UnixMilli()), make([]driver.Decision, 1)))
	require.NoError(t, s.Close())
	later, err := os.ReadFile(path)
	require.NoError(t, err)

	// Every leaf page calls itself another page.
	pageSize := os.Getpagesize()
	for off := 0; off+pageSize <= len(data); off += pageSize {
		if binary.NativeEndian.Uint16(data[off+8:]) == 0x02 {
			binary.NativeEndian.PutUint64(data[off:], 1<<40)
		}
	}
	require.NoError(t, os.WriteFile(path, data, 0o600))
	_, err = boltstore.Open(path)
	require.ErrorIs(t, err, boltstore.ErrDamagedFile)

	boltstore.SetTreeRefused(func() { require.NoError(t, os.WriteFile(path, later, 0o600)) })
	defer boltstore.SetTreeRefused(nil)
	s = open(t, path)
	out := make([]driver.Record, 1)
	require.NoError(t, s.Load(context.Background(), []driver.RecordID{{Name: "l", Key: "k2"}}, out))
	require.True(t, out[0].Found)
}

// Files of every shape bbolt writes open: buckets within buckets, buckets
// held in their parent's value, values over many pages, buckets deleted,
// pages of 1, 4 and 16 KiB, and a list of free pages written or not.
func TestOpenTakesSoundFiles(t *testing.T) {
	for seed := range 8 {
		r := rand.New(rand.NewPCG(uint64(seed), 1))
		path := filepath.Join(t.TempDir(), "app.db")
		db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true, NoFreelistSync: seed%2 == 0, PageSize: []int{0, 1024, 4096, 16384}[seed%4]})
		require.NoError(t, err)
		for range 20 {
			require.NoError(t, db.Update(func(tx *bolt.Tx) error {
				for range r.IntN(300) {
					b, err := tx.CreateBucketIfNotExists(fmt.Append(nil, "b", r.IntN(4)))
					if err != nil {
						return err
					}
					if r.IntN(3) == 0 {
						if b, err = b.CreateBucketIfNotExists(fmt.Append(nil, "n", r.IntN(4))); err != nil {
							return err
						}
					}
					k := fmt.Append(nil, r.IntN(2000))
					switch x := r.IntN(20); {
					case x < 4:
						err = b.Delete(k)
					case x == 4:
						err = b.Put(k, make([]byte, r.IntN(20_000)))
					default:
						err = b.Put(k, make([]byte, r.IntN(40)))
					}
					if err != nil {
						return err
					}
				}
				if r.IntN(8) == 0 {
					if err := tx.DeleteBucket(fmt.Append(nil, "b", r.IntN(4))); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
						return err
					}
				}
				return nil
			}))
		}
		require.NoError(t, db.Close())
		s, err := boltstore.Open(path)
		require.NoError(t, err, "seed %d", seed)
		require.NoError(t, s.Close())
	}
}

// A file damaged while the store has it open (written by something else,
// cut short) fails the calls that reach the damage with ErrDamagedFile,
// and every call after them, rather than end the process: bbolt, which
// reads the file through its memory map, panicked on a damaged page on
// the caller's goroutine or on the store's own, and a page past the end of
// a file cut short, or one past the end of the mapping, was a memory
// fault that no recover catches. Close still releases the file.
func TestDamagedWhileOpen(t *testing.T) {
	pageSize := os.Getpagesize()
	damages := map[string]func(t *testing.T, path string){
		"cut short": func(t *testing.T, path string) {
			require.NoError(t, os.Truncate(path, int64(2*pageSize)))
		},
		"branch page naming a page past the mapping": func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			require.NoError(t, err)
			defer f.Close()
			info, err := f.Stat()
			require.NoError(t, err)
			branches := 0
			page := make([]byte, pageSize)
			for off := int64(0); off+int64(pageSize) <= info.Size(); off += int64(pageSize) {
				_, err := f.ReadAt(page, off)
				require.NoError(t, err)
				if flags := binary.NativeEndian.Uint16(page[8:]); flags == 0x01 {
					for i := range int(binary.NativeEndian.Uint16(page[10:])) {
						binary.NativeEndian.PutUint64(page[16+16*i+8:], 1<<40)
					}
					_, err := f.WriteAt(page, off)
					require.NoError(t, err)
					branches++
				}
			}
			require.Positive(t, branches)
		},
		"leaf pages overwritten": func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			require.NoError(t, err)
			defer f.Close()
			info, err := f.Stat()
			require.NoError(t, err)
			leaves := 0
			page := make([]byte, pageSize)
			for off := int64(0); off+int64(pageSize) <= info.Size(); off += int64(pageSize) {
				_, err := f.ReadAt(page, off)
				require.NoError(t, err)
				if flags := binary.NativeEndian.Uint16(page[8:]); flags == 0x02 {
					for i := 16; i < len(page); i++ {
						page[i] = 0xff
					}
					_, err := f.WriteAt(page, off)
					require.NoError(t, err)
					leaves++
				}
			}
			require.Positive(t, leaves)
		},
	}
	// The first call to meet the damage reads, or writes: a write
	// transaction rolled back by bbolt's Update as a panic passed rebuilt
	// the list of free pages from the damaged pages, panicked again before
	// it released bbolt's writer lock, and Close waited for it for ever.
	firsts := map[string]func(ctx context.Context, s *boltstore.Store, ids []driver.RecordID) error{
		"read first": func(ctx context.Context, s *boltstore.Store, ids []driver.RecordID) error {
			return s.Load(ctx, ids, make([]driver.Record, len(ids)))
		},
		"write first": func(ctx context.Context, s *boltstore.Store, ids []driver.RecordID) error {
			ops, outs := make([]*driver.Op, len(ids)), make([][]driver.Decision, len(ids))
			for i, id := range ids {
				ops[i], outs[i] = takeOp(id.Name, id.Key, 1, t0.UnixMilli()), make([]driver.Decision, 1)
			}
			return s.ApplyBatch(ctx, ops, outs)
		},
	}
	for name, damage := range damages {
		for first, call := range firsts {
			t.Run(name+"/"+first, func(t *testing.T) {
				ctx := context.Background()
				path := filepath.Join(t.TempDir(), "open.db")
				s, err := boltstore.Open(path)
				require.NoError(t, err)
				ops, outs := make([]*driver.Op, 2000), make([][]driver.Decision, 2000)
				ids := make([]driver.RecordID, len(ops))
				for i := range ops {
					key := fmt.Sprint("open-", i)
					ops[i], outs[i] = takeOp("l", key, 1, t0.UnixMilli()), make([]driver.Decision, 1)
					ids[i] = driver.RecordID{Name: "l", Key: key}
				}
				require.NoError(t, s.ApplyBatch(ctx, ops, outs))
				damage(t, path)

				recs := make([]driver.Record, len(ids))
				err = call(ctx, s, ids)
				require.ErrorIs(t, err, boltstore.ErrDamagedFile)
				require.NotContains(t, err.Error(), "boltstore: boltstore:")
				// Every call after it, on every path.
				out := make([]driver.Decision, 1)
				require.ErrorIs(t, s.Apply(ctx, takeOp("l", "open-1", 1, t0.UnixMilli()), out), boltstore.ErrDamagedFile)
				dctx, cancel := context.WithTimeout(ctx, time.Hour)
				defer cancel()
				require.ErrorIs(t, s.Load(dctx, ids[:1], recs[:1]), boltstore.ErrDamagedFile)
				require.ErrorIs(t, s.Delete(dctx, ids[:1]), boltstore.ErrDamagedFile)
				_, err = s.DeleteExpired(ctx, t0.Add(1000*time.Hour))
				require.ErrorIs(t, err, boltstore.ErrDamagedFile)
				require.NoError(t, s.Close())
				// The file is released: Open checks it again, and refuses it.
				_, err = boltstore.Open(path)
				require.ErrorIs(t, err, boltstore.ErrDamagedFile)
			})
		}
	}
}

// New on a database of the application's whose file was damaged since
// bbolt opened it refuses it with ErrDamagedFile, as a call of the store
// does: the store's first transaction, which makes its bucket, ran
// unguarded, so that bbolt's panic on the damaged page went on out of New
// (and bbolt's Update, rolling back, walked the damaged file again).
func TestNewOnDamagedDatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new.db")
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucket([]byte("app"))
		return err
	}))
	// The page of the bucket of buckets, named by the latest meta page (a
	// meta page is a page header of 16 bytes, then the magic, version,
	// page size and flags, 4 bytes each, the root bucket's page, its
	// sequence, the list of free pages, the high water mark, the
	// transaction's ID).
	pageSize := db.Info().PageSize
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var root uint64
	var txid uint64
	for m := range 2 {
		meta := data[m*pageSize+16:]
		if id := binary.NativeEndian.Uint64(meta[48:]); id >= txid {
			txid, root = id, binary.NativeEndian.Uint64(meta[16:])
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{0, 0}, int64(root)*int64(pageSize)+8) // a page of no type
	require.NoError(t, err)
	require.NoError(t, f.Close())

	var s *boltstore.Store
	require.NotPanics(t, func() { s, err = boltstore.New(db) })
	require.ErrorIs(t, err, boltstore.ErrDamagedFile)
	require.Nil(t, s)
}

// Open's refusal of a file bbolt cannot open names the path once: it read
// "boltstore: open p: open p: permission denied", bbolt's error (an
// *fs.PathError) behind Open's own words.
func TestOpenErrorNamesPathOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.db")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	// Denied as a file of mode 0400 is to any user but root.
	boltstore.SetOpenFile(func(name string, flag int, perm os.FileMode) (*os.File, error) {
		return nil, &os.PathError{Op: "open", Path: name, Err: os.ErrPermission}
	})
	defer boltstore.SetOpenFile(nil)
	_, err := boltstore.Open(path, boltstore.WithTimeout(time.Second))
	require.ErrorIs(t, err, os.ErrPermission)
	var pe *os.PathError
	require.ErrorAs(t, err, &pe, "bbolt's error is kept")
	require.EqualError(t, err, "boltstore: open "+path+": permission denied")
}
