package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"

	"github.com/benbjohnson/clock"
)

var (
	// ErrInvalidJanitor is matched (errors.Is) by the error of NewJanitor
	// when an argument or option is unusable.
	ErrInvalidJanitor = errors.New("ratelimit: invalid janitor")
	// ErrJanitorClosed is returned by Janitor.Sweep once Close was called.
	ErrJanitorClosed = errors.New("ratelimit: janitor is closed")
)

// Janitor calls a store's DeleteExpired periodically, so that a store
// that keeps records until told to drop them (memstore, boltstore,
// pgstore: see driver.Expirer) stays proportional to the keys active
// recently. Build it with NewJanitor and Close it when done; it owns one
// goroutine in between.
//
// Sweeps never overlap: the timer starts the next sweep Every after the
// last one ended, a tick that finds a Sweep call under way is skipped, and
// Sweep waits for the sweep under way before starting its own.
//
// The time passed to DeleteExpired is the janitor's clock at the start of
// the sweep, or, for a store that keeps its own clock (driver.TimeSource
// reporting OwnClock), the store's, since its records are stamped with it.
type Janitor struct {
	store    driver.Expirer
	every    time.Duration
	clock    clock.Clock
	own      driver.TimeSource // the store's own clock, if it uses one
	logger   *slog.Logger      // nil: slog.Default() at the time of logging
	observer func(SweepResult)

	ctx    context.Context // canceled by Close: ends the loop and the sweep under way
	cancel context.CancelFunc
	timer  *clock.Timer
	sem    chan struct{} // held by the sweep under way; Close takes it for good
	exited chan struct{} // closed when the loop has returned
	once   sync.Once
}

// SweepResult describes one sweep of a Janitor, as the function given to
// WithSweepObserver sees it.
type SweepResult struct {
	// Now is the time passed to DeleteExpired.
	Now time.Time
	// Deleted is how many records the store removed, also when Err is set
	// (those it removed before it failed or was stopped).
	Deleted int
	// Duration is how long the sweep took, on the janitor's clock.
	Duration time.Duration
	// Err is the store's error, nil on success. A sweep that Close
	// interrupted ends with an error matching context.Canceled.
	Err error
	// Manual is true for a sweep of Janitor.Sweep, false for one of the
	// timer.
	Manual bool
}

// JanitorOption configures a Janitor in NewJanitor.
type JanitorOption func(*Janitor) error

// WithJanitorClock sets the clock that times the sweeps and gives their
// now. Production uses the real clock (the default); tests pass
// clock.NewMock() and move time by hand.
func WithJanitorClock(c clock.Clock) JanitorOption {
	return func(j *Janitor) error {
		if c == nil {
			return fmt.Errorf("ratelimit: WithJanitorClock(nil): pass a clock, or leave the option out for the real one: %w", ErrInvalidJanitor)
		}
		j.clock = c
		return nil
	}
}

// WithJanitorLogger sets the logger for failed sweeps (at level Warn) and
// for the count of each sweep (Debug). By default the janitor logs to
// slog.Default(); to silence it, pass slog.New(slog.DiscardHandler).
func WithJanitorLogger(logger *slog.Logger) JanitorOption {
	return func(j *Janitor) error {
		j.logger = logger
		return nil
	}
}

// WithSweepObserver sets a function called after every sweep, on the
// goroutine that swept (the janitor's own, or Sweep's caller), before the
// next sweep may start: calls never overlap. Use it to feed metrics or to
// alert on Err; keep it fast, since it delays the next sweep and Close.
func WithSweepObserver(f func(SweepResult)) JanitorOption {
	return func(j *Janitor) error {
		j.observer = f
		return nil
	}
}

// NewJanitor starts a janitor that calls store.DeleteExpired every
// interval, the first time one interval from now, until Close. A minute
// to a few minutes suits every store of this module: a record is removed
// only once its bucket has been full again for driver.ExpiryGrace, so
// sweeping more often than that buys little. An interval that is not
// positive, or a nil store, is an error matching ErrInvalidJanitor.
func NewJanitor(store driver.Expirer, every time.Duration, opts ...JanitorOption) (*Janitor, error) {
	if store == nil {
		return nil, fmt.Errorf("ratelimit: NewJanitor needs a store that implements driver.Expirer: %w", ErrInvalidJanitor)
	}
	if every <= 0 {
		return nil, fmt.Errorf("ratelimit: NewJanitor: interval %v is not positive: pass how often to sweep, such as time.Minute: %w", every, ErrInvalidJanitor)
	}
	j := &Janitor{store: store, every: every, clock: clock.New(),
		sem: make(chan struct{}, 1), exited: make(chan struct{})}
	for _, o := range opts {
		if err := o(j); err != nil {
			return nil, err
		}
	}
	if ts, ok := store.(driver.TimeSource); ok && ts.OwnClock() {
		j.own = ts
	}
	j.ctx, j.cancel = context.WithCancel(context.Background())
	// Armed here, not in the goroutine, so that the first sweep is due one
	// interval after NewJanitor returns whatever the scheduling.
	j.timer = j.clock.Timer(every)
	go j.loop()
	return j, nil
}

