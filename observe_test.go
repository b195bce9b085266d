package ratelimit_test

import (
	"context"
	"fmt"
	"sort"
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

func TestLimitAll(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"hour":   {Kind: ratelimit.FixedWindow, Rate: 2000, Period: time.Hour, Start: t0},
		"minute": {Kind: ratelimit.FixedWindow, Rate: 33, Period: time.Minute, Start: t0},
	}, ratelimit.WithClock(mock))
	require.NoError(t, err)
	names := []string{"hour", "minute"}

	res, err := lim.LimitAll(ctx, "k", names, ratelimit.Count(30))
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Len(t, res.All, 2)
	assert.Equal(t, "minute", res.Name, "the binding limit is the one with fewest tokens left")
	assert.Equal(t, 3.0, res.Remaining)

	mock.Add(10 * time.Second)
	res, err = lim.LimitAll(ctx, "k", names, ratelimit.Count(30))
	require.NoError(t, err)
	require.False(t, res.OK)
	assert.Equal(t, "minute", res.Name)
	assert.Equal(t, 50*time.Second, res.RetryAfter)
	assert.True(t, res.All[0].OK, "the hour alone would grant")
	assert.Equal(t, 1970.0, res.All[0].Remaining, "but was not charged")
	st, err := lim.Value(ctx, "hour", "k")
	require.NoError(t, err)
	assert.Equal(t, 1970.0, st.Remaining, "a refused LimitAll charges no limit")

	_, err = lim.LimitAll(ctx, "k", []string{"hour", "hour"})
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	_, err = lim.LimitAll(ctx, "k", []string{"hour", "nope"})
	require.ErrorIs(t, err, ratelimit.ErrUnknownLimit)
	_, err = lim.LimitAll(ctx, "k", nil)
	require.Error(t, err)
	_, err = lim.LimitAll(ctx, "k", names, ratelimit.Count(34))
	require.ErrorIs(t, err, ratelimit.ErrInvalidCount, "a count one of the limits can never grant")
}

func TestObserver(t *testing.T) {
	ctx := context.Background()
	var events []ratelimit.Event
	store := &flakyStore{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, MaxReserved: 1},
	}, ratelimit.WithClock(newMock()), ratelimit.WithDenyCache(8),
		ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) { events = append(events, e) })))
	require.NoError(t, err)
	_, _ = lim.Limit(ctx, "l", "k")
	_, _ = lim.Limit(ctx, "l", "k", ratelimit.WithReserve())
	_, _ = lim.Limit(ctx, "l", "k")
	_, _ = lim.Check(ctx, "l", "k")
	store.fail.Store(true)
	_, _ = lim.Limit(ctx, "l", "other")
	require.Len(t, events, 5)
	var got []string
	for _, e := range events {
		got = append(got, fmt.Sprintf("%s/%v/local=%v/check=%v/err=%v", e.Result.Name, e.Outcome, e.Result.Local, e.Check, e.Err != nil))
	}
	assert.Equal(t, []string{
		"l/allowed/local=false/check=false/err=false",
		"l/reserved/local=false/check=false/err=false",
		"l/denied/local=false/check=false/err=false",
		"l/denied/local=true/check=true/err=false",
		"l/degraded/local=false/check=false/err=true",
	}, got)
}

// Event.Inline tells the calls of a limit given inline (WithConfig on a
// name not declared), whose names may be made per call, from those of a
// declared limit, WithConfig or not, whichever path decided them: the
// store, the failure policy, a reservation.
func TestObserverInline(t *testing.T) {
	ctx := context.Background()
	var events []ratelimit.Event
	store := &flakyStore{Store: must(memstore.New())}
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}
	lim, err := ratelimit.New(store, ratelimit.Limits{"l": cfg, "m": cfg}, ratelimit.WithClock(newMock()),
		ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) { events = append(events, e) })))
	require.NoError(t, err)
	inline := ratelimit.WithConfig(cfg)
	_, _ = lim.Limit(ctx, "l", "k")
	_, _ = lim.Limit(ctx, "l", "k2", inline)
	_, _ = lim.Limit(ctx, "tenant-42", "k", inline)
	_, _ = lim.Check(ctx, "tenant-42", "k", inline)
	_, _ = lim.Reserve(ctx, "tenant-43", "k", inline)
	_, _ = lim.LimitAll(ctx, "k3", []string{"l", "m"})
	store.fail.Store(true)
	_, _ = lim.Limit(ctx, "tenant-44", "k", inline)
	_, _ = lim.Limit(ctx, "l", "k4")
	var got []string
	for _, e := range events {
		got = append(got, fmt.Sprintf("%s/%v/inline=%v", e.Result.Name, e.Outcome, e.Inline))
	}
	assert.Equal(t, []string{
		"l/allowed/inline=false",
		"l/allowed/inline=false",
		"tenant-42/allowed/inline=true",
		"tenant-42/denied/inline=true",
		"tenant-43/allowed/inline=true",
		"l/allowed/inline=false",
		"m/allowed/inline=false",
		"tenant-44/degraded/inline=true",
		"l/degraded/inline=false",
	}, got)
}

