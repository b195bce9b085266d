// Package janitor drops the expired records of a store that keeps them
// until told (store/boltstore, store/pgstore: a driver.Expirer),
// periodically, the same way for every such store. Redis expires its keys
// itself, and store/memstore drops its own as calls go by: neither needs a
// janitor (memstore's DeleteExpired, which a janitor may call too, drops
// them all at once).
package janitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/isnil"

	"github.com/benbjohnson/clock"
)

var (
	// ErrInvalid is matched (errors.Is) by the error of New
	// when an argument or option is unusable.
	ErrInvalid = errors.New("janitor: invalid argument")
	// ErrClosed is returned by Janitor.Sweep once Close was called.
	ErrClosed = errors.New("janitor: janitor is closed")
	// ErrGoexit is the Err of a timer's sweep whose store called
	// runtime.Goexit (t.FailNow does, in a test's fake store): the
	// janitor's goroutine ended, and another took its place.
	ErrGoexit = errors.New("janitor: sweep: the store called runtime.Goexit and did not return: return an error from DeleteExpired instead (in a test, t.Error rather than t.FailNow off the test's goroutine)")
)

// Janitor calls a store's DeleteExpired periodically, so that a store
// that keeps records until told to drop them (boltstore, pgstore: see
// driver.Expirer) stays proportional to the keys active recently. Build it with New and Close it when done; it owns one
// goroutine in between.
//
// Sweeps never overlap: the timer starts the next sweep Every after the
// last one ended, the timer's or a Sweep call's; a tick that finds a
// Sweep call under way is skipped, and Sweep waits for the sweep under
// way before starting its own.
//
// The time passed to DeleteExpired is the janitor's clock at the start of
// the sweep, or, for a store that keeps its own clock (driver.TimeSource
// reporting OwnClock), the store's, since its records are stamped with it.
// The janitor's clock is read as the earlier of its wall clock and the
// wall clock at New plus the time elapsed since (which, on the real
// clock, is the monotonic clock's): a step of the system's clock forward
// does not move the sweeps on with it, since they would drop the records
// of buckets that are not full again at the clocks of other processes,
// or once the clock is stepped back. Sweeps then drop records later, by
// the step (or by the time the machine was suspended, which the monotonic
// clock does not count), until the janitor is made anew; a step back is
// followed at once.
type Janitor struct {
	store    driver.Expirer
	every    time.Duration
	clock    clock.Clock
	own      driver.TimeSource // the store's own clock, if it uses one
	logger   *slog.Logger      // nil: slog.Default() at the time of logging
	observer func(Result)

	ctx    context.Context // canceled by Close: ends the loop and the sweep under way
	cancel context.CancelFunc
	timer  *clock.Timer
	sem    chan struct{} // held by the sweep under way; Close takes it for good
	// lastEnd is when the last sweep ended, the timer's or a Sweep
	// call's; under sem.
	lastEnd time.Time
	// start is the wall clock at New, from which the time elapsed bounds
	// the time of a sweep (see now).
	start  time.Time
	exited chan struct{} // closed when the loop has returned
	once   sync.Once
}

// Result describes one sweep of a Janitor, as the function given to
// WithObserver sees it.
type Result struct {
	// Now is the time passed to DeleteExpired: the janitor's clock at the
	// start of the sweep, not moved on by a step of the system's clock
	// forward (see Janitor), or the store's own.
	Now time.Time
	// Deleted is how many records the store removed, also when Err is set
	// (those it removed before it failed or was stopped).
	Deleted int
	// Duration is how long the sweep took, on the janitor's clock.
	Duration time.Duration
	// Err is the store's error, nil on success. A sweep that Close
	// interrupted ends with an error matching context.Canceled. A timer's
	// sweep whose store panicked ends with a *PanicError, which wraps the
	// panic's value when it is an error, and one whose store called
	// runtime.Goexit with ErrGoexit (a Sweep call's panic or Goexit goes
	// on to its caller instead).
	Err error
	// Manual is true for a sweep of Janitor.Sweep, false for one of the
	// timer.
	Manual bool
}

// Option configures a Janitor in New.
type Option func(*Janitor) error

