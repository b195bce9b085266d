package compare

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// Role says what a contender is in the comparison.
type Role uint8

const (
	// Library is this library, through its public API.
	Library Role = iota + 1
	// Peer is another rate-limiting library.
	Peer
	// Bare is the least a limiter on the medium can do: one counter
	// update per call, no library.
	Bare
)

// String returns the role's name in reports: library, peer or bare.
func (r Role) String() string {
	switch r {
	case Library:
		return "library"
	case Peer:
		return "peer"
	case Bare:
		return "bare"
	}
	return "?"
}

// Limit is the limit every contender of a run is configured with: Rate
// tokens per Period for each key, a burst (capacity) of Rate.
type Limit struct {
	Rate   int
	Period time.Duration
	// Kind is the library's kind of limit; the peers have one kind each.
	Kind ratelimit.Kind
}

// PerSecond returns the limit's rate in tokens per second.
func (l Limit) PerSecond() float64 { return float64(l.Rate) / l.Period.Seconds() }

// Taker is one contender set up for one cell of the matrix.
type Taker interface {
	// Take asks for one token of key and reports whether it was granted.
	Take(ctx context.Context, key string) (bool, error)
}

// A Contender is one limiter under test.
type Contender struct {
	// Name is the contender in the report, e.g. "ulule/limiter redis".
	Name string
	// Code is short and unique within its medium; it starts the
	// contender's keys.
	Code string
	Role Role
	// Bound returns what the contender promises each key under l.
	Bound func(l Limit) Bound
	// New sets the contender up for one cell, on the medium's
	// connections. Its state must not be shared with another cell's: the
	// keys of every cell are different, and in-process contenders are
	// built anew. The Taker is closed (io.Closer) after the cell when it
	// implements it.
	New func(ctx context.Context, env *env, l Limit) (Taker, error)
}

// TakeFunc adapts a function to a Taker.
type TakeFunc func(ctx context.Context, key string) (bool, error)

// Take calls f.
func (f TakeFunc) Take(ctx context.Context, key string) (bool, error) { return f(ctx, key) }

// libraryTaker calls Limiter.Limit: the library as a user calls it.
type libraryTaker struct {
	lim *ratelimit.Limiter
	// own is the store when the cell made it (redisstore's, whose
	// goroutines send its calls), closed with the cell; nil when the
	// medium's contenders share one (bbolt's, PostgreSQL's).
	own io.Closer
}

// limitName is the name of the one limit the library's contenders declare.
const limitName = "compare"

// newLibrary returns the library on store, which the medium keeps and
// closes.
func newLibrary(store ratelimit.Store, l Limit) (Taker, error) {
	lim, err := newLimiter(store, l)
	if err != nil {
		return nil, err
	}
	return &libraryTaker{lim: lim}, nil
}

// newOwnLibrary returns the library on a store made for the cell, which
// the Taker closes.
func newOwnLibrary(store interface {
	ratelimit.Store
	io.Closer
}, l Limit) (Taker, error) {
	lim, err := newLimiter(store, l)
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	return &libraryTaker{lim: lim, own: store}, nil
}

func newLimiter(store ratelimit.Store, l Limit) (*ratelimit.Limiter, error) {
	return ratelimit.New(store, ratelimit.Limits{
		limitName: {Kind: l.Kind, Rate: float64(l.Rate), Period: l.Period},
	})
}

func (t *libraryTaker) Take(ctx context.Context, key string) (bool, error) {
	res, err := t.lim.Limit(ctx, limitName, key)
	return res.OK, err
}

// Close closes the store the cell made, if any.
func (t *libraryTaker) Close() error {
	if t.own == nil {
		return nil
	}
	return t.own.Close()
}

// libraryBound is the library's promise: a token bucket of capacity Rate,
// or a fixed window with rollover (capacity Rate, Rate granted at each
// window start, at a per-key phase).
func libraryBound(l Limit) Bound {
	if l.Kind == ratelimit.FixedWindow {
		return WindowBound("fixed window", float64(l.Rate), float64(l.Rate), l.Period)
	}
	return BucketBound("token bucket", float64(l.Rate), l.PerSecond())
}

// counterBound is the promise of a counter of windows: at most Rate calls
// granted in each window of at least Period, however the windows are
// placed.
func counterBound(l Limit) Bound {
	return WindowBound("window counter", float64(l.Rate), float64(l.Rate), l.Period)
}

// gcraBound is the promise of GCRA with burst Rate and emission interval
// Period/Rate: a token bucket of capacity Rate.
func gcraBound(l Limit) Bound {
	return BucketBound("GCRA", float64(l.Rate), l.PerSecond())
}
