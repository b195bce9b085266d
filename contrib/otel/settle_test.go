package ratelimitotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
)

// A settlement reaches the store as a refund; its span says which it is,
// a use or a cancel (ratelimit.settle), and, when the store found the
// token settled before and did nothing, how it was settled
// (ratelimit.settled) and whether by the same settler
// (ratelimit.settled_own), so that a trace tells a job's use from a
// refund, and a retry from a second settlement.
func TestWrapStoreSettlements(t *testing.T) {
	ctx := context.Background()
	spans, tp := newTracer(t)
	w := ratelimitotel.WrapStore(must(memstore.New()), ratelimitotel.WithTracerProvider(tp))
	lim, err := ratelimit.New(w, ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, MaxReserved: 10},
	}, ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	receipt := func() *ratelimit.Token {
		t.Helper()
		res, err := lim.Limit(ctx, "jobs", secretKey, ratelimit.WithReceipt())
		require.NoError(t, err)
		require.NotNil(t, res.Token)
		return res.Token
	}
	settler := ratelimit.Settler([16]byte{1})
	// last returns the attributes of the last span, an apply's.
	last := func() map[attribute.Key]string {
		t.Helper()
		got := spans.GetSpans()
		require.NotEmpty(t, got)
		s := got[len(got)-1]
		require.Equal(t, ratelimitotel.SpanApply, s.Name)
		return attrs(s)
	}
	settle := func(kind string) map[attribute.Key]string {
		return map[attribute.Key]string{"ratelimit.mode": "refund", "ratelimit.reserve": "false",
			"ratelimit.limits": `["jobs"]`, "ratelimit.ok": "true", "ratelimit.settle": kind}
	}
	found := func(kind, was, own string) map[attribute.Key]string {
		m := settle(kind)
		m["ratelimit.ok"] = "false" // the op did nothing
		m["ratelimit.settled"], m["ratelimit.settled_own"] = was, own
		return m
	}

	tok := receipt()
	require.NoError(t, lim.Use(ctx, tok))
	assert.Equal(t, settle("use"), last(), "Use")
	require.ErrorIs(t, lim.Refund(ctx, tok), ratelimit.ErrReservationUsed)
	assert.Equal(t, found("cancel", "use", "false"), last(), "a Refund after a Use")

	tok = receipt()
	require.NoError(t, lim.Refund(ctx, tok, settler))
	assert.Equal(t, settle("cancel"), last(), "Refund")
	require.NoError(t, lim.Refund(ctx, tok, settler))
	assert.Equal(t, found("cancel", "cancel", "true"), last(), "a Refund retried")

	tok = receipt()
	require.NoError(t, lim.Settle(ctx, tok, 0.5))
	assert.Equal(t, settle("use"), last(), "Settle of a part")

	r, err := lim.Reserve(ctx, "jobs", secretKey, ratelimit.Count(5))
	require.NoError(t, err)
	require.NoError(t, r.Cancel(ctx))
	assert.Equal(t, settle("cancel"), last(), "a Reservation's Cancel")
	require.NoError(t, r.Cancel(ctx), "the second Cancel is the reservation's own, and is not sent")

	r, err = lim.Reserve(ctx, "jobs", secretKey, ratelimit.Count(0))
	require.NoError(t, err)
	_ = r.Token() // so that its Wait reaches the store
	require.NoError(t, r.Wait(ctx))
	assert.Equal(t, settle("use"), last(), "a Reservation's Wait")

	// A plain call is no settlement.
	_, err = lim.Limit(ctx, "jobs", secretKey)
	require.NoError(t, err)
	assert.NotContains(t, last(), attribute.Key("ratelimit.settle"))
	assert.NotContains(t, last(), attribute.Key("ratelimit.settled"))
}
