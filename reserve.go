package ratelimit

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
)

// DefaultRefundTimeout is how long past the end of its context a
// Reservation.Wait that gives up may take to hand the tokens back, unless
// WithRefundTimeout says otherwise.
const DefaultRefundTimeout = time.Second

// DefaultAfterFuncTimeout is how long Reservation.AfterFunc waits on the
// store to mark a reservation used, when the job's time comes, before it
// gives up and lets go of the job, unless WithAfterFuncTimeout says
// otherwise.
const DefaultAfterFuncTimeout = 10 * time.Second

// Reservation is capacity taken for a job that may have to wait for it:
// the answer to Limiter.Reserve. When OK, the tokens are the job's, and
// Time says when the job may run; the job's owner waits for that moment
// (Wait), has a function run then (AfterFunc), or hands the tokens back
// (Cancel) when the job will not run. A Reservation is safe for
// concurrent use.
//
// A reservation is one job, let run once: by the first Wait that returns
// nil, or the first AfterFunc that runs its function. While a Wait or an
// AfterFunc of it is under way, another fails at once with an error
// matching ErrReservationScheduled; once the job was let run, with one
// matching ErrReservationUsed.
//
// A method waiting on the store holds up no other: while a Cancel, or the
// use of a Wait or an AfterFunc, is on its way to a slow store, Token,
// Delay, a Cancel, and a Wait or an AfterFunc (which fails at once while
// another holds the job) go on, each within its own context; the store,
// which settles a reservation once, decides between a use and a cancel
// sent together.
//
// Its Token lets another process settle it: a worker that runs the job
// marks it used (Limiter.Use), one that drops it cancels it
// (Limiter.Refund). The store settles a reservation at most once, whoever
// asks: Cancel goes through the store's record of settlements, and so do
// Wait and AfterFunc once a token was taken (before that, no other
// process can know the reservation, and a use stays local).
//
// The zero Reservation, made by no Reserve, is a refused one that holds
// nothing and knows no Limiter: OK reports false, Result is the zero
// Result, Time the zero time, Delay 0, Token nil, and Cancel returns nil
// (nothing to hand back); Wait and AfterFunc return an error matching
// ErrInvalidOption, and schedule nothing. Reserve makes the Reservation
// to use.
//
// A nil *Reservation, which Reserve returns beside an error other than a
// store's (bad input, a done context), answers as the zero Reservation
// does, its errors saying that it is nil: a Wait, or a deferred Cancel,
// reached before Reserve's error was checked is bad input, an error,
// not a panic.
type Reservation struct {
	lim    *Limiter
	res    Result
	at     time.Time
	charge charge
	// ctx is the context of the Reserve call: AfterFunc's store call and
	// its JobObserver's event carry its values (a trace, a span), without
	// its cancellation or deadline (context.WithoutCancel), as its job
	// runs after the call returned. Nil for the zero Reservation.
	ctx context.Context

	mu       sync.Mutex
	canceled bool   // its tokens were handed back
	lapsed   bool   // canceled past its token's Expires: nothing came back
	used     bool   // the job was let run: Wait returned nil, or AfterFunc ran fn; or a holder of its token used it
	held     bool   // used by a holder of its token: the job is the holder's, and Wait refuses it
	claimed  bool   // a Wait or an AfterFunc of it is under way: no other may let the job run
	tok      *Token // made by Token, or by Cancel; nil before
	// byHolder is the settlement, found in the store, by which a holder of
	// its token canceled it (or a mark of a kind no Limiter writes), which
	// every Cancel reports; nil when it was canceled by its own Cancel.
	byHolder *SettledError
	// settler names the reservation in the store's marks of its
	// settlements (driver.Settlement.Settler), so that a retried Wait or
	// Cancel tells its own earlier attempt, whose answer was lost, from a
	// holder's settlement of its token; random, chosen at its first
	// settlement (settlerID).
	settler [16]byte
}

// Reserve takes Count tokens (default 1) of the named limit for key, for a
// job that may run once they have been granted: now if they are there,
// later if the bucket may owe them (up to MaxReserved). A reservation
// refused by MaxReserved is not OK, and its RetryAfter says how long until
// it would fit. The error is for bad input, a done context or a store
// failure, as for Limit: when the store failed, the Reservation is
// returned beside the error, decided by the limit's failure policy
// (Result.Degraded), and holds no tokens; for any other error, the
// Reservation is nil (which answers as the zero Reservation does).
//
// A store that answered returns the Reservation, also when ctx ended
// while the store call was on its way: the tokens are the caller's, to
// hand back (Cancel; a Wait on the ended ctx does it). A store call that
// failed, or that ctx's end cut short (an error matching ctx's), may have
// charged the tokens all the same, as any call over a network may have
// taken effect: no Reservation holds them then, and nothing hands them
// back; they are granted again as the limit refills. The Limiter cannot
// hand them back, as it does when its Observer panics: it does not know
// whether the store took the charge, and a refund of a charge the store
// never took would grant tokens the limit never had. The limit errs
// toward granting less, never more.
//
// Reserve is small enough to be inlined, so that a Reservation its caller
// keeps to itself lives on the caller's stack: a plain Reserve allocates
// nothing unless the Reservation escapes (to AfterFunc, another goroutine,
// a longer-lived structure).
func (l *Limiter) Reserve(ctx context.Context, name, key string, opts ...CallOption) (*Reservation, error) {
	return l.reserve(ctx, new(Reservation), name, key, opts)
}

