package ratelimit

import (
	"fmt"
	"math"
	"time"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
	"github.com/ratelimit-go/ratelimit/internal/refill"
)

// Kind selects how a limit grants tokens: FixedWindow or TokenBucket. The
// zero Kind is invalid, so that a Config must say which kind it means.
type Kind = driver.Kind

const (
	// FixedWindow grants Rate tokens at the start of every window of length
	// Period, capped at Capacity; unused tokens roll over up to the cap.
	FixedWindow = driver.FixedWindow
	// TokenBucket refills continuously at Rate tokens per Period, capped at
	// Capacity.
	TokenBucket = driver.TokenBucket
)

// Config describes one named limit. In YAML and JSON its fields are
// written kind, rate, period ("1m"), capacity, maxReserved, shards, start
// and failOpen (ParseLimits).
//
// The zero values of Capacity, MaxReserved, Shards and Start mean "default":
// Capacity = Rate, no bound on reservations, one record, and a per-key phase
// derived from a hash of the limit's name and key.
type Config struct {
	// Kind is FixedWindow or TokenBucket. Required.
	Kind driver.Kind `json:"kind" yaml:"kind"`
	// Rate is the number of tokens granted per Period: from 1e-9 to
	// MaxTokens; fractions are allowed.
	Rate float64 `json:"rate" yaml:"rate"`
	// Period is the window length (fixed window) or the time in which Rate
	// tokens are refilled (token bucket). A whole number of milliseconds,
	// from 1 ms to MaxPeriod.
	Period time.Duration `json:"period" yaml:"period"`
	// Capacity is the most tokens a bucket holds, at most MaxTokens; grants
	// beyond it are lost. 0 means Rate.
	Capacity float64 `json:"capacity,omitempty" yaml:"capacity,omitempty"`
	// MaxReserved is the most tokens a bucket may owe through reservations.
	// 0 means as many as MaxTokens, which no real limit reaches. Set, with
	// Capacity it is bounded by MaxFractionalTokens unless both (each
	// shard's share of them) are whole numbers.
	MaxReserved float64 `json:"maxReserved,omitempty" yaml:"maxReserved,omitempty"`
	// Shards splits a hot limit into that many independent records, each
	// holding Rate/Shards, Capacity/Shards and MaxReserved/Shards (a share
	// that rounds to 0 tokens is refused). 0 or 1 means one record.
	Shards int `json:"shards,omitempty" yaml:"shards,omitempty"`
	// Start fixes the phase of a fixed window: windows begin at
	// Start + k·Period for every integer k. The zero time.Time means a phase
	// derived per key, so that clients of different keys do not all retry at
	// the same instant; time.UnixMilli(0) aligns windows to the epoch. Only
	// for FixedWindow. The phase is computed from Start's Unix milliseconds,
	// so that Start must be an instant whose milliseconds an int64 holds:
	// from time.UnixMilli(math.MinInt64) to the end of the millisecond
	// time.UnixMilli(math.MaxInt64), some 292 million years either side of
	// 1970.
	Start time.Time `json:"start,omitzero" yaml:"start,omitempty"`
	// FailOpen is the failure policy: when the store cannot be asked, a
	// call is allowed if FailOpen is true, and refused if it is false (the
	// default). Fail closed when exceeding the limit costs more than
	// refusing some calls during an outage (signups, paid APIs, LLM spend);
	// fail open when the limit is a courtesy and availability comes first.
	// See docs/production.md.
	FailOpen bool `json:"failOpen,omitempty" yaml:"failOpen,omitempty"`
}

// Limits maps limit names to their configs, as given to New and
// SetLimits.
type Limits map[string]Config

// Validate reports whether c is a valid config. The error is a
// *ConfigError that names the field and the rule, and matches
// ErrInvalidConfig with errors.Is.
func (c Config) Validate() error { return c.validate("", false) }

