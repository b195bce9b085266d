package memstore_test

import (
	"context"
	"testing"
	"time"

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
