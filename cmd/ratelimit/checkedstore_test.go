package main

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// serverClock is a store that judges at a clock of its own, as a Redis or
// PostgreSQL store given WithServerTime does: at now, whatever Op.Now.
type serverClock struct {
	*memstore.Store
	now int64 // Unix milliseconds
}

func (s serverClock) OwnClock() bool                     { return true }
func (s serverClock) Now(context.Context) (int64, error) { return s.now, nil }
func (s serverClock) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	o := *op
	o.Now = s.now
	return s.Store.Apply(ctx, &o, out)
}

// inspect and limit read through a checkedStore, which keeps the store's
// own clock: inspect --server-time judged the records at this machine's
// time, as the wrapper hid the store's TimeSource from the Limiter.
func TestCheckedStoreKeepsServerTime(t *testing.T) {
	// The server's clock is 10 hours behind this machine's: a bucket
	// emptied at the server's time is still empty by it, and full again
	// by this machine's.
	store := serverClock{Store: must(memstore.New()), now: time.Now().Add(-10 * time.Hour).UnixMilli()}
	require.Equal(t, 0.0, remainingAfterOne(t, store), "the tokens at the server's time, not at this machine's")
}

// recordClock is a serverClock whose records' server keeps another clock
// than the one its Now reads, as a Redis Cluster's servers may
// (driver.RecordClock): it judges every op at recordNow.
type recordClock struct {
	serverClock
	recordNow int64 // Unix milliseconds
}

func (s recordClock) RecordNow(context.Context, driver.RecordID) (int64, error) {
	return s.recordNow, nil
}
func (s recordClock) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	o := *op
	o.Now = s.recordNow
	return s.Store.Apply(ctx, &o, out)
}

// inspect and limit read through a checkedStore, which keeps the store's
// clock of each record (driver.RecordClock): on a Cluster, inspect
// --server-time judged a key's records at the time of any of its servers,
// as the wrapper hid it from the Limiter.
func TestCheckedStoreKeepsRecordClock(t *testing.T) {
	// The key's server is 10 hours behind the one Now reads.
	now := time.Now()
	store := recordClock{serverClock{Store: must(memstore.New()), now: now.UnixMilli()}, now.Add(-10 * time.Hour).UnixMilli()}
	require.Equal(t, 0.0, remainingAfterOne(t, store), "the tokens at the time of the key's server")
}

// remainingAfterOne takes the one token of a bucket of 1 an hour through
// a checkedStore over store, and returns the tokens Value reads after.
func remainingAfterOne(t *testing.T, store ratelimit.Store) float64 {
	t.Helper()
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour}
	lim, err := ratelimit.New(newCheckedStore(store), ratelimit.Limits{"x": cfg})
	require.NoError(t, err)
	res, err := lim.Limit(context.Background(), "x", "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	st, err := lim.Value(context.Background(), "x", "k")
	require.NoError(t, err)
	return st.Remaining
}
