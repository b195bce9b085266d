package ratelimitotel_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	ratelimitotel "github.com/ratelimit-go/ratelimit/contrib/otel"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// A wrapper over a store its constructor did not make passes
// storetest.ZeroStore, as the store does: every call fails with
// driver.ErrZeroStore. Its Now, of a store that keeps no clock, failed
// with the wrapper's own error, and its Close, of memstore's, which has
// none, returned nil.
func TestWrapStoreZeroStore(t *testing.T) {
	for _, zero := range []ratelimit.Store{&memstore.Store{}, &boltstore.Store{}} {
		t.Run(fmt.Sprintf("%T", zero), func(t *testing.T) {
			_, tp := newTracer(t)
			storetest.ZeroStore(t, ratelimitotel.WrapStore(zero, ratelimitotel.WithTracerProvider(tp)))
		})
	}
}

// panicLoadStore panics on every Load, as a store of one's own may when
// its zero value is called.
type panicLoadStore struct{ failStore }

func (panicLoadStore) Load(context.Context, []driver.RecordID, []driver.Record) error {
	panic("no database")
}

// The wrapper's Close of a store that has none, and cannot tell whether
// its constructor made it, calls nothing of the store: it returns nil,
// even of a store that panics on every call.
func TestWrapStoreCloseLoadPanics(t *testing.T) {
	w := ratelimitotel.WrapStore(panicLoadStore{})
	var err error
	require.NotPanics(t, func() { err = w.(io.Closer).Close() })
	require.NoError(t, err)
}
