package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// serversClock is a store over servers whose clocks disagree
// (driver.RecordClock): the server of its records is an hour behind
// the one its Now reads, and judges every op at its own time.
type serversClock struct {
	*Model
	now int64 // Unix milliseconds, the time Now reads
}

func (s serversClock) OwnClock() bool                     { return true }
func (s serversClock) Now(context.Context) (int64, error) { return s.now, nil }
func (s serversClock) recordNow() int64                   { return s.now - time.Hour.Milliseconds() }
func (s serversClock) RecordNow(context.Context, driver.RecordID) (int64, error) {
	return s.recordNow(), nil
}

func (s serversClock) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	o := *op
	o.Now = s.recordNow()
	return s.Model.Apply(ctx, &o, out)
}

// The store failing wraps for the retry cases keeps the clock of each
// record (driver.RecordClock) as well as its own clock, so that a
// Limiter settles a token through it at the time of the token's server,
// as it would through the store: it kept the TimeSource only, and the
// Limiter read the time of any server, here one an hour ahead, at which
// a token just made reads as expired.
func TestFailingKeepsRecordClock(t *testing.T) {
	ctx := context.Background()
	store := serversClock{NewModel(), epoch.UnixMilli()}
	wrapped, _ := failing(store)
	_, ok := wrapped.(driver.RecordClock)
	require.True(t, ok, "the wrapper is a driver.RecordClock")
	lim, err := ratelimit.New(wrapped, ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute}})
	require.NoError(t, err)
	res, err := lim.Limit(ctx, "jobs", "k", ratelimit.WithReceipt())
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, lim.Refund(ctx, res.Token), "a refund of a token just made, at the time of its server")
}