// reserve makes the reservation r of Reserve, and returns it, or nil with
// the error of a call that could not be decided.
func (l *Limiter) reserve(ctx context.Context, r *Reservation, name, key string, opts []CallOption) (*Reservation, error) {
	c := newCall(opts)
	c.reserve, c.reservation = true, true
	r.lim, r.ctx = l, ctx
	var err error
	if lim := l.declared(name); lim != nil && lim.bound != nil && c.cfg == nil {
		v, now, plain, e := l.doBoundFull(ctx, driver.ModeLimit, lim, key, c, &r.res, &r.charge)
		if plain {
			r.res = boundResult(lim, key, c, v, now)
		}
		err = e
	} else {
		names := [1]string{name}
		r.res, r.charge, err = l.do(ctx, driver.ModeLimit, names[:], key, c)
	}
	if err != nil && !r.res.Degraded {
		return nil, err
	}
	r.at = r.charge.start.Add(r.res.RetryAfter)
	if c.receipt && r.res.OK && r.charge.n > 0 {
		// The receipt is the reservation's token, taken now: Wait and
		// AfterFunc settle through it (the bound path makes none).
		r.res.Token = r.token()
	}
	return r, err
}

// OK reports whether the reservation was granted.
func (r *Reservation) OK() bool { return r != nil && r.res.OK }

// Result returns the decision behind the reservation.
func (r *Reservation) Result() Result {
	if r == nil {
		return Result{}
	}
	return r.res
}

// Time returns when the job may run: the time of the reservation plus its
// RetryAfter. For a refused reservation, when the same reservation would
// have fit.
func (r *Reservation) Time() time.Time {
	if r == nil {
		return time.Time{}
	}
	return r.at
}

// Delay returns how long from now, on the Limiter's clock, until the job
// may run; 0 when it may run now, and for the zero Reservation, which has
// no clock (and whose Time is the zero time).
func (r *Reservation) Delay() time.Duration {
	if r == nil || r.lim == nil {
		return 0
	}
	return max(r.at.Sub(r.lim.clock.Now()), 0)
}

// zeroErr is the error of Wait or AfterFunc (what) of the zero
// Reservation, which no Reserve made, or of a nil one (r).
func zeroErr(r *Reservation, what string) error {
	if r == nil {
		return fmt.Errorf("ratelimit: %s: the Reservation is nil, as Limiter.Reserve returns it beside an error (other than a store's): it holds no tokens and has no job to let run; check Reserve's error first: %w", what, ErrInvalidOption)
	}
	return fmt.Errorf("ratelimit: %s: the Reservation is the zero value, made by no Limiter.Reserve: it holds no tokens and has no job to let run; use the Reservation that Reserve returns: %w", what, ErrInvalidOption)
}

// Wait blocks until the job may run, on the Limiter's clock, and then
// marks the reservation used: the job runs, and Cancel hands nothing back.
// It returns at once with an error when the reservation was refused (a
// *LimitError) or was canceled (ErrReservationCanceled). It gives up, and
// hands the tokens back, when the context's deadline comes before the
// job's time (at once, with an error matching context.DeadlineExceeded)
// or the context is done while waiting, or while the use is on its way to
// the store (with the context's error). Its error then matches the
// context's (errors.Is), and its message names the limit and says what
// became of the tokens (handed back, settled by a holder of the token,
// spent, or not handed back). Use a context made by the Limiter's clock
// (clock.WithTimeout) when that clock is a mock.
//
// Giving up, Wait returns once the tokens are handed back, and at most
// the Limiter's refund timeout (WithRefundTimeout, default
// DefaultRefundTimeout) after the context's deadline, or after it saw the
// context canceled, however slow the store. If its error does not match
// ErrNotRefunded, the tokens were handed back (or a holder of the token
// settled it first, or its token had expired, past which nothing comes
// back: the message says which), unless it matches ErrReservationUsed: the
// reservation's own use (Wait's, sent as its context ended, or an earlier
// Wait's or AfterFunc's, its answer lost) had reached the store, and the
// tokens are spent (no Cancel hands them back; a Wait lets the job run).
// If it matches ErrNotRefunded, the store did not hand them back in that
// time, and the reservation may still hold them: call Cancel, which hands
// them back and returns nil once they are.
//
// Once a token was taken, Wait marks the reservation used in the store,
// and the job must not run if it returns an error: a holder of the token
// may have canceled it (a *SettledError matching ErrReservationCanceled)
// or used it (one matching ErrReservationUsed: the job is the holder's),
// or the token has expired (ErrTokenExpired: a Wait later than the token's
// Expires, when the store may have forgotten a holder's settlement of it;
// Cancel then hands nothing back). A Wait that failed on a store error (a
// *StoreError, matching ErrStoreUnavailable) may be retried: if the store took the first one's use after all, the retry
// returns nil. The store's mark of a settlement names the Reservation
// that made it (driver.Settlement.Settler), so the retry returns nil only
// for its own use: a use by a holder of the token, made while the first
// attempt never reached the store, is the holder's (ErrReservationUsed),
// as is a mark that names no settler (one written by an earlier release).
//
// The job is let run once: Wait returns at once with an error matching
// ErrReservationScheduled while another Wait or an AfterFunc of the
// reservation is under way, and with one matching ErrReservationUsed once
// the job was let run.
func (r *Reservation) Wait(ctx context.Context) error {
	if r == nil || r.lim == nil {
		return zeroErr(r, "Wait")
	}
	if !r.res.OK {
		return r.res.Err()
	}
	if err := r.claim("Wait"); err != nil {
		return err
	}
	defer r.release()
	if dl, ok := ctx.Deadline(); ok && dl.Before(r.at) {
		why := fmt.Sprintf("the job may run at %s, after the context's deadline %s", timeText(r.at), timeText(dl))
		return r.giveUp(ctx, why, context.DeadlineExceeded)
	}
	if d := r.Delay(); d > 0 {
		t := r.lim.clock.Timer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return r.giveUp(ctx, "its context ended before the job's time", ctx.Err())
		}
	} else if err := ctx.Err(); err != nil {
		return r.giveUp(ctx, "its context had ended by the job's time", err)
	}
	err := r.use(ctx, 0)
	if err != nil && ctx.Err() != nil && !errors.Is(err, ErrAlreadySettled) &&
		!errors.Is(err, ErrReservationCanceled) && !errors.Is(err, ErrReservationUsed) {
		// The context ended while the use was on its way: the store did
		// not take it, or took it and the answer was lost. Give up as
		// while waiting: the refund hands the tokens back, or finds the
		// use and says that they are spent.
		if cerr := ctx.Err(); !errors.Is(err, cerr) {
			err = fmt.Errorf("%w: %w", cerr, err)
		}
		return r.giveUp(ctx, "its context ended while the use was on its way to the store", err)
	}
	return err
}

