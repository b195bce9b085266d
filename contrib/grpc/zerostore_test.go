package ratelimitgrpc_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// zeroStore fails every call as a store its constructor did not make
// does, and does not say so (no driver.ZeroChecker), as a store of
// another module, or one behind a wrapper that hides it, may not.
type zeroStore struct{}

var errZero = fmt.Errorf("teststore: the store is the zero teststore.Store: build it with teststore.New: %w", driver.ErrZeroStore)

func (zeroStore) Apply(context.Context, *driver.Op, []driver.Decision) error     { return errZero }
func (zeroStore) Load(context.Context, []driver.RecordID, []driver.Record) error { return errZero }
func (zeroStore) Delete(context.Context, []driver.RecordID) error                { return errZero }

// A call over a store its constructor did not make is the service's
// error, not a store failure for the policy to decide, nor the client's
// excess: Internal, with no word of the error, which is logged; never let
// through, though its limits fail open.
func TestZeroStoreIsInternal(t *testing.T) {
	ctx := context.Background()
	lim, err := ratelimit.New(zeroStore{}, ratelimit.Limits{
		"closed": twoPerMinute,
		"open":   {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute, FailOpen: true},
		"open2":  {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Minute, FailOpen: true},
	}, ratelimit.WithClock(clock.NewMock()))
	require.NoError(t, err)
	var logs bytes.Buffer
	ic, err := ratelimitgrpc.New(lim, []string{"open"}, ratelimitgrpc.WithMethod(watchMethod, "open", "open2"),
		ratelimitgrpc.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	client, served := serve(t, []grpc.UnaryServerInterceptor{ic.Unary()}, []grpc.StreamServerInterceptor{ic.Stream()})

	for range 3 {
		_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
		st := status.Convert(err)
		assert.Equal(t, codes.Internal, st.Code())
		assert.Equal(t, "rate limit: internal error", st.Message())
		assert.Empty(t, st.Details(), "no RetryInfo: a retry gets the same")

		wctx, cancel := context.WithCancel(ctx)
		stream, err := client.Watch(wctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		_, err = stream.Recv()
		assert.Equal(t, codes.Internal, status.Code(err))
		cancel()
	}
	assert.Zero(t, served.calls.Load(), "a call let through")
	assert.Contains(t, logs.String(), "build it with teststore.New", "the store's error is logged")
	assert.Contains(t, logs.String(), "level=ERROR")
}