// Every returns the interval between the end of one sweep and the start of
// the next.
func (j *Janitor) Every() time.Duration { return j.every }

func (j *Janitor) loop() {
	defer close(j.exited)
	defer j.timer.Stop()
	for {
		select {
		case <-j.ctx.Done():
			return
		case <-j.timer.C:
		}
		select {
		case j.sem <- struct{}{}:
			res := j.sweep(j.ctx, false)
			// Re-armed before the observer hears of the sweep, so that the
			// next is due one interval after this one's end.
			j.timer.Reset(j.every)
			j.report(j.ctx, res)
			<-j.sem
		default:
			// A Sweep call is under way: this tick is served by it.
			j.timer.Reset(j.every)
		}
	}
}

// Sweep runs one sweep now and returns how many records the store removed.
// If a sweep is under way, it waits for it to end first. It returns
// ErrJanitorClosed after Close, and ctx's error if ctx ends while it
// waits; Close interrupts the sweep (the store stops at its next step
// with what it removed so far and an error matching context.Canceled).
// The observer of WithSweepObserver hears of it as of the timer's.
func (j *Janitor) Sweep(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("ratelimit: janitor sweep: %w", err)
	}
	select {
	case j.sem <- struct{}{}:
	case <-ctx.Done():
		return 0, fmt.Errorf("ratelimit: janitor sweep: waiting for the sweep under way: %w", ctx.Err())
	case <-j.ctx.Done():
		return 0, ErrJanitorClosed
	}
	defer func() { <-j.sem }()
	if j.ctx.Err() != nil {
		return 0, ErrJanitorClosed
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(j.ctx, cancel)
	defer stop()
	res := j.sweep(sctx, true)
	j.report(sctx, res)
	return res.Deleted, res.Err
}

// sweep calls DeleteExpired once; the caller holds sem.
func (j *Janitor) sweep(ctx context.Context, manual bool) SweepResult {
	start := j.clock.Now()
	res := SweepResult{Now: start, Manual: manual}
	if j.own != nil {
		ms, err := j.own.Now(ctx)
		if err != nil {
			res.Err = fmt.Errorf("ratelimit: janitor: reading the store's clock: %w", err)
			res.Duration = j.clock.Since(start)
			return res
		}
		res.Now = time.UnixMilli(ms)
	}
	res.Deleted, res.Err = j.store.DeleteExpired(ctx, res.Now)
	res.Duration = j.clock.Since(start)
	return res
}

// report logs res and hands it to the observer; the caller holds sem.
func (j *Janitor) report(ctx context.Context, res SweepResult) {
	logger := j.logger
	if logger == nil {
		logger = slog.Default()
	}
	switch {
	case res.Err == nil:
		logger.LogAttrs(ctx, slog.LevelDebug, "ratelimit: janitor swept the store",
			slog.Int("deleted", res.Deleted), slog.Duration("took", res.Duration))
	case j.ctx.Err() != nil && errors.Is(res.Err, context.Canceled):
		// Close interrupted it: nothing went wrong.
	default:
		logger.LogAttrs(ctx, slog.LevelWarn, "ratelimit: janitor: sweeping expired records failed; the next sweep tries again",
			slog.Int("deleted", res.Deleted), slog.Any("err", res.Err))
	}
	if j.observer != nil {
		j.observer(res)
	}
}

// Close stops the janitor: it interrupts the sweep under way, if any
// (through its context), waits for it to return, and stops the timer.
// Afterwards, Sweep returns ErrJanitorClosed. It is idempotent and safe to
// call concurrently; it does not close the store. The error is always nil
// (Close has one to be an io.Closer).
func (j *Janitor) Close() error {
	j.once.Do(func() {
		j.cancel()
		<-j.exited
		j.sem <- struct{}{} // held for good: no sweep starts again
	})
	return nil
}
