package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// When the store fails, a call cannot know the state of its limit. Each
// limit then follows its failure policy (Config.FailOpen): fail closed (the
// default) refuses the call, fail open allows it. Either way the Result is
// marked Degraded and the store's error is returned beside it, wrapped in a
// *StoreError, so that the caller sees the failure and may still act on
// the policy's decision.
//
// A store that keeps failing would add its timeout to every call. The
// Limiter's breaker counts consecutive failures; past a threshold it stops
// asking the store for a cool-down, deciding every call by its policy at
// once, then lets one call probe the store, and closes again on success.

// ErrStoreUnavailable is matched by the *StoreError of a call decided by
// the failure policy because the store failed or the breaker is open.
var ErrStoreUnavailable = errors.New("ratelimit: store unavailable")

// StoreError is the error of a call that the store could not decide. Its
// Result is Degraded and follows the limit's failure policy.
type StoreError struct {
	// Name is the limit called (the first, for LimitAll).
	Name string
	// Err is the store's error; nil when the breaker was open and the store
	// was not asked.
	Err error
	// Until is, when the breaker is open, the time it lets a probe through.
	Until time.Time
}

func (e *StoreError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("ratelimit: limit %q: store not asked: it failed repeatedly; the failure policy decides until %v",
			e.Name, e.Until.Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("ratelimit: limit %q: store: %v", e.Name, e.Err)
}

// Unwrap returns the store's error.
func (e *StoreError) Unwrap() error { return e.Err }

// Is reports whether target is ErrStoreUnavailable.
func (e *StoreError) Is(target error) bool { return target == ErrStoreUnavailable }

// Defaults of the breaker; WithBreaker changes them.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = 2 * time.Second
)

// WithBreaker sets how many consecutive store failures open the breaker,
// and for how long it then decides calls by their failure policy without
// asking the store. failures ≤ 0 disables the breaker: every call asks the
// store.
func WithBreaker(failures int, cooldown time.Duration) Option {
	return func(l *Limiter) { l.breaker.threshold, l.breaker.cooldown = failures, cooldown }
}

type breaker struct {
	threshold int
	cooldown  time.Duration

	mu      sync.Mutex
	fails   int
	until   time.Time // open until then
	probing bool      // a probe is under way
}

// allow reports whether a call may ask the store now; when not, until says
// when a probe will be let through.
func (b *breaker) allow(now time.Time) (ok bool, until time.Time) {
	if b.threshold <= 0 {
		return true, time.Time{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.fails < b.threshold:
		return true, time.Time{}
	case now.Before(b.until) || b.probing:
		return false, b.until
	}
	b.probing = true
	return true, time.Time{}
}

func (b *breaker) success() (closed bool) {
	if b.threshold <= 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	closed = b.fails >= b.threshold
	b.fails, b.probing = 0, false
	return closed
}

func (b *breaker) failure(now time.Time) (opened bool) {
	if b.threshold <= 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails++
	b.probing = false
	if b.fails >= b.threshold {
		b.until = now.Add(b.cooldown)
		return true
	}
	return false
}

// callerGaveUp reports whether err comes from the caller's own context
// being canceled, which says nothing about the store's health.
func callerGaveUp(ctx context.Context, err error) bool {
	return errors.Is(err, context.Canceled) && ctx.Err() != nil
}