// refundContext returns the context of a refund made for a caller whose
// context ctx may have ended: it keeps ctx's values, and ends the refund
// timeout (WithRefundTimeout) after the later of ctx's deadline and now,
// on the Limiter's clock.
func (l *Limiter) refundContext(ctx context.Context) (context.Context, context.CancelFunc) {
	end := l.clock.Now()
	if dl, ok := ctx.Deadline(); ok && dl.After(end) {
		end = dl
	}
	return l.clock.WithDeadline(context.WithoutCancel(ctx), end.Add(l.refundTimeout))
}

// giveUp hands the tokens back for a Wait that gives up, for the reason
// why, because of ctx, whose error (or, at once, context.DeadlineExceeded)
// is cause. It returns cause (errors.Is finds it) in an error that names
// the limit and says what became of the tokens: handed back; settled
// before by a holder of the token; spent by the reservation's own use
// (ErrReservationUsed); or not handed back (ErrNotRefunded, with the
// refund's failure). The refund is sent on a context of its own: ctx may
// have ended already, and the store would refuse it. That context ends
// the refund timeout after the later of ctx's deadline and now, so that a
// slow store holds Wait no longer than that past the caller's deadline;
// with no time left, no refund is sent, though Cancel still settles a
// reservation that needs no store (cancelsHere).
func (r *Reservation) giveUp(ctx context.Context, why string, cause error) error {
	rctx, cancel := r.lim.refundContext(ctx)
	defer cancel()
	var cerr error
	if rctx.Err() != nil && !r.cancelsHere() {
		cerr = fmt.Errorf("ratelimit: cancel reservation of limit %s: not sent: the context ended, and the refund timeout (WithRefundTimeout) is 0", written(r.res.Name))
	} else {
		cerr = r.Cancel(rctx)
	}
	head := fmt.Sprintf("ratelimit: limit %s: Wait gave up, as %s", written(r.res.Name), why)
	r.mu.Lock()
	lapsed := r.lapsed
	r.mu.Unlock()
	var se *SettledError
	switch {
	case cerr == nil && lapsed:
		return fmt.Errorf("%s; the reservation is canceled, but its token had expired (Token.Expires), and nothing came back (nothing would by then): nothing is left to do: %w", head, cause)
	case cerr == nil && r.charge.n == 0:
		// Granted by the failure policy: it held no tokens.
		return fmt.Errorf("%s; the reservation is canceled (it held no tokens: the failure policy granted it): nothing is left to do: %w", head, cause)
	case cerr == nil:
		return fmt.Errorf("%s; the reservation is canceled and its tokens were handed back: nothing is left to do: %w", head, cause)
	case errors.As(cerr, &se) && se.own && se.Kind == driver.SettleUse:
		// The reservation's own use reached the store: this Wait's, sent
		// as its context ended, or an earlier Wait's or AfterFunc's, its
		// answer lost. No cancel can hand the tokens back, and a Wait
		// would let the job run: the caller must not take them for
		// handed back.
		return fmt.Errorf("%s; the tokens were not handed back: the reservation's own use (this Wait's, or an earlier Wait's or AfterFunc's, its answer lost) reached the store, and they are spent; a Wait with a live context lets the job run: %w: %w", head, cerr, cause)
	case errors.As(cerr, &se):
		// Settled first by a holder of the token (or a mark of a kind
		// no Limiter writes): nothing the reservation holds is lost. Not
		// wrapped: the use of a holder is no use of this reservation's
		// (ErrReservationUsed would say the job may run here).
		var what string
		switch se.Kind {
		case driver.SettleCancel:
			what = "a holder of its token canceled it first, which handed its tokens back"
		case driver.SettleUse:
			what = "a holder of its token used it first: the job is the holder's, and the tokens are spent on it"
		default:
			what = "the store holds a mark of its token of a kind no Limiter writes: treat it as settled"
		}
		return fmt.Errorf("%s; %s (%v); nothing is left to do: %w", head, what, cerr, cause)
	case errors.Is(cerr, ErrReservationUsed):
		// The job was let run meanwhile: nothing the reservation holds
		// is lost.
		return fmt.Errorf("%s; the job was let run, and its tokens are spent on it: nothing is left to do: %w", head, cause)
	case errors.Is(cerr, driver.ErrBadRecord):
		// A mark of the token, or a record, the store cannot read: it
		// settled nothing, and every Cancel meets the same. Not
		// ErrNotRefunded, whose remedy is a Cancel.
		return fmt.Errorf("%s; the tokens were not handed back, and no Cancel can hand them back (%w); nothing else is left to do: %w", head, cerr, cause)
	}
	return fmt.Errorf("%s; %w: %w; call Cancel, with a context of your own, to hand them back: %w", head, ErrNotRefunded, cerr, cause)
}

