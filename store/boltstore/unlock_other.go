//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package boltstore

import "os"

// unlockFile does nothing where bbolt locks its file otherwise than by
// flock: closing the file releases the lock.
func unlockFile(*os.File) {}
