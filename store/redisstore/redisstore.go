// Package redisstore is a ratelimit.Store on Redis, for a fleet of
// processes sharing limits: a single server, Sentinel, or a Redis Cluster.
//
// Each Apply is one network round trip: the whole transition
// (ratelimit.Evaluate) runs server-side in a Lua script (apply.lua),
// which Redis runs atomically. The script is loaded once and called by its
// digest (EVALSHA), falling back to EVAL when the server does not know it.
//
// Every record is one Redis key. All records of one ratelimit key, whatever
// the limit's name or shard, share a hash tag derived from the key, so
// they live in one Cluster slot and one script may touch them all (an op's
// items share one key). Records expire once their bucket would be full
// again, plus a margin for the server's clock disagreeing with the
// application's.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/redis/go-redis/v9"
)

//go:embed apply.lua
var applyLua string

var applyScript = redis.NewScript(applyLua)

// DefaultPrefix starts every key the store writes, unless WithPrefix
// gives another.
const DefaultPrefix = "ratelimit:"

// DefaultExpiryMargin is how long a record is kept past the moment its
// bucket is full again, unless WithExpiryMargin gives another: as long as
// ratelimit.ExpiryGrace.
const DefaultExpiryMargin = time.Duration(ratelimit.ExpiryGrace) * time.Millisecond

// Store is a ratelimit.Store on Redis, safe for concurrent use. Build it
// with New.
type Store struct {
	client     redis.UniversalClient
	prefix     string
	serverTime bool
	margin     int64 // ms
	err        error // a bad option, reported by every call
}

var (
	_ ratelimit.Store      = (*Store)(nil)
	_ ratelimit.TimeSource = (*Store)(nil)
)

// Option configures a Store in New.
type Option func(*Store)

// WithPrefix sets the prefix of every key the store writes (default
// DefaultPrefix), so that several applications may share a server. It
// must not contain '{' or '}', which would change the Cluster hash tag.
func WithPrefix(prefix string) Option { return func(s *Store) { s.prefix = prefix } }

// WithServerTime makes the store judge every call at the Redis server's
// time (TIME) instead of the Limiter's clock. Choose it when the
// processes of a fleet have clocks that disagree by more than the
// precision the limits need: the server is then the one clock. Tests that
// drive the Limiter's clock by hand cannot use it.
func WithServerTime() Option { return func(s *Store) { s.serverTime = true } }

// WithExpiryMargin sets how long a record is kept past the moment its
// bucket is full again (default DefaultExpiryMargin). Redis expires keys
// on its own clock; the margin covers how far it may run ahead of the
// application's, and how far the nows of calls in flight may lag (see
// ratelimit.ExpiryGrace), so that no record is dropped while, by the
// Limiter's clock, its bucket is not yet full.
func WithExpiryMargin(d time.Duration) Option {
	return func(s *Store) { s.margin = d.Milliseconds() }
}

// New returns a store on client: a *redis.Client, a Sentinel-backed
// failover client, or a *redis.ClusterClient. The store does not own the
// client; close it yourself.
func New(client redis.UniversalClient, opts ...Option) *Store {
	s := &Store{client: client, prefix: DefaultPrefix, margin: DefaultExpiryMargin.Milliseconds()}
	for _, o := range opts {
		o(s)
	}
	switch {
	case client == nil:
		s.err = errors.New("redisstore: New needs a client: pass redis.NewClient(...) or redis.NewClusterClient(...)")
	case strings.ContainsAny(s.prefix, "{}"):
		s.err = fmt.Errorf("redisstore: prefix %q contains a brace, which would change the Cluster hash tag: remove it", s.prefix)
	case s.margin < 0:
		s.err = fmt.Errorf("redisstore: expiry margin %dms is negative: pass 0 or more", s.margin)
	}
	return s
}

// OwnClock implements ratelimit.TimeSource: it reports whether the store
// was built WithServerTime.
func (s *Store) OwnClock() bool { return s.serverTime }

// Now implements ratelimit.TimeSource: the server's time in Unix ms.
func (s *Store) Now(ctx context.Context) (int64, error) {
	if s.err != nil {
		return 0, s.err
	}
	t, err := s.client.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("redisstore: time: %w", err)
	}
	return t.UnixMilli(), nil
}

