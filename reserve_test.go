package ratelimit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newReserveLimiter(t *testing.T, cfg ratelimit.Config) (*ratelimit.Limiter, *clock.Mock) {
	t.Helper()
	mock := newMock()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"jobs": cfg}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	return lim, mock
}

// jobsLimiter returns a Limiter over store, on a mock clock, of the limit
// "jobs": a fixed window of 10 a minute from t0.
func jobsLimiter(store ratelimit.Store) *ratelimit.Limiter {
	return must(ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(newMock())))
}

// advanceUntil moves the mock clock forward in steps until done is closed
// (or the clock has moved by limit), and returns the clock's time then.
func advanceUntil(t *testing.T, mock *clock.Mock, done <-chan struct{}, step, limit time.Duration) time.Time {
	t.Helper()
	end := mock.Now().Add(limit)
	for {
		select {
		case <-done:
			return mock.Now()
		default:
		}
		if !mock.Now().Before(end) {
			t.Fatalf("still waiting after the clock moved by %v", limit)
		}
		mock.Add(step)
	}
}

func TestReservationWait(t *testing.T) {
	ctx := context.Background()
	lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Start: t0})

	first, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(10))
	require.NoError(t, err)
	require.True(t, first.OK())
	assert.Equal(t, time.Duration(0), first.Delay())
	require.NoError(t, first.Wait(ctx), "a job whose tokens are there runs at once")

	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(5))
	require.NoError(t, err)
	require.True(t, r.OK())
	assert.Equal(t, t0.Add(time.Second), r.Time())
	assert.True(t, r.Result().Reserved())

	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = r.Wait(ctx); close(done) }()
	at := advanceUntil(t, mock, done, 50*time.Millisecond, 5*time.Second)
	require.NoError(t, waitErr)
	assert.False(t, at.Before(r.Time()), "Wait returned at %v, before the job's time %v", at, r.Time())
}

func TestReservationAfterFunc(t *testing.T) {
	ctx := context.Background()
	lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Second, Capacity: 2})
	_, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(2))
	require.NoError(t, err)

	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(3))
	require.NoError(t, err)
	require.Equal(t, 1500*time.Millisecond, r.Result().RetryAfter)
	ran := make(chan time.Time, 1)
	_, err = r.AfterFunc(func() { ran <- mock.Now() })
	require.NoError(t, err)
	mock.Add(1499 * time.Millisecond)
	select {
	case <-ran:
		t.Fatal("the job ran before its time")
	default:
	}
	mock.Add(time.Millisecond)
	assert.Equal(t, t0.Add(1500*time.Millisecond), <-ran)

	// A stopped job hands its tokens back.
	r2, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(1))
	require.NoError(t, err)
	stop, err := r2.AfterFunc(func() { t.Error("a stopped job ran") })
	require.NoError(t, err)
	before, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	require.True(t, stop(ctx))
	after, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, before.Remaining+1, after.Remaining)
	assert.False(t, stop(ctx), "a job stops once")
	mock.Add(time.Minute)
}

func TestReservationCancel(t *testing.T) {
	ctx := context.Background()
	lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	_, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(4))
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(9))
	require.NoError(t, err)
	require.True(t, r.OK())
	st, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	require.Equal(t, -3.0, st.Remaining)

	require.NoError(t, r.Cancel(ctx))
	st, err = lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, 6.0, st.Remaining, "cancel hands the 9 tokens back")
	require.NoError(t, r.Cancel(ctx))
	st, err = lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, 6.0, st.Remaining, "only once")
	assert.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)

	// Capped at capacity: a refund after the bucket refilled adds nothing
	// beyond it.
	r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(6))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "jobs", "k", ratelimit.Count(0))
	require.NoError(t, err)
	require.NoError(t, lim.Reset(ctx, "jobs", "k"))
	require.NoError(t, r.Cancel(ctx))
	st, err = lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, 10.0, st.Remaining)
}

func TestReservationShardedCancel(t *testing.T) {
	ctx := context.Background()
	lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 40, Period: time.Minute, Shards: 4, Start: t0})
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(16)) // more than one shard holds
	require.NoError(t, err)
	require.True(t, r.OK())
	st, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	require.Equal(t, 24.0, st.Remaining)
	require.NoError(t, r.Cancel(ctx))
	st, err = lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, 40.0, st.Remaining)
	for _, sh := range st.Shards {
		assert.Equal(t, 10.0, sh.Remaining, "shard %d gets back what it gave", sh.Index)
	}
}

func TestReservationDeadline(t *testing.T) {
	ctx := context.Background()
	lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, Capacity: 1})
	_, err := lim.Limit(ctx, "jobs", "k")
	require.NoError(t, err)

	// A deadline before the job's time, also one already passed: the
	// refund used to be sent with the done context itself, which the
	// store refused, so that the tokens stayed charged (-5 left, not 0).
	for _, deadline := range []time.Duration{2 * time.Second, 0} {
		r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(5)) // runs in 5 s
		require.NoError(t, err)
		dctx, cancel := mock.WithTimeout(ctx, deadline)
		err = r.Wait(dctx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NotErrorIs(t, err, ratelimit.ErrNotRefunded)
		assert.Equal(t, t0, mock.Now(), "Wait returns at once when the deadline comes first")
		st, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		assert.Equal(t, 0.0, st.Remaining, "and the tokens are handed back (deadline %v)", deadline)
	}

	// Canceled while waiting: tokens handed back too.
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(3))
	require.NoError(t, err)
	cctx, cancelWait := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Wait(cctx) }()
	cancelWait()
	require.ErrorIs(t, <-done, context.Canceled)
	st, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, 0.0, st.Remaining)
}

// A canceled reservation never runs AfterFunc's fn: AfterFunc says so, and
// its stop reports false. AfterFunc used to schedule fn all the same (which
// then found the reservation canceled), and stop reported true, as if it
// had stopped a job that was going to run.
func TestAfterFuncOfCanceledReservation(t *testing.T) {
	ctx := context.Background()
	lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	_, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(10))
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(1)) // next window
	require.NoError(t, err)
	require.True(t, r.OK())
	require.NoError(t, r.Cancel(ctx))
	stop, err := r.AfterFunc(func() { t.Error("a canceled reservation ran fn") })
	require.ErrorIs(t, err, ratelimit.ErrReservationCanceled)
	assert.False(t, stop(ctx), "stop of a canceled reservation reports false")
	mock.Add(2 * time.Minute)
}

// A reservation runs one job. A second AfterFunc, or a Wait, while an
// AfterFunc of it is under way fails at once with ErrReservationScheduled
// and schedules nothing; once the job was let run, by AfterFunc or by Wait,
// another fails with ErrReservationUsed. Both AfterFuncs used to run their
// function, and a Wait after them returned nil: the job ran three times on
// one reservation's tokens.
func TestReservationRunsOneJob(t *testing.T) {
	ctx := context.Background()
	for _, receipt := range []bool{false, true} {
		lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0, MaxReserved: 10})
		var opts []ratelimit.CallOption
		if receipt {
			opts = append(opts, ratelimit.WithReceipt()) // the use goes through the store
		}
		reserve := func(n float64) *ratelimit.Reservation {
			r, err := lim.Reserve(ctx, "jobs", "k", append(opts, ratelimit.Count(n))...)
			require.NoError(t, err)
			require.True(t, r.OK())
			return r
		}
		var runs atomic.Int32
		job := func() { runs.Add(1) }

		// AfterFunc first.
		r := reserve(4)
		stop, err := r.AfterFunc(job)
		require.NoError(t, err)
		stop2, err := r.AfterFunc(job)
		require.ErrorIs(t, err, ratelimit.ErrReservationScheduled, "receipt %v: a second AfterFunc while the first is under way", receipt)
		assert.False(t, stop2(ctx), "receipt %v: the stop of an AfterFunc that scheduled nothing", receipt)
		require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationScheduled, "receipt %v: a Wait while AfterFunc is under way", receipt)
		mock.Add(0) // the mock clock runs the function now, on this goroutine
		require.Equal(t, int32(1), runs.Load(), "receipt %v: the job ran once", receipt)
		assert.False(t, stop(ctx), "receipt %v", receipt)
		_, err = r.AfterFunc(job)
		require.ErrorIs(t, err, ratelimit.ErrReservationUsed, "receipt %v: AfterFunc after the job ran", receipt)
		require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationUsed, "receipt %v: Wait after the job ran", receipt)
		mock.Add(time.Minute)
		require.Equal(t, int32(1), runs.Load(), "receipt %v: the job ran once", receipt)

		// Wait first.
		r = reserve(2)
		require.NoError(t, r.Wait(ctx))
		_, err = r.AfterFunc(job)
		require.ErrorIs(t, err, ratelimit.ErrReservationUsed, "receipt %v: AfterFunc after Wait let the job run", receipt)

		// Stopped, the job is canceled: no AfterFunc runs it again.
		r = reserve(1)
		stop, err = r.AfterFunc(job)
		require.NoError(t, err)
		require.True(t, stop(ctx))
		_, err = r.AfterFunc(job)
		require.ErrorIs(t, err, ratelimit.ErrReservationCanceled, "receipt %v: AfterFunc after stop", receipt)
		mock.Add(time.Minute)
		require.Equal(t, int32(1), runs.Load(), "receipt %v: no other job ran", receipt)

		// Refused (past MaxReserved): AfterFunc says why.
		reserve(15)
		refused, err := lim.Reserve(ctx, "jobs", "k", append(opts, ratelimit.Count(10))...)
		require.NoError(t, err)
		require.False(t, refused.OK())
		_, err = refused.AfterFunc(job)
		require.ErrorIs(t, err, ratelimit.ErrLimited, "receipt %v", receipt)
	}
}

