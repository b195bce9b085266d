//go:build !(linux && amd64)

package ratelimit

import "time"

// wallNow reads the real clock's wall time.
func wallNow() time.Time { return time.Now() }
