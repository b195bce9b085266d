package ratelimit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The times the errors quote are RFC 3339 in UTC, as the command
// ratelimit writes times: %v wrote an expired token's expiry as
// "2024-01-01 00:00:02 +0000 UTC", and the breaker's and a deadline's
// times in the zone they came in.
func TestErrorTimesAreRFC3339InUTC(t *testing.T) {
	cet := time.FixedZone("CET", 3600)
	var err error = &ratelimit.StoreError{Name: "api", Until: time.Date(2026, 11, 23, 23, 46, 45, 559e6, cet)}
	assert.EqualError(t, err, `ratelimit: limit "api": store not asked: it failed repeatedly; the failure policy decides until 2026-11-23T22:46:45.559Z`)

	ctx := context.Background()
	lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	_, err = lim.Limit(ctx, "jobs", "k", ratelimit.Count(10))
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4)) // runs in the next window
	require.NoError(t, err)
	dctx, cancel := context.WithDeadline(ctx, r.Time().Add(-1500*time.Millisecond).In(cet))
	defer cancel()
	err = r.Wait(dctx)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	assert.ErrorContains(t, err, "the job may run at 2024-01-01T00:01:00Z, after the context's deadline 2024-01-01T00:00:58.5Z")
}