// counterVec is a stand-in for a Prometheus CounterVec, to keep the
// example free of dependencies.
type counterVec struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counterVec) inc(labels string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[labels]++
}

// Feeding a metrics library: count decisions by limit and outcome. Never
// label by key: one series per user or IP grows without bound. Nor by the
// names of limits given inline, which may be made up per call.
func ExampleWithObserver() {
	ctx := context.Background()
	decisions := &counterVec{n: map[string]int{}}
	observer := ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) {
		name := e.Result.Name
		if e.Inline {
			name = "_OTHER"
		}
		decisions.inc(fmt.Sprintf(`limit=%q,outcome=%q`, name, e.Outcome))
	})
	lim, _ := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"search": {Kind: ratelimit.TokenBucket, Rate: 3, Period: time.Minute},
	}, ratelimit.WithObserver(observer))

	for _, user := range []string{"ann", "ann", "ann", "ann", "bob"} {
		_, _ = lim.Limit(ctx, "search", user)
	}
	var lines []string
	for labels, n := range decisions.n {
		lines = append(lines, fmt.Sprintf("ratelimit_decisions_total{%s} %d", labels, n))
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// ratelimit_decisions_total{limit="search",outcome="allowed"} 4
	// ratelimit_decisions_total{limit="search",outcome="denied"} 1
}

// jobRecorder is an Observer and a JobObserver that keeps what it is told.
type jobRecorder struct {
	mu        sync.Mutex
	decisions []ratelimit.Event
	jobs      []ratelimit.JobEvent
}

func (o *jobRecorder) Observe(_ context.Context, e ratelimit.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.decisions = append(o.decisions, e)
}

func (o *jobRecorder) ObserveJob(_ context.Context, e ratelimit.JobEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.jobs = append(o.jobs, e)
}

// take returns the job events told since the last take, each as
// name/outcome/inline/err.
func (o *jobRecorder) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var got []string
	for _, e := range o.jobs {
		got = append(got, fmt.Sprintf("%s/%v/inline=%v/err=%v", e.Result.Name, e.Outcome, e.Inline, e.Err != nil))
	}
	o.jobs = nil
	return got
}

