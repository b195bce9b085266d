// Package compare runs this library beside other Go rate limiters and bare
// baselines on the same media (memory, bbolt, Redis, a Redis Cluster,
// PostgreSQL), interleaved in one run, and checks that no contender
// granted more than its own algorithm allows.
//
// # The matrix
//
// For every medium, every cell of the matrix (a number of goroutines, a
// number of keys) runs all the medium's contenders in short slices,
// rotated round-robin over several rounds, so that noise on the machine
// falls on all of them alike. A first round warms connections and caches
// and is not counted. Each call of a slice picks a key at random.
//
// # The check
//
// Every granted call is recorded with the moment it was made and the
// moment it was answered. After a cell, each contender's grants are
// checked, key by key, against the bound its own algorithm promises
// (Bound): no run of grants may exceed it over the span the run could
// have been decided in.
package compare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"
)

// Options are the matrix, the limit and the servers of a run.
type Options struct {
	// Media to run, in order: memory, bolt, redis, cluster, pg.
	Media []string
	// Goroutines and Keys are the matrix: every pair is a cell.
	Goroutines []int
	Keys       []int
	// Rounds is how many rounds are counted, after one warm-up round.
	Rounds int
	// Slice is how long a contender runs in each round.
	Slice time.Duration
	// Limit is every contender's limit.
	Limit Limit
	// Match, when not nil, keeps only the contenders whose name matches.
	Match *regexp.Regexp
	// The servers; they must be on this machine (loopback).
	RedisAddr    string
	ClusterAddrs []string
	PostgresURL  string
	// RedisPool and PGConns size the clients' pools; 0 means go-redis's
	// default (10 per CPU) and 20.
	RedisPool, PGConns int
	// Progress, when not nil, receives a line per cell, one per medium
	// skipped, and the warnings about a Redis server's settings that let
	// it lose a limiter's records (no persistence, eviction).
	Progress io.Writer

	// extra adds contenders to a medium (tests).
	extra map[string][]Contender
	// media replaces the media of the same name (tests).
	media map[string]medium
}

// AllMedia lists the media a run may name, in the order they run.
var AllMedia = []string{"memory", "bolt", "redis", "cluster", "pg"}

// DefaultOptions returns a run of every medium over 1, 8 and 64
// goroutines, one hot key and 10,000 keys, 5 rounds of 200 ms slices, and
// a limit of 100 per second per key (the library as a token bucket).
func DefaultOptions() Options {
	return Options{
		Media:        AllMedia,
		Goroutines:   []int{1, 8, 64},
		Keys:         []int{1, 10_000},
		Rounds:       5,
		Slice:        200 * time.Millisecond,
		Limit:        Limit{Rate: 100, Period: time.Second, Kind: ratelimit.TokenBucket},
		RedisAddr:    "127.0.0.1:6379",
		ClusterAddrs: []string{"127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"},
		PostgresURL:  "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
	}
}

// Report is the outcome of a run.
type Report struct {
	Options Options
	// Prefix starts every key, table and file name the run made.
	Prefix  string
	Started time.Time
	Elapsed time.Duration
	Media   []*MediumReport
}

// Violations returns every check that failed.
func (r *Report) Violations() []*Result {
	var out []*Result
	for _, m := range r.Media {
		for _, c := range m.Cells {
			for _, res := range c.Results {
				if res.Check.Violated() {
					out = append(out, res)
				}
			}
		}
	}
	return out
}

// CleanupErr returns the errors of removing what the run made, each
// named by its medium, or nil when every medium that ran removed all it
// made: the keys, tables or files of a medium whose cleanup failed may
// be left.
func (r *Report) CleanupErr() error {
	var errs []error
	for _, m := range r.Media {
		if m.Cleanup != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.Name, m.Cleanup))
		}
	}
	return errors.Join(errs...)
}

