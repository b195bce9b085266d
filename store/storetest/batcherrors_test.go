package storetest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// failures records the failures of a check, which runs on a goroutine
// of its own (FailNow ends it).
type failures struct{ msgs []string }

func (f *failures) Errorf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}
func (f *failures) FailNow() { runtime.Goexit() }
func (f *failures) Helper()  {}

// listedOpsOf runs listedOps on err, and returns what it listed and its
// failures.
func listedOpsOf(err error) ([]int, []string) {
	f := &failures{}
	var listed []int
	done := make(chan struct{})
	go func() {
		defer close(done)
		listed = listedOps(f, err, "the batch")
	}()
	<-done
	return listed, f.msgs
}

// The suite's check of an ApplyBatch's error lists the ops of a join of
// *driver.OpErrors, and fails an error that holds them elsewhere: a join
// wrapped by what the store adds ("%w: %w", the shape of redisstore's
// defect fixed in 5814c84), or a join that holds another error beside
// them, hides from a caller which ops failed.
func TestListedOps(t *testing.T) {
	op := func(i int, err error) error { return &driver.OpError{Index: i, Err: fmt.Errorf("store: %w", err)} }
	joined := errors.Join(op(0, driver.ErrBadRecord), op(2, context.Canceled))

	listed, failed := listedOpsOf(joined)
	require.Empty(t, failed)
	require.Equal(t, []int{0, 2}, listed)

	listed, failed = listedOpsOf(fmt.Errorf("store: %w", context.Canceled))
	require.Empty(t, failed, "an error that holds no *driver.OpError")
	require.Nil(t, listed)

	for name, err := range map[string]error{
		"a join wrapped":            fmt.Errorf("%w: %w", context.Canceled, joined),
		"a join wrapped by a note":  fmt.Errorf("store: %w", joined),
		"a join with another error": errors.Join(op(0, driver.ErrBadRecord), driver.ErrClosed),
		"an op's error alone":       op(1, context.Canceled),
	} {
		_, failed := listedOpsOf(err)
		require.NotEmpty(t, failed, name)
	}
}
