package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrDamagedFile is matched by the error of Open for a file that is not a
// bbolt database, or one that is damaged: shorter than its last commit
// (cut by a copy that did not finish, a full disk, a file system that lost
// its tail), or with a page of its last commit that bbolt cannot read. bbolt
// maps the file into memory and reads it there, trusting what it finds: a
// page past the end of a cut file would end the process with a bus error
// that no recover can catch, and a damaged page with a panic on a
// goroutine of bbolt's own; so Open first reads, through reads of the file,
// its meta pages and every page of its last commit, and refuses it. Restore
// the file from a backup, or move it aside and Open the path again for an
// empty file (every limit then starts full again, and a token settled
// before could be settled once more until it expires).
//
// It is matched too by the error of every call of a store whose file was
// damaged while open, from the first call that met the damage on (where
// bbolt panicked or faulted reading it): Close the store, then restore the
// file or move it aside.
var ErrDamagedFile = errors.New("boltstore: the file is damaged or is not a bbolt database")

// The layout of bbolt's pages (its internal/common: a meta page's Meta
// behind a page header of 16 bytes, the elements of branch and leaf pages,
// a bucket's value), in the machine's byte order, for checkFile.
const (
	pageHeaderLen  = 16
	metaLen        = 64
	metaMagic      = 0xED0CDAED
	metaVersion    = 2
	metaSumOffset  = 56 // the checksum, FNV-64a of the bytes before it
	metaPageSize   = 8  // uint32
	metaRoot       = 16 // pgid: the root page of the bucket of buckets
	metaFreelist   = 32 // pgid: the list of free pages, or noFreelist
	metaHighWater  = 40 // pgid: the first page past the file's pages
	metaTxID       = 48
	maxMetaPageLen = 1 << 16

	noFreelist       = math.MaxUint64 // a commit that wrote no list of free pages
	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	freelistPageFlag = 0x10
	elementLen       = 16   // a branch page's element, or a leaf page's
	bucketLeafFlag   = 0x01 // a leaf page's element that is a bucket
	bucketHeaderLen  = 16   // a bucket's value: its root page and sequence
)

// restoreHint says what to do with a file refused with ErrDamagedFile.
const restoreHint = "restore it from a backup, or move it aside to start with an empty file (every limit starts full again)"

// bboltMeta is what checkFile reads of a meta page.
type bboltMeta struct {
	pageSize  int64
	root      uint64
	freelist  uint64
	highWater uint64
	txid      uint64
}

// readMeta reads the meta page at off of f, and reports whether it is a
// valid one (bbolt's Meta.Validate).
func readMeta(f *os.File, off int64) (bboltMeta, bool) {
	var buf [pageHeaderLen + metaLen]byte
	if _, err := f.ReadAt(buf[:], off); err != nil {
		return bboltMeta{}, false
	}
	m := buf[pageHeaderLen:]
	h := fnv.New64a()
	h.Write(m[:metaSumOffset])
	if ne.Uint32(m) != metaMagic || ne.Uint32(m[4:]) != metaVersion || ne.Uint64(m[metaSumOffset:]) != h.Sum64() {
		return bboltMeta{}, false
	}
	return bboltMeta{
		pageSize:  int64(ne.Uint32(m[metaPageSize:])),
		root:      ne.Uint64(m[metaRoot:]),
		freelist:  ne.Uint64(m[metaFreelist:]),
		highWater: ne.Uint64(m[metaHighWater:]),
		txid:      ne.Uint64(m[metaTxID:]),
	}, true
}

var ne = binary.NativeEndian

// lastMeta returns the meta page of f that bbolt reads: of the valid ones,
// the one of the highest transaction.
func lastMeta(f *os.File) (bboltMeta, bool) {
	best, ok := readMeta(f, 0)
	if ok {
		if m, ok1 := readMeta(f, best.pageSize); ok1 && m.txid > best.txid {
			best = m
		}
		return best, true
	}
	// The first meta page is damaged: look for the second, at each page
	// size bbolt may have used, as bbolt does.
	for size := int64(1024); size <= maxMetaPageLen; size *= 2 {
		if m, ok1 := readMeta(f, size); ok1 && m.pageSize == size {
			return m, true
		}
	}
	return bboltMeta{}, false
}

