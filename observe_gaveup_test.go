package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Observer sees decisions: a call whose caller gave up before the
// store answered (its context ended, the store failed with its error)
// was decided by neither the store nor the failure policy, and is not
// reported; its caller has the context's error. A call the store answered
// after its caller's context ended is a decision, and is reported, a
// Reserve's as Reserved or Allowed: its Reservation holds the tokens.
func TestObserverSeesNoCallItsCallerGaveUp(t *testing.T) {
	for _, apply := range []bool{false, true} {
		for _, reserve := range []bool{false, true} {
			store := &endingStore{Store: must(memstore.New()), apply: apply}
			var events []ratelimit.Event
			obs := ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) { events = append(events, e) })
			lim := must(ratelimit.New(store, ratelimit.Limits{
				"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
			}, ratelimit.WithClock(newMock()), ratelimit.WithObserver(obs)))
			ctx, cancel := context.WithCancel(context.Background())
			store.cancel.Store(&cancel)
			var err error
			if reserve {
				_, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
			} else {
				_, err = lim.Limit(ctx, "jobs", "k", ratelimit.Count(4))
			}
			if !apply {
				require.ErrorIs(t, err, context.Canceled)
				assert.Empty(t, events, "reserve %v: no decision, no event", reserve)
				continue
			}
			require.NoError(t, err)
			require.Len(t, events, 1, "reserve %v", reserve)
			assert.Equal(t, ratelimit.Allowed, events[0].Outcome)
		}
	}
}
