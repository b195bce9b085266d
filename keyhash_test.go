package ratelimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keyRecorder is a memstore that records every key it is given, by every
// method and by the BoundLimits it binds.
type keyRecorder struct {
	*memstore.Store
	mu   sync.Mutex
	keys map[string]bool
}

func (s *keyRecorder) saw(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[string]bool{}
	}
	s.keys[key] = true
}

func (s *keyRecorder) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	for _, it := range op.Items {
		s.saw(it.Key)
	}
	return s.Store.Apply(ctx, op, out)
}

func (s *keyRecorder) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	for _, id := range ids {
		s.saw(id.Key)
	}
	return s.Store.Load(ctx, ids, out)
}

func (s *keyRecorder) Delete(ctx context.Context, ids []driver.RecordID) error {
	for _, id := range ids {
		s.saw(id.Key)
	}
	return s.Store.Delete(ctx, ids)
}

func (s *keyRecorder) Bind(name string, p driver.Params, phase func(string) int64) driver.BoundLimit {
	return &recordedBound{BoundLimit: s.Store.Bind(name, p, phase), s: s}
}

type recordedBound struct {
	driver.BoundLimit
	s *keyRecorder
}

func (b *recordedBound) Decide(ctx context.Context, key string, mode driver.Mode, now int64, count float64, reserve bool) (driver.Verdict, error) {
	b.s.saw(key)
	return b.BoundLimit.Decide(ctx, key, mode, now, count, reserve)
}

func (b *recordedBound) Store() ratelimit.Store { return b.s }

// With WithKeyHash, no path hands the store a clear key: Limit and Check
// (the Binder's fast path and Apply), Reserve and Cancel, LimitAll, a
// sharded limit, an inline config, Value, Reset and the deny cache; while
// the Results, errors and events keep the clear key.
func TestKeyHashOnEveryPath(t *testing.T) {
	ctx := context.Background()
	store := &keyRecorder{Store: must(memstore.New())}
	var (
		mu     sync.Mutex
		events []ratelimit.Event
	)
	observer := ratelimit.ObserverFunc(func(_ context.Context, e ratelimit.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	})
	limits := ratelimit.Limits{
		"one":     {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Second},
		"window":  {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Second},
		"sharded": {Kind: ratelimit.TokenBucket, Rate: 4, Period: time.Second, Shards: 2},
	}
	secret := []byte("0123456789abcdef")
	plain, err := ratelimit.New(store, limits, ratelimit.WithClock(newMock()), ratelimit.WithKeyHash(secret))
	require.NoError(t, err)
	watched, err := ratelimit.New(store, limits, ratelimit.WithClock(newMock()), ratelimit.WithKeyHash(secret),
		ratelimit.WithDenyCache(10), ratelimit.WithObserver(observer))
	require.NoError(t, err)

	const key = "api-key-SECRET"
	for _, lim := range []*ratelimit.Limiter{plain, watched} {
		for _, name := range []string{"one", "window", "sharded"} {
			for range 3 {
				res, err := lim.Limit(ctx, name, key)
				require.NoError(t, err)
				assert.Equal(t, key, res.Key)
				if !res.OK {
					var le *ratelimit.LimitError
					require.ErrorAs(t, res.Err(), &le)
					assert.Equal(t, key, le.Key)
				}
			}
			_, err := lim.Check(ctx, name, key)
			require.NoError(t, err)
			st, err := lim.Value(ctx, name, key)
			require.NoError(t, err)
			assert.True(t, st.Shards[0].Stored || st.Shards[len(st.Shards)-1].Stored)
			r, err := lim.Reserve(ctx, name, key, ratelimit.WithReserve())
			require.NoError(t, err)
			assert.Equal(t, key, r.Result().Key)
			require.NoError(t, r.Cancel(ctx))
			require.NoError(t, lim.Reset(ctx, name, key))
		}
		res, err := lim.LimitAll(ctx, key, []string{"one", "window"})
		require.NoError(t, err)
		assert.Equal(t, key, res.Key)
		_, err = lim.Limit(ctx, "inline", key, ratelimit.WithConfig(ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}))
		require.NoError(t, err)
	}

	require.NotEmpty(t, store.keys)
	hashed := ""
	for k := range store.keys {
		assert.NotContains(t, k, "SECRET", "a clear key reached the store")
		assert.Len(t, k, 22, "%q is not a keyed hash", k)
		hashed = k
	}
	assert.Len(t, store.keys, 1, "one key, one hash, on every path")
	require.NotEmpty(t, events)
	for _, e := range events {
		assert.Equal(t, key, e.Result.Key)
	}

	// The same secret and key give the same hash in another Limiter; the
	// record under it is the one the calls above wrote.
	_, err = plain.Limit(ctx, "one", key)
	require.NoError(t, err)
	var recs [1]driver.Record
	require.NoError(t, store.Store.Load(ctx, []driver.RecordID{{Name: "one", Key: hashed}}, recs[:]))
	assert.True(t, recs[0].Found)
}

func TestKeyHashRefusesAShortSecret(t *testing.T) {
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}}
	for _, secret := range [][]byte{nil, []byte("fifteen bytes!!")} {
		_, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithKeyHash(secret))
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption)
		assert.Contains(t, err.Error(), "at least 16 random bytes")
	}
	_, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithKeyHash([]byte("sixteen bytes!!!")))
	require.NoError(t, err)
}

// A secret of zero bytes only is a buffer never filled (make([]byte, 32)
// and no crypto/rand.Read, or a hex decode of an unset variable into one):
// anyone can compute the hashes under it, so it hides no key.
func TestKeyHashRefusesAZeroSecret(t *testing.T) {
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}}
	for _, n := range []int{16, 32, 64} {
		_, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithKeyHash(make([]byte, n)))
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "%d zero bytes", n)
		assert.Contains(t, err.Error(), "zero bytes only")
	}
	secret := make([]byte, 32)
	secret[31] = 1
	_, err := ratelimit.New(must(memstore.New()), limits, ratelimit.WithKeyHash(secret))
	require.NoError(t, err)
}

// The secret is copied: changing the caller's slice afterwards changes
// nothing.
func TestKeyHashCopiesTheSecret(t *testing.T) {
	ctx := context.Background()
	store := must(memstore.New())
	limits := ratelimit.Limits{"l": {Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Minute}}
	secret := []byte("a secret of many bytes")
	a, err := ratelimit.New(store, limits, ratelimit.WithClock(newMock()), ratelimit.WithKeyHash(secret))
	require.NoError(t, err)
	res, err := a.Limit(ctx, "l", "k")
	require.NoError(t, err)
	require.True(t, res.OK)
	secret[0] ^= 0xff
	b, err := ratelimit.New(store, limits, ratelimit.WithClock(newMock()), ratelimit.WithKeyHash([]byte("a secret of many bytes")))
	require.NoError(t, err)
	res, err = b.Limit(ctx, "l", "k")
	require.NoError(t, err)
	assert.False(t, res.OK, "a's record, under the secret as it was given")
}