// checkFile returns an error matching ErrDamagedFile when the bbolt file
// at path is shorter than the pages its last commit holds, as bbolt will
// read it (the meta page of the highest transaction that is valid), or
// when a page of its last commit is damaged (checkTree). It leaves every
// other fault (no such file, no meta page that reads) to bbolt's Open,
// which reports it. The file's size is read after its meta pages: bbolt
// grows a file before it writes a commit's meta page, so a process
// writing the file meanwhile cannot make a sound file look cut.
func checkFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	best, ok := lastMeta(f)
	if !ok || best.pageSize <= 0 || best.highWater > uint64(1<<62/best.pageSize) {
		return nil
	}
	info, err := f.Stat()
	if err != nil {
		return nil
	}
	if need := int64(best.highWater) * best.pageSize; info.Size() < need {
		return fmt.Errorf("%w: it holds %d bytes, and its last commit (transaction %d) holds %d pages of %d bytes, %d bytes: "+
			"it was cut short; "+restoreHint, ErrDamagedFile, info.Size(), best.txid, best.highWater, best.pageSize, need)
	}
	if err := checkTree(f, best); err != nil {
		if treeRefused != nil {
			treeRefused()
		}
		// A process writing the file meanwhile may have reused pages of
		// the commit read, once a later one freed them: only a commit
		// still the last once read through is judged. (A file that
		// another process holds waits for it in bbolt's Open.)
		if again, ok := lastMeta(f); !ok || again.txid != best.txid {
			return nil
		}
		return err
	}
	return nil
}

// treeRefused, if set, is called when checkTree refuses a tree, before
// checkFile reads the meta pages again; for the tests.
var treeRefused func()

// checkTree reads every page of the commit m, from the root of its
// bucket of buckets down through every bucket, as bbolt does, in its Open
// and after a write transaction that panicked or failed in its commit, to
// rebuild its list of free pages when the last commit did not write it
// (Open's NoFreelistSync), and reads its list of free pages if it did. bbolt
// reads them from its memory map and trusts what it finds: a page that
// names one past the end of the mapping faults; a page that is not the
// one named, or of no type, panics in Open, which leaves its memory map
// and a goroutine behind; and what its check of the tree finds (a page
// reached twice, a meta page or a list of free pages in the tree, keys
// out of order) it reports on a goroutine of its own, by a panic there
// that ends the process. checkTree returns an error matching
// ErrDamagedFile for each of those, and for an element, a key or a value
// past the end of its page, a bucket's value too short to be one, and a
// list of free pages that names a page outside the commit's or in its
// tree, through reads of the file, which fail with an error where the
// memory map would fault.
func checkTree(f *os.File, m bboltMeta) error {
	c := &treeCheck{f: f, pageSize: uint64(m.pageSize), highWater: m.highWater,
		seen: make([]uint64, (m.highWater+63)/64), txid: m.txid}
	if _, err := c.subtree(m.root, nil, nil); err != nil {
		return err
	}
	if m.freelist != noFreelist {
		return c.freelist(m.freelist)
	}
	return nil
}

// treeCheck is the walk of checkTree.
type treeCheck struct {
	f         *os.File
	pageSize  uint64
	highWater uint64
	seen      []uint64 // a bit per page reached
	txid      uint64
}

// damaged returns the error of a damaged page.
func (c *treeCheck) damaged(format string, args ...any) error {
	return fmt.Errorf("%w: in its last commit (transaction %d), %s: "+restoreHint,
		ErrDamagedFile, c.txid, fmt.Sprintf(format, args...))
}

