package pgstore_test

import (
	"context"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/stretchr/testify/require"
)

// During a rolling deploy, processes of an earlier release call the
// function this release installs, with the arguments they know: no job
// times for their refunds (they follow the marks in p_marks). Their
// refunds still work, and are judged against the time of the charge, the
// safe side: while the record owes tokens granted after it, nothing comes
// back. This release's refund of the tail, with its job time, gets it all.
func TestRefundOfAnEarlierRelease(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, testserver.PostgresURL(t), nil)
	s := newStore(t, pool)
	p := driver.Params{Kind: driver.FixedWindow, Rate: 1, Period: 1000, Capacity: 1, MaxReserved: 10}
	now := int64(1_700_000_000_000)
	item := driver.Item{Name: "jobs", Key: "k", Count: 1, Shards: []driver.Shard{{Params: p}}}
	out := make([]driver.Decision, 1)
	var runs [3]int64
	for i := range runs {
		require.NoError(t, s.Apply(ctx, &driver.Op{Now: now, Reserve: true, Items: []driver.Item{item}}, out))
		require.True(t, out[0].OK)
		runs[i] = out[0].Now + out[0].RetryAfter
	}
	require.Equal(t, [3]int64{now, now + 1000, now + 2000}, runs)

	refund := func(run int64, earlier bool) driver.Decision {
		t.Helper()
		it := item
		it.At, it.Run = now, run
		op := &driver.Op{Mode: driver.ModeRefund, Now: now, Items: []driver.Item{it}}
		if earlier {
			require.NoError(t, pgstore.ApplyAsEarlierRelease(ctx, s, op, out))
		} else {
			require.NoError(t, s.Apply(ctx, op, out))
		}
		require.True(t, out[0].OK)
		require.Equal(t, now, out[0].Now)
		return out[0]
	}
	d := refund(runs[2], true)
	require.Equal(t, 0.0, d.Charged[0], "an earlier release's refund is judged against its charge")
	require.Equal(t, -2.0, d.Remaining)
	d = refund(runs[1], false)
	require.Equal(t, 0.0, d.Charged[0], "B stands before C")
	d = refund(runs[2], false)
	require.Equal(t, -1.0, d.Charged[0], "C is the tail")
	require.Equal(t, -1.0, d.Remaining)
	// Out of debt, an earlier release's refund gives back as before.
	d = refund(runs[1], false)
	require.Equal(t, -1.0, d.Charged[0], "B is the tail now")
	d = refund(runs[0], true)
	require.Equal(t, -1.0, d.Charged[0], "A, with no debt left")
	require.Equal(t, 1.0, d.Remaining)
}
