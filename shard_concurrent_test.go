package ratelimit_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
)

// Sharded reservations made at once by many goroutines of two Limiters on
// one store, while the clock runs and reservations are canceled, never
// schedule more than the limit into a window
// (storetest.ShardedReservationsAtOnce). store/boltstore runs the same on
// bbolt.
func TestShardedReservationsAtOnceKeepEveryWindow(t *testing.T) {
	storetest.ShardedReservationsAtOnce(t, must(memstore.New()))
}
