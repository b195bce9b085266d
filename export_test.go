package ratelimit

// HoldDenyStripe locks stripe i of l's deny cache until release is called:
// a change of limits that forgets entries (SetLimits, SetLimit) stops
// there, after it has published the new limits, and so do the calls of
// the keys the stripe keeps.
func HoldDenyStripe(l *Limiter, i int) (release func()) {
	pt := &l.deny.parts[i]
	pt.mu.Lock()
	return pt.mu.Unlock
}

// DenyStripe returns the stripe of l's deny cache that keeps the entry of
// (name, key), key as the store knows it.
func DenyStripe(l *Limiter, name, key string) int {
	c := l.deny
	k := denyKey{name, key}
	for i := range c.n {
		if c.part(k) == &c.parts[i] {
			return int(i)
		}
	}
	return -1
}

// ReservationLocked reports whether r's lock is held: a test that stops
// one of r's store calls halfway asks whether it holds up r's other
// methods.
func ReservationLocked(r *Reservation) bool {
	if r.mu.TryLock() {
		r.mu.Unlock()
		return false
	}
	return true
}

// DenyKeys returns the keys l's deny cache holds, as it holds them.
func DenyKeys(l *Limiter) []string {
	var keys []string
	for i := range l.deny.n {
		pt := &l.deny.parts[i]
		pt.mu.Lock()
		for k := range pt.m {
			keys = append(keys, k.key)
		}
		pt.mu.Unlock()
	}
	return keys
}
