package redisstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// answerFcalls answers every call of the function with reply (nil: a nil
// reply), as a foreign function registered under the library's name
// would, without sending it.
type answerFcalls struct{ reply any }

func (h answerFcalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h answerFcalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "fcall" {
			return next(ctx, cmd)
		}
		c := cmd.(interface {
			SetVal(any)
			SetErr(error)
		})
		if h.reply == nil {
			c.SetErr(redis.Nil)
			return redis.Nil
		}
		c.SetVal(h.reply)
		return nil
	}
}

func (h answerFcalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestUnexpectedReply: a reply of the function that is no string of
// decisions (nil, a number, an array, a string of another length), as a
// foreign function under the library's name answers, fails the call, alone
// or batched, with an error that names the library and says what may be
// wrong, rather than Redis's nil or go-redis's type error.
func TestUnexpectedReply(t *testing.T) {
	ctx := context.Background()
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 100, Period: 1000, Capacity: 100}
	for _, reply := range []any{nil, int64(1), []any{int64(1), "x"}, "", strings.Repeat("\x01", 48)} {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
		c.AddHook(answerFcalls{reply})
		store := newStore(c, "ratelimit-test:reply:")
		requireUnexpected := func(err error, how string) {
			t.Helper()
			require.Error(t, err, "%#v %s", reply, how)
			require.ErrorContains(t, err, redisstore.FunctionLibrary(), "%#v %s: names the library", reply, how)
			require.ErrorContains(t, err, "another library", "%#v %s: says what may be wrong", reply, how)
			require.NotErrorIs(t, err, redis.Nil, "%#v %s", reply, how)
		}
		op := func(key string) *driver.Op { return oneItemOp(driver.ModeLimit, 1000, "l", key, 1, p) }
		requireUnexpected(store.Apply(ctx, op("k"), make([]driver.Decision, 1)), "alone")
		outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
		requireUnexpected(store.ApplyBatch(ctx, []*driver.Op{op("k"), op("k2")}, outs), "batched")
		require.NoError(t, store.Close())
		require.NoError(t, c.Close())
	}
}

// TestForeignLibraryUnderItsName: a library of other code loaded under
// the library's name, without the store's function, is found by the
// store's load ("already exists"); the call that finds the function
// missing once more fails with an error that names the library and says
// to delete it, alone or batched, rather than with Redis's bare "Function
// not found".
func TestForeignLibraryUnderItsName(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: ownServer(t)})
	t.Cleanup(func() { c.Close() })
	name := redisstore.FunctionLibrary()
	require.NoError(t, c.FunctionLoad(ctx, "#!lua name="+name+"\nredis.register_function('other', function() return 1 end)\n").Err())
	store := newStore(c, "ratelimit-test:foreign:")
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 100, Period: 1000, Capacity: 100}
	op := func(key string) *driver.Op { return oneItemOp(driver.ModeLimit, 1000, "l", key, 1, p) }
	requireForeign := func(err error, how string) {
		t.Helper()
		require.Error(t, err, how)
		require.ErrorContains(t, err, "Function not found", "%s: Redis's answer", how)
		require.ErrorContains(t, err, "FUNCTION DELETE "+name, "%s: names the library and says what to do", how)
	}
	requireForeign(store.Apply(ctx, op("k"), make([]driver.Decision, 1)), "alone")
	outs := [][]driver.Decision{make([]driver.Decision, 1), make([]driver.Decision, 1)}
	requireForeign(store.ApplyBatch(ctx, []*driver.Op{op("k"), op("k2")}, outs), "batched")

	require.NoError(t, c.FunctionDelete(ctx, name).Err())
	require.NoError(t, store.Apply(ctx, op("k"), make([]driver.Decision, 1)), "the store loads its own library")
}
