package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
)

func init() {
	// The pool's own log lines would repeat the error the command reports.
	redis.SetLogger(quietLogger{})
}

// quietLogger drops go-redis's log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// storeFlags select a store by URL.
type storeFlags struct {
	url, prefix, table, bucket string
}

func (f *storeFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.url, "store", "", "the store: bolt://PATH, redis://HOST:PORT/DB, redis+cluster://H1:P1,H2:P2, postgres://..., or mem:")
	fs.StringVar(&f.prefix, "prefix", redisstore.DefaultPrefix, "Redis: the prefix of the store's keys")
	fs.StringVar(&f.table, "table", pgstore.DefaultTable, "PostgreSQL: the store's table")
	fs.StringVar(&f.bucket, "bucket", boltstore.DefaultBucket, "bbolt: the store's bucket")
}

// open opens the store; close releases what it opened.
func (f *storeFlags) open(ctx context.Context) (s ratelimit.Store, close func(), err error) {
	u := f.url
	scheme, rest, _ := strings.Cut(u, ":")
	switch scheme {
	case "":
		return nil, nil, usagef("give a store: --store bolt://PATH, redis://HOST:PORT, postgres://... or mem:")
	case "mem":
		m, err := memstore.New()
		if err != nil {
			return nil, nil, err
		}
		return m, func() {}, nil
	case "bolt":
		path := strings.TrimPrefix(rest, "//")
		if path == "" {
			return nil, nil, usagef("--store %q: write bolt://PATH, e.g. bolt://limits.db or bolt:///var/lib/app/limits.db", u)
		}
		b, err := boltstore.Open(path, boltstore.WithBucket(f.bucket))
		if err != nil {
			return nil, nil, err
		}
		return b, func() { b.Close() }, nil
	case "redis", "rediss":
		opt, err := redis.ParseURL(u)
		if err != nil {
			return nil, nil, usagef("--store %q: %v", u, err)
		}
		c := redis.NewClient(opt)
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close()
			return nil, nil, fmt.Errorf("redis at %s: %w (is the server up? check --store)", opt.Addr, err)
		}
		rs, err := redisstore.New(c, redisstore.WithPrefix(f.prefix))
		if err != nil {
			c.Close()
			return nil, nil, usagef("--prefix: %v", err)
		}
		return rs, func() { c.Close() }, nil
	case "redis+cluster":
		addrs := strings.Split(strings.TrimPrefix(rest, "//"), ",")
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close()
			return nil, nil, fmt.Errorf("redis cluster at %v: %w (are the nodes up? check --store)", addrs, err)
		}
		rs, err := redisstore.New(c, redisstore.WithPrefix(f.prefix))
		if err != nil {
			c.Close()
			return nil, nil, usagef("--prefix: %v", err)
		}
		return rs, func() { c.Close() }, nil
	case "postgres", "postgresql":
		pool, err := pgxpool.New(ctx, u)
		if err != nil {
			return nil, nil, usagef("--store: %v", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("postgres: %w (is the server up? check --store)", err)
		}
		p, err := pgstore.New(ctx, pool, pgstore.WithTable(f.table))
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return p, pool.Close, nil
	}
	return nil, nil, usagef("--store %q: unknown kind of store %q: use bolt, redis, redis+cluster, postgres or mem", u, scheme)
}
