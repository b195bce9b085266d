package boltstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
)

// bbolt locks its file with flock, which a second open of the file in the
// same process also waits for: Open would wait out its timeout and blame
// another process. So the process keeps a registry of the files its stores
// have open, known by identity (device and inode), not by the spelling of
// their paths, and Open refuses one already in it at once.
var registry struct {
	sync.Mutex
	files []*openEntry
}

// openEntry is a file in the registry, from Open until Close.
type openEntry struct {
	path string
	info os.FileInfo
}

// register enters the file at path in the registry, creating it if need
// be so that it has an identity, or says that it is already there.
func register(path string) (*openEntry, error) {
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		// A file this process has open exists: a new one is not among
		// them, and closing its descriptor releases no lock of theirs.
		var f *os.File
		if f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err == nil {
			info, err = f.Stat()
			f.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("boltstore: %w", err)
	}
	registry.Lock()
	defer registry.Unlock()
	for _, e := range registry.files {
		if os.SameFile(e.info, info) {
			return nil, fmt.Errorf("boltstore: open %s: this process already has the file open (as %s): share that Store, or pass its DB to New with WithBucket for a bucket of its own: %w", path, e.path, ErrAlreadyOpen)
		}
	}
	e := &openEntry{path: path, info: info}
	registry.files = append(registry.files, e)
	return e, nil
}

// release takes e out of the registry. It is idempotent.
func (e *openEntry) release() {
	registry.Lock()
	defer registry.Unlock()
	registry.files = slices.DeleteFunc(registry.files, func(f *openEntry) bool { return f == e })
}