// MediumReport is one medium's part of a run.
type MediumReport struct {
	Name string
	// Addr says where the medium ran: "On Redis 7.0.15 at 127.0.0.1:6379".
	Addr string
	// Skipped says why the medium did not run; empty when it ran.
	Skipped string
	// Contenders are the medium's, in the order of every cell's Results.
	Contenders []Contender
	// Cells are the cells that finished, in the order they ran.
	Cells []*Cell
	// Cleanup is the error of removing the run's keys, tables or files.
	Cleanup error
}

// Cell is one cell of the matrix on one medium.
type Cell struct {
	Goroutines, Keys int
	Results          []*Result
}

// Result is one contender's outcome in one cell.
type Result struct {
	Contender *Contender
	Medium    string
	Cell      *Cell
	// PerRound holds the decisions per second of each counted round: the
	// calls answered without an error; a failed call decided nothing.
	PerRound []float64
	// Median, Min and Max summarize PerRound.
	Median, Min, Max float64
	// P50 and P99 are latencies of the decisions of the counted rounds.
	P50, P99 time.Duration
	// Calls, Granted and Errors count the calls of the counted rounds.
	Calls, Granted, Errors int64
	// Err is the first error a call of the counted rounds returned.
	Err error
	// Check is the verdict on every grant of the cell, warm-up included.
	Check Check
}

// env is what a medium's contenders share: its connections, and names
// unique to the run.
type env struct {
	prefix string // starts every key the run writes
	keys   int    // the cell's number of keys, for a store sized by it

	redis redis.UniversalClient

	pg        *pgxpool.Pool
	pgSchema  string
	pgStore   *pgstore.Store
	upsertSQL string

	dir                   string
	boltStore             *boltstore.Store
	boltUpdate, boltBatch *bolt.DB
}