// WithClock sets the clock that times the sweeps and gives their
// now. Production uses the real clock (the default); tests pass
// clock.NewMock() and move time by hand. A nil clock, or one holding a
// nil pointer, makes New fail with an error matching ErrInvalid.
func WithClock(c clock.Clock) Option {
	return func(j *Janitor) error {
		if c == nil {
			return fmt.Errorf("janitor: WithClock(nil): pass a clock, or leave the option out for the real one: %w", ErrInvalid)
		}
		if isnil.Is(c) {
			return fmt.Errorf("janitor: WithClock(%T(nil)): pass a clock, or leave the option out for the real one: %w", c, ErrInvalid)
		}
		j.clock = c
		return nil
	}
}

// WithLogger sets the logger for failed sweeps (at level Warn), for a
// panic or runtime.Goexit of the store in a timer's sweep (Error), and for the count of
// each sweep (Debug). A sweep that Close interrupts is
// not logged, and one of Sweep that its caller's context stops is logged
// at Debug: neither is a failure of the store. By default the janitor logs to
// slog.Default(); to silence it, pass slog.New(slog.DiscardHandler).
func WithLogger(logger *slog.Logger) Option {
	return func(j *Janitor) error {
		j.logger = logger
		return nil
	}
}

// WithObserver sets a function called after every sweep, on the
// goroutine that swept (the janitor's own, or Sweep's caller), before the
// next sweep may start: calls never overlap. Use it to feed metrics or to
// alert on Err; keep it fast, since it delays the next sweep and Close.
// It must not call the janitor's Sweep or Close, which wait for it: the
// call would never return (start them on another goroutine).
//
// A panic of f is not recovered, as a Limiter's Observer's is not: it is
// a bug of the application's, not a failure of the store. In a Sweep call
// it goes on to Sweep's caller; on the janitor's goroutine it ends the
// process, as a panic of time.AfterFunc's function does. After one in a
// Sweep call the janitor stays usable, as after a runtime.Goexit of f
// (on its own goroutine, the sweeps go on on another).
func WithObserver(f func(Result)) Option {
	return func(j *Janitor) error {
		j.observer = f
		return nil
	}
}

// New starts a janitor that calls store.DeleteExpired every
// interval, the first time one interval from now, until Close. A minute
// to a few minutes suits every store of this module: a record is removed
// only once its bucket has been full again for driver.ExpiryGrace, so
// sweeping more often than that buys little. An interval that is not
// positive, no store (nil, or a nil pointer of a store's type), or a nil
// Option, is an error matching ErrInvalid; so is a store that its
// constructor did not make (&boltstore.Store{}), which says so
// (driver.ZeroChecker): the error matches driver.ErrZeroStore too.
func New(store driver.Expirer, every time.Duration, opts ...Option) (*Janitor, error) {
	if store == nil {
		return nil, fmt.Errorf("janitor: New needs a store that implements driver.Expirer: %w", ErrInvalid)
	}
	if isnil.Is(store) {
		err := fmt.Errorf("janitor: New needs a store, and was given %T(nil): pass the store that its New or Open returned, once it returned no error: %w", store, ErrInvalid)
		if driver.CheckZero(store) != nil {
			err = fmt.Errorf("%w: %w", err, driver.ErrZeroStore) // as its sweeps would fail
		}
		return nil, err
	}
	if err := driver.CheckZero(store); err != nil {
		return nil, fmt.Errorf("janitor: New was given a store that its constructor did not make, whose every sweep would fail (%w): %w", err, ErrInvalid)
	}
	if every <= 0 {
		return nil, fmt.Errorf("janitor: New: interval %v is not positive: pass how often to sweep, such as time.Minute: %w", every, ErrInvalid)
	}
	j := &Janitor{store: store, every: every, clock: clock.New(),
		sem: make(chan struct{}, 1), exited: make(chan struct{})}
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("janitor: New was given a nil Option (option %d): leave it out, or pass the option it was meant to be: %w", i+1, ErrInvalid)
		}
		if err := o(j); err != nil {
			return nil, err
		}
	}
	if ts, ok := store.(driver.TimeSource); ok && ts.OwnClock() {
		j.own = ts
	}
	j.start = j.clock.Now()
	j.ctx, j.cancel = context.WithCancel(context.Background())
	// Armed here, not in the goroutine, so that the first sweep is due one
	// interval after New returns whatever the scheduling.
	j.timer = j.clock.Timer(every)
	go j.loop()
	return j, nil
}

