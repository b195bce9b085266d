package ratelimit

import (
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/refill"
)

// What a call answers: its Result, and the Status that Value reports.

// Result is the answer to Limit or Check.
type Result struct {
	// OK is true when the call is allowed, or reserved (then RetryAfter > 0).
	OK bool
	// RetryAfter is, for a reserved call, when its tokens will have been
	// granted, and for a denied call, how long until the same call would
	// succeed; 0 when allowed outright. Whole milliseconds, rounded up:
	// the least such wait, for a sharded limit as for one record, on the
	// two shards the call evaluated (docs/sharding.md). A longer wait than
	// the longest time.Duration (about 292 years, driver.MaxRetryAfter
	// milliseconds) is reported as that.
	RetryAfter time.Duration
	// Remaining is the tokens left after an OK call (negative: owed through
	// reservations), or the tokens available now after a denied one. For a
	// sharded limit it counts the two shards the call evaluated.
	Remaining float64
	// ResetAfter is how long until the limit next replenishes: for a fixed
	// window, until its next window starts (for a sharded one, the window
	// of the first shard evaluated, though the other's may come first);
	// for a token bucket, until it is full again, refilling from the
	// record's time (later than now for a caller whose clock lags the
	// record's, as RetryAfter counts it; for a sharded one, the time of
	// the first shard evaluated, as the store reports no other: the
	// second shard, if its record is further ahead, is full later by the
	// difference). For a sharded token
	// bucket it is how long the two shards the call evaluated take to
	// refill their shortfall together (their two capacities less
	// Remaining) at their rate together: until both are full when they are
	// short alike, while a shard shorter than the other is full later, up
	// to twice as late. A store reports the two shards' sum, not each
	// one's level or window. It feeds the "t" of the IETF RateLimit header
	// (package httplimit). Whole milliseconds, rounded up.
	ResetAfter time.Duration
	// Name, Key and Count repeat the call. For LimitAll, Name is the limit
	// that decided the answer: the one with the longest wait, or, when the
	// failure policy decided (Degraded), the first named that fails closed.
	Name  string
	Key   string
	Count float64
	// Degraded is true when the store could not decide and the limit's
	// failure policy did (Config.FailOpen); the call's error says why.
	Degraded bool
	// Local is true when the deny cache refused the call without asking
	// the store (WithDenyCache).
	Local bool
	// All holds, for LimitAll, each limit's own answer in the order named.
	All []Result
	// Token is, for an OK call made WithReceipt() that the store decided,
	// the receipt of its charge: settle it by its outcome (Settle, Use,
	// Refund) from any process. Nil otherwise, and always for a Check,
	// which charges nothing.
	//
	// It also makes a Result 112 bytes, a multiple of 16: Go copies a
	// returned Result by 16-byte moves, and at 104 bytes the last move
	// overlaps the one before it, so that the next copy (callers make
	// two) waits for both to be stored.
	Token *Token
}

// Reserved reports whether the call was OK only by reserving tokens that
// will be granted after RetryAfter.
func (r Result) Reserved() bool { return r.OK && r.RetryAfter > 0 }

// Err returns nil when r is OK, and otherwise a *LimitError that matches
// ErrLimited, for callers who prefer errors.
func (r Result) Err() error {
	if r.OK {
		return nil
	}
	return &LimitError{Name: r.Name, Key: r.Key, Count: r.Count, RetryAfter: r.RetryAfter}
}

// boundResult is the Result of a call of lim that the store decided as v,
// judged at now.
func boundResult(lim *limit, key string, c call, v driver.Verdict, now int64) Result {
	return Result{
		OK:         v.OK,
		RetryAfter: time.Duration(v.RetryAfter) * time.Millisecond,
		Remaining:  v.Remaining,
		ResetAfter: lim.resetOne(v.Remaining, now, v.TS),
		Name:       lim.name,
		Key:        key,
		Count:      c.count,
	}
}

// resetAfter computes Result.ResetAfter for a limit of n shards of params p
// from the decision d: for a fixed window, until the next window of the
// record as the store holds it (its phase may predate a change of Start
// or of the phase seed); for a token bucket, until the shards the call
// evaluated have refilled their shortfall together, at their rate
// together, from the record's time (d.TS: later than d.Now for a caller
// whose clock lags the record's, which refills from its own time on):
// d.Remaining is their sum, so that the shortfall of each is not known,
// and a shard shorter than the other is full up to twice as late.
func resetAfter(p driver.Params, n int, d driver.Decision) time.Duration {
	return resetMillis(&p, n, d.Remaining, d.Now, d.TS)
}

// resetOne is resetMillis of one record of lim, without a division when
// it can do without. A token bucket's wait until full, w =
// max(Capacity-remaining, 0)·Period/Rate rounded up, is estimated as
// max(Capacity-remaining, 0)·msPerToken. Each is within 2 roundings (a
// relative 2^-52) of the exact quotient, so they are within 5·2^-53 of
// the estimate of each other; when the estimate is further than that from
// every whole number, both round up to the same one. Otherwise, and for
// waits too small or too large for that reasoning, it divides.
func (lim *limit) resetOne(remaining float64, now, ts int64) time.Duration {
	p := &lim.base
	if p.Kind == driver.TokenBucket {
		// max(Capacity-remaining, 0) == 0 without max's care for NaN
		// and -0: a NaN takes the division below, as it would there.
		x := p.Capacity - remaining
		if x <= 0 {
			return 0
		}
		est := x * lim.msPerToken
		// A record ahead of now (a caller's clock lagging it) refills from
		// its own time: resetMillis adds the lag.
		if ts <= now && est >= 1e-290 && est < 1<<42 { // below MaxRetryAfter: never clamped
			// math.Floor of a positive number below 2^63: a conversion,
			// not a call (GOAMD64=v1 has no rounding instruction).
			whole := float64(int64(est))
			frac, margin := est-whole, est*6e-16
			if frac > margin && frac < 1-margin {
				return time.Duration(whole+1) * time.Millisecond
			}
		}
	}
	return resetMillis(p, 1, remaining, now, ts)
}

// resetMillis is resetAfter of a decision's Remaining, Now and TS.
func resetMillis(p *driver.Params, n int, remaining float64, now, ts int64) time.Duration {
	var ms float64
	if p.Kind == driver.FixedWindow {
		ms = float64(ts + p.Period - now)
	} else {
		ms = refill.Millis(p, n, remaining)
		if ms > 0 && ts > now {
			// The refill starts at the record's time, ahead of a caller
			// whose clock lags it.
			ms += float64(ts - now)
		}
	}
	return time.Duration(retryMillis(ms)) * time.Millisecond
}

// Status describes the state of (name, key) now, as Value reports it.
type Status struct {
	// Remaining is the tokens available now, summed over all shards; negative
	// while reservations are owed.
	Remaining float64
	// Capacity is the most tokens the limit holds (all shards together).
	Capacity float64
	// WindowStart is the start of the current window, and NextGrant the
	// time of the next grant, of a fixed window (for a sharded limit, the
	// shard whose next grant comes first). Both are zero for a token bucket.
	WindowStart time.Time
	NextGrant   time.Time
	// Shards holds each record's part; one element when unsharded.
	Shards []ShardStatus
}

// ShardStatus is one record's part of a Status.
type ShardStatus struct {
	Index       int       // the shard, from 0
	Remaining   float64   // its tokens now; negative while reservations are owed
	WindowStart time.Time // fixed window only
	NextGrant   time.Time // fixed window only
	// Stored reports whether the store holds a record; a missing one is a
	// full bucket.
	Stored bool
}