// A JobObserver learns how every job of Reservation.AfterFunc ended, once:
// it ran, was dropped, or was stopped (with the refund's error, which stop
// does not return). A job that AfterFunc did not schedule is no event, nor
// is the reservation's decision told twice. Such jobs used to leave no
// trace in the observer, and so in the metrics.
func TestObserverJobs(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	store := &flakyStore{Store: must(memstore.New())}
	obs := &jobRecorder{}
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, MaxReserved: 2}
	lim, err := ratelimit.New(store, ratelimit.Limits{"jobs": cfg}, ratelimit.WithClock(mock),
		ratelimit.WithBreaker(0, 0), ratelimit.WithObserver(obs))
	require.NoError(t, err)
	inline := ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, FailOpen: true})
	var runs atomic.Int32
	job := func() { runs.Add(1) }

	// t0: a job that runs, a second later.
	require.NoError(t, must(lim.Limit(ctx, "jobs", "k")).Err())
	r, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	_, err = r.AfterFunc(job)
	require.NoError(t, err)
	assert.Empty(t, obs.take(), "not before its time")
	mock.Add(time.Second)
	assert.Equal(t, int32(1), runs.Load())
	assert.Equal(t, []string{"jobs/ran/inline=false/err=false"}, obs.take())

	// A job stopped: its tokens go back. A second stop is no event.
	r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(2))
	require.NoError(t, err)
	stop, err := r.AfterFunc(job)
	require.NoError(t, err)
	require.True(t, stop(ctx))
	require.False(t, stop(ctx))
	assert.Equal(t, []string{"jobs/stopped/inline=false/err=false"}, obs.take())

	// A job stopped whose refund fails: stop reports true, and the event
	// says what stop does not.
	r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(2), ratelimit.WithReceipt())
	require.NoError(t, err)
	stop, err = r.AfterFunc(job)
	require.NoError(t, err)
	store.fail.Store(true)
	require.True(t, stop(ctx))
	store.fail.Store(false)
	obs.mu.Lock()
	require.Len(t, obs.jobs, 1)
	assert.Equal(t, ratelimit.JobStopped, obs.jobs[0].Outcome)
	assert.ErrorIs(t, obs.jobs[0].Err, errDown)
	want := r.Result()
	want.Token = nil // an event carries no receipt
	assert.Equal(t, want, obs.jobs[0].Result, "the reservation's decision")
	obs.mu.Unlock()
	obs.take()
	require.NoError(t, r.Cancel(ctx), "the refund, again")

	// A job dropped: its reservation was canceled by a holder of its token.
	r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.WithReceipt())
	require.NoError(t, err)
	var dropped error
	_, err = r.AfterFunc(job, ratelimit.OnDropped(func(err error) { dropped = err }))
	require.NoError(t, err)
	require.NoError(t, lim.Refund(ctx, r.Token()))
	mock.Add(time.Second)
	require.ErrorIs(t, dropped, ratelimit.ErrReservationCanceled)
	obs.mu.Lock()
	require.Len(t, obs.jobs, 1)
	assert.Equal(t, ratelimit.JobDropped, obs.jobs[0].Outcome)
	assert.Equal(t, dropped, obs.jobs[0].Err, "what OnDropped is told")
	obs.mu.Unlock()
	obs.take()

	// A limit given inline, granted by the failure policy (its
	// reservation holds no tokens, and its job runs): Inline as its
	// decision's.
	store.fail.Store(true)
	r, err = lim.Reserve(ctx, "tenant-7", "k", inline)
	require.ErrorIs(t, err, ratelimit.ErrStoreUnavailable)
	require.True(t, r.OK() && r.Result().Degraded)
	_, err = r.AfterFunc(job)
	require.NoError(t, err)
	mock.Add(0)
	store.fail.Store(false)
	assert.Equal(t, []string{"tenant-7/ran/inline=true/err=false"}, obs.take())
	r, err = lim.Reserve(ctx, "tenant-8", "k", inline)
	require.NoError(t, err)
	stop, err = r.AfterFunc(job)
	require.NoError(t, err)
	require.True(t, stop(ctx))
	assert.Equal(t, []string{"tenant-8/stopped/inline=true/err=false"}, obs.take())

	// Scheduled nothing: no event. A refused reservation; a second
	// AfterFunc; a nil function.
	require.NoError(t, must(lim.Limit(ctx, "jobs", "k", ratelimit.Count(1))).Err())
	r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.Count(3))
	require.NoError(t, err)
	require.False(t, r.OK())
	_, err = r.AfterFunc(job)
	require.Error(t, err)
	r, err = lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	stop, err = r.AfterFunc(job)
	require.NoError(t, err)
	_, err = r.AfterFunc(job)
	require.ErrorIs(t, err, ratelimit.ErrReservationScheduled)
	_, err = r.AfterFunc(nil)
	require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
	assert.Empty(t, obs.take())
	require.True(t, stop(ctx))
	assert.Len(t, obs.take(), 1, "the one scheduled")

	obs.mu.Lock()
	defer obs.mu.Unlock()
	assert.Len(t, obs.decisions, 10, "one decision per Limit or Reserve, none for a job")
}

// aheadClock reads the time of a mock a day ahead: a clock that overrides
// Now alone (as this package's benchmarks' fixedClock does), and keeps
// the mock's Since.
type aheadClock struct{ *clock.Mock }

func (c aheadClock) Now() time.Time { return c.Mock.Now().Add(24 * time.Hour) }

