package ratelimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// badMarkStore answers every settlement as a store does that finds, where
// the token's mark belongs, a value it cannot read: driver.ErrBadRecord,
// settling nothing.
type badMarkStore struct{ ratelimit.Store }

func (s badMarkStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if op.Settle != nil {
		return fmt.Errorf("teststore: the mark of token %x cannot be read: the token may have been settled already: treat it as settled: %w",
			op.Settle.ID[:4], driver.ErrBadRecord)
	}
	return s.Store.Apply(ctx, op, out)
}

// A settlement that meets a mark the store cannot read settled nothing,
// and every retry meets the same mark: the store's error says to treat
// the token as settled (docs/reservations.md). The Limiter's own words
// told the caller the opposite, that the store may have taken the
// settlement and to retry it.
func TestSettlementOfAnUnreadableMarkIsNotToRetry(t *testing.T) {
	ctx := context.Background()
	store := badMarkStore{must(memstore.New())}
	lim := must(ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(newMock())))
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
	require.NoError(t, err)
	tok := r.Token()
	for name, settle := range map[string]func() error{
		"Use":    func() error { return lim.Use(ctx, tok) },
		"Refund": func() error { return lim.Refund(ctx, tok, ratelimit.Settler([16]byte{1})) },
		"Settle": func() error { return lim.Settle(ctx, tok, 1) },
		"Cancel": func() error { return r.Cancel(ctx) },
	} {
		err := settle()
		require.ErrorIs(t, err, driver.ErrBadRecord, name)
		require.NotErrorIs(t, err, ratelimit.ErrAlreadySettled, name)
		require.NotContains(t, err.Error(), "retry it", name)
		require.NotContains(t, err.Error(), "may have taken", name)
		require.ErrorContains(t, err, "the store settled nothing", name)
		require.ErrorContains(t, err, "treat the token as settled", name)
	}
}

// The errors of a settlement that cannot be made say what to do: an
// expired token's, that its job is not to run (a use) or that nothing is
// left to do (a refund, or a settlement of part of it); no token's, what
// to give instead. They said only that the token had expired, or that
// there was none.
func TestSettlementErrorsSayWhatToDo(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim := must(ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithSettleWindow(0)))
	res, err := lim.Limit(ctx, "jobs", "k", ratelimit.WithReceipt())
	require.NoError(t, err)
	mock.Add(time.Hour)

	err = lim.Use(ctx, res.Token)
	require.ErrorIs(t, err, ratelimit.ErrTokenExpired)
	require.ErrorContains(t, err, "do not run its job: reserve again to run it")
	for _, refund := range []func() error{
		func() error { return lim.Refund(ctx, res.Token) },
		func() error { return lim.Settle(ctx, res.Token, 0) },
		func() error { return lim.Settle(ctx, res.Token, 0.5) },
	} {
		err := refund()
		require.ErrorIs(t, err, ratelimit.ErrTokenExpired)
		require.ErrorContains(t, err, ": it expired at 2024-01-01T00:00:02Z; nothing was handed back (past its expiry a token hands nothing back), and nothing is left to do: ratelimit: token expired")
		require.NotContains(t, err.Error(), "a refund", "a settlement of part of it is no refund")
	}
	for _, tok := range []*ratelimit.Token{nil, {}} {
		err := lim.Use(ctx, tok)
		require.ErrorIs(t, err, ratelimit.ErrInvalidToken)
		require.ErrorContains(t, err, "give the token of a charge")
	}
}

// A Wait that gives up and meets a mark of its token the store cannot
// read says, as a settlement does, to treat the token as settled: no
// Cancel can hand its tokens back, since every one meets the same mark.
// It said to call Cancel to hand them back, beside the store's error that
// said the opposite.
func TestWaitGivingUpOnAnUnreadableMark(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim := must(ratelimit.New(badMarkStore{must(memstore.New())}, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(mock)))
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(14)) // 4 of the next window
	require.NoError(t, err)
	require.Positive(t, r.Delay())
	wctx, cancel := mock.WithTimeout(ctx, time.Second) // before the job's time
	defer cancel()
	err = r.Wait(wctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, driver.ErrBadRecord)
	require.NotErrorIs(t, err, ratelimit.ErrNotRefunded, "no Cancel hands them back")
	require.NotContains(t, err.Error(), "call Cancel")
	require.ErrorContains(t, err, "treat the token as settled")
}
