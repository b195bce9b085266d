package pgstore

// SetExpiredChunk sets how many rows one transaction of DeleteExpired
// walks, for a test, and returns a function that restores it.
func SetExpiredChunk(n int) (restore func()) {
	was := expiredChunk
	expiredChunk = n
	return func() { expiredChunk = was }
}