// A Wait after a Wait that let the job run fails with ErrReservationUsed,
// with or without a token. It returned nil, so that a caller that waited
// twice (two goroutines given one reservation) ran the job twice.
func TestSecondWaitAfterTheJobRan(t *testing.T) {
	ctx := context.Background()
	for _, receipt := range []bool{false, true} {
		lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
		opts := []ratelimit.CallOption{ratelimit.Count(2)}
		if receipt {
			opts = append(opts, ratelimit.WithReceipt())
		}
		r, err := lim.Reserve(ctx, "jobs", "k", opts...)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx))
		require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationUsed, "receipt %v: a second Wait", receipt)
	}
}

// An AfterFunc whose use the store failed did not run its function and
// let go of the job: a new AfterFunc tries the use again, and runs the job
// once the store answers, finding the first attempt's use its own.
func TestAfterFuncAgainAfterAStoreFailure(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := &lostReplyStore{Store: must(memstore.New())}
	lim := must(ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(mock)))
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
	require.NoError(t, err)
	var runs atomic.Int32
	store.lose.Store(true)
	_, err = r.AfterFunc(func() { runs.Add(1) })
	require.NoError(t, err)
	mock.Add(0)
	require.Equal(t, int32(0), runs.Load(), "the store failed: the job does not run")
	store.lose.Store(false)
	_, err = r.AfterFunc(func() { runs.Add(1) })
	require.NoError(t, err, "the failed AfterFunc let go of the job")
	mock.Add(0)
	require.Equal(t, int32(1), runs.Load())
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed)
}

func TestReservationRefusedPastMaxReserved(t *testing.T) {
	ctx := context.Background()
	lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, MaxReserved: 20})
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(30)) // 10 now, 20 owed
	require.NoError(t, err)
	require.True(t, r.OK())
	assert.Equal(t, 2*time.Second, r.Delay())

	refused, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(5))
	require.NoError(t, err)
	require.False(t, refused.OK())
	assert.Equal(t, 500*time.Millisecond, refused.Result().RetryAfter, "the wait until 5 more fit in MaxReserved")
	err = refused.Wait(ctx)
	require.ErrorIs(t, err, ratelimit.ErrLimited)
	var le *ratelimit.LimitError
	require.True(t, errors.As(err, &le))
	require.NoError(t, refused.Cancel(ctx), "nothing to hand back")
	st, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, -20.0, st.Remaining)
}

// A reservation of Capacity plus MaxReserved on a full bucket owes exactly
// MaxReserved, which the float arithmetic may overstate by noise (1 − 1.3
// is −0.30000000000000004, against a MaxReserved of 0.3): it is granted.
// It was refused, and refused again at every retry: a full bucket cannot
// grow, so a count New accepts could never be granted. A sharded limit
// has the same case on two full shards, which the count leaves each owing
// its MaxReserved.
func TestReservationOfCapacityPlusMaxReservedOnAFullBucket(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []ratelimit.Kind{ratelimit.FixedWindow, ratelimit.TokenBucket} {
		for _, shards := range []int{1, 2} {
			t.Run(fmt.Sprintf("%v/%d shards", kind, shards), func(t *testing.T) {
				n := float64(shards)
				cfg := ratelimit.Config{Kind: kind, Rate: n, Capacity: n, MaxReserved: 0.3 * n, Period: time.Second, Shards: shards}
				if kind == ratelimit.FixedWindow {
					cfg.Start = time.UnixMilli(0)
				}
				lim, _ := newReserveLimiter(t, cfg)
				res, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(1.3*n), ratelimit.WithReserve())
				require.NoError(t, err, "the count is within Capacity plus MaxReserved")
				require.True(t, res.OK, "a debt of MaxReserved, overstated by float noise, is within MaxReserved")
				assert.InDelta(t, -0.3*n, res.Remaining, 1e-9)
				// Its tokens are granted when the debt, 0.30000000000000004
				// on each shard it took from, is paid to within the noise:
				// at 300 ms (1 per second), not 301; a window for a fixed
				// window.
				want := 300 * time.Millisecond
				if kind == ratelimit.FixedWindow {
					want = time.Second
				}
				assert.Equal(t, want, res.RetryAfter)
			})
		}
	}
}

// Once a job was let run, its tokens are spent: Cancel hands nothing
// back and says so. It used to refund them (6 → 10 tokens), so that a
// job could run and have its tokens back.
func TestCancelAfterTheJobRan(t *testing.T) {
	ctx := context.Background()
	lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})

	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx), "may run now")
	err = r.Cancel(ctx)
	require.ErrorIs(t, err, ratelimit.ErrReservationUsed)
	st, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, 6.0, st.Remaining, "nothing handed back after Wait let the job run")

	r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(2))
	require.NoError(t, err)
	ran := make(chan struct{})
	stop, err := r.AfterFunc(func() { close(ran) })
	require.NoError(t, err)
	mock.Add(time.Millisecond)
	<-ran
	assert.False(t, stop(ctx), "already ran")
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed)
	st, err = lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, 4.0, st.Remaining, "nothing handed back after AfterFunc ran the job")

	// Canceled first: the job never runs.
	r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(1))
	require.NoError(t, err)
	require.NoError(t, r.Cancel(ctx))
	require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
}

// A cancel after the reservation's tokens were granted gives back only
// what the grants since could not have covered: the window that paid for
// the job cannot also serve the refund. With a limit of 10 per minute,
// the second window here served 7 plain calls and the reservation's 3; a
// late refund of all 9 tokens used to let it serve 9 more.
func TestLateCancelDoesNotServeAWindowTwice(t *testing.T) {
	ctx := context.Background()
	lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	_, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(4))
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(9)) // 6 now, 3 of the next window
	require.NoError(t, err)
	require.Equal(t, time.Minute, r.Delay())

	mock.Add(time.Minute + time.Second)
	res, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(7))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.NoError(t, r.Cancel(ctx), "the job was never let run")
	served := 7.0
	for {
		res, err := lim.Limit(ctx, "jobs", "k")
		require.NoError(t, err)
		if !res.OK {
			break
		}
		served++
	}
	assert.LessOrEqual(t, served, 10.0, "the window's grant is 10")

	// Within its own window, a cancel gives everything back.
	r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(5))
	require.NoError(t, err)
	before, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	require.NoError(t, r.Cancel(ctx))
	after, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, before.Remaining+5, after.Remaining)
}

// Reserve reports a store failure as Limit does; the reservation it
// returns beside the error is the failure policy's and holds nothing.
func TestReserveReportsStoreFailure(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	store.fail.Store(true)
	r, err := lim.Reserve(ctx, "jobs", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.NotNil(t, r)
	assert.False(t, r.OK())
	assert.True(t, r.Result().Degraded)
}

// A reservation granted by the failure policy (fail open) holds no tokens,
// yet Cancel must still cancel it: Wait then refuses the job with
// ErrReservationCanceled. Cancel used to return nil and leave it as it
// was, so that Wait let the canceled job run.
func TestCancelOfDegradedReservation(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second, FailOpen: true},
	}, ratelimit.WithClock(newMock()))
	require.NoError(t, err)
	store.fail.Store(true)
	r, err := lim.Reserve(ctx, "jobs", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.True(t, r.OK())
	require.True(t, r.Result().Degraded)
	require.Nil(t, r.Token(), "it holds no tokens")
	require.NoError(t, r.Cancel(ctx))
	require.NoError(t, r.Cancel(ctx), "a second Cancel returns nil")
	require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
	stop, err := r.AfterFunc(func() { t.Error("a canceled reservation ran fn") })
	require.ErrorIs(t, err, ratelimit.ErrReservationCanceled)
	assert.False(t, stop(ctx))

	// Let run, it cannot be canceled any more.
	r, err = lim.Reserve(ctx, "jobs", "k")
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.NoError(t, r.Wait(ctx))
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed)
}