// Key returns the Redis key of a record. Every record of one ratelimit key
// carries the same hash tag, a digest of the key, so that they share a
// Cluster slot; the name is length-prefixed, so that no two records share
// a Redis key whatever bytes their names and keys hold.
func (s *Store) Key(id ratelimit.RecordID) string {
	h := fnv.New64a()
	h.Write([]byte(id.Key))
	var b strings.Builder
	b.Grow(len(s.prefix) + 40 + len(id.Name) + len(id.Key))
	b.WriteString(s.prefix)
	b.WriteByte('{')
	b.WriteString(strconv.FormatUint(h.Sum64(), 16))
	b.WriteByte('}')
	b.WriteString(strconv.Itoa(len(id.Name)))
	b.WriteByte(':')
	b.WriteString(id.Name)
	b.WriteByte(':')
	b.WriteString(strconv.Itoa(id.Shard))
	b.WriteByte(':')
	b.WriteString(id.Key)
	return b.String()
}

func (s *Store) usable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.err
}

func formatFloat(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// Apply implements ratelimit.Store: one script call.
func (s *Store) Apply(ctx context.Context, op *ratelimit.Op, out []ratelimit.Decision) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	ids := op.AppendRecordIDs(make([]ratelimit.RecordID, 0, 4))
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = s.Key(id)
	}
	now := strconv.FormatInt(op.Now, 10)
	if s.serverTime {
		now = ""
	}
	reserve := "0"
	if op.Reserve {
		reserve = "1"
	}
	args := make([]any, 0, 5+len(op.Items)*2+len(ids)*6)
	args = append(args, strconv.Itoa(int(op.Mode)), now, reserve, strconv.FormatInt(s.margin, 10), strconv.Itoa(len(op.Items)))
	for i := range op.Items {
		it := &op.Items[i]
		args = append(args, formatFloat(it.Count), strconv.Itoa(len(it.Shards)))
		for _, sh := range it.Shards {
			p := sh.Params
			args = append(args, strconv.Itoa(int(p.Kind)), formatFloat(p.Rate), strconv.FormatInt(p.Period, 10),
				formatFloat(p.Capacity), formatFloat(p.MaxReserved), strconv.FormatInt(p.Phase, 10))
		}
	}
	reply, err := applyScript.Run(ctx, s.client, keys, args...).StringSlice()
	if err != nil {
		return fmt.Errorf("redisstore: apply: %w", err)
	}
	if len(reply) != 5*len(op.Items) {
		return fmt.Errorf("redisstore: apply: the script answered %d values for %d items: is another apply.lua loaded under this digest?", len(reply), len(op.Items))
	}
	for i := range op.Items {
		r := reply[5*i:]
		var d ratelimit.Decision
		d.OK = r[0] == "1"
		retry, err1 := strconv.ParseFloat(r[1], 64)
		d.RetryAfter = int64(retry)
		var err2, err3, err4 error
		d.Remaining, err2 = strconv.ParseFloat(r[2], 64)
		d.Charged[0], err3 = strconv.ParseFloat(r[3], 64)
		d.Charged[1], err4 = strconv.ParseFloat(r[4], 64)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return fmt.Errorf("redisstore: apply: bad reply %q: %w", r[:5], err)
		}
		out[i] = d
	}
	return nil
}

// Load implements ratelimit.Store: one pipeline of GETs, which a Cluster
// client splits by node.
func (s *Store) Load(ctx context.Context, ids []ratelimit.RecordID, out []ratelimit.Record) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	cmds := make([]*redis.StringCmd, len(ids))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.Get(ctx, s.Key(id))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redisstore: load: %w", err)
	}
	for i, c := range cmds {
		raw, err := c.Result()
		if errors.Is(err, redis.Nil) {
			out[i] = ratelimit.Record{}
			continue
		}
		if err != nil {
			return fmt.Errorf("redisstore: load: %w", err)
		}
		st, err := parseState(raw)
		if err != nil {
			return fmt.Errorf("redisstore: load %q: %w", s.Key(ids[i]), err)
		}
		out[i] = ratelimit.Record{State: st, Found: true}
	}
	return nil
}

func parseState(raw string) (ratelimit.State, error) {
	v, ts, ok := strings.Cut(raw, " ")
	if !ok {
		return ratelimit.State{}, fmt.Errorf("record %q is not \"<value> <ts>\"", raw)
	}
	value, err1 := strconv.ParseFloat(v, 64)
	t, err2 := strconv.ParseFloat(ts, 64)
	if err := errors.Join(err1, err2); err != nil {
		return ratelimit.State{}, fmt.Errorf("record %q: %w", raw, err)
	}
	return ratelimit.State{Value: value, TS: int64(t)}, nil
}

// Delete implements ratelimit.Store: one pipeline of DELs.
func (s *Store) Delete(ctx context.Context, ids []ratelimit.RecordID) error {
	if err := s.usable(ctx); err != nil {
		return err
	}
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.Del(ctx, s.Key(id))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisstore: delete: %w", err)
	}
	return nil
}
