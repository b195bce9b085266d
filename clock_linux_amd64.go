//go:build linux && amd64

package ratelimit

import (
	"syscall"
	"time"
)

// wallNow reads the real clock's wall time. On linux/amd64 that is one
// vDSO call (gettimeofday, microseconds), where time.Now makes two (the
// wall clock and the monotonic one): the same reading of the same clock,
// in half the time, without a monotonic part.
func wallNow() time.Time {
	var tv syscall.Timeval
	if syscall.Gettimeofday(&tv) != nil {
		return time.Now()
	}
	return time.Unix(tv.Sec, tv.Usec*1000)
}
