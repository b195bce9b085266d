//go:build !windows && !plan9 && !solaris && !aix && !android

package boltstore

import (
	"os"
	"syscall"
)

// unlockFile releases bbolt's lock of f (flock) before f is closed: the
// memory map bbolt leaves behind after a panic in its Open holds the open
// file, and with it the lock, past Close.
func unlockFile(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
