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

// lockFree reports whether no opener holds the flock of the file at path
// (or there is no file yet), by taking the lock on a descriptor of its own
// and releasing it at once; ok is true: flock is bbolt's lock here.
func lockFree(path string) (free, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return true, true // no file, or none to read: bbolt's Open says why
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return err != syscall.EWOULDBLOCK, true
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return true, true
}
