package httplimit

import (
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/refill"
)

// The header fields' names, canonical (http.CanonicalHeaderKey), to index
// an http.Header without canonicalizing them, which allocates, at every
// request.
const (
	policyField    = "Ratelimit-Policy"
	rateLimitField = "Ratelimit"
)

// Bounds of the RateLimit-Policy announcement.
const (
	// maxSFInteger is the largest Integer a structured field may hold
	// (RFC 9651, section 3.3.1).
	maxSFInteger = 999_999_999_999_999
	// maxExactWindow is the longest window, in seconds, searched for a
	// whole quota that states a limit's rate exactly (unless the limit's
	// own period is longer).
	maxExactWindow = 86400
)

// setHeaders sets RateLimit-Policy and RateLimit: for every limit its
// tokens left (floored, never negative) and, where more will come, the
// seconds until the next quota unit is made available. Items an outer
// middleware of the chain set stay (see addItems).
func (m *Middleware) setHeaders(h http.Header, res ratelimit.Result) {
	v := m.current()
	addItems(h, policyField, v.policy, v.items)
	parts := res.All
	if len(parts) == 0 {
		parts = []ratelimit.Result{res}
	}
	// On the stack for the usual one or two items: a make of a size
	// known only at run time is on the heap before Go 1.25, one
	// allocation more per request.
	var buf [128]byte
	b := buf[:0]
	for i, p := range parts {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, m.quoted[i]...)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, wholeTokens(p.Remaining), 10)
		if t, ok := resetSeconds(p, v.cfgs[i]); ok {
			b = append(b, ";t="...)
			b = strconv.AppendInt(b, t, 10)
		}
	}
	addItems(h, rateLimitField, string(b), nil)
}

// addItems sets the list field name (canonical) of h to items, after the
// items that middlewares further out in the chain put there (a router's
// limit, then a route's): a response lists every limit it passed, the
// binding one among them. A limit decided by two middlewares (one limit
// keyed by address in one and by user in another, or the same middleware
// twice) has an item of each in RateLimit, in the order decided: the
// middleware cannot tell whether they spent one budget or two, and an
// item dropped would hide the budget that refuses next. An item equal to
// one of mine, the items being added, is dropped: the same policy stated
// again says nothing more. So is a member that is no item of the draft (a
// policy name that is a String, then parameters), such as the "limit=100,
// remaining=50" of other libraries: kept, it would make the whole field
// malformed, which the draft has clients ignore. The field stays one
// line, as clients that read only a field's first line see it whole.
func addItems(h http.Header, name, items string, mine []string) {
	lines := h[name]
	if len(lines) == 0 {
		h[name] = []string{items}
		return
	}
	var b strings.Builder
	for _, line := range lines {
		for len(line) > 0 {
			var item string
			item, line = nextItem(line)
			if !draftItem.MatchString(item) || slices.Contains(mine, item) {
				continue
			}
			b.WriteString(item)
			b.WriteString(", ")
		}
	}
	b.WriteString(items)
	h[name] = []string{b.String()}
}

// nextItem splits the first member off a structured-field list: up to the
// first comma outside a string, spaces and tabs around it trimmed.
func nextItem(list string) (item, rest string) {
	quoted := false
	for i := 0; i < len(list); i++ {
		switch c := list[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == ',':
			return strings.Trim(list[:i], " \t"), list[i+1:]
		}
	}
	return strings.Trim(list, " \t"), ""
}

// Structured fields (RFC 9651) as the items of RateLimit and
// RateLimit-Policy take them.
const (
	sfString = `"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"`
	sfKey    = `[a-z*][a-z0-9_.*-]*`
	sfBare   = `(?:-?[0-9]{1,15}(?:\.[0-9]{1,3})?|` + sfString + "|[A-Za-z*][!#$%&'*+.^_`|~0-9A-Za-z:/-]*|:[A-Za-z0-9+/=]*:|\\?[01]|@-?[0-9]{1,15})"
	sfItem   = `^(` + sfString + `)(?:; *` + sfKey + `(?:=` + sfBare + `)?)*$`
)

// draftItem matches an item of the draft's fields, its policy name (a
// String, quotes and escapes as written) in the first group.
var draftItem = regexp.MustCompile(sfItem)

// wholeTokens is the "r" of a limit's RateLimit item: the whole tokens of
// remaining, as the Limiter grants them. It grants a call that a record
// falls short of by less than driver.Noise (float noise: 0.4 + 0.6 is
// 0.9999999999999999), so that such a record holds its whole token: r
// says 1 when a request of 1 passes.
func wholeTokens(remaining float64) int64 { return sfInteger(remaining + driver.Noise) }

