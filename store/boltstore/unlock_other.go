//go:build windows || plan9 || solaris || aix || android

package boltstore

import "os"

// unlockFile does nothing where bbolt locks its file otherwise than by
// flock: closing the file releases the lock.
func unlockFile(*os.File) {}
