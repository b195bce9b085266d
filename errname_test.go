package ratelimit_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// Every error that shows a limit's name shows it as the errors of a
// limits file and a refused call do (LimitError, ConfigError): quoted and
// cut to its first 256 bytes, followed by its length. A name of a
// megabyte (of 60,000 bytes where a token carries it) was printed whole,
// in a message as long, by every path below.
func TestErrorsShowALongNameCut(t *testing.T) {
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}
	other := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Second}
	errDown := errors.New("store down")
	type env struct {
		ctx   context.Context
		mock  interface{ Add(time.Duration) }
		lim   *ratelimit.Limiter
		store *hookStore
	}
	setup := func(t *testing.T, long string, opts ...ratelimit.Option) env {
		mock := newMock()
		store := &hookStore{Store: must(memstore.New())}
		lim, err := ratelimit.New(store, ratelimit.Limits{long: cfg}, append([]ratelimit.Option{ratelimit.WithClock(mock)}, opts...)...)
		require.NoError(t, err)
		return env{context.Background(), mock, lim, store}
	}
	ended := func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	// delayed returns a reservation of the limit's second token, which
	// waits a second for it.
	delayed := func(t *testing.T, long string, e env) *ratelimit.Reservation {
		_, err := e.lim.Limit(e.ctx, long, "k")
		require.NoError(t, err)
		r, err := e.lim.Reserve(e.ctx, long, "k", ratelimit.WithReserve())
		require.NoError(t, err)
		require.True(t, r.OK())
		require.True(t, len(long) > 64<<10 || r.Token() != nil)
		return r
	}
	outOfRange := func(t *testing.T, long string, opts ...ratelimit.Option) env {
		mock := newMock()
		mock.Set(time.UnixMilli(1<<52 + 1))
		lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{long: cfg}, append([]ratelimit.Option{ratelimit.WithClock(mock)}, opts...)...)
		require.NoError(t, err)
		return env{ctx: context.Background(), lim: lim}
	}
	for _, tc := range []struct {
		name  string
		do    func(t *testing.T, long string) error
		token bool // the name goes in a token, which holds at most 64 KiB
	}{
		{"limit not declared", func(t *testing.T, long string) error {
			lim, err := ratelimit.New(must(memstore.New()), nil, ratelimit.WithClock(newMock()))
			require.NoError(t, err)
			_, err = lim.Limit(context.Background(), long, "k")
			return err
		}, false},
		{"declared with another config", func(t *testing.T, long string) error {
			e := setup(t, long)
			_, err := e.lim.Limit(e.ctx, long, "k", ratelimit.WithConfig(other))
			return err
		}, false},
		{"LimitAll names it twice", func(t *testing.T, long string) error {
			e := setup(t, long)
			_, err := e.lim.LimitAll(e.ctx, "k", []string{long, long})
			return err
		}, false},
		{"Limit, context ended", func(t *testing.T, long string) error {
			_, err := setup(t, long).lim.Limit(ended(), long, "k")
			return err
		}, false},
		{"Reserve, context ended", func(t *testing.T, long string) error {
			_, err := setup(t, long).lim.Reserve(ended(), long, "k", ratelimit.WithReserve())
			return err
		}, false},
		{"LimitAll, context ended", func(t *testing.T, long string) error {
			_, err := setup(t, long).lim.LimitAll(ended(), "k", []string{long})
			return err
		}, false},
		{"Limit, time out of range", func(t *testing.T, long string) error {
			e := outOfRange(t, long)
			_, err := e.lim.Limit(e.ctx, long, "k")
			return err
		}, false},
		{"Reserve, time out of range", func(t *testing.T, long string) error {
			e := outOfRange(t, long)
			_, err := e.lim.Reserve(e.ctx, long, "k", ratelimit.WithReserve())
			return err
		}, false},
		{"LimitAll, time out of range", func(t *testing.T, long string) error {
			e := outOfRange(t, long)
			_, err := e.lim.LimitAll(e.ctx, "k", []string{long})
			return err
		}, false},
		{"Value, time out of range", func(t *testing.T, long string) error {
			e := outOfRange(t, long)
			_, err := e.lim.Value(e.ctx, long, "k")
			return err
		}, false},
		{"caller gave up, store said the same", func(t *testing.T, long string) error {
			e := setup(t, long)
			ctx, cancel := context.WithCancel(e.ctx)
			e.store.apply = func(context.Context, string) error { cancel(); return context.Canceled }
			_, err := e.lim.LimitAll(ctx, "k", []string{long})
			return err
		}, false},
		{"caller gave up, store said else", func(t *testing.T, long string) error {
			e := setup(t, long)
			ctx, cancel := context.WithCancel(e.ctx)
			e.store.apply = func(context.Context, string) error { cancel(); return errDown }
			_, err := e.lim.LimitAll(ctx, "k", []string{long})
			return err
		}, false},
		{"Value, caller gave up, store said the same", func(t *testing.T, long string) error {
			e := setup(t, long)
			ctx, cancel := context.WithCancel(e.ctx)
			e.store.load = func(context.Context, string) error { cancel(); return context.Canceled }
			_, err := e.lim.Value(ctx, long, "k")
			return err
		}, false},
		{"Value, caller gave up, store said else", func(t *testing.T, long string) error {
			e := setup(t, long)
			ctx, cancel := context.WithCancel(e.ctx)
			e.store.load = func(context.Context, string) error { cancel(); return errDown }
			_, err := e.lim.Value(ctx, long, "k")
			return err
		}, false},
		{"Wait gave up", func(t *testing.T, long string) error {
			e := setup(t, long)
			r := delayed(t, long, e)
			return r.Wait(ended())
		}, false},
		{"Wait gave up, refund timeout 0", func(t *testing.T, long string) error {
			e := setup(t, long, ratelimit.WithRefundTimeout(0))
			r := delayed(t, long, e)
			return r.Wait(ended())
		}, false},
		{"Wait after Cancel", func(t *testing.T, long string) error {
			e := setup(t, long)
			r := delayed(t, long, e)
			require.NoError(t, r.Cancel(e.ctx))
			return r.Wait(e.ctx)
		}, false},
		{"Wait after Wait", func(t *testing.T, long string) error {
			e := setup(t, long)
			r, err := e.lim.Reserve(e.ctx, long, "k", ratelimit.WithReserve())
			require.NoError(t, err)
			require.NoError(t, r.Wait(e.ctx))
			return r.Wait(e.ctx)
		}, false},
		{"Cancel after Wait", func(t *testing.T, long string) error {
			e := setup(t, long)
			r, err := e.lim.Reserve(e.ctx, long, "k", ratelimit.WithReserve())
			require.NoError(t, err)
			require.NoError(t, r.Wait(e.ctx))
			return r.Cancel(e.ctx)
		}, false},
		{"Wait while an AfterFunc is under way", func(t *testing.T, long string) error {
			e := setup(t, long)
			r := delayed(t, long, e)
			_, err := r.AfterFunc(func() {})
			require.NoError(t, err)
			return r.Wait(e.ctx)
		}, false},
		{"Wait after a holder's use", func(t *testing.T, long string) error {
			e := setup(t, long)
			r := delayed(t, long, e)
			require.NoError(t, e.lim.Use(e.ctx, r.Token()))
			e.mock.Add(time.Second)
			return r.Wait(e.ctx)
		}, true},
		{"Cancel after a holder's use", func(t *testing.T, long string) error {
			e := setup(t, long)
			r := delayed(t, long, e)
			require.NoError(t, e.lim.Use(e.ctx, r.Token()))
			return r.Cancel(e.ctx)
		}, true},
		{"Wait after a holder's refund", func(t *testing.T, long string) error {
			e := setup(t, long)
			r := delayed(t, long, e)
			require.NoError(t, e.lim.Refund(e.ctx, r.Token()))
			e.mock.Add(time.Second)
			return r.Wait(e.ctx)
		}, true},
		{"Cancel after a holder's refund", func(t *testing.T, long string) error {
			e := setup(t, long)
			r := delayed(t, long, e)
			require.NoError(t, e.lim.Refund(e.ctx, r.Token()))
			return r.Cancel(e.ctx)
		}, true},
		{"Cancel, store down", func(t *testing.T, long string) error {
			e := setup(t, long)
			r := delayed(t, long, e)
			e.store.apply = func(context.Context, string) error { return errDown }
			return r.Cancel(e.ctx)
		}, false},
		{"settle a token of a limit not declared", func(t *testing.T, long string) error {
			e := setup(t, long)
			r := delayed(t, long, e)
			lim, err := ratelimit.New(must(memstore.New()), nil, ratelimit.WithClock(newMock()))
			require.NoError(t, err)
			return lim.Use(e.ctx, r.Token())
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			long := strings.Repeat("n", 1<<20)
			if tc.token {
				long = long[:60_000]
			}
			shown := strconv.Quote(long[:256]) + "… (" + strconv.Itoa(len(long)) + " bytes)"
			err := tc.do(t, long)
			require.Error(t, err)
			msg := err.Error()
			require.Less(t, len(msg), 1<<10, "the message is bounded: %.300s", msg)
			require.Contains(t, msg, shown, "the message names the limit as written does")
		})
	}
}