// slowApply advances the mock by delay during each Apply: the decision
// takes that long on the Limiter's clock.
type slowApply struct {
	ratelimit.Store
	mock  *clock.Mock
	delay time.Duration
}

func (s *slowApply) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	s.mock.Add(s.delay)
	return s.Store.Apply(ctx, op, out)
}

// Event.Latency is measured as every time the Limiter reads: by its
// clock's Now. It was the clock's Since of the start, which a clock that
// overrides Now alone answers from another time: a day less than the
// decision took, here.
func TestObserverLatencyByNow(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	var got []time.Duration
	lim, err := ratelimit.New(&slowApply{Store: must(memstore.New()), mock: mock, delay: 3 * time.Millisecond},
		ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}},
		ratelimit.WithClock(aheadClock{mock}),
		ratelimit.WithObserver(ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) { got = append(got, e.Latency) })))
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	_, err = lim.Limit(ctx, "l", "k")
	require.NoError(t, err)
	assert.Equal(t, []time.Duration{3 * time.Millisecond, 3 * time.Millisecond}, got)
}

// Jobs stopped, canceled and run at once each end once: the JobObserver
// is told of every job scheduled exactly once, as its function runs, or
// stop reports true, or neither (a drop).
func TestObserverJobsConcurrent(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	obs := &jobRecorder{}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 1000, Period: time.Second, MaxReserved: 1000},
	}, ratelimit.WithClock(mock), ratelimit.WithObserver(obs))
	require.NoError(t, err)
	const n = 150
	var runs, stops atomic.Int32
	rs := make([]*ratelimit.Reservation, n)
	stop := make([]func(context.Context) bool, n)
	for i := range n {
		opts := []ratelimit.CallOption{ratelimit.Count(3)}
		if i%2 == 0 {
			opts = append(opts, ratelimit.WithReceipt()) // the use and cancel go to the store
		}
		rs[i], err = lim.Reserve(ctx, "jobs", "k", opts...)
		require.NoError(t, err)
		stop[i], err = rs[i].AfterFunc(func() { runs.Add(1) })
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i % 3 {
			case 0:
				if stop[i](ctx) {
					stops.Add(1)
				}
			case 1:
				_ = rs[i].Cancel(ctx)
			}
		}()
	}
	for range 10 {
		mock.Add(50 * time.Millisecond)
	}
	wg.Wait()
	mock.Add(time.Minute) // every job's time

	obs.mu.Lock()
	defer obs.mu.Unlock()
	require.Len(t, obs.jobs, n, "one event per job")
	count := map[ratelimit.JobOutcome]int32{}
	for _, e := range obs.jobs {
		count[e.Outcome]++
	}
	assert.Equal(t, runs.Load(), count[ratelimit.JobRan], "one JobRan per function run")
	assert.Equal(t, stops.Load(), count[ratelimit.JobStopped], "one JobStopped per stop that reported true")
	assert.Equal(t, int32(n), count[ratelimit.JobRan]+count[ratelimit.JobStopped]+count[ratelimit.JobDropped])
}

// An Event never carries a receipt (Result.Token), which is the caller's:
// a bearer capability that an observer logging its events would spread.
// It carried one for some calls only: a Limit with WithReceipt, a Reserve
// of a sharded limit, not a Reserve of a limit its store binds, nor any
// limit of a LimitAll.
func TestObserverNoReceipt(t *testing.T) {
	ctx := context.Background()
	obs := &jobRecorder{}
	mock := newMock()
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 100, Period: time.Second, MaxReserved: 10}
	sharded := cfg
	sharded.Shards = 4
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"b": cfg, "s": sharded},
		ratelimit.WithClock(mock), ratelimit.WithObserver(obs))
	require.NoError(t, err)
	receipt := ratelimit.WithReceipt()
	res, err := lim.Limit(ctx, "b", "k", receipt)
	require.NoError(t, err)
	require.NotNil(t, res.Token)
	r, err := lim.Reserve(ctx, "b", "k", receipt)
	require.NoError(t, err)
	require.NotNil(t, r.Token())
	r, err = lim.Reserve(ctx, "s", "k", receipt)
	require.NoError(t, err)
	require.NotNil(t, r.Token())
	res, err = lim.LimitAll(ctx, "k", []string{"b", "s"}, receipt)
	require.NoError(t, err)
	require.NotNil(t, res.Token)
	_, err = lim.Limit(ctx, "b", "k", receipt, ratelimit.WithConfig(cfg))
	require.NoError(t, err)
	stop, err := r.AfterFunc(func() {})
	require.NoError(t, err)
	require.True(t, stop(ctx))

	obs.mu.Lock()
	defer obs.mu.Unlock()
	require.Len(t, obs.decisions, 6)
	for _, e := range obs.decisions {
		assert.Nil(t, e.Result.Token, "%s: %v", e.Result.Name, e.Outcome)
	}
	require.Len(t, obs.jobs, 1)
	assert.Nil(t, obs.jobs[0].Result.Token)
}

