package ratelimitgrpc

import "github.com/benbjohnson/clock"

// SetLogClock makes i space its log lines (of refusals, deadlines, internal
// errors) on c, from c's present time, so that a test moves the interval by
// hand.
func SetLogClock(i *Interceptor, c clock.Clock) { i.setLogClock(c) }