// resetSeconds is the "t" of a limit's RateLimit item: in the words of
// draft-ietf-httpapi-ratelimit-headers-10, the seconds until additional
// quota is made available, rounded up. The quota unit is one token: t is
// the time until the whole tokens left ("r", wholeTokens) grow by one. A
// token bucket refills continuously, from the record's time, ahead of a
// caller whose clock lags the record (lagMillis); a fixed window grants Rate at the
// start of each window, the next in Result.ResetAfter, so that r grows
// then unless the window grants less than the whole token missing (a Rate
// below 1): then at the first window by which the grants add up to it. A
// bucket that holds as many whole tokens as it ever will has no such
// time, and ok is false: the item carries no t.
//
// A limit that refused a request of at least the next whole token cannot
// grant it before r grows: its own RetryAfter, the least wait the Limiter
// computed for the request, bounds t, and is t itself when the request
// costs exactly that token. The estimate from the config alone is late or
// early where the Limiter knows better: a sharded fixed window's second
// shard, whose window may come first (ResetAfter is the first shard's),
// and a sharded token bucket one of whose two shards is full, which
// refills at half the rate.
//
// Retry-After may still be below the t of a limit, and rightly so: of a
// limit that did not refuse the request (it holds the request's cost
// already, and its next token is not needed), and of a limit that refused
// a request of a fractional cost it will grant before its next whole
// token (0.3 left, a cost of 0.5).
func resetSeconds(res ratelimit.Result, cfg ratelimit.Config) (t int64, ok bool) {
	// A sharded call evaluates two shards (or its one): their share of
	// the capacity and the rate, as Result.Remaining counts them.
	n := float64(max(cfg.Shards, 1))
	k := math.Min(n, 2)
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = cfg.Rate
	}
	capacity *= k / n
	rate := cfg.Rate * k / n // tokens per Period
	next := float64(wholeTokens(res.Remaining)) + 1
	if next > capacity {
		return 0, false
	}
	// The shortfall as the Limiter compares it: a record within
	// driver.Noise of next holds it.
	short := next - res.Remaining - driver.Noise
	period := float64(cfg.Period.Milliseconds())
	var ms float64
	if cfg.Kind == ratelimit.FixedWindow {
		// The windows whose grants make up the shortfall; the first is
		// the next. The division may round past the count that makes it
		// up, or short of it.
		windows := max(math.Ceil(short/rate), 1)
		for windows > 1 && rate*(windows-1) >= short {
			windows--
		}
		for range 4 {
			if rate*windows >= short {
				break
			}
			windows++
		}
		ms = float64(res.ResetAfter.Milliseconds()) + (windows-1)*period
	} else {
		// Whole milliseconds, as RetryAfter, from the record's time: for
		// a caller whose clock lags the record, the lag on.
		ms = math.Ceil(short*period/rate) + lagMillis(res, cfg)
	}
	t = sfInteger(math.Ceil(ms / 1000))
	if wait := res.RetryAfter.Milliseconds(); !res.OK && wait > 0 && wait < driver.MaxRetryAfter && res.Count+driver.Noise >= next {
		if ra := seconds(res.RetryAfter); res.Count-driver.Noise <= next || ra < t {
			t = ra
		}
	}
	return t, true
}

// lagMillis is how far ahead of the caller's clock the record of a token
// bucket's Result res is, whose refill starts at the record's time:
// ResetAfter counts the time until full from there (Result.ResetAfter).
// The time until full from now is computed by the Limiter's own
// arithmetic (internal/refill), on the share of one shard it decides
// with, so that the difference is the lag alone, in whole milliseconds;
// 0 when the record is not ahead. A ResetAfter cut at
// driver.MaxRetryAfter gives less than the lag, never more.
func lagMillis(res ratelimit.Result, cfg ratelimit.Config) float64 {
	p := driver.Params{Kind: driver.TokenBucket, Period: cfg.Period.Milliseconds()}
	p.Rate, p.Capacity = refill.Share(cfg.Rate, cfg.Capacity, cfg.Shards)
	full := math.Ceil(refill.Millis(&p, cfg.Shards, res.Remaining))
	return max(float64(res.ResetAfter.Milliseconds())-full, 0)
}

// sfInteger is x floored as a structured-field Integer: never negative,
// and at most maxSFInteger (a bucket that refills one token in millions
// of years says maxSFInteger seconds).
func sfInteger(x float64) int64 {
	if !(x > 0) { // NaN too
		return 0
	}
	return int64(math.Min(math.Floor(x), maxSFInteger))
}

// policyItem describes a limit for RateLimit-Policy: a whole quota q per
// window of w seconds that states its rate (see quota).
//
// The rate is what the limit grants in the long run: a token bucket
// refills Rate per Period whatever it holds, but a fixed window's grant
// is cut to its Capacity, so that one whose Capacity is below its Rate
// grants Capacity per window.
func policyItem(quotedName string, cfg ratelimit.Config) string {
	rate := cfg.Rate
	if cfg.Kind == ratelimit.FixedWindow && cfg.Capacity != 0 {
		rate = min(rate, cfg.Capacity)
	}
	q, w := quota(rate, cfg.Period)
	return quotedName + ";q=" + strconv.FormatInt(q, 10) + ";w=" + strconv.FormatInt(w, 10)
}