// An Observer that panicked as Reserve reported its decision lost the
// reservation's tokens: the store had charged them, and the Reservation
// that could hand them back never reached its caller. They go back before
// the panic goes on; the decisions of Limit keep what they took.
func TestObserverPanicDuringReserveHandsTheTokensBack(t *testing.T) {
	ctx := context.Background()
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour, MaxReserved: 1}
	for _, tt := range []struct {
		name string
		opts []ratelimit.CallOption
	}{
		{"declared", nil},
		{"inline", []ratelimit.CallOption{ratelimit.WithConfig(cfg)}},
		{"declared, with a receipt", []ratelimit.CallOption{ratelimit.WithReceipt()}},
		{"sharded", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var boom atomic.Bool
			obs := ratelimit.ObserverFunc(func(context.Context, ratelimit.Event) {
				if boom.Load() {
					panic("observer boom")
				}
			})
			sharded := cfg
			sharded.Rate, sharded.MaxReserved, sharded.Shards = 2, 2, 2
			limits := ratelimit.Limits{"declared": cfg, "declared, with a receipt": cfg, "sharded": sharded}
			lim, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithClock(newMock()), ratelimit.WithObserver(obs))
			require.NoError(t, err)
			for range 2 { // the token there, then the one that may be owed
				boom.Store(true)
				require.PanicsWithValue(t, "observer boom", func() { _, _ = lim.Reserve(ctx, tt.name, "k", tt.opts...) })
				boom.Store(false)
			}
			res, err := lim.Limit(ctx, tt.name, "k", tt.opts...)
			require.NoError(t, err)
			assert.True(t, res.OK, "the tokens went back")
			assert.Zero(t, res.RetryAfter, "nothing is owed")
		})
	}
}

// An Observer that panicked as Limit or LimitAll with WithReserve reported
// its decision leaves the charge taken, owed tokens and all, as the
// Observer's doc says: only a Reserve's tokens go back, since only its
// Reservation was a means to hand them back. The Values before and after
// show the whole charge kept, nothing handed back, once or twice.
func TestObserverPanicDuringLimitWithReserveKeepsTheCharge(t *testing.T) {
	ctx := context.Background()
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Hour, MaxReserved: 1}
	for _, tt := range []struct {
		name string
		call func(*ratelimit.Limiter, ...ratelimit.CallOption) (ratelimit.Result, error)
	}{
		{"Limit", func(lim *ratelimit.Limiter, opts ...ratelimit.CallOption) (ratelimit.Result, error) {
			return lim.Limit(ctx, "a", "k", opts...)
		}},
		{"LimitAll", func(lim *ratelimit.Limiter, opts ...ratelimit.CallOption) (ratelimit.Result, error) {
			return lim.LimitAll(ctx, "k", []string{"a", "b"}, opts...)
		}},
	} {
		for _, receipt := range []bool{false, true} {
			opts := []ratelimit.CallOption{ratelimit.WithReserve(), ratelimit.Count(2)}
			if receipt {
				opts = append(opts, ratelimit.WithReceipt())
			}
			t.Run(fmt.Sprintf("%s, receipt %v", tt.name, receipt), func(t *testing.T) {
				var boom atomic.Bool
				obs := ratelimit.ObserverFunc(func(context.Context, ratelimit.Event) {
					if boom.Load() {
						panic("observer boom")
					}
				})
				lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"a": cfg, "b": cfg},
					ratelimit.WithClock(newMock()), ratelimit.WithObserver(obs))
				require.NoError(t, err)
				before, err := lim.Value(ctx, "a", "k")
				require.NoError(t, err)
				boom.Store(true)
				require.PanicsWithValue(t, "observer boom", func() { _, _ = tt.call(lim, opts...) })
				boom.Store(false)
				after, err := lim.Value(ctx, "a", "k")
				require.NoError(t, err)
				assert.Equal(t, 1.0, before.Remaining, "before")
				assert.Equal(t, -1.0, after.Remaining, "after: the token there and the one owed, kept")
				res, err := tt.call(lim, opts...)
				require.NoError(t, err)
				assert.False(t, res.OK, "nothing went back: no room is left")
			})
		}
	}
}