// Reserve with WithReceipt gives the reservation's token in Result.Token,
// sharded (through Apply) or not (a bound limit), and Wait settles through
// it: after a holder refunded it, Wait refuses the job; after Wait let the
// job run, a refund of it hands nothing back. Wait used to look only for a
// token taken by Reservation.Token, and let a job run whose tokens a
// holder of the receipt had handed back; an unsharded limit gave no
// receipt at all.
func TestReserveWithReceipt(t *testing.T) {
	ctx := context.Background()
	for _, shards := range []int{1, 2} {
		lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 20, Period: time.Minute, Shards: shards, Start: t0})
		r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
		require.NoError(t, err)
		require.True(t, r.OK())
		tok := r.Result().Token
		require.NotNil(t, tok, "%d shards: WithReceipt gives the reservation's token", shards)
		require.Same(t, tok, r.Token())
		require.NoError(t, lim.Refund(ctx, tok), "a holder of the token cancels the job")
		require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled, "%d shards", shards)
		st, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		require.Equal(t, 20.0, st.Remaining)

		r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx))
		require.ErrorIs(t, lim.Refund(ctx, r.Result().Token), ratelimit.ErrReservationUsed, "%d shards", shards)
		st, err = lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		require.Equal(t, 16.0, st.Remaining)
	}
}

// A Reserve with WithReceipt whose receipt would be too large to read back
// (here of a limit named by 70,000 bytes) is refused before it charges
// anything, with an error matching ErrInvalidConfig, as Limit's is:
// sharded (through Apply) or not (through the limit's bound path). An
// unsharded limit's charged, and gave a token that ParseToken refused. A
// key of 70,000 bytes no longer makes one: the store, and the token, know
// it by its digest form.
func TestReserveWithReceiptTooLargeIsRefused(t *testing.T) {
	ctx := context.Background()
	name := strings.Repeat("n", 70_000)
	for _, shards := range []int{1, 2} {
		lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
			name: {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Shards: shards, Start: t0},
		}, ratelimit.WithClock(newMock()))
		require.NoError(t, err)
		_, err = lim.Limit(ctx, name, "k", ratelimit.WithReceipt())
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig, "%d shards: Limit", shards)
		r, err := lim.Reserve(ctx, name, "k", ratelimit.WithReceipt())
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig, "%d shards: Reserve", shards)
		require.Nil(t, r)
		st, err := lim.Value(ctx, name, "k")
		require.NoError(t, err)
		require.Equal(t, 10.0, st.Remaining, "%d shards: nothing was charged", shards)

		r, err = lim.Reserve(ctx, name, "k")
		require.NoError(t, err, "%d shards: without WithReceipt, any name", shards)
		require.True(t, r.OK())
	}

	lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	r, err := lim.Reserve(ctx, "jobs", strings.Repeat("k", 70_000), ratelimit.WithReceipt())
	require.NoError(t, err, "a long key: its digest form is in the receipt")
	require.NotNil(t, r.Result().Token)
}

// A plain Reserve (without WithReceipt) of a limit whose name is so long
// that its token would be longer than ParseToken reads (here 70,000
// bytes) gives no token: Token returns nil rather than one that no
// process could settle, and the reservation still runs and cancels by
// itself. It gave a token that ParseToken refused. A name that fits gives
// a token that reads back, whatever the key's length (the store knows a
// long key by its digest form, or by its keyed hash with WithKeyHash).
func TestReservationTokenTooLargeIsNil(t *testing.T) {
	ctx := context.Background()
	for _, shards := range []int{1, 2} {
		long, short := strings.Repeat("n", 70_000), strings.Repeat("n", 25_000)
		lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
			long:  {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Shards: shards, Start: t0},
			short: {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Shards: shards, Start: t0},
		}, ratelimit.WithClock(newMock()))
		require.NoError(t, err)
		r, err := lim.Reserve(ctx, long, "k", ratelimit.Count(3))
		require.NoError(t, err)
		require.True(t, r.OK())
		require.Nil(t, r.Token(), "%d shards: a token no process could read back", shards)
		require.Nil(t, r.Token(), "%d shards: asked again", shards)
		require.NoError(t, r.Cancel(ctx), "%d shards", shards)
		st, err := lim.Value(ctx, long, "k")
		require.NoError(t, err)
		require.Equal(t, 10.0, st.Remaining, "%d shards: canceled without a token", shards)
		r, err = lim.Reserve(ctx, long, "k")
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx), "%d shards: runs without a token", shards)

		r, err = lim.Reserve(ctx, short, strings.Repeat("k", 70_000))
		require.NoError(t, err)
		tok := r.Token()
		require.NotNil(t, tok, "%d shards: a name that fits, and a long key", shards)
		back, err := ratelimit.ParseToken(tok.String())
		require.NoError(t, err, "%d shards", shards)
		require.NoError(t, lim.Refund(ctx, back), "%d shards", shards)
	}

	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute}},
		ratelimit.WithClock(clock.NewMock()), ratelimit.WithKeyHash([]byte("0123456789abcdef0123456789abcdef")))
	require.NoError(t, err)
	r, err := lim.Reserve(ctx, "jobs", strings.Repeat("k", 70_000))
	require.NoError(t, err)
	tok := r.Token()
	require.NotNil(t, tok, "the store key is a hash of the key")
	_, err = ratelimit.ParseToken(tok.String())
	require.NoError(t, err)
}

// Above 2^23 tokens a float64 resolves less than driver.Noise, the
// tolerance by which a call is granted: a Capacity plus MaxReserved with a
// fraction of a token there (1e8 + 0.1 and 0.2) rounds up, and a
// reservation of Capacity plus MaxReserved, which New's count check lets
// through, owes 1.5e-8 tokens more than MaxReserved on a full bucket. It
// was refused, told to retry after 4s, and refused again then, forever. New
// refuses such a config, with the bound; whole numbers of tokens, exact in
// a float64, and fractions within the bound are accepted, and that count
// is granted. For a sharded limit the bound is on each shard's share.
func TestFractionalTokensAboveTheBoundAreRefused(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range []ratelimit.Config{
		{Kind: ratelimit.FixedWindow, Rate: 10, Capacity: 1e8 + 0.1, MaxReserved: 0.2, Period: time.Second},
		{Kind: ratelimit.TokenBucket, Rate: 10, Capacity: 1e8 + 0.1, MaxReserved: 0.2, Period: time.Second},
		{Kind: ratelimit.TokenBucket, Rate: 1e8 + 0.5, MaxReserved: 7, Period: time.Second},
		{Kind: ratelimit.FixedWindow, Rate: 9e7, MaxReserved: 3e7, Period: time.Second, Shards: 7},
	} {
		_, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"jobs": cfg})
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig, "%+v", cfg)
		var ce *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, "MaxReserved", ce.Field)
		assert.Contains(t, err.Error(), "8388608")
	}
	for _, cfg := range []ratelimit.Config{
		{Kind: ratelimit.FixedWindow, Rate: 10, Capacity: 8e6 + 0.1, MaxReserved: 0.2, Period: time.Second},
		{Kind: ratelimit.TokenBucket, Rate: 10, Capacity: 1e9, MaxReserved: 1e9, Period: time.Second},
		{Kind: ratelimit.FixedWindow, Rate: 9e6, MaxReserved: 3e6, Period: time.Second, Shards: 3},
		{Kind: ratelimit.TokenBucket, Rate: 1e8 + 0.5, Period: time.Second},
	} {
		if cfg.Kind == ratelimit.FixedWindow {
			cfg.Start = time.UnixMilli(0)
		}
		lim, _ := newReserveLimiter(t, cfg)
		n := float64(max(cfg.Shards, 1))
		count := cfg.Capacity + cfg.MaxReserved
		if cfg.Capacity == 0 {
			count = cfg.Rate + cfg.MaxReserved
		}
		if n > 1 {
			count = 2 * count / n // two shards' share
		}
		if cfg.MaxReserved == 0 {
			count = cfg.Rate // no bound on debt: a plain call of the capacity
		}
		res, err := lim.Limit(ctx, "jobs", "k", ratelimit.Count(count), ratelimit.WithReserve())
		require.NoError(t, err, "%+v", cfg)
		require.True(t, res.OK, "%+v: a reservation of Capacity plus MaxReserved on a full bucket", cfg)
	}
}

