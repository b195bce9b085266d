package ratelimit

import (
	"errors"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
)

var (
	// ErrLimited is matched (errors.Is) by the error of a denied call, as
	// returned by Result.Err.
	ErrLimited = errors.New("ratelimit: rate limited")
	// ErrUnknownLimit means a call named a limit that is not declared (in
	// New, SetLimits or SetLimit) and came without WithConfig, or that a
	// token given to settle charges such a limit, or a shard the limit no
	// longer has (its Shards was lowered since the charge).
	ErrUnknownLimit = errors.New("ratelimit: unknown limit")
	// ErrInvalidConfig is matched by every *ConfigError.
	ErrInvalidConfig = errors.New("ratelimit: invalid config")
	// ErrUnknownField is matched by the *ConfigError of a field that a
	// limits file (ParseLimits), or Limits or a Config read from YAML or
	// JSON, gives and the format does not know: a typo (capcity), or a
	// field that reads as one of the Config's (Rate, where the file's
	// field is rate). Its Field is then the field as written, and tells
	// no more: Rate there is not the Config's field Rate, whose value an
	// error of Rate that does not match ErrUnknownField refuses.
	ErrUnknownField = errors.New("ratelimit: unknown field")
	// ErrInvalidOption is matched by the error of New given a bad
	// argument: no store, or an option such as WithKeyHash with a short
	// secret; by that of Reservation.AfterFunc given a nil function, or
	// OnDropped(nil); by that of Wait or AfterFunc of the zero
	// Reservation, which no Reserve made, or of a nil one; by that of
	// Use, Refund or Settle given Settler with an all-zero ID; and by that
	// of UnmarshalText of a nil *Token.
	ErrInvalidOption = errors.New("ratelimit: invalid option")
	// ErrInvalidCount is matched by every *CountError.
	ErrInvalidCount = errors.New("ratelimit: invalid count")
	// ErrTimeRange is matched by the error of a call made while the
	// Limiter's clock reads a time beyond ±driver.MaxTime, or, for a store
	// that keeps its own clock (driver.TimeSource), while the store's
	// does (Value, and the settlement of a token).
	ErrTimeRange = errors.New("ratelimit: time out of range")
	// ErrReservationCanceled is returned by Reservation.Wait on a canceled
	// reservation.
	ErrReservationCanceled = errors.New("ratelimit: reservation canceled")
	// ErrReservationUsed is returned by Reservation.Cancel once the job was
	// let run: its tokens were spent and nothing is handed back. It is
	// matched too by the error of a Wait or AfterFunc then: a reservation
	// runs one job.
	ErrReservationUsed = errors.New("ratelimit: reservation already used: the job was let run")
	// ErrReservationScheduled is matched by the error of Reservation.Wait
	// or AfterFunc while another Wait or AfterFunc of the same reservation
	// is under way: a reservation runs one job, so a second would run it
	// twice. Stop the first, or reserve again for another job.
	ErrReservationScheduled = errors.New("ratelimit: reservation already scheduled")
	// ErrNotRefunded is matched by the error of a Reservation.Wait that
	// gave up (its context ended, or its deadline comes before the job's
	// time) and could not hand the reservation's tokens back within its
	// bound (WithRefundTimeout): the store failed, or had not answered by
	// then (not for a mark or a record the store cannot read, matching
	// driver.ErrBadRecord, which no Cancel gets past). The error matches
	// the context's error too. The reservation
	// may still hold its tokens: call Cancel, with a context of your own,
	// to hand them back; it returns nil once they are (also when the store
	// took the refund of Wait after all). It is matched too by the error
	// that Reservation.AfterFunc gives an OnDropped function when the
	// store failed to mark the reservation used, or did not answer within
	// the AfterFunc timeout: AfterFunc hands nothing back, and the store
	// may have taken the use (Cancel then says the tokens are spent) or
	// not.
	ErrNotRefunded = errors.New("ratelimit: the reservation's tokens were not handed back")
	// ErrAlreadySettled is matched by the error of Use, Refund, Settle or
	// Reservation.Cancel on a token settled before (a *SettledError): the
	// call did nothing.
	ErrAlreadySettled = errors.New("ratelimit: already settled")
	// ErrTokenExpired means a token was given to settle after its Expires:
	// a job that late must not run, and a refund that late would hand
	// nothing back.
	ErrTokenExpired = errors.New("ratelimit: token expired")
	// ErrInvalidToken means a token could not be read, or does not carry a
	// valid tag under any key of the Limiter's WithTokenKey (the signing
	// key or one it accepts), or carries none where one is needed.
	ErrInvalidToken = errors.New("ratelimit: invalid token")
)

