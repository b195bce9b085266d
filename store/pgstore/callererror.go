package pgstore

import (
	"context"
	"errors"
	"fmt"
)

// callerError returns err, the error of a call whose context is ctx, made
// to match ctx's error too when ctx has ended and err does not already:
// pgx fails a statement whose context ends while the statement is written
// with the connection's timeout alone ("write failed: ... i/o timeout"),
// which a caller, and the Limiter, would read as the server's failure
// rather than the caller's own deadline. ApplyBatch calls it on each op's
// failure, not on the join of its *driver.OpErrors, whose Unwrap() []error
// must list the ops alone.
func callerError(ctx context.Context, err error) error {
	cerr := ctx.Err()
	if err == nil || cerr == nil || errors.Is(err, cerr) {
		return err
	}
	return fmt.Errorf("%w: %w", cerr, err)
}
