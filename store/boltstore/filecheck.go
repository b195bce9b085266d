package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrDamagedFile is matched by the error of Open for a file that is not a
// bbolt database, or one that is damaged: shorter than its last commit
// (cut by a copy that did not finish, a full disk, a file system that lost
// its tail), or whose pages bbolt could not read. bbolt maps the file into
// memory and reads it there: a page past the end of a cut file would end
// the process with a bus error that no recover can catch, so Open reads
// the file's meta pages first and refuses it. Restore the file from a
// backup, or move it aside and Open the path again for an empty file (every
// limit then starts full again, and a token settled before could be
// settled once more until it expires).
var ErrDamagedFile = errors.New("boltstore: the file is damaged or is not a bbolt database")

// The layout of a bbolt meta page (bbolt's internal/common Meta, behind a
// page header of 16 bytes), in the machine's byte order, for checkFile.
const (
	pageHeaderLen  = 16
	metaLen        = 64
	metaMagic      = 0xED0CDAED
	metaVersion    = 2
	metaSumOffset  = 56 // the checksum, FNV-64a of the bytes before it
	metaPageSize   = 8  // uint32
	metaHighWater  = 40 // pgid: the first page past the file's pages
	metaTxID       = 48
	maxMetaPageLen = 1 << 16
)

// bboltMeta is what checkFile reads of a meta page.
type bboltMeta struct {
	pageSize  int64
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
	ne := binary.NativeEndian
	h := fnv.New64a()
	h.Write(m[:metaSumOffset])
	if ne.Uint32(m) != metaMagic || ne.Uint32(m[4:]) != metaVersion || ne.Uint64(m[metaSumOffset:]) != h.Sum64() {
		return bboltMeta{}, false
	}
	return bboltMeta{
		pageSize:  int64(ne.Uint32(m[metaPageSize:])),
		highWater: ne.Uint64(m[metaHighWater:]),
		txid:      ne.Uint64(m[metaTxID:]),
	}, true
}

// checkFile returns an error matching ErrDamagedFile when the bbolt file
// at path is shorter than the pages its last commit holds, as bbolt will
// read it: the meta page of the highest transaction that is valid. It
// leaves every other fault (no such file, no meta page that reads) to
// bbolt's Open, which reports it. The file's size is read after its meta
// pages: bbolt grows a file before it writes a commit's meta page, so a
// process writing the file meanwhile cannot make a sound file look cut.
func checkFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	best, ok := readMeta(f, 0)
	if ok {
		if m, ok1 := readMeta(f, best.pageSize); ok1 && m.txid > best.txid {
			best = m
		}
	} else {
		// The first meta page is damaged: look for the second, at each
		// page size bbolt may have used, as bbolt does.
		for size := int64(1024); size <= maxMetaPageLen; size *= 2 {
			if m, ok1 := readMeta(f, size); ok1 && m.pageSize == size {
				best, ok = m, true
				break
			}
		}
	}
	if !ok || best.pageSize <= 0 || best.highWater > uint64(1<<62/best.pageSize) {
		return nil
	}
	info, err := f.Stat()
	if err != nil {
		return nil
	}
	if need := int64(best.highWater) * best.pageSize; info.Size() < need {
		return fmt.Errorf("%w: it holds %d bytes, and its last commit (transaction %d) holds %d pages of %d bytes, %d bytes: "+
			"it was cut short; restore it from a backup, or move it aside to start with an empty file "+
			"(every limit starts full again)", ErrDamagedFile, info.Size(), best.txid, best.highWater, best.pageSize, need)
	}
	return nil
}

// openBolt opens the bbolt file at path after checkFile, and returns
// bbolt's refusal of a file that is no bbolt database, and a panic or a
// memory fault in bbolt's Open (a damaged page), as an error matching
// ErrDamagedFile.
func openBolt(path string, opts *bolt.Options) (db *bolt.DB, err error) {
	if err := checkFile(path); err != nil {
		return nil, err
	}
	// The file bbolt opens, to unlock and close on a panic: its lock would
	// hold back the next Open of the file, once restored in place. (The
	// memory map bbolt made stays: nothing here can reach it.)
	var file *os.File
	o := *opts
	o.OpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
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
			db, err = nil, fmt.Errorf("%w: bbolt failed reading it: %v: restore it from a backup, or move it aside to start with an empty file "+
				"(every limit starts full again)", ErrDamagedFile, v)
		}
	}()
	db, err = bolt.Open(path, 0o600, &o)
	if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrVersionMismatch) || errors.Is(err, berrors.ErrChecksum) {
		err = fmt.Errorf("%w: %w", ErrDamagedFile, err)
	}
	return db, err
}
