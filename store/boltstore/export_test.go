package boltstore

import (
	"context"
	"os"

	"github.com/ratelimit-go/ratelimit/driver"
	bolt "go.etcd.io/bbolt"
)

// Hooks let the tests watch and steer a store.
type Hooks struct {
	WaitWriter func()                    // a writer finds the writer lock held
	InWrite    func(tx *bolt.Tx)         // in a batch's transaction, before its ops
	InSweep    func(tx *bolt.Tx)         // in a sweep's transaction, before its deletes
	Scanned    func()                    // a sweep's step has read its keys, before its write
	FailOp     func(op *driver.Op) error // an op fails on its own, after its writes
	Decided    func(ctx context.Context) // an op of a call of ctx was decided, in its transaction
}

// SetHooks sets s's hooks; call it before s is used.
func SetHooks(s *Store, h Hooks) {
	s.hooks = hooks{waitWriter: h.WaitWriter, inWrite: h.InWrite, inSweep: h.InSweep, scanned: h.Scanned, failOp: h.FailOp, decided: h.Decided}
}

// Queued returns how many calls wait for the next write transaction.
func Queued(s *Store) int { return s.batcher.Queued() }

// SetSweepBatch sets the most keys a transaction of DeleteExpired visits.
func SetSweepBatch(s *Store, n int) { s.sweepBatch = n }

// RecordKey is the bbolt key of id.
func RecordKey(id driver.RecordID) []byte { return appendRecordKey(nil, id) }

// MarkKey is the bbolt key of the mark of the settlement id.
func MarkKey(id [16]byte) []byte { return markKey(id) }

// SetTreeRefused sets a function that Open calls when it has found the
// tree of the file's last commit damaged, before it reads the file's meta
// pages again; nil unsets it.
func SetTreeRefused(f func()) { treeRefused = f }

// SetLockWait sets a function that OpenContext calls each time it finds
// the file held, before it waits to try again; nil unsets it.
func SetLockWait(f func()) { lockWait = f }

// SetOpenFile sets the function with which Open's bbolt opens the file,
// in place of os.OpenFile; nil restores it.
func SetOpenFile(f func(name string, flag int, perm os.FileMode) (*os.File, error)) {
	if f == nil {
		f = os.OpenFile
	}
	openFile = f
}
