package compare

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/redis/go-redis/v9"
)

// medium is where a group of contenders keeps its state.
type medium struct {
	contenders []Contender
	// open connects and makes what the contenders share; an error means
	// the medium is skipped (its server cannot be reached). It returns
	// what the medium runs on, for the report.
	open func(ctx context.Context, o *Options, e *env) (string, error)
	// close deletes what the run made and disconnects.
	close func(ctx context.Context, e *env) error
}

var media = map[string]medium{
	"memory": {
		contenders: memoryContenders,
		open:       func(context.Context, *Options, *env) (string, error) { return "In this process", nil },
		close:      func(context.Context, *env) error { return nil },
	},
	"bolt":    {contenders: boltContenders, open: openBolt, close: closeBolt},
	"redis":   {contenders: redisContenders, open: openRedis, close: closeRedis},
	"cluster": {contenders: redisContenders, open: openCluster, close: closeRedis},
	"pg":      {contenders: pgContenders, open: openPG, close: closePG},
}

// reachTimeout bounds the first contact with a server.
const reachTimeout = 3 * time.Second

func openBolt(_ context.Context, _ *Options, e *env) (string, error) {
	dir, err := os.MkdirTemp("", e.prefix) // named after the run
	if err != nil {
		return "", err
	}
	e.dir = dir
	if e.boltStore, err = boltstore.Open(filepath.Join(dir, "ratelimit.db")); err != nil {
		return "", errors.Join(err, closeBolt(context.Background(), e))
	}
	if e.boltUpdate, err = openBareBolt(filepath.Join(dir, "update.db")); err != nil {
		return "", errors.Join(err, closeBolt(context.Background(), e))
	}
	if e.boltBatch, err = openBareBolt(filepath.Join(dir, "batch.db")); err != nil {
		return "", errors.Join(err, closeBolt(context.Background(), e))
	}
	return "On files in " + dir, nil
}

func closeBolt(_ context.Context, e *env) error {
	var errs []error
	if e.boltStore != nil {
		errs = append(errs, e.boltStore.Close())
	}
	for _, db := range []interface{ Close() error }{e.boltUpdate, e.boltBatch} {
		if db != nil {
			errs = append(errs, db.Close())
		}
	}
	if e.dir != "" {
		errs = append(errs, os.RemoveAll(e.dir))
	}
	return errors.Join(errs...)
}

func openRedis(ctx context.Context, o *Options, e *env) (string, error) {
	if err := dial(o.RedisAddr); err != nil {
		return "", fmt.Errorf("the Redis server at %s cannot be reached: %w", o.RedisAddr, err)
	}
	c := redis.NewClient(&redis.Options{Addr: o.RedisAddr, PoolSize: o.RedisPool})
	e.redis = c
	if err := ping(ctx, c); err != nil {
		c.Close()
		return "", fmt.Errorf("the Redis server at %s cannot be reached: %w", o.RedisAddr, err)
	}
	warnRedis(ctx, o, e)
	return "On Redis " + serverVersion(ctx, c) + " at " + o.RedisAddr, nil
}

func openCluster(ctx context.Context, o *Options, e *env) (string, error) {
	if err := dial(o.ClusterAddrs[0]); err != nil {
		return "", fmt.Errorf("the Redis Cluster at %s cannot be reached: %w", strings.Join(o.ClusterAddrs, ","), err)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: o.ClusterAddrs, PoolSize: o.RedisPool})
	e.redis = c
	err := ping(ctx, c)
	if err == nil {
		// Every master must answer: the keys spread over all of them.
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return ping(ctx, n) })
	}
	if err != nil {
		c.Close()
		return "", fmt.Errorf("the Redis Cluster at %s cannot be reached: %w", strings.Join(o.ClusterAddrs, ","), err)
	}
	warnRedis(ctx, o, e)
	return "On a Redis Cluster " + serverVersion(ctx, c) + " at " + strings.Join(o.ClusterAddrs, ","), nil
}

// dial fails fast when nothing listens at addr, before a client retries.
func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, reachTimeout)
	if err == nil {
		c.Close()
	}
	return err
}

func ping(ctx context.Context, c redis.UniversalClient) error {
	ctx, cancel := context.WithTimeout(ctx, reachTimeout)
	defer cancel()
	return c.Ping(ctx).Err()
}

func serverVersion(ctx context.Context, c redis.UniversalClient) string {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return ""
}

func closeRedis(ctx context.Context, e *env) error {
	_, err := deleteKeys(ctx, e.redis, e.prefix)
	return errors.Join(err, e.redis.Close())
}

// pgConfig parses the PostgreSQL URL of o, and checks that it names this
// machine. It returns the server's host:port.
func pgConfig(o *Options) (*pgxpool.Config, string, error) {
	cfg, err := pgxpool.ParseConfig(o.PostgresURL)
	if err != nil {
		return nil, "", fmt.Errorf("PostgreSQL URL %q: %w", o.PostgresURL, err)
	}
	host := cfg.ConnConfig.Host
	if strings.HasPrefix(host, "/") {
		host = "localhost" // a Unix socket is this machine
	}
	addr := net.JoinHostPort(host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	if err := loopback(addr); err != nil {
		return nil, "", fmt.Errorf("PostgreSQL server: %w", err)
	}
	return cfg, addr, nil
}

func openPG(ctx context.Context, o *Options, e *env) (string, error) {
	cfg, addr, err := pgConfig(o)
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		if err := dial(addr); err != nil {
			return "", fmt.Errorf("the PostgreSQL server at %s cannot be reached: %w", addr, err)
		}
	}
	cfg.MaxConns = int32(o.PGConns)
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 20
	}
	cctx, cancel := context.WithTimeout(ctx, reachTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, cfg)
	if err == nil {
		err = pool.Ping(cctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return "", fmt.Errorf("the PostgreSQL server at %s:%d cannot be reached: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	e.pg = pool
	var version string
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&version)
	if err := pgSetup(ctx, e); err != nil {
		return "", errors.Join(fmt.Errorf("setting up PostgreSQL: %w", err), closePG(ctx, e))
	}
	if f := strings.Fields(version); len(f) > 0 {
		version = f[0] // "15.20 (Debian …)"
	}
	return fmt.Sprintf("On PostgreSQL %s at %s:%d, a pool of %d", version, cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.MaxConns), nil
}

func closePG(ctx context.Context, e *env) error {
	err := pgCleanup(ctx, e)
	e.pg.Close()
	return err
}