// SettledError is the error of settling a token that was settled before:
// Kind says how it was. It matches ErrAlreadySettled, and also
// ErrReservationUsed when it was used, or ErrReservationCanceled when it
// was canceled; neither when the store's mark of it holds another Kind,
// which no Limiter writes.
type SettledError struct {
	ID   [16]byte          // the token's ID (Token.ID)
	Kind driver.SettleKind // how the store's mark says it was settled
	// own: the store's mark records the settler that asked
	// (driver.Decision.Own), a Reservation or a holder of the token
	// (Settler) whose earlier attempt took effect, its answer lost.
	own bool
}

// Error says which token was settled before, and how.
func (e *SettledError) Error() string {
	var how string
	switch e.Kind {
	case driver.SettleCancel:
		how = "canceled"
	case driver.SettleUse:
		how = "used"
	default:
		// A store's mark that no Limiter wrote: something else wrote
		// the store's keys.
		how = fmt.Sprintf("how, its mark in the store cannot say: it reads %v, which no Limiter writes; treat the token as settled", e.Kind)
	}
	return fmt.Sprintf("ratelimit: token %x was already settled (%s): nothing done", e.ID[:4], how)
}

// Is reports whether target is ErrAlreadySettled, or the sentinel of how
// the token was settled.
func (e *SettledError) Is(target error) bool {
	switch target {
	case ErrAlreadySettled:
		return true
	case ErrReservationUsed:
		return e.Kind == driver.SettleUse
	case ErrReservationCanceled:
		return e.Kind == driver.SettleCancel
	}
	return false
}

// LimitError is the error of a denied call: the limit's name and key, and
// how long to wait before the same call would succeed. It matches
// ErrLimited with errors.Is.
type LimitError struct {
	Name       string
	Key        string
	Count      float64
	RetryAfter time.Duration
}

// Error names the limit and the key as ConfigError names a limit: quoted,
// control characters and bytes that are not UTF-8 escaped, and cut, when
// longer, at a character's start, followed by the length. The key is cut
// to its first 64 bytes, so that an application that logs refusals of
// keys a client chose (a header) does not log a line as long as each one;
// the name to its first 256, as ConfigError's. Key and Name keep them
// whole.
func (e *LimitError) Error() string {
	return fmt.Sprintf("ratelimit: limit %s exceeded for key %s: retry after %v",
		written(e.Name), quoteCut(e.Key, maxErrorKey), e.RetryAfter)
}

// maxErrorKey is the most bytes of a key that LimitError's message shows.
const maxErrorKey = 64

// Is reports whether target is ErrLimited.
func (e *LimitError) Is(target error) bool { return target == ErrLimited }

// ConfigError describes an invalid Config: the limit's name (empty for
// Config.Validate, and for a limit named ""), the field and what is wrong
// with it. It matches ErrInvalidConfig with errors.Is. The error of a
// field of a limits file (ParseLimits), or of Limits or a Config read from
// YAML or JSON, holds one too: its Field is then the Config's field that
// the file's field reads (Rate for rate), or the field as written when the
// file format has none of that name, and the error matches
// ErrUnknownField too, which tells such a field from the Config's of the
// same text (Rate, where the file's field is rate).
type ConfigError struct {
	Name    string
	Field   string
	Problem string
	// named is whether the config is the limit "" (of New, SetLimits,
	// SetLimit, WithConfig, ParseLimits), so that Error names it, rather
	// than as a Config of no limit. It is false for every other name,
	// which Error names anyway: their errors compare equal (==) to the
	// ConfigError of their exported fields, as they did before it.
	named bool
	// written is whether Field is a field of a file as written (an
	// unknown one), which Error quotes even when it reads as one of the
	// Config's fields (Rate, a file's unknown field, where rate is known),
	// and Is matches to ErrUnknownField.
	written bool
}

// Error names the limit, the field and what is wrong with it. A Field
// that is none of the Config's (a limits file's unknown field, as written)
// is quoted, as the name is, and so is a file's unknown field that reads
// as one of them (Rate, where the file's field is rate). The name is
// cut to its first 256 bytes, followed by its length, when it is longer,
// as the other errors of a limits file show a name (ParseLimits), so that
// a file with a name of megabytes does not make an error as long; Name
// keeps it whole.
func (e *ConfigError) Error() string {
	if e.Name == "" && !e.named {
		return fmt.Sprintf("ratelimit: invalid config: %s %s", e.fieldText(), e.Problem)
	}
	return fmt.Sprintf("ratelimit: limit %s: %s %s", written(e.Name), e.fieldText(), e.Problem)
}

