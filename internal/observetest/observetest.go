// Package observetest holds what the tests of the Prometheus and the
// OpenTelemetry observers run alike: a sequence of Reservation.AfterFunc
// jobs that run, stop and are dropped, whose counts both observers must
// report, and decisions of many limits from many goroutines at once. A
// step added here reaches the tests of both.
package observetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// Jobs makes a Limiter that reports to obs, with limit "jobs" declared and
// a limit given inline ("tenant-1"), and runs through it, with key:
// two jobs that run, one stopped, one dropped because its token was
// refunded, and one inline stopped. An observer then counts, by limit and
// how the job ended: "jobs" ran 2, stopped 1, dropped 1, and the inline
// limit stopped 1; and one decision per reservation, none per job: "jobs"
// allowed 3 and reserved 1, the inline limit allowed 1.
func Jobs(t *testing.T, obs ratelimit.Observer, key string) {
	t.Helper()
	ctx := context.Background()
	mock := clock.NewMock()
	store, err := memstore.New()
	require.NoError(t, err)
	cfg := ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second, MaxReserved: 2}
	lim, err := ratelimit.New(store, ratelimit.Limits{"jobs": cfg},
		ratelimit.WithObserver(obs), ratelimit.WithClock(mock), ratelimit.WithBreaker(0, 0))
	require.NoError(t, err)
	job := func() {}
	reserve := func(name string, opts ...ratelimit.CallOption) *ratelimit.Reservation {
		t.Helper()
		r, err := lim.Reserve(ctx, name, key, opts...)
		require.NoError(t, err)
		return r
	}

	for range 2 { // ran
		_, err = reserve("jobs").AfterFunc(job)
		require.NoError(t, err)
		mock.Add(time.Second)
	}
	stop, err := reserve("jobs").AfterFunc(job) // stopped
	require.NoError(t, err)
	require.True(t, stop(ctx))
	r := reserve("jobs", ratelimit.Count(2), ratelimit.WithReceipt()) // dropped: its token was refunded
	_, err = r.AfterFunc(job)
	require.NoError(t, err)
	require.NoError(t, lim.Refund(ctx, r.Token()))
	mock.Add(time.Second)
	stop, err = reserve("tenant-1", ratelimit.WithConfig(cfg)).AfterFunc(job) // inline
	require.NoError(t, err)
	require.True(t, stop(ctx))
}

// Concurrently reports to obs, from workers goroutines at once, an allowed
// decision of each of names limits ("l0", "l1", ...) with key, and a job
// that ran of limit "api" with every hundredth decision, while collect
// runs times times on a goroutine of its own, as a reader or a registry
// gathers. An observer then counts each limit's decisions workers times,
// and workers*((names+99)/100) jobs. Run it with -race, with names past
// the attribute sets or series the observer keeps.
func Concurrently(obs interface {
	ratelimit.Observer
	ratelimit.JobObserver
}, key string, workers, names, times int, collect func()) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range names {
				obs.Observe(ctx, ratelimit.Event{Result: ratelimit.Result{Name: fmt.Sprint("l", (i+w)%names), Key: key, OK: true},
					Outcome: ratelimit.Allowed})
				if i%100 == 0 {
					obs.ObserveJob(ctx, ratelimit.JobEvent{Result: ratelimit.Result{Name: "api", Key: key}, Outcome: ratelimit.JobRan})
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range times {
			collect()
		}
	}()
	wg.Wait()
}