// cancelsHere reports whether Cancel answers without the store, which
// needs no time: the reservation holds no tokens (the failure policy's),
// or it is settled already (canceled, or its job let run).
func (r *Reservation) cancelsHere() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.charge.n == 0 || r.canceled || r.used
}

// use marks the reservation used, unless it was canceled: in the store,
// once a token was taken (a holder of the token may have settled it).
// The store call is made without r.mu, so that Token, Cancel and another
// Wait or AfterFunc (which then fails at once: the job is claimed) do not
// wait on the store; a Cancel sent meanwhile reaches the store too, which
// settles the reservation once, and the flags follow its answer. With
// timeout > 0 (AfterFunc's, which has no caller's context), the store
// call ends after timeout.
func (r *Reservation) use(ctx context.Context, timeout time.Duration) error {
	r.mu.Lock()
	if err := r.settled(); err != nil {
		r.mu.Unlock()
		return err
	}
	tok := r.tok
	if tok == nil {
		// No other process can know the reservation: a local use.
		r.used = true
		r.mu.Unlock()
		return nil
	}
	settler := r.settlerID()
	r.mu.Unlock()

	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = r.lim.clock.WithTimeout(ctx, timeout)
		defer cancel()
	}
	err := r.lim.settle(ctx, tok, r.tokenLimits(), driver.SettleUse, 0, true, settler)
	// late: AfterFunc's bound passed before the store's answer came.
	late := timeout > 0 && ctx.Err() != nil
	var se *SettledError
	if err != nil && late && !errors.As(err, &se) {
		if !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		}
		err = fmt.Errorf("ratelimit: limit %s: AfterFunc: the store did not answer the use within the AfterFunc timeout (WithAfterFuncTimeout) of %v: %w", written(r.res.Name), timeout, err)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil, errors.As(err, &se) && se.Kind == driver.SettleUse && se.own:
		// Marked used; or this reservation's own use, taken by the store
		// on an earlier call whose answer was lost: the job may run.
		if r.canceled {
			// A Cancel sent while the use was on its way returned nil
			// for a token the store judged expired, and the job must not
			// run after a Cancel that returned nil. (The store settles
			// once: this is the only way both can succeed.)
			return fmt.Errorf("ratelimit: limit %s: %w", written(r.res.Name), ErrReservationCanceled)
		}
		if late {
			// The store took the use, but said so past the bound: the
			// job is not run that late. The use is the reservation's
			// own in the store, as when its answer is lost: a new
			// AfterFunc or a Wait finds it and runs the job.
			return &lateUseError{name: r.res.Name, timeout: timeout}
		}
		r.used = true
		return nil
	case errors.As(err, &se) && se.Kind == driver.SettleUse:
		// Used by a holder of the token, which runs the job; or by a
		// settler the mark does not name (one an earlier release wrote),
		// which may be the holder too.
		r.used, r.held = true, true
		return fmt.Errorf("ratelimit: limit %s: used by a holder of its token: %w", written(r.res.Name), err)
	case errors.As(err, &se) && se.Kind != driver.SettleCancel:
		// A mark of a kind no Limiter writes (something else wrote the
		// store's keys): settled, how the mark cannot say; the job is
		// not this reservation's to run.
		r.canceled, r.byHolder = true, se
		return fmt.Errorf("ratelimit: limit %s: settled before: %w", written(r.res.Name), err)
	case errors.As(err, &se) && se.own:
		r.canceled = true
		return fmt.Errorf("ratelimit: limit %s: canceled by a Cancel of the reservation (one under way, or an earlier one whose answer was lost): %w", written(r.res.Name), err)
	case errors.As(err, &se):
		r.canceled, r.byHolder = true, se
		return fmt.Errorf("ratelimit: limit %s: canceled by a holder of its token: %w", written(r.res.Name), err)
	case errors.Is(err, ErrTokenExpired):
		return fmt.Errorf("ratelimit: limit %s: too late to run the job: its token expired (Token.Expires), and the job must not run past it; nothing comes back by then either (Cancel hands nothing back): reserve again to run it: %w", written(r.res.Name), err)
	}
	return err
}

// lateUseError is the error of an AfterFunc whose use the store took, and
// said so only past the AfterFunc timeout: the job is not run that late
// (context.DeadlineExceeded), and its tokens are spent
// (ErrReservationUsed).
type lateUseError struct {
	name    string
	timeout time.Duration
}