// validate is Validate for the limit called name, if named: its error
// names the limit, the name "" too. Only the limit "" is marked so (see
// ConfigError): the error of any other is the value of its exported
// fields, as a program may build it to compare.
func (c Config) validate(name string, named bool) error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Name: name, Field: field, Problem: fmt.Sprintf(format, args...), named: named && name == ""}
	}
	switch c.Kind {
	case driver.FixedWindow, driver.TokenBucket:
	case 0:
		return bad("Kind", "is not set: use ratelimit.FixedWindow or ratelimit.TokenBucket")
	default:
		return bad("Kind", "is %v: use ratelimit.FixedWindow or ratelimit.TokenBucket", c.Kind)
	}
	if !finitePositive(c.Rate) || c.Rate < minRate || c.Rate > MaxTokens {
		return bad("Rate", "is %s: it must be a number of tokens from %s to %s", numtext.Format(c.Rate), numtext.Format(minRate), numtext.Format(MaxTokens))
	}
	if c.Period < time.Millisecond {
		return bad("Period", "is %v: it must be at least 1ms", c.Period)
	}
	if c.Period%time.Millisecond != 0 {
		return bad("Period", "is %v: it must be a whole number of milliseconds", c.Period)
	}
	if c.Period > MaxPeriod {
		return bad("Period", "is %v: it must be at most %v (100 years)", c.Period, MaxPeriod)
	}
	if c.Capacity != 0 && (!finitePositive(c.Capacity) || c.Capacity > MaxTokens) {
		return bad("Capacity", "is %s: it must be a number of tokens > 0 and at most %s, or 0 for Rate", numtext.Format(c.Capacity), numtext.Format(MaxTokens))
	}
	if c.MaxReserved != 0 && (!finitePositive(c.MaxReserved) || c.MaxReserved > MaxTokens) {
		return bad("MaxReserved", "is %s: it must be a number of tokens > 0 and at most %s, or 0 for as many as %s", numtext.Format(c.MaxReserved), numtext.Format(MaxTokens), numtext.Format(MaxTokens))
	}
	if c.Shards < 0 {
		return bad("Shards", "is %d: it must be 0 or 1 for one record, or at least 2", c.Shards)
	}
	if c.Shards > MaxShards {
		return bad("Shards", "is %d: at most %d shards are supported", c.Shards, MaxShards)
	}
	if n := float64(c.shards()); n > 1 {
		// Each shard holds its share: one that rounds to 0 would leave a
		// shard's bucket empty for good or, of MaxReserved, unbounded.
		if c.Capacity != 0 && c.Capacity/n == 0 {
			return bad("Capacity", "is %s: over %d shards, each shard's share rounds to 0 tokens: raise it, or use fewer shards", numtext.Format(c.Capacity), c.Shards)
		}
		if c.MaxReserved != 0 && c.MaxReserved/n == 0 {
			return bad("MaxReserved", "is %s: over %d shards, each shard's share rounds to 0 tokens, which would mean as many as %s: raise it, or use fewer shards", numtext.Format(c.MaxReserved), c.Shards, numtext.Format(MaxTokens))
		}
	}
	if reach := c.reach(); reach < 1 && c.Capacity == 0 {
		// Set explicitly, a capacity below 1 serves calls of fractional
		// counts; left to default to a Rate below 1, it is a mistake.
		what := fmt.Sprintf("is %s and Capacity is unset (so also %s)", numtext.Format(c.Rate), numtext.Format(c.Rate))
		if c.shards() > 1 {
			what += fmt.Sprintf(", over %d shards", c.shards())
		}
		need := max(1, float64(c.shards())/2) // two shards of n hold 2/n of it
		return bad("Rate", "%s: one call can take at most %s tokens, so no call of the default count 1 can ever pass: set Capacity to at least %s (a bucket may hold more than one period's Rate), or explicitly below 1 for calls of fractional counts",
			what, numtext.Format(reach), numtext.Format(need))
	}
	if c.MaxReserved != 0 {
		// Each shard's share, as params computes it: the magnitude at
		// which the transition compares a debt with MaxReserved.
		n := float64(c.shards())
		pc, pm := c.capacity()/n, c.MaxReserved/n
		if pc+pm > MaxFractionalTokens && (math.Trunc(pc) != pc || math.Trunc(pm) != pm) {
			what, fix, sum := fmt.Sprintf("is %s and Capacity %s", numtext.Format(c.MaxReserved), numtext.Format(c.capacity())), "make both whole numbers of tokens", "their sum"
			if n > 1 {
				what += fmt.Sprintf(", %s and %s on each of %d shards", numtext.Format(pm), numtext.Format(pc), c.shards())
				fix = fmt.Sprintf("make both whole multiples of %d, so that each shard's share is a whole number of tokens", c.shards())
				sum = "each shard's share of their sum"
			}
			return bad("MaxReserved", "%s: above %s tokens together, a fraction of a token is finer than a decision resolves, and a reservation of Capacity plus MaxReserved would be refused forever: %s, or keep %s at most %s",
				what, numtext.Format(MaxFractionalTokens), fix, sum, numtext.Format(MaxFractionalTokens))
		}
	}
	if !c.Start.IsZero() && c.Kind != driver.FixedWindow {
		return bad("Start", "is set on a token bucket, which has no windows: remove Start")
	}
	if !c.Start.IsZero() && (c.Start.Before(minStart) || !c.Start.Before(maxStart)) {
		// Its Unix milliseconds would overflow, and the windows fall at
		// another phase.
		return bad("Start", "is %v: it must be within some 292 million years of 1970, from %v to %v, whose Unix milliseconds an int64 holds",
			c.Start, minStart.UTC(), maxStart.Add(-time.Millisecond).UTC())
	}
	return nil
}