// page reads the page id, with the pages of its overflow, which must be
// of the type flags (0: a branch or a leaf page), and marks them reached.
func (c *treeCheck) page(id uint64, flags uint16) ([]byte, error) {
	if id < 2 || id >= c.highWater {
		return nil, c.damaged("a page names page %d, outside pages 2 to %d", id, c.highWater-1)
	}
	p := make([]byte, c.pageSize)
	if _, err := c.f.ReadAt(p, int64(id*c.pageSize)); err != nil {
		return nil, c.damaged("page %d does not read: %v", id, err)
	}
	pid, pflags, overflow := ne.Uint64(p), ne.Uint16(p[8:]), uint64(ne.Uint32(p[12:]))
	switch {
	case pid != id:
		return nil, c.damaged("page %d calls itself page %d", id, pid)
	case flags == 0 && pflags != branchPageFlag && pflags != leafPageFlag:
		return nil, c.damaged("page %d, in a bucket's tree, is of type %#x: neither a branch nor a leaf", id, pflags)
	case flags != 0 && pflags != flags:
		return nil, c.damaged("page %d is of type %#x where one of type %#x belongs", id, pflags, flags)
	case overflow >= c.highWater-id:
		return nil, c.damaged("page %d runs %d pages on, past page %d", id, overflow, c.highWater-1)
	}
	for i := id; i <= id+overflow; i++ {
		if c.seen[i/64]&(1<<(i%64)) != 0 {
			return nil, c.damaged("page %d is reached twice", i)
		}
		c.seen[i/64] |= 1 << (i % 64)
	}
	if overflow > 0 {
		p = append(p, make([]byte, overflow*c.pageSize)...)
		if _, err := c.f.ReadAt(p[c.pageSize:], int64((id+1)*c.pageSize)); err != nil {
			return nil, c.damaged("page %d does not read: %v", id, err)
		}
	}
	return p, nil
}

// subtree checks the page id of a bucket's tree and every page under it,
// whose keys must be at least low and below high (nil: no bound), and
// returns the last key of its leaves, as bbolt's check does.
func (c *treeCheck) subtree(id uint64, low, high []byte) ([]byte, error) {
	p, err := c.page(id, 0)
	if err != nil {
		return nil, err
	}
	if ne.Uint16(p[8:]) == leafPageFlag {
		return c.leaf(id, p, low, high, true)
	}
	keys := make([][]byte, ne.Uint16(p[10:]))
	for i := range keys {
		if keys[i] = branchKey(p, i); keys[i] == nil {
			return nil, c.damaged("element %d of branch page %d lies past its end", i, id)
		}
	}
	prev, last := low, []byte(nil)
	for i, key := range keys {
		if !inOrder(i, key, prev, high) {
			return nil, c.damaged("key %d of branch page %d is out of order", i, id)
		}
		next := high
		if i+1 < len(keys) {
			next = keys[i+1]
		}
		child := ne.Uint64(p[pageHeaderLen+i*elementLen+8:])
		if last, err = c.subtree(child, key, next); err != nil {
			return nil, err
		}
		prev = last
	}
	return last, nil
}

// leaf checks the leaf page p (the page id, or, if not inPage, the leaf
// in the value of a bucket in page id) and the buckets it holds, and
// returns its last key.
func (c *treeCheck) leaf(id uint64, p []byte, low, high []byte, inPage bool) ([]byte, error) {
	prev, last := low, []byte(nil)
	for i := range int(ne.Uint16(p[10:])) {
		flags, key, value, ok := leafElement(p, i)
		switch {
		case !ok:
			return nil, c.damaged("element %d of leaf page %d lies past its end", i, id)
		case !inOrder(i, key, prev, high):
			return nil, c.damaged("key %d of leaf page %d is out of order", i, id)
		}
		prev, last = key, key
		switch {
		case flags&bucketLeafFlag == 0:
			continue
		case !inPage:
			return nil, c.damaged("a bucket held in the value of another in page %d holds a bucket", id)
		case len(value) < bucketHeaderLen:
			return nil, c.damaged("a bucket in page %d has a value of %d bytes", id, len(value))
		case ne.Uint64(value) != 0:
			if _, err := c.subtree(ne.Uint64(value), nil, nil); err != nil {
				return nil, err
			}
			continue
		}
		// A bucket held in its value: a leaf page of no buckets.
		in := value[bucketHeaderLen:]
		if len(in) < pageHeaderLen || ne.Uint16(in[8:]) != leafPageFlag {
			return nil, c.damaged("a bucket in page %d holds no leaf in its value", id)
		}
		if _, err := c.leaf(id, in, nil, nil, false); err != nil {
			return nil, err
		}
	}
	return last, nil
}

