package ratelimit_test

import (
	"testing"

	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
)

// Every way of letting a reservation's job run or handing its tokens back,
// called at once from many goroutines and from a second Limiter on the
// same store: the job runs at most once, and the tokens come back at most
// once (storetest.ReservationRaces). store/boltstore runs the same on
// bbolt, whose concurrent writers share a transaction. Run it with -race.
func TestReservationSettlesOnceUnderEveryRace(t *testing.T) {
	storetest.ReservationRaces(t, must(memstore.New()))
}
