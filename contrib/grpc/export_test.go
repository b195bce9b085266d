package ratelimitgrpc

import "github.com/benbjohnson/clock"

// SetLogClock makes i space the log lines of refusals on c, from c's
// present time, so that a test moves the interval by hand.
func SetLogClock(i *Interceptor, c clock.Clock) {
	i.refusals.clock = c
	i.refusals.start = c.Now()
}
