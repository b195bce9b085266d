//go:build windows || plan9 || solaris || aix || android

package boltstore

import "os"

// unlockFile does nothing where bbolt locks its file otherwise than by
// flock: closing the file releases the lock.
func unlockFile(*os.File) {}

// lockFree reports ok false: bbolt locks the file otherwise than by flock
// here, and waits for it itself.
func lockFree(string) (free, ok bool) { return false, false }
