package ratelimit

// Checking reports whether l's own check of the store (checkStore) is
// under way.
func Checking(l *Limiter) bool { return l.breaker.checking.Load() }
