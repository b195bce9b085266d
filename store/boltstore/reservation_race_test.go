package boltstore_test

import (
	"path/filepath"
	"testing"

	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// The root package's attacks on reservations and sharding, run on bbolt:
// its concurrent writers share a transaction, and a caller whose context
// ends while its batch commits leaves with the context's error, though the
// commit may take its settlement (an answer lost).

// rrStore opens a store in a temporary file without fsync: the tests are
// of its atomicity, not its durability, and must take seconds.
func rrStore(t *testing.T) *boltstore.Store {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "reservations.db"), 0o600, &bolt.Options{NoSync: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	s, err := boltstore.New(db)
	require.NoError(t, err)
	return s
}

// Every way of running or cancelling a reservation, at once, from two
// Limiters: the job runs once, the tokens come back once
// (storetest.ReservationRaces).
func TestReservationSettlesOnceUnderEveryRace(t *testing.T) {
	storetest.ReservationRaces(t, rrStore(t))
}

// Sharded reservations at once from two Limiters, with cancels and
// refunds, keep every window within the limit
// (storetest.ShardedReservationsAtOnce).
func TestShardedReservationsAtOnceKeepEveryWindow(t *testing.T) {
	storetest.ShardedReservationsAtOnce(t, rrStore(t))
}