// branchKey returns the key of the element i of the branch page p (its
// element: the key's position from the element, its size, the child's
// page); nil when the element or its key lies past the end of p.
func branchKey(p []byte, i int) []byte {
	off := pageHeaderLen + i*elementLen
	if off+elementLen > len(p) {
		return nil
	}
	return within(p, uint64(off)+uint64(ne.Uint32(p[off:])), uint64(ne.Uint32(p[off+4:])))
}

// leafElement returns the flags, the key and the value of the element i
// of the leaf page p (its element: the flags, the key's position from the
// element, the key's size, the value's, which follows the key); false when
// the element, its key or its value lies past the end of p.
func leafElement(p []byte, i int) (flags uint32, key, value []byte, ok bool) {
	off := pageHeaderLen + i*elementLen
	if off+elementLen > len(p) {
		return 0, nil, nil, false
	}
	ksize := uint64(ne.Uint32(p[off+8:]))
	kv := within(p, uint64(off)+uint64(ne.Uint32(p[off+4:])), ksize+uint64(ne.Uint32(p[off+12:])))
	if kv == nil {
		return 0, nil, nil, false
	}
	return ne.Uint32(p[off:]), kv[:ksize], kv[ksize:], true
}

// within returns the n bytes of p from start; nil when they lie past the
// end of p.
func within(p []byte, start, n uint64) []byte {
	if start > uint64(len(p)) || n > uint64(len(p))-start {
		return nil
	}
	return p[start : start+n : start+n]
}

// freelist checks the list of free pages at page id: each page it names
// lies within the commit's pages, and out of the tree.
func (c *treeCheck) freelist(id uint64) error {
	p, err := c.page(id, freelistPageFlag)
	if err != nil {
		return err
	}
	start, n := uint64(pageHeaderLen), uint64(ne.Uint16(p[10:]))
	if n == 0xFFFF { // the count is the first id
		start, n = pageHeaderLen+8, ne.Uint64(p[pageHeaderLen:])
	}
	if start > uint64(len(p)) || n > (uint64(len(p))-start)/8 {
		return c.damaged("the list of free pages at page %d runs past its end", id)
	}
	for i := range n {
		free := ne.Uint64(p[start+8*i:])
		if free < 2 || free >= c.highWater || c.seen[free/64]&(1<<(free%64)) != 0 {
			return c.damaged("the list of free pages at page %d names page %d, which is not free", id, free)
		}
	}
	return nil
}

// inOrder reports whether key, the element index of its page, is in the
// order bbolt's check asks: the first no less than prev (the least key
// the parent allows, nil for none), each other above prev (the last key
// before it), and every one below high (nil: no bound).
func inOrder(index int, key, prev, high []byte) bool {
	cmp := bytes.Compare(prev, key)
	if index == 0 && prev != nil && cmp > 0 || index > 0 && cmp >= 0 {
		return false
	}
	return high == nil || bytes.Compare(key, high) < 0
}