// A reservation whose token a holder marked used (Limiter.Use, or Settle)
// is the holder's job: the owner's Wait refuses it, with a *SettledError
// matching ErrReservationUsed, AfterFunc does not run its function, and
// Cancel hands nothing back. Wait used to take the holder's use for its
// own and return nil, so that the job ran in both processes on one
// reservation.
func TestWaitAfterAHolderUsedTheToken(t *testing.T) {
	ctx := context.Background()
	for _, settle := range []string{"Use", "Settle"} {
		mock := newMock()
		store := must(memstore.New())
		limits := ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0}}
		owner := must(ratelimit.New(store, limits, ratelimit.WithClock(mock)))
		worker := must(ratelimit.New(store, limits, ratelimit.WithClock(mock)))
		holderUses := func(r *ratelimit.Reservation) {
			tok, err := ratelimit.ParseToken(r.Token().String())
			require.NoError(t, err)
			if settle == "Use" {
				require.NoError(t, worker.Use(ctx, tok), "the worker runs the job")
			} else {
				require.NoError(t, worker.Settle(ctx, tok, 1), "the worker runs the job")
			}
		}

		r, err := owner.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
		require.NoError(t, err)
		holderUses(r)
		for range 2 {
			err = r.Wait(ctx)
			require.ErrorIs(t, err, ratelimit.ErrReservationUsed, "%s: the job is the worker's", settle)
			require.ErrorIs(t, err, ratelimit.ErrAlreadySettled, settle)
		}
		require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed, settle)

		r, err = owner.Reserve(ctx, "jobs", "k", ratelimit.Count(2))
		require.NoError(t, err)
		holderUses(r)
		ran := make(chan struct{}, 1)
		stop, err := r.AfterFunc(func() { ran <- struct{}{} })
		require.NoError(t, err, settle)
		mock.Add(time.Millisecond)
		select {
		case <-ran:
			t.Fatalf("%s: AfterFunc ran a job the worker ran", settle)
		default:
		}
		assert.False(t, stop(ctx), settle)
	}
}

// After a holder of the token canceled it, the owner's Cancel says so, a
// *SettledError matching ErrReservationCanceled, however the owner learned
// of it: by a Cancel of its own, or by a Wait or an AfterFunc that found
// the holder's mark. After a Wait had found it, Cancel returned nil, as if
// it had handed the tokens back itself.
func TestCancelAfterAHolderCanceledTheToken(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := must(memstore.New())
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0}}
	owner := must(ratelimit.New(store, limits, ratelimit.WithClock(mock)))
	worker := must(ratelimit.New(store, limits, ratelimit.WithClock(mock)))
	for _, learn := range []string{"Cancel", "Wait", "AfterFunc"} {
		r, err := owner.Reserve(ctx, "jobs", "k", ratelimit.Count(2))
		require.NoError(t, err)
		tok, err := ratelimit.ParseToken(r.Token().String())
		require.NoError(t, err)
		require.NoError(t, worker.Refund(ctx, tok), "the worker drops the job")
		switch learn {
		case "Wait":
			require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
		case "AfterFunc":
			dropped := make(chan error, 1)
			_, err := r.AfterFunc(func() { t.Error("AfterFunc ran a job the worker dropped") },
				ratelimit.OnDropped(func(err error) { dropped <- err }))
			require.NoError(t, err)
			mock.Add(time.Millisecond)
			require.ErrorIs(t, <-dropped, ratelimit.ErrReservationCanceled)
		}
		for i := range 2 {
			err := r.Cancel(ctx)
			var se *ratelimit.SettledError
			require.ErrorAs(t, err, &se, "%s, then Cancel %d", learn, i+1)
			require.ErrorIs(t, err, ratelimit.ErrReservationCanceled, "%s, then Cancel %d", learn, i+1)
		}
		require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled, learn)
	}
}

// lostReplyStore applies an op and then, when lose is set, fails as if
// the reply had been lost on the way back: the op took effect.
type lostReplyStore struct {
	ratelimit.Store
	lose atomic.Bool
}

func (s *lostReplyStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if err := s.Store.Apply(ctx, op, out); err != nil || !s.lose.Load() {
		return err
	}
	return errors.New("connection reset: the reply was lost")
}

// A Wait that failed on a store error after the store took its use may
// be retried: the retry finds its own use, not a holder's, and lets the
// job run.
func TestWaitRetriedAfterALostReply(t *testing.T) {
	ctx := context.Background()
	store := &lostReplyStore{Store: must(memstore.New())}
	lim := jobsLimiter(store)
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
	require.NoError(t, err)
	store.lose.Store(true)
	require.Error(t, r.Wait(ctx))
	store.lose.Store(false)
	require.NoError(t, r.Wait(ctx), "the retry finds its own use")
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed)
	st, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	require.Equal(t, 6.0, st.Remaining)
}

// A Cancel that failed on a store error after the store took its refund
// may be retried: the retry finds its own cancel and returns nil, as a
// second Cancel does, and the tokens came back once. It returned a
// *SettledError, as if a holder of the token had canceled it.
func TestCancelRetriedAfterALostReply(t *testing.T) {
	ctx := context.Background()
	store := &lostReplyStore{Store: must(memstore.New())}
	lim := jobsLimiter(store)
	value := func() float64 {
		st, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		return st.Remaining
	}
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(3))
	require.NoError(t, err)
	require.Equal(t, 7.0, value())
	store.lose.Store(true)
	require.Error(t, r.Cancel(ctx))
	store.lose.Store(false)
	require.Equal(t, 10.0, value(), "the first cancel took effect")
	require.NoError(t, r.Cancel(ctx), "the retry finds its own cancel")
	require.NoError(t, r.Cancel(ctx))
	require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
	require.Equal(t, 10.0, value(), "handed back once")

	// A holder's cancel is still reported as such.
	r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(3))
	require.NoError(t, err)
	require.NoError(t, lim.Refund(ctx, r.Token()))
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationCanceled)
}

// A Wait whose use never reached the store, retried after a holder of
// the token used it in another process, finds the holder's use, not its
// own: the job is the holder's, and must not run twice. The retry used to
// take any use for its own earlier attempt, and let the job run in both
// processes. A Cancel retried after a holder's refund alike.
func TestRetryAfterAFailureFindsAHoldersSettlement(t *testing.T) {
	ctx := context.Background()
	store := &flakyStore{Store: must(memstore.New())}
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0}}
	owner := must(ratelimit.New(store, limits, ratelimit.WithClock(newMock())))
	holder := must(ratelimit.New(store.Store, limits, ratelimit.WithClock(newMock())))

	r, err := owner.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
	require.NoError(t, err)
	store.fail.Store(true)
	require.ErrorIs(t, r.Wait(ctx), errDown)
	store.fail.Store(false)
	require.NoError(t, holder.Use(ctx, r.Token()), "the holder runs the job")
	err = r.Wait(ctx)
	require.ErrorIs(t, err, ratelimit.ErrReservationUsed, "the owner must not run it too")
	var se *ratelimit.SettledError
	require.ErrorAs(t, err, &se)

	r, err = owner.Reserve(ctx, "jobs", "k", ratelimit.Count(3))
	require.NoError(t, err)
	tok := r.Token()
	store.fail.Store(true)
	require.Error(t, r.Cancel(ctx))
	store.fail.Store(false)
	require.NoError(t, holder.Refund(ctx, tok))
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationCanceled, "the holder's cancel, not the owner's")
}

// An AfterFunc of a nil function schedules nothing and says so, rather than
// panicking when the job may run; the reservation stays the caller's.
func TestAfterFuncOfNil(t *testing.T) {
	ctx := context.Background()
	lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0, MaxReserved: 10})
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(2))
	require.NoError(t, err)
	stop, err := r.AfterFunc(nil)
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.False(t, stop(ctx))
	mock.Add(time.Minute) // nothing was scheduled: nothing fires
	require.NoError(t, r.Wait(ctx), "the reservation is still the caller's to run")
}

// stallRefundStore is a memstore whose refunds, while stall is set, tell
// arrived the deadline they were sent with and wait for their context to
// end (a store that does not answer). A refund sent with no deadline tells
// arrived the zero time and fails at once, rather than wait for good.
type stallRefundStore struct {
	*memstore.Store
	stall   atomic.Bool
	arrived chan time.Time
	refunds atomic.Int32
}

