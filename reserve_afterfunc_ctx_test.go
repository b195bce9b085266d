package ratelimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// traceKey is the key of a value a caller's context carries (a trace ID).
type traceKey struct{}

// ctxRecorder is a Store that keeps the trace value of the context of
// every Apply.
type ctxRecorder struct {
	ratelimit.Store
	mu     sync.Mutex
	traces []any
}

func (s *ctxRecorder) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	s.mu.Lock()
	s.traces = append(s.traces, ctx.Value(traceKey{}))
	s.mu.Unlock()
	return s.Store.Apply(ctx, op, out)
}

// ctxJobRecorder is an Observer and a JobObserver that keeps the trace
// value of the context of every job event.
type ctxJobRecorder struct {
	mu     sync.Mutex
	traces []any
}

func (o *ctxJobRecorder) Observe(context.Context, ratelimit.Event) {}

func (o *ctxJobRecorder) ObserveJob(ctx context.Context, _ ratelimit.JobEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.traces = append(o.traces, ctx.Value(traceKey{}))
}

// The store call by which AfterFunc marks a reservation used, and the
// JobObserver's event of the job, carry the values of the Reserve call's
// context (a trace, a span), not its end: the caller's context was
// canceled (its request answered) before the job's time, and the job runs
// all the same. They used to run with context.Background(), and a trace
// lost the job.
func TestAfterFuncKeepsReserveContextValues(t *testing.T) {
	mock := newMock()
	store := &ctxRecorder{Store: must(memstore.New())}
	obs := &ctxJobRecorder{}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"jobs": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second},
	}, ratelimit.WithClock(mock), ratelimit.WithObserver(obs))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), traceKey{}, "trace-1"))
	require.True(t, must(lim.Limit(ctx, "jobs", "k")).OK)
	r, err := lim.Reserve(ctx, "jobs", "k")
	require.NoError(t, err)
	require.NotNil(t, r.Token(), "a token taken: the use asks the store")
	ran := make(chan struct{}, 1)
	_, err = r.AfterFunc(func() { ran <- struct{}{} })
	require.NoError(t, err)
	cancel() // the request was answered; its job is still to run
	store.mu.Lock()
	store.traces = nil
	store.mu.Unlock()
	mock.Add(time.Second)
	<-ran
	store.mu.Lock()
	defer store.mu.Unlock()
	assert.Equal(t, []any{"trace-1"}, store.traces, "the use's store call")
	obs.mu.Lock()
	defer obs.mu.Unlock()
	assert.Equal(t, []any{"trace-1"}, obs.traces, "the JobObserver's event")
}
