package ratelimit_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
)

// A fleet of job workers sharing one limit (docs/reservations.md): a
// producer reserves capacity for each job and enqueues the job with its
// token and its time; workers, standing for other processes, mark each job
// used by its token and run it at its time without asking the limiter
// again; a job dropped from the queue is canceled by its token; the
// reservations of a producer that crashed before enqueueing are handed
// back from its outbox. Every process has its own Limiter on the shared
// store (here a memstore; Redis or PostgreSQL in production).
func Example_fleet() {
	ctx := context.Background()
	start := time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewMock()
	clk.Set(start)
	store, _ := memstore.New()
	limits := ratelimit.Limits{"send": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Second,
		MaxReserved: 20, Start: time.Unix(0, 0)}}
	process := func() *ratelimit.Limiter {
		l, _ := ratelimit.New(store, limits, ratelimit.WithClock(clk))
		return l
	}

	type job struct {
		id    int
		token string
		runAt time.Time
	}
	type entry struct {
		token    string
		enqueued bool
	}
	queue := make(chan job, 32)
	outbox := map[int]*entry{} // the producer's outbox, written before the queue
	reserved := map[int]time.Time{}

	// The producer: reserve, write the token to the outbox, enqueue, mark
	// the outbox entry enqueued. It crashes after writing jobs 12 to 14 to
	// its outbox, before enqueueing them.
	producer := process()
	var pending []job
	for id := range 15 {
		r, err := producer.Reserve(ctx, "send", "tenant-1")
		if err != nil || !r.OK() {
			fmt.Println("reserve:", err)
			return
		}
		tok := r.Token().String()
		outbox[id] = &entry{token: tok}
		reserved[id] = r.Time()
		if id >= 12 {
			continue // crashed
		}
		pending = append(pending, job{id: id, token: tok, runAt: r.Time()})
		outbox[id].enqueued = true
	}

	// Recovery, by another process that saw the producer die: every
	// outbox token never enqueued is handed back. Run twice (a retry),
	// it hands nothing back twice.
	recovery := process()
	recoverOutbox := func() (refunded, settled int) {
		for id := 0; id < 15; id++ {
			e := outbox[id]
			if e.enqueued {
				continue
			}
			tok, err := ratelimit.ParseToken(e.token)
			if err != nil {
				fmt.Println("outbox:", err)
				continue
			}
			switch err := recovery.Refund(ctx, tok); {
			case err == nil:
				refunded++
			case errors.Is(err, ratelimit.ErrAlreadySettled):
				settled++
			default:
				fmt.Println("recovery:", err)
			}
		}
		return refunded, settled
	}
	refunded, _ := recoverOutbox()
	_, again := recoverOutbox()
	fmt.Printf("recovery handed back %d reservations; its retry found %d already settled\n", refunded, again)

	// Job 3 is dropped from the queue (its user deleted it): the worker
	// that drops it cancels its token. The jobs reserved after it keep
	// their windows, so its token does not come back: the record still
	// owes the 7 tokens of jobs 5 to 11.
	for _, j := range pending {
		if j.id == 3 {
			tok, _ := ratelimit.ParseToken(j.token)
			if err := process().Refund(ctx, tok); err != nil {
				fmt.Println("drop:", err)
			}
			continue
		}
		queue <- j
	}
	close(queue)
	st, _ := recovery.Value(ctx, "send", "tenant-1")
	fmt.Printf("owed after the refunds: %v\n", -st.Remaining)

	// Three workers: mark used by token, then run at the job's time.
	var (
		mu    sync.Mutex
		ran   = map[int]time.Time{}
		wg    sync.WaitGroup
		fails []error
	)
	for range 3 {
		worker := process()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range queue {
				tok, err := ratelimit.ParseToken(j.token)
				if err == nil {
					err = worker.Use(ctx, tok)
				}
				if err != nil {
					mu.Lock()
					fails = append(fails, err)
					mu.Unlock()
					continue // settled elsewhere: the job must not run
				}
				if d := tok.RunAt().Sub(clk.Now()); d > 0 {
					<-clk.After(d)
				}
				mu.Lock()
				ran[j.id] = clk.Now() // the job runs here
				mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
			clk.Add(50 * time.Millisecond)
		}
	}

	early, perWindow, most := 0, map[int64]int{}, 0
	for id, at := range ran {
		if at.Before(reserved[id]) {
			early++
		}
		w := reserved[id].Unix()
		perWindow[w]++
		most = max(most, perWindow[w])
	}
	fmt.Printf("jobs run: %d, early: %d, failed to start: %d\n", len(ran), early, len(fails))
	fmt.Printf("most jobs in one window: %d (the limit grants 5 a second)\n", most)
	// Output:
	// recovery handed back 3 reservations; its retry found 3 already settled
	// owed after the refunds: 7
	// jobs run: 11, early: 0, failed to start: 0
	// most jobs in one window: 5 (the limit grants 5 a second)
}

// A worker marks a job's token used with Settler, naming the job's
// attempt, so that a retry after a lost reply knows whether the use was
// its own. Here the store takes the first Use, and the worker, its reply
// lost, retries: the retry finds its own use and runs the job. The queue
// then delivers the job again, as a new attempt, to another worker: its
// Use finds the first worker's and does not run it.
func ExampleSettler() {
	ctx := context.Background()
	clk := clock.NewMock()
	store, _ := memstore.New()
	limits := ratelimit.Limits{"send": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Second}}
	producer, _ := ratelimit.New(store, limits, ratelimit.WithClock(clk))
	worker, _ := ratelimit.New(store, limits, ratelimit.WithClock(clk))
	r, _ := producer.Reserve(ctx, "send", "tenant-1")
	payload := r.Token().String() // enqueued with the job

	// attempt names one delivery of a job: the job's ID alone would be
	// shared by a redelivery, which must not take the first use for its own.
	attempt := func(job string, n int) ratelimit.SettleOption {
		sum := sha256.Sum256(fmt.Appendf(nil, "%s attempt %d", job, n))
		return ratelimit.Settler([16]byte(sum[:16]))
	}
	run := func(who string, err error) {
		switch {
		case err == nil:
			fmt.Printf("%s: runs the job\n", who)
		case errors.Is(err, ratelimit.ErrAlreadySettled):
			fmt.Printf("%s: settled elsewhere (used: %t), not run\n", who, errors.Is(err, ratelimit.ErrReservationUsed))
		default:
			fmt.Printf("%s: retry later: %v\n", who, err)
		}
	}

	tok, _ := ratelimit.ParseToken(payload)
	_ = worker.Use(ctx, tok, attempt("job-7", 1)) // taken by the store; say the reply is lost
	run("worker, retrying", worker.Use(ctx, tok, attempt("job-7", 1)))
	run("another worker, attempt 2", worker.Use(ctx, tok, attempt("job-7", 2)))
	run("a worker naming no settler", worker.Use(ctx, tok))
	// Output:
	// worker, retrying: runs the job
	// another worker, attempt 2: settled elsewhere (used: true), not run
	// a worker naming no settler: settled elsewhere (used: true), not run
}