func (s *stallRefundStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if op.Mode != driver.ModeRefund || !s.stall.Load() {
		return s.Store.Apply(ctx, op, out)
	}
	s.refunds.Add(1)
	dl, ok := ctx.Deadline()
	s.arrived <- dl
	if !ok {
		return errors.New("a refund sent with no deadline: it would wait for the store for good")
	}
	<-ctx.Done()
	return ctx.Err()
}

// Wait that gives up hands the tokens back within its refund bound
// (WithRefundTimeout) past the moment its context ends, not for as long
// as the store takes: a store that does not answer used to hold Wait for
// good. A refund the store did not make within the bound is reported
// (ErrNotRefunded, beside the context's error), and Cancel hands the
// tokens back later. With a bound of 0, Wait returns when its context
// ends, without asking the store, and says the tokens are still held.
func TestWaitGivingUpIsBounded(t *testing.T) {
	ctx := context.Background()
	const bound = 3 * time.Second
	for _, tc := range []struct {
		name    string
		timeout time.Duration // WithRefundTimeout; -1: the default
		cancel  bool          // the context is canceled while Wait waits; else its deadline comes before the job's time
	}{
		{"deadline", -1, false},
		{"deadline, bound set", bound, false},
		{"canceled", -1, true},
		{"canceled, bound set", bound, true},
		{"canceled, bound 0", 0, true},
		{"deadline, bound 0", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock := newMock()
			store := &stallRefundStore{Store: must(memstore.New()), arrived: make(chan time.Time, 1)}
			opts := []ratelimit.Option{ratelimit.WithClock(mock)}
			want := ratelimit.DefaultRefundTimeout
			if tc.timeout >= 0 {
				opts = append(opts, ratelimit.WithRefundTimeout(tc.timeout))
				want = tc.timeout
			}
			lim, err := ratelimit.New(store, ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}}, opts...)
			require.NoError(t, err)
			r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(10)) // runs in 9 s
			require.NoError(t, err)
			require.True(t, r.OK())
			store.stall.Store(true)

			wctx, cancel := mock.WithTimeout(ctx, 2*time.Second)
			if tc.cancel {
				wctx, cancel = context.WithCancel(ctx)
			}
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.Wait(wctx) }()
			if tc.cancel {
				cancel()
			}
			ends := t0 // when the context ends, or Wait sees that it has
			if !tc.cancel {
				ends = t0.Add(2 * time.Second)
			}
			if want > 0 || !tc.cancel {
				// The refund is sent, bounded, and the store holds it.
				dl := <-store.arrived
				require.False(t, dl.IsZero(), "the refund was sent with no deadline")
				assert.Equal(t, ends.Add(want), dl, "the refund's deadline")
				mock.Add(dl.Sub(mock.Now()))
			}
			err = <-done
			assert.Equal(t, ends.Add(want), mock.Now(), "Wait returned when the refund's bound passed")
			if tc.cancel {
				require.ErrorIs(t, err, context.Canceled)
			} else {
				require.ErrorIs(t, err, context.DeadlineExceeded)
			}
			require.ErrorIs(t, err, ratelimit.ErrNotRefunded)
			assert.ErrorContains(t, err, "call Cancel")
			if want == 0 && tc.cancel {
				assert.Zero(t, store.refunds.Load(), "no refund sent with no time for it")
			}
			st, err := lim.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			assert.Equal(t, -9.0+mock.Now().Sub(t0).Seconds(), st.Remaining, "the tokens are still held")

			store.stall.Store(false)
			require.NoError(t, r.Cancel(ctx))
			st, err = lim.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			assert.Equal(t, 1.0, st.Remaining, "handed back by Cancel")
			require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
		})
	}
}

// settleHookStore is a memstore that stops the next settlement of kind,
// once armed (stall), on its way to the store, to see what other
// goroutines may do while a Reservation's store call is under way.
type settleHookStore struct {
	*memstore.Store
	kind driver.SettleKind
	hook atomic.Pointer[func(ctx context.Context) error]
}

func (s *settleHookStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if op.Settle != nil && op.Settle.Kind == s.kind {
		if h := s.hook.Swap(nil); h != nil {
			if err := (*h)(ctx); err != nil {
				return err
			}
		}
	}
	return s.Store.Apply(ctx, op, out)
}

// stalled is a settlement stopped by settleHookStore.
type stalled struct {
	arrived chan time.Time // the deadline it was sent with (zero: none), once it is stopped
	release chan struct{}  // closed by let: it goes on to the store
	once    sync.Once
}

// let sends the stopped settlement on to the store; more calls do nothing.
func (s *stalled) let() { s.once.Do(func() { close(s.release) }) }

// stall arms the store: the next settlement of its kind tells arrived its
// deadline and waits until let is called (then reaches the store) or its
// context ends (then fails with the context's error, as a store that does
// not answer). The test's cleanup lets it go.
func (s *settleHookStore) stall(t *testing.T) *stalled {
	st := &stalled{arrived: make(chan time.Time, 1), release: make(chan struct{})}
	t.Cleanup(st.let)
	s.hook.Store(ptr(func(ctx context.Context) error {
		dl, _ := ctx.Deadline()
		st.arrived <- dl
		select {
		case <-st.release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	return st
}

// While a Cancel waits on the store (a partitioned Redis, a locked
// PostgreSQL row), the Reservation's other methods do not wait with it:
// Cancel used to hold the Reservation's lock for its whole store call, and
// a Wait of a caller with a short deadline, a Token, a second Cancel all
// waited on the store too, whatever their context. The second Cancel (or
// the refund of a Wait giving up) reaches the store, which settles the
// reservation once: the tokens come back once, and the first Cancel, let
// go, finds the mark its own and returns nil. A Cancel while a Wait marks
// the reservation used alike: it reaches the store first, and the Wait,
// let go, finds the cancel and does not let the job run.
func TestReservationStoreCallsHoldNoLock(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		stall driver.SettleKind // the settlement that waits on the store
		other string            // what the test does meanwhile
	}{
		{"second Cancel", driver.SettleCancel, "cancel"},
		{"Wait giving up", driver.SettleCancel, "wait"},
		{"Cancel while Wait marks it used", driver.SettleUse, "cancel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &settleHookStore{Store: must(memstore.New()), kind: tc.stall}
			lim := jobsLimiter(store)
			remaining := func() float64 {
				st, err := lim.Value(ctx, "jobs", "k")
				require.NoError(t, err)
				return st.Remaining
			}
			r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
			require.NoError(t, err)
			require.Equal(t, 6.0, remaining())
			tok := r.Token()
			require.NotNil(t, tok)

			st := store.stall(t)
			first := make(chan error, 1)
			if tc.stall == driver.SettleCancel {
				go func() { first <- r.Cancel(ctx) }()
			} else {
				go func() { first <- r.Wait(ctx) }()
			}
			<-st.arrived
			require.False(t, ratelimit.ReservationLocked(r), "the Reservation is locked while the store takes its call")

			assert.Same(t, tok, r.Token())
			assert.Zero(t, r.Delay())
			switch tc.other {
			case "cancel":
				require.NoError(t, r.Cancel(ctx))
			case "wait":
				wctx, cancel := context.WithCancel(ctx)
				cancel() // a caller that leaves at once
				err := r.Wait(wctx)
				require.ErrorIs(t, err, context.Canceled)
				require.NotErrorIs(t, err, ratelimit.ErrNotRefunded, "its refund reached the store")
			}
			assert.Equal(t, 10.0, remaining(), "handed back")
			require.NoError(t, r.Cancel(ctx), "a Cancel after the refund returns nil")

			st.let()
			err = <-first
			if tc.stall == driver.SettleCancel {
				require.NoError(t, err, "the first Cancel finds its own mark")
			} else {
				require.ErrorIs(t, err, ratelimit.ErrReservationCanceled, "the Wait finds the cancel: the job must not run")
			}
			assert.Equal(t, 10.0, remaining(), "handed back once")
			require.NoError(t, r.Cancel(ctx))
			require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
			require.ErrorIs(t, lim.Use(ctx, tok), ratelimit.ErrReservationCanceled)
		})
	}
}

// Cancels of one Reservation from many goroutines at once may all reach
// the store; it settles the reservation once, the later ones find the
// first one's mark, their own, and every Cancel returns nil: the tokens
// come back once.
func TestConcurrentCancels(t *testing.T) {
	ctx := context.Background()
	lim, _ := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	for range 20 {
		require.NoError(t, lim.Reset(ctx, "jobs", "k"))
		r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4))
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = r.Cancel(ctx) }()
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "Cancel %d", i)
		}
		st, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		require.Equal(t, 10.0, st.Remaining, "handed back once")
		require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
	}
}