// fieldText returns Field as Error shows it: a Config's field as it is,
// and another, the field of a file as written (an unknown one), quoted and
// cut as a name is, so that its control characters do not reach a
// terminal.
func (e *ConfigError) fieldText() string {
	if e.written {
		return written(e.Field)
	}
	for _, f := range configFields {
		if e.Field == f.goName() {
			return e.Field
		}
	}
	return written(e.Field)
}

// Is reports whether target is ErrInvalidConfig, or ErrUnknownField for
// the error of a field the file format does not know.
func (e *ConfigError) Is(target error) bool {
	return target == ErrInvalidConfig || target == ErrUnknownField && e.written
}

// CountError describes a count that a call may not ask for: negative, not
// a number or infinite, above 0 but below MinCount, or more than the limit
// could ever grant (Max). It matches ErrInvalidCount with errors.Is. Name
// is the limit's; empty for the count used given to Settle, which
// concerns no one limit.
type CountError struct {
	Name    string
	Count   float64
	Max     float64 // the largest count the call could ask for; 0 unless the count is more than that
	Problem string
}

// Error gives the count and what is wrong with it, and names the limit as
// LimitError does (quoted, cut when longer than 256 bytes); Name keeps it
// whole.
func (e *CountError) Error() string {
	if e.Name == "" {
		return fmt.Sprintf("ratelimit: count %s %s", numtext.Format(e.Count), e.Problem)
	}
	return fmt.Sprintf("ratelimit: limit %s: count %s %s", written(e.Name), numtext.Format(e.Count), e.Problem)
}

// Is reports whether target is ErrInvalidCount.
func (e *CountError) Is(target error) bool { return target == ErrInvalidCount }

// ErrStoreUnavailable is matched by the *StoreError of a call decided by
// the failure policy because the store failed or the breaker is open; and
// by that of a settlement (Use, Refund or Settle of a token,
// Reservation.Cancel, the use of a Wait or an AfterFunc) whose store call
// failed: the store may or may not have taken it, and a retry later is
// the answer (with Settler, or on the same Reservation, a retry whose
// first attempt was taken returns nil); and by that of a Reset or a
// Value whose store call failed, which a retry later answers too. Not by
// the error of a store that its constructor did not make
// (driver.ErrZeroStore), which no retry answers, and no policy decides.
var ErrStoreUnavailable = errors.New("ratelimit: store unavailable")

// StoreError is the error of a call that the store could not decide. Its
// Result is Degraded and follows the limit's failure policy. It is also
// the error of a settlement of a token, a Reset or a Value whose store
// call failed (Until is then zero): no failure policy decides one, and
// the breaker neither counts it nor keeps it from the store. One of them
// whose context ended while the store was asked returns the context's
// error instead (and the store's beside it): the caller gave up, which
// says nothing of the store.
type StoreError struct {
	// Name is the limit called (the first, for LimitAll); for a
	// settlement, the first limit the token charges.
	Name string
	// Err is the store's error; nil when the breaker was open and the store
	// was not asked.
	Err error
	// Until is, when the breaker is open, the time it lets a probe
	// through; while a probe is in the store, a cool-down from the call,
	// the earliest the next probe may go if this one fails.
	Until time.Time

	// op, when not empty, names what failed in the message, as "reset
	// limit" for a Reset.
	op string
}

// Error names the limit, as LimitError does (quoted, cut when longer than
// 256 bytes; Name keeps it whole), and the store's failure or, when the
// breaker was open and the store not asked, until when the failure policy
// decides.
func (e *StoreError) Error() string {
	if e.op != "" {
		return fmt.Sprintf("ratelimit: %s %s: store: %v", e.op, written(e.Name), e.Err)
	}
	if e.Err == nil {
		return fmt.Sprintf("ratelimit: limit %s: store not asked: it failed repeatedly; the failure policy decides until %s",
			written(e.Name), timeText(e.Until))
	}
	return fmt.Sprintf("ratelimit: limit %s: store: %v", written(e.Name), e.Err)
}

// Unwrap returns the store's error.
func (e *StoreError) Unwrap() error { return e.Err }

// Is reports whether target is ErrStoreUnavailable.
func (e *StoreError) Is(target error) bool { return target == ErrStoreUnavailable }

// timeText writes t for a message in RFC 3339 in UTC, as the command
// ratelimit writes times, to the nanosecond it holds and no further
// (2026-11-23T22:46:45.559Z): %v writes "2026-11-23 22:46:45.559 +0000
// UTC", in the zone t came in, with a monotonic clock reading if it has
// one.
func timeText(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