// Run runs the matrix of o and checks every grant. A medium whose server
// cannot be reached is skipped, with the reason in its MediumReport; a
// server that is not on this machine, or whose address cannot be parsed,
// is an error of o (Validate). Run deletes the keys, tables and files it
// made before it returns; what it could not delete is told in each
// MediumReport's Cleanup, and by the Report's CleanupErr.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	rep := &Report{Options: o, Prefix: "rlcompare-" + id, Started: time.Now()}
	defer func() { rep.Elapsed = time.Since(rep.Started) }()
	for _, name := range o.Media {
		m := media[name]
		if t, ok := o.media[name]; ok {
			m = t
		}
		mr := &MediumReport{Name: name}
		rep.Media = append(rep.Media, mr)
		for _, c := range append(slices.Clone(m.contenders), o.extra[name]...) {
			if o.Match == nil || o.Match.MatchString(c.Name) {
				mr.Contenders = append(mr.Contenders, c)
			}
		}
		if len(mr.Contenders) == 0 {
			mr.Skipped = "no contender matches"
			continue
		}
		e := &env{prefix: rep.Prefix + "-", pgSchema: strings.ReplaceAll(rep.Prefix, "-", "_")}
		addr, err := m.open(ctx, &o, e)
		if err != nil && ctx.Err() != nil {
			// Interrupted, not unreachable: the run ends here, and the
			// media after this one are not skipped but never started.
			rep.Media = rep.Media[:len(rep.Media)-1]
			return rep, fmt.Errorf("%s: %w", name, ctx.Err())
		}
		if err != nil {
			mr.Skipped = err.Error()
			o.progressf("%s: skipped: %v\n", name, err)
			continue
		}
		mr.Addr = addr
		err = runMedium(ctx, &o, e, mr)
		// Clean up even when the run was interrupted.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		mr.Cleanup = m.close(cctx, e)
		cancel()
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// Validate reports the first setting of o that a run refuses.
func (o *Options) Validate() error {
	if len(o.Media) == 0 || len(o.Goroutines) == 0 || len(o.Keys) == 0 {
		return errors.New("compare: name at least one medium, goroutine count and key count")
	}
	for _, m := range o.Media {
		if _, ok := media[m]; !ok {
			return fmt.Errorf("compare: unknown medium %q: choose among %v", m, AllMedia)
		}
	}
	for _, g := range o.Goroutines {
		if g < 1 || g > 10_000 {
			return fmt.Errorf("compare: %d goroutines: choose 1 to 10000", g)
		}
	}
	for _, k := range o.Keys {
		if k < 1 || k > MaxKeys {
			return fmt.Errorf("compare: %d keys: choose 1 to %d", k, MaxKeys)
		}
	}
	// A value named twice ran its medium, or its cells, twice over, and
	// reported each twice.
	if err := once("medium", o.Media); err != nil {
		return err
	}
	if err := once("goroutine count", o.Goroutines); err != nil {
		return err
	}
	if err := once("key count", o.Keys); err != nil {
		return err
	}
	if o.RedisPool < 0 {
		return fmt.Errorf("compare: %d connections per Redis node: choose 0 (go-redis's default) or more", o.RedisPool)
	}
	if o.PGConns < 0 || o.PGConns > math.MaxInt32 {
		return fmt.Errorf("compare: %d PostgreSQL connections: choose 0 (the default, 20) or more", o.PGConns)
	}
	// The servers of the media to run: a server that cannot be reached is
	// skipped, one that is misnamed or elsewhere is a mistake.
	if slices.Contains(o.Media, "redis") {
		if err := loopback(o.RedisAddr); err != nil {
			return fmt.Errorf("compare: Redis server: %w", err)
		}
	}
	if slices.Contains(o.Media, "cluster") {
		if len(o.ClusterAddrs) == 0 {
			return errors.New("compare: name the Redis Cluster's nodes")
		}
		for _, a := range o.ClusterAddrs {
			if err := loopback(a); err != nil {
				return fmt.Errorf("compare: Redis Cluster node: %w", err)
			}
		}
	}
	if slices.Contains(o.Media, "pg") {
		if _, _, err := pgConfig(o); err != nil {
			return fmt.Errorf("compare: %w", err)
		}
	}
	if o.Rounds < 1 || o.Slice <= 0 {
		return fmt.Errorf("compare: %d rounds of %v: choose at least one round of a positive slice", o.Rounds, o.Slice)
	}
	if o.Limit.Rate < 1 || o.Limit.Period < time.Millisecond || o.Limit.Period%time.Millisecond != 0 {
		return fmt.Errorf("compare: limit of %d per %v: choose a rate ≥ 1 and a period of whole milliseconds", o.Limit.Rate, o.Limit.Period)
	}
	if o.Limit.Kind != ratelimit.FixedWindow && o.Limit.Kind != ratelimit.TokenBucket {
		return fmt.Errorf("compare: limit kind %v: choose a fixed window or a token bucket", o.Limit.Kind)
	}
	// A limit the library refuses would fail the first cell, after the
	// media had been opened and the report begun.
	if err := (ratelimit.Config{Kind: o.Limit.Kind, Rate: float64(o.Limit.Rate), Period: o.Limit.Period}).Validate(); err != nil {
		return fmt.Errorf("compare: limit of %d per %v: %w", o.Limit.Rate, o.Limit.Period, err)
	}
	return nil
}

// MaxKeys is the most keys a cell may spread its calls over: a cell makes
// a table of its key names, and a count up to 2^31-1, which Validate took,
// had it allocate gigabytes before its first call. The command's own bench
// takes as many (ratelimit bench --keys).
const MaxKeys = 1_000_000

// once returns an error naming the first value of vs given twice, what
// each is.
func once[T comparable](what string, vs []T) error {
	seen := make(map[T]bool, len(vs))
	for _, v := range vs {
		if seen[v] {
			return fmt.Errorf("compare: %s %#v named twice: name each once", what, v) // "redis", 8
		}
		seen[v] = true
	}
	return nil
}

func (o *Options) progressf(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format, args...)
	}
}