// A Cancel past the token's Expires hands nothing back and returns nil,
// without asking the store: the job must then not run, even when a Wait's
// use, sent before the token expired, reaches the store after it (the
// store takes it: the one case where a use and a cancel both succeed).
func TestCancelPastExpiryWhileWaitMarksItUsed(t *testing.T) {
	ctx := context.Background()
	store := &settleHookStore{Store: must(memstore.New()), kind: driver.SettleUse}
	mock := newMock()
	lim := must(ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(mock)))
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
	require.NoError(t, err)
	st := store.stall(t)
	waited := make(chan error, 1)
	go func() { waited <- r.Wait(ctx) }()
	<-st.arrived
	require.False(t, ratelimit.ReservationLocked(r), "the Reservation is locked while the store takes its call")
	mock.Set(r.Token().Expires().Add(time.Second))
	require.NoError(t, r.Cancel(ctx), "past Expires, Cancel hands nothing back")
	st.let()
	require.ErrorIs(t, <-waited, ratelimit.ErrReservationCanceled, "the job must not run after a Cancel that returned nil")
	require.NoError(t, r.Cancel(ctx))
	require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
}

// A Wait past its token's Expires does not let the job run, nor does a
// second one, and its error says what to do: reserve again. It read as a
// failed settlement ("settle token …: it expired"), which a Wait's caller
// never asked for.
func TestWaitPastItsTokensExpiry(t *testing.T) {
	ctx := context.Background()
	lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
	require.NoError(t, err)
	mock.Set(r.Token().Expires().Add(time.Millisecond))
	for range 2 {
		err = r.Wait(ctx)
		require.ErrorIs(t, err, ratelimit.ErrTokenExpired)
		require.ErrorContains(t, err, `limit "jobs": too late to run the job`)
		require.ErrorContains(t, err, "reserve again")
	}
	require.NoError(t, r.Cancel(ctx), "past Expires, Cancel hands nothing back")
	require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
}

// AfterFunc marks the reservation used on a context of its own, bounded
// by WithAfterFuncTimeout: it has no caller's context, and used to send
// the use with none, so that a store that does not answer held it for
// good: the function never ran, the job was never let go (every new
// AfterFunc or Wait failed with ErrReservationScheduled), and stop
// reported false. Now the use fails at the bound as a store failure does:
// the function does not run, the failure is logged, and a new AfterFunc
// tries again and runs the job. While the use is on its way, stop reports
// false at once, and the job stays claimed.
func TestAfterFuncUseIsBounded(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		timeout time.Duration // WithAfterFuncTimeout; 0: the default
	}{
		{"default", 0},
		{"set", 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &settleHookStore{Store: must(memstore.New()), kind: driver.SettleUse}
			mock := newMock()
			var logs bytes.Buffer
			opts := []ratelimit.Option{ratelimit.WithClock(mock), ratelimit.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))}
			want := ratelimit.DefaultAfterFuncTimeout
			if tc.timeout > 0 {
				opts = append(opts, ratelimit.WithAfterFuncTimeout(tc.timeout))
				want = tc.timeout
			}
			lim := must(ratelimit.New(store, ratelimit.Limits{
				"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
			}, opts...))
			r, err := lim.Reserve(ctx, "jobs", "user-4711", ratelimit.Count(4), ratelimit.WithReceipt())
			require.NoError(t, err)
			var runs atomic.Int32
			st := store.stall(t)
			stop, err := r.AfterFunc(func() { runs.Add(1) })
			require.NoError(t, err)
			fired := make(chan struct{})
			go func() { mock.Add(0); close(fired) }() // the job's time: the mock runs the timer's function
			dl := <-st.arrived
			require.False(t, dl.IsZero(), "AfterFunc's use was sent with no deadline: a store that does not answer holds it for good")
			assert.Equal(t, t0.Add(want), dl, "the use's deadline")

			// While the use waits on the store.
			assert.False(t, stop(ctx), "the job's time has come: too late to stop")
			_, err = r.AfterFunc(func() { runs.Add(1) })
			require.ErrorIs(t, err, ratelimit.ErrReservationScheduled, "the job is claimed while its use is on its way")
			assert.NotNil(t, r.Token())

			// The bound passes: the store ends the call, as the driver
			// contract asks.
			mock.Add(want)
			<-fired
			mock.Set(t0.Add(want)) // the two Adds ran together: end at the later time
			require.Zero(t, runs.Load(), "the use failed: the function does not run")
			assert.Contains(t, logs.String(), "AfterFunc did not run its function")
			assert.Contains(t, logs.String(), "WithAfterFuncTimeout")
			assert.NotContains(t, logs.String(), "user-4711", "keys are not logged")

			// The failed AfterFunc let go of the job: a new one runs it.
			stop, err = r.AfterFunc(func() { runs.Add(1) })
			require.NoError(t, err, "the job was let go")
			mock.Add(0)
			require.Equal(t, int32(1), runs.Load())
			assert.False(t, stop(ctx))
			require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed)
			st2, err := lim.Value(ctx, "jobs", "user-4711")
			require.NoError(t, err)
			assert.Equal(t, 6.0, st2.Remaining, "the job's tokens are spent")
		})
	}
}

// An AfterFunc whose job's time comes past its token's Expires (the
// store's clock ran ahead, or the Limiter's jumped) drops the job, and
// its log says so. It said that the store had not marked the reservation
// used in time, and that AfterFunc again would retry and Cancel hand the
// tokens back: neither does anything for an expired token.
func TestAfterFuncPastItsTokensExpiryLogsWhy(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := &clockStore{Store: must(memstore.New()), own: true, now: t0}
	var logs bytes.Buffer
	lim := must(ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(mock), ratelimit.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))))
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
	require.NoError(t, err)
	store.now = r.Token().Expires().Add(time.Second)
	dropped := make(chan error, 1)
	_, err = r.AfterFunc(func() { t.Error("the job ran past its token's Expires") },
		ratelimit.OnDropped(func(err error) { dropped <- err }))
	require.NoError(t, err)
	mock.Add(0)
	err = <-dropped
	require.ErrorIs(t, err, ratelimit.ErrTokenExpired)
	require.NotErrorIs(t, err, ratelimit.ErrNotRefunded)
	assert.Contains(t, logs.String(), "AfterFunc did not run its function")
	assert.Contains(t, logs.String(), "past its token's Expires")
	assert.NotContains(t, logs.String(), "the store did not mark the reservation used in time")
}

// A stop called while AfterFunc's use is on its way to the store reports
// false at once, without waiting for the store; a Cancel then reaches the
// store too, which settles the reservation once: here the cancel comes
// first, the tokens come back, and the function does not run (nor is a
// Cancel logged as a failure).
func TestCancelWhileAfterFuncMarksItUsed(t *testing.T) {
	ctx := context.Background()
	store := &settleHookStore{Store: must(memstore.New()), kind: driver.SettleUse}
	mock := newMock()
	var logs bytes.Buffer
	lim := must(ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(mock), ratelimit.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))))
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
	require.NoError(t, err)
	var runs atomic.Int32
	st := store.stall(t)
	stop, err := r.AfterFunc(func() { runs.Add(1) })
	require.NoError(t, err)
	fired := make(chan struct{})
	go func() { mock.Add(0); close(fired) }()
	<-st.arrived
	require.False(t, ratelimit.ReservationLocked(r), "the Reservation is locked while the store takes its call")
	assert.False(t, stop(ctx), "stop does not wait for the store")
	require.NoError(t, r.Cancel(ctx), "the cancel reaches the store first")
	value := func() float64 {
		v, err := lim.Value(ctx, "jobs", "k")
		require.NoError(t, err)
		return v.Remaining
	}
	assert.Equal(t, 10.0, value(), "handed back")
	st.let()
	<-fired
	require.Zero(t, runs.Load(), "the use found the cancel: the function does not run")
	assert.Empty(t, logs.String())
	require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
	require.NoError(t, r.Cancel(ctx))
	assert.Equal(t, 10.0, value(), "handed back once")
}

func TestWithAfterFuncTimeoutOfZero(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		_, err := ratelimit.New(must(memstore.New()), nil, ratelimit.WithAfterFuncTimeout(d))
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
		assert.ErrorContains(t, err, "WithAfterFuncTimeout")
	}
}