func (e *lateUseError) Error() string {
	return fmt.Sprintf("ratelimit: limit %s: AfterFunc: the store marked the reservation used, but answered past the AfterFunc timeout (WithAfterFuncTimeout) of %v, and the job is not run that late: the tokens are spent; a new AfterFunc or a Wait of the reservation finds the use its own and runs the job on them", written(e.name), e.timeout)
}

// Is reports whether target is context.DeadlineExceeded or
// ErrReservationUsed.
func (e *lateUseError) Is(target error) bool {
	return target == context.DeadlineExceeded || target == ErrReservationUsed
}

// settlerID returns the reservation's settler, choosing it at the first
// call; r.mu is held. Should the random source fail (it does not on
// supported platforms), it stays zero, which names no settler: a retry
// then takes no mark for its own, and the job does not run twice.
func (r *Reservation) settlerID() [16]byte {
	if r.settler == ([16]byte{}) {
		_, _ = rand.Read(r.settler[:])
	}
	return r.settler
}

// settled returns the error of letting the job run when it may not any
// more: it was canceled, or let run (by this Reservation, or by a holder
// of its token); nil otherwise. r.mu is held.
func (r *Reservation) settled() error {
	switch {
	case r.canceled && r.byHolder != nil:
		// Settled by a holder of its token, or a mark of a kind no
		// Limiter writes: say so every time, as Cancel does, not that
		// this reservation was canceled.
		return fmt.Errorf("ratelimit: limit %s: settled by a holder of its token: %w", written(r.res.Name), r.byHolder)
	case r.canceled:
		return fmt.Errorf("ratelimit: limit %s: the reservation was canceled (by Cancel, a Wait that gave up, or the stop of an AfterFunc), and its job must not run: reserve again to run it: %w", written(r.res.Name), ErrReservationCanceled)
	case r.held:
		return fmt.Errorf("ratelimit: limit %s: used by a holder of its token: %w", written(r.res.Name), &SettledError{ID: r.tok.id, Kind: driver.SettleUse})
	case r.used:
		return fmt.Errorf("ratelimit: limit %s: the job was let run already (a reservation runs one job; reserve again for another): %w", written(r.res.Name), ErrReservationUsed)
	}
	return nil
}

// claim takes the job for a Wait or an AfterFunc (what), or returns why
// it may not: the reservation was canceled, its job let run, or another
// Wait or AfterFunc holds it. The holder calls release when done.
func (r *Reservation) claim(what string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.settled(); err != nil {
		return err
	}
	if r.claimed {
		return fmt.Errorf("ratelimit: limit %s: %s: another Wait or AfterFunc of the reservation is under way (a reservation runs one job; reserve again for another, or stop the first): %w",
			written(r.res.Name), what, ErrReservationScheduled)
	}
	r.claimed = true
	return nil
}

// release ends the claim of a Wait or an AfterFunc.
func (r *Reservation) release() {
	r.mu.Lock()
	r.claimed = false
	r.mu.Unlock()
}

// Token returns the reservation's token, for another process to mark it
// used before it runs the job (Limiter.Use) or to cancel it
// (Limiter.Refund); nil for a reservation that holds no tokens (refused,
// or decided by the failure policy). The first call makes it (Reserve
// does, with WithReceipt, and gives it in Result().Token too); from then
// on, Wait and AfterFunc mark the reservation used in the store too, and
// fail if a holder of the token canceled it. Made after the job was let
// run, the token carries that use: Limiter.Use, Refund and Settle of it
// return a *SettledError matching ErrReservationUsed, and hand nothing
// back.
//
// Token is nil too when the token would be too large for ParseToken to
// read back (a limit whose name takes nearly 64 KiB or more; the store key
// in a token is at most 256 bytes, a longer key being known to the store
// by its digest form): no process could settle it. The reservation itself
// still runs and cancels. Reserve with WithReceipt refuses such a call
// before charging anything, for a caller that needs the token.
func (r *Reservation) Token() *Token {
	if r == nil || !r.res.OK || r.charge.n == 0 {
		return nil
	}
	if lims := [1]*limit{r.charge.lim}; receiptFits(r.charge.key, lims[:]) != nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.token()
}

// token makes the token if it is not made yet; r.mu is held.
func (r *Reservation) token() *Token {
	if r.tok == nil {
		if r.res.Token != nil {
			r.tok = r.res.Token
		} else {
			items, lims := chargeItems(&r.charge)
			// A job that ran with no token to mark used in the store:
			// the token carries the use, so that no holder can hand its
			// tokens back.
			// The job's time on the clock of the charge (the store's,
			// for one that keeps its own), as a refund judges it.
			run := r.charge.at + r.res.RetryAfter.Milliseconds()
			r.tok = r.lim.newToken(r.charge.key, r.charge.at, run, items, lims, r.used)
		}
	}
	return r.tok
}

// tokenLimits returns the limit each item of the reservation's token is
// settled under: the one declared under its name now, as Limiter.Refund
// of the token would, so that a refund across a change of limits writes
// the record under the config its calls now meet (its capacity, its
// refill, and its expiry, which the reservation's own config may set
// much sooner: the key would then start full); or the reservation's own,
// when the limit was removed since, and for a shard charged that the
// limit no longer has (its Shards lowered), which takes no calls any
// more. A shard the limit still has is judged by the config in force
// whatever the other shard drawn: under the old one, whose refill may be
// faster, a debt granted after the job's time under the config in force
// read as granted by it, and came back.
func (r *Reservation) tokenLimits() []*limit {
	_, lims := chargeItems(&r.charge)
	cur := r.lim.declared(r.charge.lim.name)
	if cur == nil || cur == r.charge.lim {
		return lims
	}
	for i, sh := range r.charge.shards[:r.charge.n] {
		if sh < cur.shards {
			lims[i] = cur
		}
	}
	return lims
}

