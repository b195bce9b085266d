package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
)

// downStore fails every call while down is set: a Redis or PostgreSQL
// out of reach when a job's time comes.
type downStore struct {
	ratelimit.Store
	down atomic.Bool
}

func (s *downStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	if s.down.Load() {
		return errors.New("dial tcp 127.0.0.1:6379: connection refused")
	}
	return s.Store.Apply(ctx, op, out)
}

// Learning of a job that AfterFunc dropped. The reservation's token was
// taken (WithReceipt), so AfterFunc marks the reservation used in the
// store when the job's time comes; the store is down then, and the job
// does not run. OnDropped says so, and why: the error matches
// ErrNotRefunded, so the reservation may still hold the tokens, and the
// job is scheduled again once the store is back (Cancel would hand the
// tokens back instead).
func ExampleOnDropped() {
	ctx := context.Background()
	mock := clock.NewMock()
	start := time.Date(2024, 1, 1, 9, 0, 0, 0, time.UTC)
	mock.Set(start)
	mem, err := memstore.New()
	if err != nil {
		panic(err)
	}
	store := &downStore{Store: mem}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"email": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Second, Start: start},
	}, ratelimit.WithClock(mock))
	if err != nil {
		panic(err)
	}
	if _, err := lim.Limit(ctx, "email", "newsletter"); err != nil {
		panic(err)
	}
	r, err := lim.Reserve(ctx, "email", "newsletter", ratelimit.WithReceipt())
	if err != nil || !r.OK() {
		panic(fmt.Sprint("not reserved: ", err))
	}

	send := func() { fmt.Println("sent at", mock.Now().Sub(start)) }
	again := make(chan struct{}, 1)
	_, err = r.AfterFunc(send, ratelimit.OnDropped(func(err error) {
		switch {
		case errors.Is(err, ratelimit.ErrNotRefunded):
			// The store failed, or did not answer in time.
			fmt.Println("dropped: the store failed; schedule it again")
			again <- struct{}{}
		case errors.Is(err, ratelimit.ErrReservationCanceled):
			fmt.Println("dropped: canceled, the tokens are back")
		default:
			fmt.Println("dropped:", err)
		}
	}))
	if err != nil {
		panic(err)
	}

	store.down.Store(true)
	mock.Add(time.Second) // the job's time, with the store down
	<-again
	store.down.Store(false)
	if _, err := r.AfterFunc(send); err != nil {
		panic(err)
	}
	mock.Add(0) // the job's time has passed: it runs at once
	// Output:
	// dropped: the store failed; schedule it again
	// sent at 1s
}