// The bounds of Start, the instants whose Unix milliseconds an int64
// holds: maxStart is the first instant after them.
var (
	minStart = time.UnixMilli(math.MinInt64)
	maxStart = time.UnixMilli(math.MaxInt64).Add(time.Millisecond)
)

func finitePositive(x float64) bool { return x > 0 && !math.IsInf(x, 0) && !math.IsNaN(x) }

// capacity returns the effective capacity.
func (c Config) capacity() float64 {
	if c.Capacity == 0 {
		return c.Rate
	}
	return c.Capacity
}

// reach returns the most tokens one call may take without reserving: the
// capacity, or two shards' share of it.
func (c Config) reach() float64 {
	if n := c.shards(); n > 1 {
		return 2 * c.capacity() / float64(n)
	}
	return c.capacity()
}

// shards returns the effective number of records.
func (c Config) shards() int {
	if c.Shards <= 1 {
		return 1
	}
	return c.Shards
}

// MaxShards is the largest Config.Shards accepted.
const MaxShards = driver.MaxShards

// Bounds of the config space: within them every store, whatever its
// arithmetic (Go, Lua, SQL), computes every decision exactly and alike.
const (
	// MaxTokens bounds Rate, Capacity, MaxReserved, the count of one call,
	// and the debt a record may hold when MaxReserved is 0: whole numbers
	// of tokens stay exact in a float64 far beyond it.
	MaxTokens = 1e15
	// MaxFractionalTokens bounds Capacity plus MaxReserved (each shard's
	// share of them) when either has a fraction of a token: above 2^23 a
	// float64 resolves less than the tolerance by which a decision grants
	// a call (driver.Noise), and a reservation of Capacity plus
	// MaxReserved could round to a debt beyond MaxReserved on a full
	// bucket, refused forever. Whole numbers of tokens are exact up to
	// MaxTokens and take any value within it; a MaxReserved of 0 is not
	// bounded by it.
	MaxFractionalTokens = 1 << 23
	// MinCount is the least count above 0 that one call may ask for (a
	// count of 0 is valid). A decision forgives a shortfall below
	// driver.Noise, the noise of its float arithmetic, so a call of a
	// smaller count (of twice the noise, on a sharded limit's two shards)
	// would pass on an empty bucket, and again without end. From MinCount
	// on, what a call may take beyond what the bucket holds stays below
	// driver.Noise, and the next call finds the bucket empty.
	MinCount = 1e-8
	// MaxPeriod is the longest Period: 100 years.
	MaxPeriod = 36524 * 24 * time.Hour
	// minRate is the smallest Rate: over MaxShards shards, each shard's
	// share of it is the least rate the stores accept (driver's bounds),
	// below which waits and refills would overflow.
	minRate = 1e-9
)

// params returns one shard's share of c, without its phase, in the units
// of the transition.
func (c Config) params() driver.Params {
	n := float64(c.shards())
	p := driver.Params{
		Kind:        c.Kind,
		Period:      c.Period.Milliseconds(),
		MaxReserved: c.MaxReserved,
	}
	// As httplimit finds it again from a Config (internal/refill).
	p.Rate, p.Capacity = refill.Share(c.Rate, c.Capacity, c.Shards)
	if p.MaxReserved == 0 {
		p.MaxReserved = MaxTokens // "unlimited", within what is exact
	}
	if n > 1 {
		p.MaxReserved /= n
	}
	return p
}
