package redisstore

import "context"

// CallerError is s.callerError, for the tests of the shape of its errors.
func CallerError(s *Store, ctx context.Context, err error) error { return s.callerError(ctx, err) }

// Batchers returns how many batchers s keeps: one per server called lately.
func Batchers(s *Store) int {
	if s.nodes == nil {
		return 1
	}
	return s.nodes.Len()
}