// A Wait that gives up after an earlier Wait's use reached the store, its
// answer lost, cannot hand the tokens back: the store holds the use, and
// its cancel finds it. It used to return the context's error alone, which
// says the tokens are back and nothing is left to do, while the tokens
// were spent and a Wait still let the job run. It says so now: the error
// matches ErrReservationUsed beside the context's (not ErrNotRefunded:
// no Cancel can hand them back).
func TestWaitGivingUpAfterItsOwnLostUse(t *testing.T) {
	ctx := context.Background()
	store := &lostReplyStore{Store: must(memstore.New())}
	lim := jobsLimiter(store)
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
	require.NoError(t, err)
	store.lose.Store(true)
	require.Error(t, r.Wait(ctx), "the store took the use; its answer was lost")
	store.lose.Store(false)

	gone, cancel := context.WithCancel(ctx)
	cancel()
	err = r.Wait(gone)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, ratelimit.ErrReservationUsed, "the tokens are spent, not handed back")
	require.NotErrorIs(t, err, ratelimit.ErrNotRefunded, "no Cancel can hand them back")
	st, err := lim.Value(ctx, "jobs", "k")
	require.NoError(t, err)
	assert.Equal(t, 6.0, st.Remaining, "spent")
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed)
	require.NoError(t, r.Wait(ctx), "its own use: a Wait lets the job run")
}

// useThenStallStore is a memstore whose next use, once armed, takes
// effect and then waits for its context to end, failing with the
// context's error: the reply of a use the store took, lost as the
// caller's context ended (a Redis command sent, then canceled). With
// answerOK, it answers nil then instead: a store that says it took the
// use only once the caller's bound has passed.
type useThenStallStore struct {
	*memstore.Store
	armed    atomic.Bool
	arrived  chan struct{}
	answerOK bool
}

func (s *useThenStallStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if op.Settle == nil || op.Settle.Kind != driver.SettleUse || !s.armed.CompareAndSwap(true, false) {
		return s.Store.Apply(ctx, op, out)
	}
	if err := s.Store.Apply(ctx, op, out); err != nil {
		return err
	}
	close(s.arrived)
	<-ctx.Done()
	if s.answerOK {
		return nil
	}
	return ctx.Err()
}

// A Wait whose context ends while its use is on its way to the store
// gives up as one whose context ends while it waits for the job's time:
// it hands the tokens back, or says why not. It used to return the
// store's error, which matched the context's and not ErrNotRefunded, so
// that by Wait's doc the tokens were back, while the reservation held
// them, and a caller that dropped it lost them. If the store took the
// use before the context ended, the error says the tokens are spent.
func TestWaitWhoseContextEndsWhileItsUseIsOnItsWay(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		deadline bool // the context's deadline passes; else it is canceled
		landed   bool // the store took the use before the context ended
	}{
		{"canceled", false, false},
		{"deadline", true, false},
		{"canceled, the use taken", false, true},
		{"deadline, the use taken", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock := newMock()
			hook := &settleHookStore{Store: must(memstore.New()), kind: driver.SettleUse}
			landed := &useThenStallStore{Store: hook.Store, arrived: make(chan struct{})}
			var store ratelimit.Store = hook
			if tc.landed {
				store = landed
			}
			lim := must(ratelimit.New(store, ratelimit.Limits{
				"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
			}, ratelimit.WithClock(mock)))
			remaining := func() float64 {
				st, err := lim.Value(ctx, "jobs", "k")
				require.NoError(t, err)
				return st.Remaining
			}
			r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
			require.NoError(t, err)

			wctx, cancel := context.WithCancel(ctx)
			if tc.deadline {
				wctx, cancel = mock.WithTimeout(ctx, time.Second)
			}
			defer cancel()
			var arrived <-chan struct{}
			if tc.landed {
				landed.armed.Store(true)
				arrived = landed.arrived
			} else {
				st := hook.stall(t)
				ch := make(chan struct{})
				go func() { <-st.arrived; close(ch) }()
				arrived = ch
			}
			done := make(chan error, 1)
			go func() { done <- r.Wait(wctx) }()
			<-arrived
			if tc.deadline {
				mock.Add(time.Second)
			} else {
				cancel()
			}
			err = <-done
			if tc.deadline {
				require.ErrorIs(t, err, context.DeadlineExceeded)
			} else {
				require.ErrorIs(t, err, context.Canceled)
			}
			require.NotErrorIs(t, err, ratelimit.ErrNotRefunded)
			if tc.landed {
				require.ErrorIs(t, err, ratelimit.ErrReservationUsed, "the use was taken: the tokens are spent")
				assert.Equal(t, 6.0, remaining())
				require.NoError(t, r.Wait(ctx), "its own use: a Wait lets the job run")
				return
			}
			assert.Equal(t, 10.0, remaining(), "handed back")
			require.ErrorIs(t, r.Wait(ctx), ratelimit.ErrReservationCanceled)
			require.NoError(t, r.Cancel(ctx))
			assert.Equal(t, 10.0, remaining(), "handed back once")
		})
	}
}

// An AfterFunc whose use the store takes, its answer coming back only
// past the AfterFunc timeout, does not run its function, though the use
// is in the store: a Cancel then finds the use and returns an error
// matching ErrReservationUsed without the function having run (the
// tokens are spent), and a new AfterFunc runs the job on them. So an
// ErrReservationUsed from Cancel does not by itself say that the function
// ran. The same holds when the store's answer, past the timeout, says it
// took the use (nil): the timeout is how late a job may run for a slow
// store, and the function used to run as late as the store answered.
func TestCancelAfterAnAfterFuncUseAnsweredTooLate(t *testing.T) {
	for _, answerOK := range []bool{false, true} {
		t.Run(fmt.Sprintf("answer OK %v", answerOK), func(t *testing.T) {
			ctx := context.Background()
			mock := newMock()
			store := &useThenStallStore{Store: must(memstore.New()), arrived: make(chan struct{}), answerOK: answerOK}
			var logs bytes.Buffer
			lim := must(ratelimit.New(store, ratelimit.Limits{
				"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
			}, ratelimit.WithClock(mock), ratelimit.WithAfterFuncTimeout(3*time.Second),
				ratelimit.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))))
			r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
			require.NoError(t, err)
			var runs atomic.Int32
			store.armed.Store(true)
			stop, err := r.AfterFunc(func() { runs.Add(1) })
			require.NoError(t, err)
			fired := make(chan struct{})
			go func() { mock.Add(0); close(fired) }()
			<-store.arrived // the store took the use; its answer waits for the bound
			assert.False(t, stop(ctx))
			mock.Add(3 * time.Second)
			<-fired
			mock.Set(t0.Add(3 * time.Second))
			require.Zero(t, runs.Load(), "the store answered past the timeout: the function does not run that late")
			assert.Contains(t, logs.String(), "AfterFunc did not run its function")
			assert.Contains(t, logs.String(), "WithAfterFuncTimeout")

			err = r.Cancel(ctx)
			require.ErrorIs(t, err, ratelimit.ErrReservationUsed, "the store holds the use")
			require.Zero(t, runs.Load())
			st, err := lim.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			assert.Equal(t, 6.0, st.Remaining, "spent")

			_, err = r.AfterFunc(func() { runs.Add(1) })
			require.NoError(t, err)
			mock.Add(0)
			require.Equal(t, int32(1), runs.Load(), "a new AfterFunc finds the use its own and runs the job")
		})
	}
}