// Every returns the interval between the end of one sweep and the start of
// the next.
func (j *Janitor) Every() time.Duration { return j.every }

func (j *Janitor) loop() {
	for {
		select {
		case <-j.ctx.Done():
			j.exit()
			return
		case <-j.timer.C:
		}
		if j.ctx.Err() != nil {
			// Close began while the tick was due (select chooses at
			// random among the ready cases): it waits only for the sweep
			// under way, and none is to start.
			j.exit()
			return
		}
		j.tick()
	}
}

// exit ends the loop: the timer is stopped and Close may go on.
func (j *Janitor) exit() {
	j.timer.Stop()
	close(j.exited)
}

// tick runs the timer's sweep, unless a Sweep call is under way or one
// ended less than an interval ago.
//
// A store or an observer that calls runtime.Goexit ends the loop's
// goroutine, whatever it defers, holding sem: another goroutine then
// takes the loop over, and sem with it, and ends the sweep as the loop
// would have (for the store's, a sweep failed with ErrGoexit, reported).
// Else no sweep would start again, and Close would wait for sem forever.
func (j *Janitor) tick() {
	select {
	case j.sem <- struct{}{}:
	default:
		// A Sweep call is under way: this tick is served by it.
		j.timer.Reset(j.every)
		return
	}
	if wait := j.lastEnd.Add(j.every).Sub(j.clock.Now()); wait > 0 {
		// A tick due before a Sweep call re-armed the timer: the next
		// sweep is due an interval after that call's end.
		j.timer.Reset(wait)
		<-j.sem
		return
	}
	var res Result
	swept, reported := false, false
	defer func() {
		if !reported { // runtime.Goexit: this goroutine ends on return
			go j.resume(res, !swept)
		}
	}()
	j.sweep(j.ctx, false, &res)
	swept = true
	// Re-armed before the observer hears of the sweep, so that the next
	// is due one interval after this one's end.
	j.timer.Reset(j.every)
	j.report(j.ctx, res)
	reported = true
	<-j.sem
}

// resume takes the loop over from a goroutine that runtime.Goexit ended
// in tick, holding sem: it reports res first if the store's Goexit left
// it unreported. Should the observer call runtime.Goexit again, another
// goroutine takes over in turn.
func (j *Janitor) resume(res Result, report bool) {
	if report {
		done := false
		defer func() {
			if !done {
				go j.resume(res, false)
			}
		}()
		j.timer.Reset(j.every)
		j.report(j.ctx, res)
		done = true
	}
	<-j.sem
	j.loop()
}

// Sweep runs one sweep now and returns how many records the store removed.
// If a sweep is under way, it waits for it to end first. The timer's next
// sweep is then due one interval after this one's end. It returns
// ErrClosed after Close, and ctx's error if ctx ends while it
// waits; Close interrupts the sweep (the store stops at its next step
// with what it removed so far and an error matching context.Canceled).
// The observer of WithObserver hears of it as of the timer's. A panic of
// the store goes on to Sweep's caller, who may recover it; the janitor
// stays usable.
func (j *Janitor) Sweep(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("janitor: sweep: %w", err)
	}
	select {
	case j.sem <- struct{}{}:
	case <-ctx.Done():
		return 0, fmt.Errorf("janitor: sweep: waiting for the sweep under way: %w", ctx.Err())
	case <-j.ctx.Done():
		return 0, ErrClosed
	}
	defer func() { <-j.sem }()
	if j.ctx.Err() != nil {
		return 0, ErrClosed
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(j.ctx, cancel)
	defer stop()
	var res Result
	j.sweep(sctx, true, &res)
	if j.ctx.Err() == nil {
		j.timer.Reset(j.every) // Close stops it again once it holds sem
	}
	j.report(sctx, res)
	return res.Deleted, res.Err
}