// AfterFuncOption modifies one Reservation.AfterFunc. It is a value, as
// CallOption is; the zero AfterFuncOption changes nothing.
type AfterFuncOption struct {
	set     bool
	dropped func(err error)
}

// OnDropped has AfterFunc call f, with why, when the job's time has come
// and AfterFunc does not run its function: the use it marks in the store
// failed, or found the reservation settled. It is how a caller learns, in
// code, of a job dropped, to schedule it again or raise an alert; the
// Limiter logs the failure only with WithLogger (and tells its Observer,
// if it is a JobObserver: JobDropped). f runs in the goroutine
// the function would have run in. Of several OnDropped, the last counts;
// OnDropped(nil) makes AfterFunc fail with an error matching
// ErrInvalidOption, scheduling nothing. See Reservation.AfterFunc for the
// errors f is given.
func OnDropped(f func(err error)) AfterFuncOption {
	return AfterFuncOption{set: true, dropped: f}
}

// AfterFunc runs fn in its own goroutine when the job may run (at once if
// it may run now), marking the reservation used, and returns a function
// that stops it: stop reports whether it stopped fn before it ran, and
// then hands the tokens back (Cancel, with stop's context); a refund
// that fails is not reported by stop, which has stopped fn all the same:
// call Cancel, which tries the refund again and returns its error.
//
// Once a token was taken, AfterFunc marks the reservation used in the
// store before fn runs, waiting on the store at most the Limiter's
// AfterFunc timeout (WithAfterFuncTimeout, default
// DefaultAfterFuncTimeout): fn runs as late as the store makes it, within
// that bound. That store call, and the JobObserver's event of the run or
// drop, carry the values of the Reserve call's context (a trace, a span),
// not its cancellation or deadline: the job runs even when that context
// has ended. fn does not run if the store could not mark the reservation
// used: a holder of the token canceled it, or used it (the job is the
// holder's), or the store failed or did not answer in time (which is
// logged, with WithLogger), or the job's time came past the token's
// Expires (logged too, as such: nothing comes back then, and the job is
// to be reserved again). Such an AfterFunc lets go of the job: a new
// AfterFunc (or Wait) tries the use again, and lets the job run if the
// store took the first one's use after all.
//
// With OnDropped(f), the caller learns of a job that does not run: once
// the job's time has come, AfterFunc either runs fn or calls f with why
// it did not, never both, and neither once stop has reported true. So a
// job scheduled without error ends in one of three ways: fn runs, stop
// reports true, or f is called. The Limiter's Observer, if it is a
// JobObserver, is told which, once: JobRan as fn is called, JobDropped
// with f's error (with OnDropped or without), JobStopped as stop reports
// true, with the error of its refund, which stop does not return. A
// panic of the JobObserver does not keep fn (or f) from being called:
// it goes on once fn (or f) has returned. A panic of fn or f is not
// recovered, as one of time.AfterFunc's function is not.
//
// f's error matches:
//   - ErrReservationCanceled: the reservation was canceled (by Cancel, or
//     by a holder of its token): its tokens came back.
//   - ErrReservationUsed, alone: a holder of the token used it (a
//     *SettledError): the job is the holder's.
//   - ErrReservationUsed and context.DeadlineExceeded: the store took the
//     use but said so only past the AfterFunc timeout, and fn does not
//     run that late: the tokens are spent, and a new AfterFunc or a Wait
//     finds the use its own and runs the job on them.
//   - ErrNotRefunded, beside the store's error (a *StoreError, matching
//     ErrStoreUnavailable), or context.DeadlineExceeded
//     when the store did not answer within the AfterFunc timeout: whether
//     the store took the use is not known, and the tokens were not handed
//     back. A new AfterFunc (which f may call: the job was let go) or a
//     Wait tries the use again, and runs the job if the store took the
//     first one after all; Cancel hands the tokens back, or says they are
//     spent (ErrReservationUsed).
//   - ErrTokenExpired: the job's time came past its token's Expires.
//   - ErrAlreadySettled alone: the store holds a mark of the token of a
//     kind no Limiter writes (something else wrote the store's keys).
//
// Once the job's time has come, stop reports false at once, also while
// the use is on its way to the store: it neither waits for the store nor
// calls the use off, and fn runs if the store marks the reservation used.
// To have the tokens back unless fn runs, call Cancel: the store settles
// the reservation once, so either the use comes first (fn runs, and
// Cancel returns an error matching ErrReservationUsed) or the cancel does
// (the tokens come back, and fn does not run). One case is neither: the
// store took the use, and its answer never came back (a store failure,
// or an answer past the AfterFunc timeout). Then fn does not run (which
// is logged, and told to OnDropped), Cancel returns a *SettledError
// matching ErrReservationUsed, the tokens are spent, and a new AfterFunc
// or a Wait runs the job on them.
//
// Unlike time.AfterFunc, whose calls are independent, AfterFunc schedules
// the reservation's one job: it schedules nothing, and returns an error
// at once, when the reservation was refused (a *LimitError) or canceled
// (ErrReservationCanceled), when another AfterFunc or a Wait of it is
// under way (ErrReservationScheduled: stop that one first, or, once the
// job's time has come, let its use end), when the job was let run
// (ErrReservationUsed), or when fn, or the function of an OnDropped, is
// nil (ErrInvalidOption). The stop it then returns reports false, and no
// OnDropped function is called.
func (r *Reservation) AfterFunc(fn func(), opts ...AfterFuncOption) (stop func(ctx context.Context) bool, err error) {
	if fn == nil {
		return stopped, fmt.Errorf("ratelimit: AfterFunc: the function to run is nil: pass the job's function; nothing was scheduled: %w", ErrInvalidOption)
	}
	var dropped func(error)
	for _, o := range opts {
		if o.set && o.dropped == nil {
			return stopped, fmt.Errorf("ratelimit: AfterFunc: OnDropped was given a nil function: pass the function that learns of a dropped job, or leave OnDropped out; nothing was scheduled: %w", ErrInvalidOption)
		}
		if o.set {
			dropped = o.dropped
		}
	}
	if r == nil || r.lim == nil {
		return stopped, zeroErr(r, "AfterFunc")
	}
	if !r.res.OK {
		return stopped, r.res.Err()
	}
	if err := r.claim("AfterFunc"); err != nil {
		return stopped, err
	}
	t := r.lim.clock.AfterFunc(r.Delay(), func() {
		// The values of the Reserve call's context, not its end: the
		// caller has usually returned by the job's time.
		ctx := context.Background()
		if r.ctx != nil {
			ctx = context.WithoutCancel(r.ctx)
		}
		err := r.use(ctx, r.lim.afterFuncTimeout)
		r.release()
		if err == nil {
			r.lim.observeJobThen(ctx, r, JobRan, nil, fn)
			return
		}
		// A use the store took past the bound matches ErrReservationUsed
		// and context.DeadlineExceeded: a failure, not a settlement by a
		// Cancel or a holder of the token.
		late := errors.Is(err, context.DeadlineExceeded)
		settled := errors.Is(err, ErrReservationCanceled) || errors.Is(err, ErrReservationUsed) || errors.Is(err, ErrAlreadySettled)
		expired := !settled && errors.Is(err, ErrTokenExpired)
		if !settled && !expired {
			// The store failed, or did not answer in time: whether it
			// took the use is not known.
			err = fmt.Errorf("%w; %w: the store may have taken the use (then they are spent, and a new AfterFunc or a Wait of the reservation runs the job on them) or not (then the reservation still holds them): call AfterFunc again to retry the job, or Cancel to hand them back (it says if they are spent)", err, ErrNotRefunded)
		}
		switch {
		case r.lim.logger == nil:
		case expired:
			// Neither a retry nor a Cancel does anything for it: say so,
			// not that the store failed.
			r.lim.logger.Error("ratelimit: AfterFunc did not run its function: the job's time came past its token's Expires (the clock jumped ahead, or the store's clock runs ahead of the Limiter's), and the job must not run that late; nothing comes back by then: reserve again to run the job",
				"limit", r.res.Name, "err", err)
		case late || !settled:
			r.lim.logger.Error("ratelimit: AfterFunc did not run its function: the store did not mark the reservation used in time; AfterFunc or Wait of the reservation again tries again, Cancel hands its tokens back unless the store took the use",
				"limit", r.res.Name, "err", err)
		}
		r.lim.observeJobThen(ctx, r, JobDropped, err, func() {
			if dropped != nil {
				dropped(err)
			}
		})
	})
	return func(ctx context.Context) bool {
		if !t.Stop() {
			return false
		}
		err := r.Cancel(ctx)
		r.release()
		r.lim.observeJob(ctx, r, JobStopped, err)
		return true
	}, nil
}