// guard runs fn, a transaction of bbolt's on s.db, and returns a panic of
// bbolt's in it, or a memory fault, as an error matching ErrDamagedFile:
// bbolt trusts the pages it reads through its memory map (and the store
// the values it reads there), and Open checked them only as they were
// then. A file written by something else since, or cut short, would
// otherwise end the process, with a panic on a damaged page or with a bus
// error past the end of the file. bbolt's Update and View roll the
// transaction back as the panic passes, but its state in memory may be
// half changed: from then on, every call of the store returns the same
// error, and nothing is read or written in the file. Close still releases
// it; Open checks it again.
//
// A panic of the store's own code is not the file's: it goes on as it
// was, to the caller or to the batcher, and the store stays usable.
// A fault is caught only on the goroutine that reads the page
// (debug.SetPanicOnFault): bbolt reads on the caller's, and the store's
// transactions all run here.
func (s *Store) guard(fn func() error) (err error) {
	if e := s.broken.Load(); e != nil {
		return *e
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	returned := false
	defer func() {
		if returned || !damagePanic() {
			return
		}
		v := recover()
		e := fmt.Errorf("%w: bbolt failed reading it while the store had it open (damaged since Open: written by something else, "+
			"or cut short): %v: close the store, then %s", ErrDamagedFile, v, restoreHint)
		s.broken.CompareAndSwap(nil, &e)
		err = *s.broken.Load()
	}()
	err = fn()
	returned = true
	return err
}

// update runs fn in a write transaction of db, as db.Update does, for
// guard; but a panic passing through rolls the transaction back without
// reading the file. db.Update's rollback on a panic rebuilds the list of
// free pages by walking every page of the file (Open's NoFreelistSync):
// on a damaged file it panics again there, before it releases bbolt's
// writer lock, and Close then waits for that lock for ever. A transaction
// rolled back with Rollback only forgets the pages it took.
func update(db *bolt.DB, fn func(*bolt.Tx) error) error {
	tx, err := db.Begin(true)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // after Commit: ErrTxClosed, nothing to do
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// damagePanic reports, from a function deferred by guard, whether the
// goroutine panics because of the file: a memory fault (a page past the
// end of the file or of its mapping), or a panic raised in bbolt's code.
func damagePanic() bool {
	var pcs [64]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs[:])])
	panicking := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			panicking = true
		case f.Function == "runtime.panicmemAddr":
			// A memory fault at an address, SetPanicOnFault's, in bbolt or
			// in the store's reading of a value (a nil dereference of the
			// store's own code is runtime.panicmem, and goes on).
			return panicking
		case panicking && !strings.HasPrefix(f.Function, "runtime."):
			return strings.HasPrefix(f.Function, "go.etcd.io/bbolt.") || strings.HasPrefix(f.Function, "go.etcd.io/bbolt/")
		}
		if !more {
			return false
		}
	}
}

// openFile opens the file for bbolt: os.OpenFile, but in tests.
var openFile = os.OpenFile

// openBolt opens the bbolt file at path after checkFile, and returns
// bbolt's refusal of a file that is no bbolt database, and a panic or a
// memory fault in bbolt's Open (a page damaged since checkFile read it),
// as an error matching ErrDamagedFile.
func openBolt(path string, opts *bolt.Options) (db *bolt.DB, err error) {
	if err := checkFile(path); err != nil {
		return nil, err
	}
	// The file bbolt opens, to unlock and close on a panic: its lock would
	// hold back the next Open of the file, once restored in place. (The
	// memory map bbolt made stays, and the goroutine of its check if it
	// panicked there: nothing here can reach them. checkFile has read what
	// bbolt's Open reads, so that only a file changed since gets here.)
	var file *os.File
	o := *opts
	o.OpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := openFile(name, flag, perm)
		file = f
		return f, err
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if v := recover(); v != nil {
			if file != nil {
				unlockFile(file)
				file.Close()
			}
			db, err = nil, fmt.Errorf("%w: bbolt failed reading it: %v: "+restoreHint, ErrDamagedFile, v)
		}
	}()
	db, err = bolt.Open(path, 0o600, &o)
	if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrVersionMismatch) || errors.Is(err, berrors.ErrChecksum) {
		// No meta page reads: another program's file, named by mistake,
		// or the store's, damaged.
		err = fmt.Errorf("%w: bbolt finds no database in it (%w): check the path; if it is the store's file, "+restoreHint, ErrDamagedFile, err)
	}
	return db, err
}
