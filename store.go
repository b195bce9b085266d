package ratelimit

import "github.com/ratelimit-go/ratelimit/driver"

// Store keeps the state records of a Limiter: store/memstore,
// store/boltstore, store/redisstore, store/pgstore, or one of your own.
// What a store implements is the contract of package driver.
type Store = driver.Store

// ownClock returns the store's TimeSource when it uses its own clock, and
// nil otherwise.
func ownClock(s Store) driver.TimeSource {
	if ts, ok := s.(driver.TimeSource); ok && ts.OwnClock() {
		return ts
	}
	return nil
}