// OnDropped tells the caller, in code, of a job AfterFunc did not run,
// and why: once the job's time has come, AfterFunc runs its function or
// calls the OnDropped function, never both, and neither once stop has
// reported true. The error matches the store's error, or
// context.DeadlineExceeded for the AfterFunc timeout, and says what
// became of the tokens: ErrNotRefunded while the store may or may not
// have taken the use, ErrReservationUsed when they are spent,
// ErrReservationCanceled when they came back. Before, a dropped job was
// seen only in the Limiter's log, if it had one.
func TestAfterFuncOnDropped(t *testing.T) {
	ctx := context.Background()
	const timeout = 3 * time.Second
	errTimeout := errors.New("read tcp 127.0.0.1:6379: i/o timeout")
	// env is one run: the Limiter, over a memstore that fails (flaky),
	// stops a use (hook) or takes it and answers at the timeout (late).
	type env struct {
		lim     *ratelimit.Limiter
		r       *ratelimit.Reservation
		stop    func(context.Context) bool
		flaky   *flakyStore
		hook    *settleHookStore
		late    *useThenStallStore
		arrived chan struct{} // closed when a stopped use reaches the store
	}
	// stall has the hook stop the use until its context ends, then fail
	// with fail's error.
	stall := func(e *env, fail func(ctx context.Context) error) {
		e.hook.hook.Store(ptr(func(ctx context.Context) error {
			close(e.arrived)
			<-ctx.Done()
			return fail(ctx)
		}))
	}
	for _, tc := range []struct {
		name    string
		late    bool                       // the store is the late one
		before  func(t *testing.T, e *env) // after AfterFunc, before the job's time
		stalls  bool                       // the use waits on the store until the timeout
		ran     bool                       // the function runs
		is      []error                    // the OnDropped error matches each; none: OnDropped is not called
		isNot   []error
		settled bool    // the OnDropped error is a *SettledError
		left    float64 // the tokens left, then
		cancel  error   // what Cancel returns, then (nil: the tokens come back)
	}{
		{name: "ran", ran: true, left: 6, cancel: ratelimit.ErrReservationUsed},
		{name: "stopped before its time",
			before: func(t *testing.T, e *env) { require.True(t, e.stop(ctx)) },
			left:   10},
		{name: "store fails",
			before: func(t *testing.T, e *env) { e.flaky.fail.Store(true) },
			is:     []error{errDown, ratelimit.ErrNotRefunded},
			isNot:  []error{context.DeadlineExceeded, ratelimit.ErrReservationUsed, ratelimit.ErrReservationCanceled},
			left:   6},
		{name: "no answer within the timeout",
			before: func(t *testing.T, e *env) { stall(e, context.Context.Err) },
			stalls: true,
			is:     []error{context.DeadlineExceeded, ratelimit.ErrNotRefunded},
			isNot:  []error{ratelimit.ErrReservationUsed, ratelimit.ErrReservationCanceled},
			left:   6},
		{name: "the store's own error at the timeout",
			before: func(t *testing.T, e *env) { stall(e, func(context.Context) error { return errTimeout }) },
			stalls: true,
			is:     []error{errTimeout, context.DeadlineExceeded, ratelimit.ErrNotRefunded},
			isNot:  []error{ratelimit.ErrReservationUsed},
			left:   6},
		{name: "use taken, its answer lost at the timeout", late: true,
			before: func(t *testing.T, e *env) { e.late.armed.Store(true) },
			stalls: true,
			is:     []error{context.DeadlineExceeded, ratelimit.ErrNotRefunded},
			isNot:  []error{ratelimit.ErrReservationCanceled},
			left:   6, cancel: ratelimit.ErrReservationUsed},
		{name: "use answered OK past the timeout", late: true,
			before: func(t *testing.T, e *env) { e.late.answerOK = true; e.late.armed.Store(true) },
			stalls: true,
			is:     []error{context.DeadlineExceeded, ratelimit.ErrReservationUsed},
			isNot:  []error{ratelimit.ErrNotRefunded, ratelimit.ErrReservationCanceled},
			left:   6, cancel: ratelimit.ErrReservationUsed},
		{name: "canceled before its time",
			before: func(t *testing.T, e *env) { require.NoError(t, e.r.Cancel(ctx)) },
			is:     []error{ratelimit.ErrReservationCanceled},
			isNot:  []error{ratelimit.ErrNotRefunded, ratelimit.ErrReservationUsed, context.DeadlineExceeded},
			left:   10},
		{name: "used by a holder of its token",
			before:  func(t *testing.T, e *env) { require.NoError(t, e.lim.Use(ctx, e.r.Token())) },
			is:      []error{ratelimit.ErrReservationUsed},
			isNot:   []error{ratelimit.ErrNotRefunded, context.DeadlineExceeded},
			settled: true,
			left:    6, cancel: ratelimit.ErrReservationUsed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock := newMock()
			mem := must(memstore.New())
			e := &env{arrived: make(chan struct{})}
			e.late = &useThenStallStore{Store: mem, arrived: e.arrived}
			e.hook = &settleHookStore{Store: mem, kind: driver.SettleUse}
			e.flaky = &flakyStore{Store: e.hook}
			var store ratelimit.Store = e.flaky
			if tc.late {
				store = e.late
			}
			obs := &jobRecorder{}
			e.lim = must(ratelimit.New(store, ratelimit.Limits{
				"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
			}, ratelimit.WithClock(mock), ratelimit.WithAfterFuncTimeout(timeout), ratelimit.WithObserver(obs)))
			var err error
			e.r, err = e.lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
			require.NoError(t, err)

			var runs, calls atomic.Int32
			var dropErr error
			e.stop, err = e.r.AfterFunc(func() { runs.Add(1) }, ratelimit.OnDropped(func(err error) {
				calls.Add(1)
				dropErr = err
			}))
			require.NoError(t, err)
			if tc.before != nil {
				tc.before(t, e)
			}
			fired := make(chan struct{})
			go func() { mock.Add(0); close(fired) }() // the job's time
			if tc.stalls {
				<-e.arrived
				mock.Add(timeout)
			}
			<-fired

			if tc.ran {
				require.Equal(t, int32(1), runs.Load(), "the function runs")
			} else {
				require.Zero(t, runs.Load(), "the function does not run")
			}
			// The observer learns the job's end, once, as the caller does.
			obs.mu.Lock()
			require.Len(t, obs.jobs, 1, "one job event")
			job := obs.jobs[0]
			obs.mu.Unlock()
			switch {
			case tc.ran:
				assert.Equal(t, ratelimit.JobRan, job.Outcome)
				assert.NoError(t, job.Err)
			case tc.is == nil:
				assert.Equal(t, ratelimit.JobStopped, job.Outcome)
				assert.NoError(t, job.Err)
			default:
				assert.Equal(t, ratelimit.JobDropped, job.Outcome)
				assert.Equal(t, dropErr, job.Err, "what OnDropped is told")
			}
			if tc.is == nil {
				require.Zero(t, calls.Load(), "OnDropped is not called: %v", dropErr)
			} else {
				require.Equal(t, int32(1), calls.Load(), "OnDropped is called once")
				for _, want := range tc.is {
					assert.ErrorIs(t, dropErr, want)
				}
				for _, not := range tc.isNot {
					assert.NotErrorIs(t, dropErr, not)
				}
				var se *ratelimit.SettledError
				assert.Equal(t, tc.settled, errors.As(dropErr, &se), "a *SettledError: %v", dropErr)
			}
			e.flaky.fail.Store(false)
			st, err := e.lim.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			assert.Equal(t, tc.left, st.Remaining, "the tokens left")
			if tc.cancel != nil {
				require.ErrorIs(t, e.r.Cancel(ctx), tc.cancel)
				return
			}
			require.NoError(t, e.r.Cancel(ctx))
			st, err = e.lim.Value(ctx, "jobs", "k")
			require.NoError(t, err)
			assert.Equal(t, 10.0, st.Remaining, "the tokens are back")
		})
	}
}

// The OnDropped function is called once the AfterFunc let go of the job:
// it may schedule the job again on the same reservation, which runs it
// once the store answers.
func TestAfterFuncOnDroppedMayScheduleAgain(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := &flakyStore{Store: must(memstore.New())}
	lim := must(ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(mock)))
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(4), ratelimit.WithReceipt())
	require.NoError(t, err)
	var runs atomic.Int32
	job := func() { runs.Add(1) }
	again := make(chan error, 1)
	store.fail.Store(true)
	_, err = r.AfterFunc(job, ratelimit.OnDropped(func(err error) {
		assert.ErrorIs(t, err, errDown)
		store.fail.Store(false)
		_, err = r.AfterFunc(job)
		again <- err
	}))
	require.NoError(t, err)
	mock.Add(0) // the job's time: the use fails, and the job is scheduled again at once
	require.NoError(t, <-again, "the job was let go before OnDropped was called")
	require.Equal(t, int32(1), runs.Load(), "scheduled again, the job runs")
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed)
}

// OnDropped of a nil function makes AfterFunc fail and schedule nothing,
// rather than drop the news of a dropped job, or panic; the zero
// AfterFuncOption changes nothing.
func TestAfterFuncOnDroppedOfNil(t *testing.T) {
	ctx := context.Background()
	lim, mock := newReserveLimiter(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Minute, Start: t0})
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.Count(2))
	require.NoError(t, err)
	stop, err := r.AfterFunc(func() { t.Error("a job AfterFunc refused ran") }, ratelimit.OnDropped(nil))
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.ErrorContains(t, err, "OnDropped")
	assert.False(t, stop(ctx))
	mock.Add(time.Minute) // nothing was scheduled: nothing fires

	ran := make(chan struct{})
	_, err = r.AfterFunc(func() { close(ran) }, ratelimit.AfterFuncOption{})
	require.NoError(t, err, "the reservation is still the caller's")
	mock.Add(0)
	<-ran
}
