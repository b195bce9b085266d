package pgstore

import (
	"errors"
	"fmt"

	"github.com/jackc/puddle/v2"
	"github.com/ratelimit-go/ratelimit/driver"
)

// closedPool returns err, a call's error, made to match driver.ErrClosed
// too when it is the error of a pool the caller closed
// (puddle.ErrClosedPool, which pgxpool returns as it is): the store can do
// nothing more, as a closed store of another kind, and no server is down.
func closedPool(err error) error {
	if errors.Is(err, puddle.ErrClosedPool) && !errors.Is(err, driver.ErrClosed) {
		return fmt.Errorf("the store's pool was closed: close the pool after the store's last call: %w: %w", driver.ErrClosed, err)
	}
	return err
}

// newClosedPool is closedPool for New: err, an error of one of its
// statements, made to match driver.ErrClosed too when the pool New was
// given is closed (puddle.ErrClosedPool).
func newClosedPool(err error) error {
	if errors.Is(err, puddle.ErrClosedPool) && !errors.Is(err, driver.ErrClosed) {
		return fmt.Errorf("the pool is closed: pass New an open pool, and close it after the store's last call: %w: %w", driver.ErrClosed, err)
	}
	return err
}