// stopped is the stop of an AfterFunc that scheduled nothing.
func stopped(context.Context) bool { return false }

// Cancel hands the reservation's tokens back to the shards that were
// charged, when the job will not run. It gives back the tokens charged,
// less what the limit has granted since the reservation was made (all of
// them within the window it was made in), capped at the capacity: a late
// cancel never lets a window serve its own grant and the refund too
// (docs/reservations.md). While reservations made after it stand behind
// it (the record owes tokens granted after its Time), it gives back
// nothing at all: they keep their times, and its tokens handed back
// would be reserved again beside the last of them. Only the first Cancel hands anything back; a
// refused reservation has nothing to hand back, nor has one the failure
// policy granted (Result.Degraded), which Cancel still cancels: Wait and
// AfterFunc then do not let its job run. Once the job was let run
// (Wait returned nil, or AfterFunc ran its function), Cancel hands nothing
// back and returns an error matching ErrReservationUsed. A failed refund
// (a store error: a *StoreError, matching ErrStoreUnavailable) may be
// retried: if the store took the first one after
// all, the retry returns nil; a cancel by a holder of the token, or one
// whose mark names no settler, is not the Reservation's own, and the
// retry returns a *SettledError (see Wait). If the store took the use of
// an earlier Wait or AfterFunc whose answer was lost, Cancel returns a
// *SettledError matching ErrReservationUsed, and a Wait lets the job run.
//
// After a change of the limit (SetLimits, SetLimit), the tokens go back
// under the config in force, as Limiter.Refund of the token would send
// them; under the reservation's own config when the limit was removed
// since, and, for a shard charged that the limit no longer has (its
// Shards lowered), to that shard alone: a shard still in use is judged by
// the config in force.
//
// The refund goes through the store's record of settlements, as
// Limiter.Refund of the reservation's token does: if a holder of the token
// settled it first, Cancel does nothing and returns a *SettledError (which
// matches ErrReservationUsed when the token was used, and
// ErrReservationCanceled when it was canceled), and so does every Cancel
// after it, also when a Wait or an AfterFunc found the holder's mark
// first. A second Cancel of a Reservation that its own Cancel canceled
// returns nil. Past the token's Expires, Cancel
// hands nothing back (nothing would come back by then) and returns nil,
// and the job does not run: a Wait or AfterFunc whose use was on its way
// to the store then does not let it run.
//
// Cancel waits on the store for no longer than its context allows, and
// the Reservation's other methods do not wait with it: Token, Delay and
// a Wait or AfterFunc (which claims the job, then marks it used in the
// store) go on while a Cancel is on its way. Concurrent Cancels, or a
// Cancel and the use of a Wait or an AfterFunc, may reach the store
// together; it settles the reservation once. The tokens come back once,
// and every Cancel returns nil (the later ones find the first one's mark,
// their own); or the use came first, the job runs, and Cancel returns an
// error matching ErrReservationUsed. Never both.
func (r *Reservation) Cancel(ctx context.Context) error {
	if r == nil || !r.res.OK {
		return nil
	}
	r.mu.Lock()
	switch {
	case r.held:
		// Used by a holder of its token: say so every time, as the call
		// that found the holder's use did (a Wait, an AfterFunc, or a
		// Cancel).
		r.mu.Unlock()
		return fmt.Errorf("ratelimit: cancel reservation of limit %s: used by a holder of its token, whose job it is: %w", written(r.res.Name), &SettledError{ID: r.tok.id, Kind: driver.SettleUse})
	case r.used:
		r.mu.Unlock()
		return fmt.Errorf("ratelimit: limit %s: cannot cancel: %w", written(r.res.Name), ErrReservationUsed)
	case r.canceled && r.byHolder != nil:
		// Not by this reservation: say so every time, as the Cancel that
		// found the holder's mark did (a Wait or an AfterFunc may have
		// found it first).
		se := r.byHolder
		r.mu.Unlock()
		return fmt.Errorf("ratelimit: cancel reservation of limit %s: settled by a holder of its token: %w", written(r.res.Name), se)
	case r.canceled:
		r.mu.Unlock()
		return nil
	case r.charge.n == 0:
		// Granted by the failure policy: nothing was charged, so
		// nothing goes back, but the job must not run.
		r.canceled = true
		r.mu.Unlock()
		return nil
	}
	tok := r.token()
	settler := r.settlerID()
	r.mu.Unlock()
	if tok == nil {
		return fmt.Errorf("ratelimit: cancel reservation of limit %s: no random source for its token", written(r.res.Name))
	}
	// The store call is made without r.mu, so that it holds up no other
	// method (Token; a Wait or an AfterFunc, which claims the job). A
	// concurrent Cancel, or the use of a Wait or an AfterFunc, may reach
	// the store meanwhile: the store settles the reservation once, and the
	// flags follow its answer. A second Cancel finds the first's mark, its
	// own, and returns nil.
	err := r.lim.settle(ctx, tok, r.tokenLimits(), driver.SettleCancel, 0, true, settler)
	r.mu.Lock()
	defer r.mu.Unlock()
	var se *SettledError
	switch {
	case err == nil, errors.Is(err, ErrTokenExpired):
	case errors.As(err, &se) && se.Kind == driver.SettleCancel && se.own:
		// This reservation's own cancel: another Cancel of it (or a Wait
		// giving up) got there first, or an earlier call whose answer
		// was lost.
	case errors.As(err, &se) && se.Kind == driver.SettleUse && se.own:
		// Its own use, by a Wait or an AfterFunc: one under way, whose
		// answer lets the job run, or an earlier one whose answer was
		// lost: the tokens are spent, and a Wait lets the job run.
		if r.used {
			return fmt.Errorf("ratelimit: limit %s: cannot cancel: %w", written(r.res.Name), ErrReservationUsed)
		}
		return fmt.Errorf("ratelimit: cancel reservation of limit %s: a Wait or AfterFunc of it marked it used (one under way, or an earlier one whose answer was lost): the tokens are spent (a Wait lets the job run, if none does): %w", written(r.res.Name), err)
	case errors.As(err, &se):
		if se.Kind == driver.SettleUse {
			r.used, r.held = true, true
		} else {
			r.canceled, r.byHolder = true, se
		}
		return fmt.Errorf("ratelimit: cancel reservation of limit %s: settled by a holder of its token: %w", written(r.res.Name), err)
	default:
		return fmt.Errorf("ratelimit: cancel reservation of limit %s: %w", written(r.res.Name), err)
	}
	if r.used {
		// A use sent meanwhile let the job run: the store took it
		// before this token's Expires, and judged the cancel after it.
		return fmt.Errorf("ratelimit: limit %s: cannot cancel: %w", written(r.res.Name), ErrReservationUsed)
	}
	if r.lim.deny != nil {
		r.lim.deny.forget(r.res.Name, r.charge.key)
	}
	r.canceled = true
	r.lapsed = errors.Is(err, ErrTokenExpired)
	return nil
}
