package compare

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestSliceKeepsGrantsWithoutAllocating requires a slice to record its
// grants in buffers it made before its clock started: the records grew
// by append while the clock ran, so that a contender paid, in its
// decisions per second, for each grant it made. A slice of 64,000 grants
// allocates no more than one of 64, once the slice before it has sized
// the buffers.
func TestSliceKeepsGrantsWithoutAllocating(t *testing.T) {
	allocs := func(grants int) float64 {
		r := &contenderRun{keys: []string{"a", "b", "c"}, res: &Result{}}
		// Every call is granted; the grants'th ends the slice, the loop
		// looking at its context every 64 calls.
		slice := func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			calls := 0
			r.taker = TakeFunc(func(context.Context, string) (bool, error) {
				if calls++; calls == grants {
					cancel()
				}
				return true, nil
			})
			r.grants = nil // the cell's list of buffers, kept after the clock stops
			runSlice(ctx, r, 1, time.Hour, time.Now(), true, 1)
		}
		slice() // the warm-up round
		return testing.AllocsPerRun(5, slice)
	}
	// Appending made some 20 more (37 against 18). A collection that the
	// large buffers start may allocate one or two of the runtime's own.
	few, many := allocs(64), allocs(64_000)
	assert.Less(t, many, few+4, "allocations of a slice of 64,000 grants (got) against one of 64 (%v)", few)

	// And a grant kept in the room made for it allocates nothing.
	w := &worker{grants: make([]grant, 0, 1001)}
	assert.Zero(t, testing.AllocsPerRun(1000, func() { w.keep(grant{from: 1, lat: 2}) }))
}
