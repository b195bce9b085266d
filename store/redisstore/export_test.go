package redisstore

import "context"

// CallerError is s.callerError, for the tests of the shape of its errors.
func CallerError(s *Store, ctx context.Context, err error) error { return s.callerError(ctx, err) }