// panickyJobs is an Observer whose ObserveJob panics.
type panickyJobs struct{}

func (panickyJobs) Observe(context.Context, ratelimit.Event) {}

func (panickyJobs) ObserveJob(context.Context, ratelimit.JobEvent) { panic("job observer boom") }

// A JobObserver that panicked as it was told of a job's run or drop kept
// the job from its end: the store had marked the reservation used, and
// the function never ran; nor did OnDropped learn of a dropped job. The
// function (or OnDropped's) is called, and the panic goes on after it.
func TestObserverJobPanicStillRunsTheJob(t *testing.T) {
	ctx := context.Background()
	mock := newMock()
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, MaxReserved: 1}
	lim, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{"jobs": cfg}, ratelimit.WithClock(mock),
		ratelimit.WithObserver(panickyJobs{}))
	require.NoError(t, err)

	// t0: a job whose time comes a second later. The mock runs it on the
	// goroutine that moves the clock, so the panic comes back here.
	require.NoError(t, must(lim.Limit(ctx, "jobs", "k")).Err())
	r, err := lim.Reserve(ctx, "jobs", "k", ratelimit.WithReceipt())
	require.NoError(t, err)
	var ran atomic.Int32
	_, err = r.AfterFunc(func() { ran.Add(1) })
	require.NoError(t, err)
	require.PanicsWithValue(t, "job observer boom", func() { mock.Add(time.Second) })
	assert.Equal(t, int32(1), ran.Load(), "the job ran on the tokens it used")
	require.ErrorIs(t, r.Cancel(ctx), ratelimit.ErrReservationUsed)

	// A job dropped (a holder of its token canceled it): OnDropped is told.
	r, err = lim.Reserve(ctx, "jobs", "k", ratelimit.WithReceipt())
	require.NoError(t, err)
	var dropped error
	_, err = r.AfterFunc(func() { ran.Add(1) }, ratelimit.OnDropped(func(err error) { dropped = err }))
	require.NoError(t, err)
	require.NoError(t, lim.Refund(ctx, r.Token()))
	require.PanicsWithValue(t, "job observer boom", func() { mock.Add(time.Second) })
	assert.ErrorIs(t, dropped, ratelimit.ErrReservationCanceled, "OnDropped learned of the drop")
	assert.Equal(t, int32(1), ran.Load(), "a dropped job does not run")

	// A job's own panic still goes on, as time.AfterFunc's would; the
	// observer's comes first, and the job's follows it.
	r, err = lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	_, err = r.AfterFunc(func() { ran.Add(1); panic("job boom") })
	require.NoError(t, err)
	require.PanicsWithValue(t, "job boom", func() { mock.Add(time.Second) })
	assert.Equal(t, int32(2), ran.Load())
}

// LetThrough follows the Outcome, and the failure policy's answer for a
// Degraded call: a fail-open limit lets it through, a fail-closed one not.
func TestEventLetThrough(t *testing.T) {
	for _, c := range []struct {
		outcome ratelimit.Outcome
		ok      bool
		want    bool
	}{
		{ratelimit.Allowed, true, true},
		{ratelimit.Reserved, true, true},
		{ratelimit.Denied, false, false},
		{ratelimit.Degraded, true, true},
		{ratelimit.Degraded, false, false},
	} {
		e := ratelimit.Event{Outcome: c.outcome, Result: ratelimit.Result{OK: c.ok}}
		assert.Equal(t, c.want, e.LetThrough(), "%v, OK %v", c.outcome, c.ok)
	}
}
