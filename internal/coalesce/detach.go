package coalesce

import "context"

// Detached runs fn on a goroutine of its own when ctx can end (on the
// caller's when it cannot) and returns fn's error, or ctx's once ctx ends
// first: for a call that may block past its context's end where the
// context cannot reach it (a read that a client bounds by its own timeout
// only, a lock held by another transaction). When ctx ends first, fn
// finishes in the background, so it must write only to memory its caller
// reads after Detached returns nil. A panic in fn goes on to the caller,
// as it would on the caller's goroutine, if the caller is still there;
// one left behind is dropped, rather than end the process where nobody
// can recover it. A runtime.Goexit in fn (t.FailNow) on the goroutine of
// its own ends that goroutine only: Detached returns ErrGoexit, as a
// detached lone call of a Batcher does. It is the lone call of
// Options.Detach, for calls that do not go through a Batcher.
func Detached(ctx context.Context, fn func() error) error {
	if ctx.Done() == nil {
		return fn()
	}
	type result struct {
		err      error
		panicked any
		ok       bool // fn returned: it did not panic
		exited   bool // fn called runtime.Goexit
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if !r.ok {
				r.panicked = recover()
				r.exited = r.panicked == nil // a panic's value is never nil
			}
			done <- r
		}()
		r.err = fn()
		r.ok = true
	}()
	select {
	case r := <-done:
		if r.exited {
			return ErrGoexit
		}
		if !r.ok {
			panic(r.panicked)
		}
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}
