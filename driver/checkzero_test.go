package driver_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// baseStore is a driver.Store that does nothing.
type baseStore struct{}

func (baseStore) Apply(context.Context, *driver.Op, []driver.Decision) error     { return nil }
func (baseStore) Load(context.Context, []driver.RecordID, []driver.Record) error { return nil }
func (baseStore) Delete(context.Context, []driver.RecordID) error                { return nil }

// valueChecker implements driver.ZeroChecker by a value method, which Go
// cannot call through a nil *valueChecker.
type valueChecker struct {
	baseStore
	made bool
}

func (c valueChecker) CheckZero() error {
	if !c.made {
		return errZero
	}
	return nil
}

// ptrChecker implements driver.ZeroChecker by a pointer method that
// answers for a nil pointer, as the stores of this module do.
type ptrChecker struct {
	baseStore
	made bool
}

func (c *ptrChecker) CheckZero() error {
	if c == nil || !c.made {
		return errZero
	}
	return nil
}

var errZero = errors.Join(errors.New("teststore: not made: build it with teststore.New"), driver.ErrZeroStore)

// wrapper wraps a store, with an Unwrap method and no CheckZero.
type wrapper struct{ s driver.Store }

func (w wrapper) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	return w.s.Apply(ctx, op, out)
}

func (w wrapper) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	return w.s.Load(ctx, ids, out)
}

func (w wrapper) Delete(ctx context.Context, ids []driver.RecordID) error {
	return w.s.Delete(ctx, ids)
}

func (w wrapper) Unwrap() driver.Store { return w.s }

// selfWrapper is a wrapper whose Unwrap returns itself.
type selfWrapper struct{ baseStore }

func (w *selfWrapper) Unwrap() driver.Store { return w }

// CheckZero tells a store its constructor did not make, itself or behind
// wrappers, and answers without a panic for what it cannot ask: a nil
// pointer of a type whose CheckZero is a value method (Go panics on such
// a call, as New's caller gave it a nil store, which New refuses as no
// store), and a wrapper that unwraps to itself.
func TestCheckZero(t *testing.T) {
	for _, c := range []struct {
		name  string
		store any
		zero  bool
	}{
		{"nil", nil, false},
		{"made, value method", valueChecker{made: true}, false},
		{"zero, value method", valueChecker{}, true},
		{"zero pointer, value method", &valueChecker{}, true},
		{"nil pointer, value method", (*valueChecker)(nil), false},
		{"made, pointer method", &ptrChecker{made: true}, false},
		{"zero, pointer method", &ptrChecker{}, true},
		{"nil pointer, pointer method", (*ptrChecker)(nil), true},
		{"no ZeroChecker", baseStore{}, false},
		{"wrapped zero", wrapper{wrapper{&ptrChecker{}}}, true},
		{"wrapped made", wrapper{&ptrChecker{made: true}}, false},
		{"wrapped nil", wrapper{}, false},
		{"wrapped nil pointer, pointer method", wrapper{(*ptrChecker)(nil)}, true},
		{"wrapped nil pointer, value method", wrapper{(*valueChecker)(nil)}, false},
		{"wrapper of itself", &selfWrapper{}, false},
		{"nil wrapper", (*selfWrapper)(nil), false},
	} {
		var err error
		require.NotPanics(t, func() { err = driver.CheckZero(c.store) }, c.name)
		if c.zero {
			require.ErrorIs(t, err, driver.ErrZeroStore, c.name)
		} else {
			require.NoError(t, err, c.name)
		}
	}
}