// quota states rate tokens per period as a whole quota q over a whole
// number of seconds w, as RateLimit-Policy needs them.
//
// The window is a whole number of periods, so that a fixed window's
// announced window holds whole windows. Among those that are whole seconds
// and hold a whole number of tokens, the shortest is chosen (Rate 2 per
// minute stays q=2;w=60; Rate 0.5 per second is q=1;w=2; Rate 1 per
// 100 ms is q=10;w=1), searched up to a day or the period if longer. A
// rate that no such window states exactly (Rate π per second) is rounded
// down: the window of that range whose floored quota comes closest to the
// rate without exceeding it, or else the shortest whole-second window that
// holds one token. A limit too slow for that, with less than one token in
// the longest window a field holds (maxSFInteger seconds, 31.7 million
// years), is announced as a quota of 0 over the shortest window above.
//
// A limit so fast that the shortest window of whole periods and whole
// seconds holds more tokens than a field can say (10¹³ per 1,001 ms: that
// window is 1,000 periods, 10¹⁶ tokens) is stated over whole seconds
// alone, by the same rule: that window's quota cut to maxSFInteger would
// state a thousandth of the rate at worst.
//
// The announcement never promises more than the limit grants.
func quota(rate float64, period time.Duration) (q, w int64) {
	ms := period.Milliseconds()
	stepMs := ms / gcd(ms, 1000) * 1000 // the shortest window of whole periods and whole seconds
	k1 := stepMs / ms                   // periods in that window
	step := stepMs / 1000               // seconds in that window

	limit := max(int64(maxExactWindow), step)
	if rate*float64(k1) > maxSFInteger {
		// Every window of whole periods is too long: one of whole seconds,
		// shorter than step, holds a quota a field can say.
		return closest(func(w int64) float64 { return rate * float64(1000*w) / float64(ms) }, 1, min(step, limit))
	}
	if q, w = closest(func(m int64) float64 { return rate * float64(k1*m) }, step, limit/step); w > 0 {
		return q, w
	}
	// Less than one token in the whole range: the shortest whole-second
	// window that holds one.
	perSecond := rate * 1000 / float64(ms)
	if one := math.Ceil(1 / perSecond); one <= maxSFInteger {
		return 1, int64(one)
	}
	// Less than one token in the longest window a field holds (31.7
	// million years): no whole quota, over the shortest window of whole
	// periods and whole seconds (1,000 periods of 100 years at most, well
	// within a field). A quota of 1 over that longest window would
	// promise more.
	return 0, step
}

// closest searches the windows of m units of unit seconds, m from 1 to
// most, x(m) tokens each, for the shortest whose quota states x(m)
// exactly, or else the one whose floored quota comes closest to the rate
// from below. A window whose x(m) is more than a field holds ends the
// search; if it is the first, its quota is cut to maxSFInteger (below the
// rate: the most a field holds). w is 0 when no window holds a token.
func closest(x func(m int64) float64, unit, most int64) (q, w int64) {
	for m := int64(1); m <= most; m++ {
		x := x(m)
		if x > maxSFInteger {
			if w == 0 {
				return maxSFInteger, m * unit
			}
			break
		}
		r := math.Round(x)
		if r >= 1 && states(r, x) {
			return int64(r), m * unit
		}
		// The best from below so far: the floored quota whose rate comes
		// closest to the limit's.
		if f := math.Floor(x); f >= 1 && (w == 0 || f/float64(m*unit) > float64(q)/float64(w)) {
			q, w = int64(f), m*unit
		}
	}
	return q, w
}

// states reports whether the whole quota r states x tokens exactly: r
// differs from x by no more than the rounding of the float product that
// made x (a few units in its last place: Rate 1/3 per second over 3 s is
// one token), and is never above x by a part of a token the limit does not
// grant (999,999,999.5 per second is not a quota of 10⁹).
func states(r, x float64) bool {
	d := r - x
	return math.Abs(d) <= 4*(math.Nextafter(x, math.Inf(1))-x) && d < 1e-9
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// quote writes a name as a structured-field string.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range []byte(policyName(s)) {
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String()
}

// policyName is a limit's name as the headers and problem details carry
// it: bytes a structured-field string cannot hold become "_".
func policyName(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '_'
		}
		return r
	}, s)
}

// seconds rounds d up to whole seconds, for any d (a wait near
// driver.MaxRetryAfter too).
func seconds(d time.Duration) int64 {
	s := d / time.Second
	if d%time.Second > 0 {
		s++
	}
	return int64(s)
}
