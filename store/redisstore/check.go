package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/coalesce"
	"github.com/redis/go-redis/v9"
)

// A limiter's records must outlive restarts and memory pressure: a record
// Redis forgets reads as a full bucket, so a key whose limit was spent may
// spend it again at once. CheckServer reads the two settings that decide
// this, where the server lets it.

// Warning is a setting of a Redis server that lets it lose the limiter's
// records.
type Warning struct {
	// Server is the address of the server (of one master, on a Cluster;
	// of the master on a client of Sentinel, as the server tells it).
	Server string
	// Setting names the configuration directives at fault.
	Setting string
	// Value is what the server reported for them.
	Value string
	// Problem says what goes wrong and what to do about it.
	Problem string
}

// String returns the warning as one line.
func (w Warning) String() string {
	return fmt.Sprintf("redis %s: %s %s: %s", w.Server, w.Setting, w.Value, w.Problem)
}

const (
	problemPersistence = "no persistence: a restart forgets every record, and every limit starts full again; " +
		"turn on appendonly (appendfsync everysec loses at most a second of writes) or RDB snapshots (save)"
	problemEviction = "when memory is full, Redis evicts keys, the limiter's records among them (each has an expiry), " +
		"and their limits start full again; set maxmemory-policy noeviction (writes then fail and calls follow " +
		"their failure policy) or give the limiter a Redis of its own"
)

// CheckServer reads the settings of the server (of every master, on a
// Cluster) that decide whether the limiter's records survive, and returns
// one Warning for each that lets them be lost:
//
//   - no persistence (save "" and appendonly no): a restart forgets every
//     record;
//   - maxmemory set with a maxmemory-policy other than noeviction: a flood
//     of other keys evicts the limiter's records.
//
// A server that refuses CONFIG GET, as managed services may, is not
// checked: CheckServer returns no warning for it and no error. The error
// is for a server that could not be reached (a Ring with no shard up, or
// closed, too), or ctx's when it ends first: CheckServer returns then,
// whatever the client's timeouts.
func (s *Store) CheckServer(ctx context.Context) ([]Warning, error) {
	if err := s.usable(ctx, "CheckServer"); err != nil {
		return nil, err
	}
	var (
		mu       sync.Mutex
		warnings []Warning
	)
	check := func(ctx context.Context, c *redis.Client) error {
		ws, err := checkServer(ctx, c)
		mu.Lock()
		warnings = append(warnings, ws...)
		mu.Unlock()
		return err
	}
	// Detached, so that ctx, not go-redis's read timeout, bounds a stalled
	// server; when ctx ends first, the checks finish in the background and
	// the warnings found by then are returned.
	err := coalesce.Detached(ctx, func() error { return s.forEachServer(ctx, check) })
	mu.Lock()
	found := slices.Clone(warnings)
	mu.Unlock()
	if err != nil {
		return found, fmt.Errorf("redisstore: check server: %w", s.callerError(ctx, err))
	}
	return found, nil
}

func checkServer(ctx context.Context, c *redis.Client) ([]Warning, error) {
	names := []string{"save", "appendonly", "maxmemory", "maxmemory-policy"}
	cmds := make([]*redis.MapStringStringCmd, len(names))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, n := range names {
			cmds[i] = p.ConfigGet(ctx, n)
		}
		return nil
	})
	if err != nil {
		var refused redis.Error
		if errors.As(err, &refused) {
			return nil, nil // CONFIG renamed or not allowed: nothing to say
		}
		return nil, err
	}
	conf := make(map[string]string, len(names))
	for i, n := range names {
		v, ok := cmds[i].Val()[n]
		if !ok {
			return nil, nil // hidden
		}
		conf[n] = v
	}
	addr := serverAddr(ctx, c)
	var ws []Warning
	if conf["save"] == "" && conf["appendonly"] == "no" {
		ws = append(ws, Warning{Server: addr, Setting: "save, appendonly", Value: `"", no`, Problem: problemPersistence})
	}
	if conf["maxmemory"] != "0" && conf["maxmemory-policy"] != "noeviction" {
		ws = append(ws, Warning{Server: addr, Setting: "maxmemory-policy", Value: fmt.Sprintf("%s (maxmemory %s)", conf["maxmemory-policy"], conf["maxmemory"]),
			Problem: problemEviction})
	}
	return ws, nil
}

// WithLogger sets the logger the store warns on (default slog.Default()).
// Once its first call has succeeded, the store runs CheckServer in the
// background and logs each Warning at level warn; nil turns that off.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// checkTimeout bounds the background check.
const checkTimeout = 10 * time.Second

// warnOnce runs CheckServer once, in the background, and logs what it
// finds. Errors (an unreachable server) are not logged: the calls report
// them.
func (s *Store) warnOnce() {
	if s.logger == nil {
		return
	}
	s.checkOnce.Do(func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
			defer cancel()
			ws, _ := s.CheckServer(ctx)
			for _, w := range ws {
				s.logger.Warn("redisstore: "+w.Problem, "server", w.Server, "setting", w.Setting, "value", w.Value)
			}
		}()
	})
}

// serverAddr returns the address of c's server, for a Warning: the one in
// c's options, or, where they hold none (a client of Sentinel, whose
// options say "FailoverClient" whatever its master), the address the
// server says the client reached it at (CLIENT INFO's laddr), when it
// says.
func serverAddr(ctx context.Context, c *redis.Client) string {
	o := c.Options()
	if _, _, err := net.SplitHostPort(o.Addr); err == nil || o.Network == "unix" {
		return o.Addr
	}
	if info, err := c.ClientInfo(ctx).Result(); err == nil && info.LAddr != "" {
		return info.LAddr
	}
	return o.Addr
}
