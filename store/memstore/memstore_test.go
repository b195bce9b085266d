package memstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) ratelimit.Store { return memstore.New() })
}

func TestModelConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) ratelimit.Store { return storetest.NewModel() })
}

// A call judged at a now read a moment before a record's FullAt may reach
// the store after a later call has swept expired records: it must still
// see the record, not a full bucket.
func TestLateCallAfterDeletion(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	p := ratelimit.Params{Kind: ratelimit.FixedWindow, Rate: 10, Period: 1000, Capacity: 10}
	item := ratelimit.Item{Name: "l", Key: "k", Count: 10, Shards: []ratelimit.Shard{{Params: p}}}
	out := make([]ratelimit.Decision, 1)
	require.NoError(t, s.Apply(ctx, &ratelimit.Op{Now: 5_500, Items: []ratelimit.Item{item}}, out))
	require.True(t, out[0].OK) // drained; full again at 6_000
	s.DeleteExpired(time.UnixMilli(6_000))
	late := &ratelimit.Op{Now: 5_999, Items: []ratelimit.Item{item}}
	require.NoError(t, s.Apply(ctx, late, out))
	require.False(t, out[0].OK, "a call judged in the drained window found a full bucket")
	// Once the grace has passed, the record goes.
	s.DeleteExpired(time.UnixMilli(6_000 + ratelimit.ExpiryGrace))
	require.Zero(t, s.Len())
}

// A calls' clock that steps forward, then back, must not mint tokens:
// sweeps made by other keys at the forward time used to drop a drained
// record, and after the clock came back the key was full again (10
// grants where none were due; the other stores granted none).
func TestClockStepForwardAndBackMintsNothing(t *testing.T) {
	ctx := context.Background()
	mock := clock.NewMock()
	start := time.UnixMilli(1_700_000_040_000)
	mock.Set(start)
	lim, err := ratelimit.New(memstore.New(), ratelimit.Limits{
		"l": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: time.UnixMilli(0)},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "l", "drained", ratelimit.Count(10))
	require.NoError(t, err)
	require.True(t, res.OK)

	mock.Set(start.Add(3 * time.Hour))
	for i := range 5000 {
		_, err := lim.Limit(ctx, "l", fmt.Sprint("other-", i))
		require.NoError(t, err)
	}
	mock.Set(start.Add(time.Second))
	granted := 0
	for range 10 {
		res, err := lim.Limit(ctx, "l", "drained")
		require.NoError(t, err)
		if res.OK {
			granted++
		}
	}
	require.Zero(t, granted, "the window was drained before the clock jumped")
}
