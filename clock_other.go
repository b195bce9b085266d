//go:build !(linux && amd64)

package ratelimit

import "time"

// wallMillis reads the real clock's wall time in Unix milliseconds.
func wallMillis() int64 { return time.Now().UnixMilli() }