func runMedium(ctx context.Context, o *Options, e *env, mr *MediumReport) error {
	for _, g := range o.Goroutines {
		for _, k := range o.Keys {
			cell := &Cell{Goroutines: g, Keys: k}
			mr.Cells = append(mr.Cells, cell)
			start := time.Now()
			if err := runCell(ctx, o, e, mr, cell, len(mr.Cells)); err != nil {
				// The report holds the cells that finished: this one has
				// neither statistics nor a check.
				mr.Cells = mr.Cells[:len(mr.Cells)-1]
				return fmt.Errorf("%s, %s: %w", mr.Name, cell, err)
			}
			o.progressf("%s, %s: %v\n", mr.Name, cell, time.Since(start).Round(time.Millisecond))
		}
	}
	return nil
}

// contenderRun is one contender's state during a cell.
type contenderRun struct {
	taker  Taker
	keys   []string
	res    *Result
	hist   histogram
	grants [][]grant
	// most is the most grants one goroutine made in a slice of the cell
	// so far, by which the next slice sizes its goroutines' buffers.
	most int
}

func runCell(ctx context.Context, o *Options, e *env, mr *MediumReport, cell *Cell, index int) error {
	runs := make([]*contenderRun, len(mr.Contenders))
	e.keys = cell.Keys
	defer func() {
		for _, r := range runs {
			if r == nil {
				continue
			}
			if c, ok := r.taker.(io.Closer); ok {
				c.Close()
			}
		}
	}()
	for i := range mr.Contenders {
		c := &mr.Contenders[i]
		t, err := c.New(ctx, e, o.Limit)
		if err != nil {
			return fmt.Errorf("setting up %s: %w", c.Name, err)
		}
		keys := make([]string, cell.Keys)
		for k := range keys {
			keys[k] = e.prefix + c.Code + "-" + strconv.Itoa(index) + "-" + strconv.Itoa(k)
		}
		res := &Result{Contender: c, Medium: mr.Name, Cell: cell}
		cell.Results = append(cell.Results, res)
		runs[i] = &contenderRun{taker: t, keys: keys, res: res}
	}
	base := time.Now()
	for round := 0; round <= o.Rounds; round++ {
		for n := range runs {
			if err := ctx.Err(); err != nil {
				return err
			}
			// Rotate who goes first, so that each goes first in turn.
			// The cycle is the same in every round: a contender follows
			// the one before it in every round but the one it opens, so
			// what a slice leaves behind (garbage to collect, a server's
			// or a disk's backlog) falls mostly on the same next one.
			// Each slice's keys are drawn from a stream of its own: the
			// contenders' streams differ, alike in distribution.
			r := runs[(n+round)%len(runs)]
			seed := uint64(index)<<40 ^ uint64(round)<<20 ^ uint64(n)
			runSlice(ctx, r, cell.Goroutines, o.Slice, base, round > 0, seed)
		}
	}
	for _, r := range runs {
		res := r.res
		res.P50, res.P99 = r.hist.quantile(1, 2), r.hist.quantile(99, 100)
		sorted := slices.Sorted(slices.Values(res.PerRound))
		res.Min, res.Max = sorted[0], sorted[len(sorted)-1]
		res.Median = median(sorted)
		n := 0
		for _, g := range r.grants {
			n += len(g)
		}
		all := make([]grant, 0, n)
		for i, g := range r.grants {
			all = append(all, g...)
			r.grants[i] = nil
		}
		res.Check = check(res.Contender.Bound(o.Limit), all, r.keys)
	}
	return nil
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// worker is one goroutine's share of a slice. The pads keep what one
// goroutine writes on every call off the cache lines of its neighbours in
// the slice of workers (the counters of one, the grants of the one
// before), so that workers on different cores do not pass lines back and
// forth, a cost that would fall on the contenders granted most.
type worker struct {
	_                      [64]byte
	calls, granted, errors int64
	err                    error
	last                   time.Duration
	hist                   histogram
	grants                 []grant   // the buffer being filled
	full                   [][]grant // the buffers filled before it
	_                      [64]byte
}

// minGrants is the least room for grants a worker starts a slice with.
const minGrants = 256

// keep records g. The buffer was made before the slice's clock started,
// with room for a quarter more grants than the most a goroutine made in
// a slice before: a grant costs a store, for every contender alike. Only
// a slice that grants more than that (the warm-up round's first) makes
// another buffer, twice as large, and copies nothing.
func (w *worker) keep(g grant) {
	if len(w.grants) == cap(w.grants) {
		w.full = append(w.full, w.grants)
		w.grants = make([]grant, 0, 2*cap(w.grants))
	}
	w.grants = append(w.grants, g)
}

// runSlice runs r from goroutines goroutines for about d: each goroutine
// calls until a call ends after the deadline. A counted slice adds its
// decisions per second (the calls answered without an error over the time
// from the start to the last answer: a call that failed decided nothing)
// and their latencies to r's result; every slice's grants are kept for
// the check.
func runSlice(ctx context.Context, r *contenderRun, goroutines int, d time.Duration, base time.Time, counted bool, seed uint64) {
	workers := make([]worker, goroutines)
	room := max(minGrants, r.most+r.most/4)
	for i := range workers {
		workers[i].grants = make([]grant, 0, room)
	}
	start := time.Since(base)
	deadline := start + d
	done := ctx.Done()
	var wg sync.WaitGroup
	for g := range workers {
		w := &workers[g]
		wg.Go(func() {
			rng := streamStart(seed, g)
			keys := r.keys
			n := uint64(len(keys))
			for i := 0; ; i++ {
				k := 0
				if n > 1 {
					rng += golden
					k = int(splitmix(rng) % n)
				}
				t0 := time.Since(base)
				ok, err := r.taker.Take(ctx, keys[k])
				t1 := time.Since(base)
				w.calls++
				if counted && err == nil {
					w.hist.add(uint64(t1 - t0))
				}
				switch {
				case err != nil:
					w.errors++
					if w.err == nil {
						w.err = err
					}
				case ok:
					w.granted++
					// Latency in whole microseconds, rounded up: the
					// answer is never placed earlier than it came.
					lat := min((t1-t0+time.Microsecond-1)/time.Microsecond, math.MaxUint32)
					w.keep(grant{from: int64(t0), key: int32(k), lat: uint32(lat)})
				}
				w.last = t1
				if t1 >= deadline {
					return
				}
				if i&63 == 63 {
					select {
					case <-done:
						return
					default:
					}
				}
			}
		})
	}
	wg.Wait()
	var last time.Duration
	var decisions int64
	res := r.res
	for i := range workers {
		w := &workers[i]
		last = max(last, w.last)
		r.grants = append(append(r.grants, w.full...), w.grants)
		r.most = max(r.most, int(w.granted))
		if !counted {
			continue
		}
		if w.err != nil && res.Err == nil {
			res.Err = w.err
		}
		decisions += w.calls - w.errors
		res.Calls += w.calls
		res.Granted += w.granted
		res.Errors += w.errors
		r.hist.merge(&w.hist)
	}
	if counted {
		res.PerRound = append(res.PerRound, float64(decisions)/(last-start).Seconds())
	}
}

// golden is SplitMix64's step, 2⁶⁴ divided by the golden ratio.
const golden = 0x9e3779b97f4a7c15

// streamStart is where goroutine g of a slice seeded with seed starts its
// SplitMix64 stream of keys. The start is itself drawn by splitmix, so
// that the goroutines' streams begin far apart on the one sequence that
// every stream walks: were two of them a few steps apart, one goroutine
// would call the keys that another called a few calls before it.
func streamStart(seed uint64, g int) uint64 {
	return splitmix(seed ^ uint64(g+1)*golden)
}

// splitmix is the output function of SplitMix64, whose state steps by
// golden.
func splitmix(x uint64) uint64 {
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// loopback checks that addr (host:port) names this machine: the run
// writes and deletes keys and tables, and only on local servers.
func loopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s is not a loopback address: the comparison writes and deletes keys and tables, so it only talks to servers on this machine", addr)
	}
	return nil
}