// sweep calls DeleteExpired once, and sets *res to what became of it,
// also when the store calls runtime.Goexit; the caller holds sem.
func (j *Janitor) sweep(ctx context.Context, manual bool, res *Result) {
	start := j.clock.Now()
	*res = Result{Now: j.now(start), Manual: manual}
	returned := false
	defer func() {
		if !returned && !manual {
			// A panic of the store on the janitor's goroutine would end
			// the process, with no caller to recover it: it is the
			// sweep's error instead, and the next sweep is due as after
			// any other. So is runtime.Goexit (recover returns nil),
			// after which the loop goes on on another goroutine (see
			// tick). A Sweep call's panic or Goexit goes on to its
			// caller.
			res.Deleted, res.Err = 0, ErrGoexit
			if v := recover(); v != nil {
				res.Err = &PanicError{Store: fmt.Sprintf("%T", j.store), Value: v, Stack: debug.Stack()}
			}
		}
		res.Duration = j.clock.Since(start)
		j.lastEnd = start.Add(res.Duration)
	}()
	if j.own != nil {
		ms, err := j.own.Now(ctx)
		if err != nil {
			res.Err = fmt.Errorf("janitor: sweep: reading the store's clock: %w", err)
			returned = true
			return
		}
		res.Now = time.UnixMilli(ms)
	}
	res.Deleted, res.Err = j.store.DeleteExpired(ctx, res.Now)
	returned = true
}

// PanicError is the Err of a timer's sweep whose store panicked, in
// DeleteExpired or in reading its own clock (driver.TimeSource): on the
// janitor's goroutine no caller could recover the panic, and the process
// would end. (A Sweep call's panic goes on to its caller.)
type PanicError struct {
	Store string // the store's type, such as *boltstore.Store
	Value any    // the value the store panicked with
	Stack []byte // the stack of the janitor's goroutine as it panicked
}

// Error says which store panicked, with what, and what to do.
func (e *PanicError) Error() string {
	return fmt.Sprintf("janitor: sweep: the store (%s) panicked: %v; it has a bug: report it to its authors with the stack logged beside this error (PanicError.Stack)", e.Store, e.Value)
}

// Unwrap returns the value of the panic when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// now returns the time of a sweep that starts at wall, the janitor's clock:
// the earlier of wall and the wall clock at New plus the time elapsed since
// (the monotonic clock's, on the real clock), without a monotonic reading.
func (j *Janitor) now(wall time.Time) time.Time {
	wall = wall.Round(0)
	if t := j.start.Round(0).Add(j.clock.Since(j.start)); t.Before(wall) {
		return t
	}
	return wall
}

// report logs res and hands it to the observer; the caller holds sem.
func (j *Janitor) report(ctx context.Context, res Result) {
	logger := j.logger
	if logger == nil {
		logger = slog.Default()
	}
	var pe *PanicError
	switch {
	case res.Err == nil:
		logger.LogAttrs(ctx, slog.LevelDebug, "janitor: swept the store",
			slog.Int("deleted", res.Deleted), slog.Duration("took", res.Duration))
	case errors.As(res.Err, &pe):
		logger.LogAttrs(ctx, slog.LevelError, "janitor: the store panicked in a sweep; the next sweep tries again",
			slog.Any("err", res.Err), slog.String("stack", string(pe.Stack)))
	case errors.Is(res.Err, ErrGoexit):
		logger.LogAttrs(ctx, slog.LevelError, "janitor: the store called runtime.Goexit in a sweep; the next sweep tries again",
			slog.Any("err", res.Err))
	case j.ctx.Err() != nil && errors.Is(res.Err, context.Canceled):
		// Close interrupted it: nothing went wrong.
	case res.Manual && ctx.Err() != nil && errors.Is(res.Err, ctx.Err()):
		// The caller of Sweep stopped it (its context ended): the store
		// did not fail.
		logger.LogAttrs(ctx, slog.LevelDebug, "janitor: sweep stopped by its caller's context",
			slog.Int("deleted", res.Deleted), slog.Any("err", res.Err))
	default:
		logger.LogAttrs(ctx, slog.LevelWarn, "janitor: sweeping expired records failed; the next sweep tries again",
			slog.Int("deleted", res.Deleted), slog.Any("err", res.Err))
	}
	if j.observer != nil {
		j.observer(res)
	}
}

// Close stops the janitor: it interrupts the sweep under way, if any
// (through its context), waits for it to return, and stops the timer.
// Afterwards, Sweep returns ErrClosed. It is idempotent and safe to
// call concurrently; it does not close the store. The error is always nil
// (Close has one to be an io.Closer).
func (j *Janitor) Close() error {
	j.once.Do(func() {
		j.cancel()
		<-j.exited
		j.sem <- struct{}{} // held for good: no sweep starts again
		j.timer.Stop()      // which a Sweep call may have re-armed
	})
	return nil
}
