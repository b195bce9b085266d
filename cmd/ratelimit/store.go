package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/pgstore"
	"github.com/ratelimit-go/ratelimit/store/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

func init() {
	// The pool's own log lines would repeat the error the command reports.
	redis.SetLogger(quietLogger{})
}

// quietLogger drops go-redis's log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// storeFlags select a store by URL, and the secret of its keys' hashes,
// and bound the time to wait for it.
type storeFlags struct {
	url, prefix, table, bucket string
	keySecret                  string
	takesSecret                bool // --key-secret is registered: the command reads the secret
	timeout                    time.Duration
	serverTime                 bool           // the store's WithServerTime
	phaseSeed                  uint64         // the Limiter's WithPhaseSeed
	fs                         *pflag.FlagSet // to tell the flags given
}

// keySecretEnv names the environment variable that gives the secret when
// --key-secret does not, so that it stays out of the command line (and of
// ps and the shell's history).
const keySecretEnv = "RATELIMIT_KEY_SECRET"

func (f *storeFlags) register(fs *pflag.FlagSet) {
	f.registerURL(fs)
	f.registerKeySecret(fs)
	f.timeout = defaultTimeout
	fs.Var((*exactDuration)(&f.timeout), "timeout", "the longest to wait for the store: inspect, limit and reset end within it, bench's calls within it of the run's end")
}

// registerStore registers the flags of the store without --key-secret:
// for the commands that settle tokens, which hold the key as the store
// knows it.
func (f *storeFlags) registerStore(fs *pflag.FlagSet) {
	f.registerURL(fs)
	f.timeout = defaultTimeout
	fs.Var((*exactDuration)(&f.timeout), "timeout", "the longest to wait for the store: to open it, and for each token's settlement")
}

// registerURL registers --store and the flags that name the store's part
// of it.
func (f *storeFlags) registerURL(fs *pflag.FlagSet) {
	f.fs = fs
	fs.StringVar(&f.url, "store", "", "the store: bolt://PATH, redis://HOST:PORT/DB, redis+cluster://[USER:PASSWORD@]H1:P1,H2:P2, postgres://... or 'host=... dbname=...', or mem:")
	fs.StringVar(&f.prefix, "prefix", redisstore.DefaultPrefix, "Redis: the prefix of the store's keys")
	fs.StringVar(&f.table, "table", pgstore.DefaultTable, "PostgreSQL: the store's table")
	fs.StringVar(&f.bucket, "bucket", boltstore.DefaultBucket, "bbolt: the store's bucket")
	fs.BoolVar(&f.serverTime, "server-time", false, "Redis, PostgreSQL: judge at the server's time, as the application's store given WithServerTime")
	fs.Var((*decimalUint64)(&f.phaseSeed), "phase-seed", "the application's ratelimit.WithPhaseSeed, in decimal: where the windows of a fixed window without a start fall for each key")
}

// registerKeySecret registers --key-secret.
func (f *storeFlags) registerKeySecret(fs *pflag.FlagSet) {
	f.fs, f.takesSecret = fs, true
	fs.StringVar(&f.keySecret, "key-secret", "", "the secret of the application's ratelimit.WithKeyHash, as text, when its keys are hashed (default: $"+keySecretEnv+")")
}

// defaultTimeout is --timeout's default: far more than any store takes to
// answer a command, short enough that a stalled one is given up on.
var defaultTimeout = 30 * time.Second

// errTimeout is the cause of the end of a command's context at --timeout.
var errTimeout = errors.New("--timeout")

// check refuses, before connecting, a --timeout that is not above 0, a
// --store that names no store it can open (parse), a flag of another kind
// of store than --store's (--prefix, --table, --bucket), which that store
// would ignore, and a --table or --bucket that is no name.
func (f *storeFlags) check() error {
	if f.timeout <= 0 {
		return usagef("--timeout %v: give a time above 0, such as 30s", f.timeout)
	}
	if err := f.checkKeySecret(); err != nil {
		return err
	}
	if _, err := f.parse(); err != nil {
		return err
	}
	scheme := storeScheme(f.url)
	if scheme == "bolt" && f.bucket == "" {
		return usagef("--bucket \"\": give the bucket's name (the application's boltstore.WithBucket), or leave --bucket out for the default, %q", boltstore.DefaultBucket)
	}
	if scheme == "postgres" || scheme == "postgresql" {
		if _, err := pgstore.Schema(f.table); err != nil {
			return usageError{fmt.Errorf("--table: %w", err)}
		}
	}
	for _, sf := range storeOnlyFlags {
		if f.fs.Changed(sf.flag) && !slices.Contains(sf.schemes, scheme) && slices.Contains(knownSchemes, scheme) {
			shown, _ := hidePassword(f.url)
			return usagef("--%s is of %s, and --store %q is not one: leave --%s out", sf.flag, sf.of, shown, sf.flag)
		}
	}
	return nil
}

// storeOnlyFlags are the flags of one kind of store, and the schemes of
// --store of that kind.
var storeOnlyFlags = []struct {
	flag, of string
	schemes  []string
}{
	{"prefix", "a Redis store", []string{"redis", "rediss", "redis+cluster"}},
	{"table", "a PostgreSQL store", []string{"postgres", "postgresql"}},
	{"bucket", "a bbolt store", []string{"bolt"}},
}

// knownSchemes are the schemes of the stores that --store takes.
var knownSchemes = []string{"mem", "bolt", "redis", "rediss", "redis+cluster", "postgres", "postgresql"}

// storeScheme returns the scheme of the store u: what precedes its first
// colon, or postgres for a connection string of keywords.
func storeScheme(u string) string {
	if keywords.MatchString(u) {
		return "postgres" // a connection string of keywords, which pgx reads as it does a URL
	}
	scheme, _, _ := strings.Cut(u, ":")
	return scheme
}

// timedOut returns err, an error of a command whose context is ctx, told
// as the store's silence when --timeout ended ctx: a server that accepts a
// connection and answers its handshake, then never answers a query, or a
// store that is far slower than it should be. Clients report it in their
// own words (a timeout, a context deadline, a closed connection).
func (f *storeFlags) timedOut(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	scheme := storeScheme(f.url)
	local := scheme == "bolt" || scheme == "mem"
	// A store's answer that ctx's end did not cause (a file or a key that
	// is not there) is not told as its silence, though ctx ended since.
	// Clients report ctx's end in words of their own; a local store, as
	// ctx's error.
	caused := !errors.Is(err, errNotFound) && (!local || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errTimeout))
	if caused && errors.Is(causeAfter(ctx, err), errTimeout) {
		err = fmt.Errorf("no answer from the store within --timeout %v: %w", f.timeout, err)
	}
	if local {
		return noServerError{err}
	}
	return err
}

// noServerError is an error of a store without a server (a bbolt file,
// mem:), which isConnError never takes for a server's: a call that ran
// out of --timeout ends with a context's deadline, which reads as a
// network timeout, and the error asked whether the server was up.
type noServerError struct{ err error }

func (e noServerError) Error() string { return e.err.Error() }
func (e noServerError) Unwrap() error { return e.err }

// causeAfter returns the cause of ctx's end, once ctx has ended, err
// being the error of a call made with ctx. A store may give up at ctx's
// deadline by a timer of its own (a batch's context, a connection's read
// deadline) a moment before ctx's own timer has ended ctx: a deadline
// error once that deadline has passed waits for ctx to end, which it does
// at once, so that the cause is ctx's.
func causeAfter(ctx context.Context, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			<-ctx.Done()
		}
	}
	return context.Cause(ctx)
}

// checkKeySecret refuses an empty secret, given by --key-secret "" or by
// $RATELIMIT_KEY_SECRET set and empty, as $RATELIMIT_TOKEN_KEY set and
// empty is refused: ratelimit.WithKeyHash refuses an empty secret, as it
// does a short one. Either meant no secret (--key-secret "" the
// environment's), so that a secret lost on its way (--key-secret
// "$SECRET" with $SECRET unset, a secret store that gave nothing) read
// keys in the clear, and the command saw other records than the
// application's.
func (f *storeFlags) checkKeySecret() error {
	if !f.takesSecret {
		return nil // a command that takes no secret
	}
	if f.fs.Changed("key-secret") {
		if f.keySecret != "" {
			return nil
		}
		return usagef("--key-secret \"\": the secret is empty, and ratelimit.WithKeyHash refuses a secret of fewer than %d bytes: "+
			"give the application's secret, or leave --key-secret out where the application does not hash keys (with $%s unset)",
			ratelimit.MinKeySecret, keySecretEnv)
	}
	if v, ok := os.LookupEnv(keySecretEnv); ok && v == "" {
		return usagef("$%s is set and empty, and ratelimit.WithKeyHash refuses a secret of fewer than %d bytes: "+
			"give it the application's secret, or unset it where the application does not hash keys", keySecretEnv, ratelimit.MinKeySecret)
	}
	return nil
}

// secret returns the secret of the keys' hashes, given by --key-secret or
// by the environment; "" for none.
func (f *storeFlags) secret() string {
	if f.keySecret != "" {
		return f.keySecret
	}
	return os.Getenv(keySecretEnv)
}

// options returns the Limiter options the flags ask for: WithPhaseSeed,
// and WithKeyHash when a secret is given, by --key-secret or by the
// environment.
func (f *storeFlags) options() []ratelimit.Option {
	opts := []ratelimit.Option{ratelimit.WithPhaseSeed(f.phaseSeed)}
	if secret := f.secret(); secret != "" {
		opts = append(opts, ratelimit.WithKeyHash([]byte(secret)))
	}
	return opts
}

// noClock returns the usage error of --server-time, if it is given, for
// the store of --store shown, which has no clock of its own; nil without
// --server-time.
func (f *storeFlags) noClock(shown string) error {
	if !f.serverTime {
		return nil
	}
	return usagef("--server-time: the store of %s has no clock of its own: the application's Redis or PostgreSQL store takes WithServerTime; leave --server-time out", shown)
}

// unusedPhaseSeed returns the usage error of --phase-seed, if it is
// given, when no limit of limits, of the limits file file ("" for an
// inline limit), is a fixed window without a start: the seed moves the
// windows of such a limit, at a phase of each key, and nothing else. A
// token bucket has no windows, and a start aligns the windows of every
// key to it. nil without --phase-seed, or when a limit uses it.
func (f *storeFlags) unusedPhaseSeed(limits ratelimit.Limits, file string) error {
	if !f.fs.Changed("phase-seed") {
		return nil
	}
	var name string
	for n, cfg := range limits {
		if cfg.Kind == ratelimit.FixedWindow && cfg.Start.IsZero() {
			return nil
		}
		name = n
	}
	const moves = "--phase-seed moves the windows of a fixed window without a start, which fall at a phase of each key"
	switch {
	case len(limits) != 1:
		return usagef("%s, and no limit of %s is one: it would change nothing; leave --phase-seed out", moves, file)
	case limits[name].Kind != ratelimit.FixedWindow:
		return usagef("%s, and limit %s is a token bucket, which has no windows: it would change nothing; leave --phase-seed out", moves, nameText(name))
	}
	return usagef("%s, and the windows of limit %s are aligned to its start: it would change nothing; leave --phase-seed out", moves, nameText(name))
}

// maxRawKey is the longest key the Limiter gives a store as it is, without
// WithKeyHash (docs/api.md#keys).
const maxRawKey = 256

// lookAlike reports whether key, of maxRawKey bytes or fewer, is one
// the Limiter gives the store as its digest form all the same: one of the
// digest form's length that begins with its prefix, which the store
// keeps for digests (docs/api.md#keys).
func lookAlike(key string) bool {
	return len(key) == len("sha256:")+43 && strings.HasPrefix(key, "sha256:")
}

// storeKey returns the key under which the store knows key, as the
// Limiter gives it (docs/api.md#keys), and what it is of key: its keyed
// hash when a secret is given (WithKeyHash: HMAC-SHA256 under the secret,
// cut to 16 bytes, in unpadded base64url), its digest when it is longer
// than maxRawKey ("sha256:" and its SHA-256 in unpadded base64url) or
// spelt as a digest form (lookAlike), and key itself otherwise ("").
func (f *storeFlags) storeKey(key string) (stored, form string) {
	if secret := f.secret(); secret != "" {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(key))
		return base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:16]), "keyed hash"
	}
	if len(key) <= maxRawKey && !lookAlike(key) {
		return key, ""
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:]), "digest"
}

// connectTimeout bounds the connection to a PostgreSQL server whose
// connection string gives no connect_timeout, as go-redis bounds its own
// (a dial of 5 s, then 3 s for each answer).
var connectTimeout = 10 * time.Second

// access says whether opening a store may create what it lacks.
type access int

const (
	// mayCreate lets the store create its file, bucket or table, as the
	// application's store would: for the commands that write.
	mayCreate access = iota
	// mustExist refuses a bbolt file or bucket, a PostgreSQL table or a
	// Redis prefix that is not there: a typo in --store, --bucket, --table
	// or --prefix would otherwise look at, or clear, an empty store.
	mustExist
)

// storeURL is --store as read before connecting: what open connects to.
type storeURL struct {
	scheme string
	// shown is --store with its password hidden, for the usage errors
	// that quote it; hide hides it in a text that quotes it, such as a
	// client's error.
	shown   string
	hide    func(string) string
	bolt    string                // bolt: the file's path
	redis   *redis.Options        // redis, rediss
	cluster *redis.ClusterOptions // redis+cluster
	pg      *pgxpool.Config       // postgres, postgresql, or a connection string of keywords
}

// parse reads --store, and refuses as a usage error what names no store
// it can open: none, an unknown kind, a URL the client cannot read, and
// --server-time for a store without a clock of its own. It connects to
// nothing, so that the commands refuse such a --store before they do
// anything (the token commands before they read a token).
func (f *storeFlags) parse() (storeURL, error) {
	u := f.url
	// The usage errors below quote --store, and the clients' errors about
	// it may too: with its password hidden, and its password hidden in
	// theirs.
	shown, hide := hidePassword(u)
	s := storeURL{shown: shown, hide: hide}
	scheme, rest, _ := strings.Cut(u, ":")
	if keywords.MatchString(u) {
		scheme = storeScheme(u)
	} else if _, _, malformed := passwordIn(u); malformed && storeSchemes[scheme] && scheme != "redis+cluster" {
		// The clients would read the host and port from the password,
		// and quote its parts in their errors.
		return s, usagef("--store %q: the password holds a /, ? or # as it is, which ends a URL's host: write it escaped (%%2F, %%3F, %%23)", shown)
	}
	s.scheme = scheme
	switch scheme {
	case "":
		return s, usagef("give a store: --store bolt://PATH, redis://HOST:PORT, postgres://... (or 'host=... dbname=...') or mem:")
	case "mem":
		if rest != "" {
			// It was the empty store all the same: --store mem:limits.db
			// reset nothing, and said it had.
			return s, usagef("--store %q: mem: is an empty in-memory store, and names nothing after its colon: write mem: alone, or bolt://PATH for a file", shown)
		}
		return s, f.noClock(shown)
	case "bolt":
		s.bolt = strings.TrimPrefix(rest, "//")
		if s.bolt == "" {
			return s, usagef("--store %q: write bolt://PATH, e.g. bolt://limits.db or bolt:///var/lib/app/limits.db", shown)
		}
		return s, f.noClock(shown)
	case "redis", "rediss":
		if !strings.HasPrefix(rest, "//") {
			// go-redis reads the address after the slashes, and without
			// them dials localhost:6379, whatever follows.
			return s, usagef("--store %q: write %s://HOST:PORT/DB, with the two slashes", shown, scheme)
		}
		opt, err := redis.ParseURL(u)
		if err != nil {
			return s, clientRefused(u, shown, hide(err.Error()))
		}
		// go-redis takes any digits for a port, and the dial failed with
		// the hint to check that the server is up.
		if _, port, err := net.SplitHostPort(opt.Addr); err == nil && !validPort(port) {
			return s, usagef("--store %q: port %q is not a number from 1 to 65535", shown, port)
		}
		s.redis = opt
	case "redis+cluster":
		opt, err := parseClusterURL(rest)
		if err != nil {
			return s, usagef("--store %q: %s: write redis+cluster://HOST:PORT,HOST:PORT, with USER:PASSWORD@ before the nodes if the cluster asks for them", shown, hide(err.Error()))
		}
		s.cluster = opt
	case "postgres", "postgresql":
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			return s, clientRefused(u, shown, hide(pgParseError(err)))
		}
		s.pg = cfg
	default:
		return s, usagef("--store %q: unknown kind of store %q: use bolt, redis, redis+cluster, postgres (or a connection string of keywords, host=... dbname=...) or mem", shown, hide(scheme))
	}
	return s, nil
}

// open opens the store; close releases what it opened.
func (f *storeFlags) open(ctx context.Context, acc access) (store ratelimit.Store, close func(), err error) {
	s, err := f.parse()
	if err != nil {
		return nil, nil, err
	}
	switch s.scheme {
	case "mem":
		m, err := memstore.New()
		if err != nil {
			return nil, nil, err
		}
		return m, func() {}, nil
	case "bolt":
		if err := boltCheck(ctx, s.bolt, f.bucket, acc); err != nil {
			return nil, nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("bbolt file %s: not opened: %w", s.bolt, context.Cause(ctx))
		}
		// OpenContext, not Open: Open waited out its timeout for a file
		// another process holds, whatever ended the command's context
		// (Ctrl-C in bench).
		b, err := boltstore.OpenContext(ctx, s.bolt, boltstore.WithBucket(f.bucket), boltstore.WithTimeout(boltWait(ctx)))
		switch {
		case errors.Is(err, berrors.ErrTimeout) || err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
			return nil, nil, boltHeld(ctx, s.bolt)
		case err != nil:
			return nil, nil, err
		}
		return b, func() { b.Close() }, nil
	case "redis", "rediss":
		s.redis.ContextTimeoutEnabled = true // --timeout ends a read that waits
		return f.openRedis(ctx, redis.NewClient(s.redis), "redis at "+s.redis.Addr, acc)
	case "redis+cluster":
		s.cluster.ContextTimeoutEnabled = true
		return f.openRedis(ctx, redis.NewClusterClient(s.cluster), "redis cluster at "+strings.Join(s.cluster.Addrs, ","), acc)
	}
	// PostgreSQL.
	var opts []pgstore.Option
	if f.serverTime {
		opts = append(opts, pgstore.WithServerTime())
	}
	if acc == mustExist {
		opts = append(opts, pgstore.WithoutDDL())
	}
	// Without connect_timeout, pgx waits as long as the server takes to
	// answer: for ever, for one that accepts and never speaks.
	if s.pg.ConnConfig.ConnectTimeout == 0 {
		s.pg.ConnConfig.ConnectTimeout = connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, s.pg)
	if err != nil {
		return nil, nil, usagef("--store %q: %s", s.shown, s.hide(pgParseError(err)))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	if acc == mustExist {
		if err := pgExists(ctx, pool, f.table); err != nil {
			pool.Close()
			return nil, nil, err
		}
	}
	// New refuses a relation of the table's name, or a function of the
	// names it gives its functions, that is not the store's (a view, the
	// table or a function of another program), with or without
	// WithoutDDL, and leaves it as it is: the command applies the store's
	// own rules.
	p, err := pgstore.New(ctx, pool, append(opts, pgstore.WithTable(f.table))...)
	if errors.Is(err, pgstore.ErrNotStoreTable) || errors.Is(err, pgstore.ErrNotStoreFunction) {
		err = fmt.Errorf("postgres: check --table (the application's pgstore.WithTable) and the database in --store: %w", err)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return p, pool.Close, nil
}

// keywords matches a PostgreSQL connection string of keywords, as libpq
// and pgx read one (host=127.0.0.1 port=5432 dbname=test): a keyword and
// =, where every other store starts with a scheme and a colon.
var keywords = regexp.MustCompile(`^[ \t\n\r\v\f]*[A-Za-z_][A-Za-z0-9_]*[ \t\n\r\v\f]*=`)

// pgParseError returns the text of err, pgx's error about the connection
// string it could not read, without the string, which the command quotes
// itself with its password hidden: pgx quotes it hiding the password of
// password=x and password='x', not of password = x.
func pgParseError(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return err.Error()
	}
	// "cannot parse `STRING`: what is wrong (the cause)"; what is wrong
	// holds no backquote.
	whole := pe.Error()
	what := "pgx cannot read it"
	if i := strings.LastIndex(whole, "`: "); i >= 0 {
		what = whole[i+len("`: "):]
	}
	return strings.Replace(err.Error(), whole, what, 1)
}

// hidePassword returns the store URL u with its password, if it has one
// (SCHEME://USER:PASSWORD@..., or a parameter password=... or
// sslpassword=..., of a URL or of a connection string of keywords),
// written as xxxxx, and a function that does the same to a text that
// quotes u, such as a client's error: u whole, the password after its
// user's colon and before its @, the password alone and as the client
// reads it unescaped, and an escape of it that url.Parse cannot read
// (invalid URL escape "%zz").
func hidePassword(u string) (string, func(string) string) {
	var (
		passwords []string
		contexts  []string // where a password of any length is hidden: pairs of old, new
	)
	shown := u
	if keywords.MatchString(u) {
		shown, passwords = hideKeywords(u)
	} else if !strings.HasPrefix(u, "bolt:") { // a bolt path holds anything
		if i, j, _ := passwordIn(u); j > i {
			shown = u[:i] + "xxxxx" + u[j:]
			passwords = append(passwords, u[i:j])
			contexts = append(contexts, ":"+u[i:j]+"@", ":xxxxx@")
		}
	}
	if !strings.HasPrefix(u, "bolt:") && !keywords.MatchString(u) {
		shown = passwordParam.ReplaceAllStringFunc(shown, func(p string) string {
			m := passwordParam.FindStringSubmatch(p)
			passwords = append(passwords, strings.Trim(m[3], "'"))
			return m[1] + m[2] + "=xxxxx"
		})
	}
	var forms []string
	for _, p := range passwords {
		// url.Parse quotes the first escape it cannot read, %zz.
		for rest := p; strings.Contains(rest, "%"); {
			_, rest, _ = strings.Cut(rest, "%")
			contexts = append(contexts, strconv.Quote("%"+rest[:min(2, len(rest))]), `"%xx"`)
		}
		// A password of a few characters would be found all over a text
		// (in a port, an address), and hides nothing worth hiding: it is
		// hidden in u and after its user's colon alone.
		if len(p) < 4 {
			continue
		}
		forms = append(forms, p)
		if clear, err := url.PathUnescape(p); err == nil && clear != p {
			forms = append(forms, clear)
		}
		if clear, err := url.QueryUnescape(p); err == nil && clear != p {
			forms = append(forms, clear)
		}
	}
	if shown != u {
		contexts = append([]string{u, shown}, contexts...)
	}
	hideContexts := strings.NewReplacer(contexts...)
	return shown, func(s string) string {
		s = hideContexts.Replace(s)
		for _, p := range forms {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
		return s
	}
}

// clientRefused is the usage error of u, a store URL that the client
// refused with the error why (its passwords hidden), shown as shown. A URL
// of the form that reads both ways (userinfoIn) is read as the clients
// read it, a port and a query holding the @, as RFC 3986 reads it; when
// the client refuses that query, its error quoted what may be a password
// written without its ? escaped (redis://app:1234?x=y@host: "unexpected
// option: x"), and the URL whole: neither is shown then, and the error says
// how to write either reading.
func clientRefused(u, shown, why string) error {
	i, j, _, ambiguous := userinfoIn(u)
	if !ambiguous {
		return usagef("--store %q: %s", shown, why)
	}
	return usagef("--store %q: the text from the user's colon to the @ (xxxxx here) reads as a port and a query (?...) holding the @, and the client refused that query: "+
		"if it is a password, write its ? or # escaped (%%3F, %%23); if the @ is in a query's value, write it escaped (%%40)", u[:i]+"xxxxx"+u[j:])
}

// passwordIn returns where the password of u, a store URL, is, if it has
// one: u[i:j], empty for none. It finds one that a URL does not hold as
// written too: one that holds a /, ? or # not escaped, which ends a URL's
// host, so that clients read it as a port, a path or a query (malformed
// is then true); one of a URL without its slashes (redis:user:pw@host);
// and, for a scheme that is not a store's, the userinfo whole, which may
// be a password without its user and scheme (pw@host, user:pw@host).
func passwordIn(u string) (i, j int, malformed bool) {
	i, j, malformed, ambiguous := userinfoIn(u)
	if ambiguous {
		return 0, 0, false
	}
	return i, j, malformed
}

// userinfoIn is passwordIn, and reports besides whether u is of the form
// that reads both ways, USER:DIGITS?KEY=VALUE@...: as a port and a query
// holding the @, as the clients read it (and as passwordIn reads it, with
// no password), or as a password holding a ? or # not escaped; u[i:j] is
// then that password, if it is one.
func userinfoIn(u string) (i, j int, malformed, ambiguous bool) {
	scheme, rest, ok := strings.Cut(u, ":")
	if !ok {
		return 0, 0, false, false
	}
	start := len(u) - len(strings.TrimLeft(rest, "/"))
	after := u[start:] // after the scheme and its slashes
	at := strings.LastIndex(after, "@")
	if at < 0 {
		return 0, 0, false, false
	}
	userinfo := after[:at]
	user, password, ok := strings.Cut(userinfo, ":")
	if !strings.ContainsAny(userinfo, "/?#") { // the @ is the host's
		switch {
		case ok && password != "":
			return start + len(user) + 1, start + at, false, false
		case !ok && !storeSchemes[scheme]:
			return start, start + at, false, false
		}
		return 0, 0, false, false
	}
	// A / ? or # before the @: an @ in a path or a query, or a password
	// that holds one of them, written after a user and a colon. After a
	// port (digits), an @ in the value of a query's key=value is the
	// query's (?user=app@tenant); one in a path, or after a ? or # that
	// no key=value follows (1234?abc@), a password's: a path names a
	// database, which redis:// numbers, and a query is of key=value.
	if !ok || strings.ContainsAny(user, "/?#[") {
		return 0, 0, false, false
	}
	end := strings.IndexAny(password, "/?#")
	if q := strings.IndexAny(password, "?#"); allDigits(password[:end]) && q >= 0 && queryValue.MatchString(password[q+1:]) {
		return start + len(user) + 1, start + at, false, true
	}
	return start + len(user) + 1, start + at, true, false
}

// queryValue matches the text of a query, or of a fragment, up to an @ in
// the value of its last key=value.
var queryValue = regexp.MustCompile(`(^|&)[A-Za-z_][A-Za-z0-9_.-]*=[^&=]+$`)

// storeSchemes are the schemes of the stores that --store takes as a URL.
var storeSchemes = map[string]bool{"redis": true, "rediss": true, "redis+cluster": true, "postgres": true, "postgresql": true}

// passwordParam matches a parameter password=... or sslpassword=... of a
// URL's query, or of a text that looks like one (password=x,
// password='x y'): what precedes it, its name, and its value.
var passwordParam = regexp.MustCompile(`(^|[?&\s])((?:ssl)?password)=('[^']*'|[^&#\s]*)`)

// spaces are the characters that separate the settings of a connection
// string of keywords, as pgx reads it.
const spaces = " \t\n\r\v\f"

// hideKeywords returns s, a connection string of keywords, with the
// values of its settings password and sslpassword written as xxxxx, and
// those values, as written and as pgx reads them. It reads s as pgx does:
// a setting is a keyword, =, and a value, with spaces around the = or
// none; a value in quotes holds spaces, and a backslash takes the next
// character as it is (\' and \\ are ' and \). A value left open, by an
// unterminated quote or a backslash at the end, runs to the end.
func hideKeywords(s string) (string, []string) {
	var (
		shown     strings.Builder
		passwords []string
	)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			shown.WriteString(s)
			break
		}
		key := strings.Trim(s[:eq], spaces)
		rest := strings.TrimLeft(s[eq+1:], spaces)
		shown.WriteString(s[:len(s)-len(rest)])
		// The value's end: its closing quote, or the first space.
		end, quoted := 0, strings.HasPrefix(rest, "'")
		if quoted {
			end = 1
		}
		for end < len(rest) {
			c := rest[end]
			if quoted && c == '\'' {
				end++
				break
			}
			if !quoted && strings.IndexByte(spaces, c) >= 0 {
				break
			}
			if c == '\\' {
				end++
			}
			end++
		}
		end = min(end, len(rest))
		value := rest[:end]
		s = rest[end:]
		if key != "password" && key != "sslpassword" {
			shown.WriteString(value)
			continue
		}
		shown.WriteString("xxxxx")
		if quoted {
			value = strings.TrimSuffix(value[1:], "'")
		}
		passwords = append(passwords, value, strings.NewReplacer(`\\`, `\`, `\'`, `'`).Replace(value))
	}
	return shown.String(), passwords
}

// parseClusterURL reads what follows "redis+cluster:" in --store:
// //[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...][/0]. Without a node, go-redis
// would dial localhost:6379; a path or credentials were taken for a node's
// address ("unknown port", "too many colons").
func parseClusterURL(rest string) (*redis.ClusterOptions, error) {
	rest, ok := strings.CutPrefix(rest, "//")
	if !ok {
		return nil, errors.New("the nodes follow //")
	}
	opt := &redis.ClusterOptions{}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		user, password, _ := strings.Cut(rest[:i], ":")
		var err1, err2 error
		opt.Username, err1 = url.PathUnescape(user)
		opt.Password, err2 = url.PathUnescape(password)
		if err := errors.Join(err1, err2); err != nil {
			return nil, errors.New("the user or password is not escaped as in a URL")
		}
		rest = rest[i+1:]
	}
	nodes, path, _ := strings.Cut(rest, "/")
	switch {
	case path != "" && path != "0":
		return nil, fmt.Errorf("a cluster has one database, 0, not %q", path)
	case strings.ContainsAny(nodes, "?#"):
		return nil, errors.New("options (?...) are not read")
	}
	for addr := range strings.SplitSeq(nodes, ",") {
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			return nil, fmt.Errorf("node %q is not HOST:PORT", addr)
		} else if !validPort(port) {
			return nil, fmt.Errorf("node %q: port %q is not a number from 1 to 65535", addr, port)
		}
		opt.Addrs = append(opt.Addrs, addr)
	}
	return opt, nil
}

// validPort reports whether port is a TCP port: a number in decimal from
// 1 to 65535.
func validPort(port string) bool {
	n, err := strconv.ParseUint(port, 10, 16)
	return err == nil && n > 0
}

// openRedis makes the store on c, a client of the server or Cluster
// described by where, once it answers (and, for acc mustExist, once it
// holds a key of the prefix); on an error it closes c.
func (f *storeFlags) openRedis(ctx context.Context, c redis.UniversalClient, where string, acc access) (ratelimit.Store, func(), error) {
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("%s: %w", where, err)
	}
	// A node of a Cluster, given as redis://, holds a part of the keys and
	// answers MOVED for the others. (A server whose INFO is turned off is
	// taken as it is.)
	if node, ok := c.(*redis.Client); ok {
		if info, err := node.Info(ctx, "cluster").Result(); err == nil && strings.Contains(info, "cluster_enabled:1") {
			c.Close()
			return nil, nil, usagef("%s is a node of a Redis Cluster, which holds some of the keys: write --store redis+cluster://%s (any of its nodes)", where, node.Options().Addr)
		}
	}
	if acc == mustExist {
		if err := redisExists(ctx, c, f.prefix, where); err != nil {
			c.Close()
			return nil, nil, err
		}
	}
	// No background check of the server's settings (redisstore.WithLogger):
	// a command is over in a moment, and its client's Close would race the
	// check's calls still in flight.
	opts := []redisstore.Option{redisstore.WithPrefix(f.prefix), redisstore.WithLogger(nil)}
	if f.serverTime {
		opts = append(opts, redisstore.WithServerTime())
	}
	rs, err := redisstore.New(c, opts...)
	if err != nil {
		c.Close()
		return nil, nil, usagef("--prefix: %v", err)
	}
	return rs, func() { closeWithin(closeWait, c.Close) }, nil
}

// closeWait bounds the wait for a Redis client's Close. go-redis's Close
// clears the read deadline of a connection that a call still waits on,
// then waits for that read: for ever, on a server that stopped answering
// calls the command gave up on at --timeout (the store sends them from
// goroutines of its own). The command is done by then: the process's exit
// closes what is left.
var closeWait = time.Second

// closeWithin calls closeFn, and returns when it has returned or after d,
// whichever comes first.
func closeWithin(d time.Duration, closeFn func() error) {
	done := make(chan struct{})
	go func() {
		_ = closeFn()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// errNotFound is matched by the error of a store that is not there.
var errNotFound = errors.New("no such store")

// boltTimeout is how long opening a bbolt file waits at most for another
// process that holds it.
var boltTimeout = boltstore.DefaultTimeout

// boltWait returns how long opening a bbolt file may wait for another
// process that holds it: boltTimeout, or less when ctx ends sooner (at
// --timeout). bbolt takes a wait of 0 for no bound, so a ctx that has
// ended gives the shortest wait there is: one try.
func boltWait(ctx context.Context) time.Duration {
	wait := boltTimeout
	if deadline, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(deadline))
	}
	return max(wait, time.Nanosecond)
}

// boltHeld returns the error of opening the bbolt file at path, which
// another process held until the wait for it ended: at boltTimeout, at
// --timeout (ctx's deadline), or when ctx was cancelled (Ctrl-C). It
// matches bbolt's ErrTimeout, and ctx's cause once ctx has ended.
func boltHeld(ctx context.Context, path string) error {
	const what = "a bbolt file serves one process at a time: stop the process that holds it (the application, or another ratelimit command), then run the command again"
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		<-ctx.Done() // the wait was bounded by ctx's deadline, which ends ctx at once
	}
	switch {
	case ctx.Err() == nil:
		return fmt.Errorf("bbolt file %s: another process holds the file, and the wait for it ended after %v; %s: %w", path, boltTimeout, what, berrors.ErrTimeout)
	case errors.Is(context.Cause(ctx), errTimeout):
		return fmt.Errorf("bbolt file %s: another process holds the file; %s: %w (%w)", path, what, berrors.ErrTimeout, context.Cause(ctx))
	}
	return fmt.Errorf("bbolt file %s: another process holds the file, and the command was stopped while it waited for it; %s: %w (%w)", path, what, context.Cause(ctx), berrors.ErrTimeout)
}

// boltRetry is how often the wait for a bbolt file that another process
// holds tries its lock again: bbolt's own interval.
const boltRetry = 50 * time.Millisecond

// boltWaiting, if set, is called each time the file is found held, before
// the wait to try again.
var boltWaiting func()

// openReadOnly opens the bbolt file at path read-only, waiting for a
// process that holds it up to boltWait(ctx), or until ctx ends: bbolt's
// own wait (Options.Timeout) sleeps through ctx's end, so it is given one
// try at a time.
func openReadOnly(ctx context.Context, path string) (*bolt.DB, error) {
	stop := time.NewTimer(boltWait(ctx))
	defer stop.Stop()
	for {
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: -1}) // one try
		if !errors.Is(err, berrors.ErrTimeout) {
			return db, err
		}
		if boltWaiting != nil {
			boltWaiting()
		}
		retry := time.NewTimer(boltRetry)
		select {
		case <-ctx.Done():
			retry.Stop()
			return nil, boltHeld(ctx, path)
		case <-stop.C:
			retry.Stop()
			return nil, boltHeld(ctx, path)
		case <-retry.C:
		}
	}
}

// boltCheck checks, without creating or changing anything, that the file
// at path, if there is one, is a bbolt file that is whole and whose pages
// of bucket bbolt can read, and for acc mustExist that it exists and holds
// bucket. A file cut short would make bbolt read past the end of its
// mapping, a fault that ends the process, and a damaged page makes it
// panic: both are reported instead. It waits for a process that holds the
// file up to boltWait(ctx), or until ctx ends.
func boltCheck(ctx context.Context, path, bucket string, acc access) error {
	const check = "check the path in --store (the application's boltstore.Open path)"
	fi, err := os.Stat(path)
	switch {
	case (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) && acc == mayCreate:
		// The store would be created in the file's directory: bbolt's
		// error did not say which of the two was missing.
		dir := filepath.Dir(path)
		di, err := os.Stat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("bbolt file %s: its directory %s does not exist: %s: %w", path, dir, check, errNotFound)
		case err == nil && !di.IsDir():
			return fmt.Errorf("bbolt file %s: %s is not a directory: %s", path, dir, check)
		}
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("bbolt file %s does not exist: %s: %w", path, check, errNotFound)
	case err != nil:
		return fmt.Errorf("bbolt file %s: %w", path, err)
	case fi.IsDir():
		return fmt.Errorf("bbolt file %s is a directory, not a file: %s", path, check)
	case !fi.Mode().IsRegular():
		// A named pipe has no size: taken for an empty file that the
		// store may be written into, it held bbolt's read for ever, past
		// --timeout.
		return fmt.Errorf("bbolt file %s is not a regular file (a named pipe, a device or a socket): %s", path, check)
	case fi.Size() == 0 && acc == mayCreate:
		return nil // bbolt writes its first pages into it
	case fi.Size() == 0:
		// bbolt would write its first pages into it, and fail read-only
		// with "bad file descriptor".
		return fmt.Errorf("bbolt file %s is empty: no store was opened on it: %s: %w", path, check, errNotFound)
	}
	db, err := openReadOnly(ctx, path)
	var pathErr *fs.PathError
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return err
	case errors.As(err, &pathErr):
		return fmt.Errorf("bbolt file %s: %w", path, err)
	case err != nil:
		return fmt.Errorf("%s is not a bbolt file, or a damaged one (%w): %s", path, err, check)
	}
	defer db.Close()
	damaged := func(what any) error {
		return fmt.Errorf("bbolt file %s is damaged (%v): restore it from a copy, or remove it (every limit starts full again)", path, what)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return db.View(func(tx *bolt.Tx) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = damaged(p)
			}
		}()
		if tx.Size() > fi.Size() {
			return damaged(fmt.Sprintf("cut short: it has %d bytes, and its pages reach %d", fi.Size(), tx.Size()))
		}
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			if acc == mustExist {
				return fmt.Errorf("bbolt file %s has no bucket %q: check --bucket (the application's boltstore.WithBucket): %w", path, bucket, errNotFound)
			}
			return nil
		}
		// Every page of the bucket's records, once: what the store reads
		// later is then known to be readable.
		return b.ForEach(func(_, _ []byte) error { return nil })
	})
}

// pgExists checks that a relation of the store's table's name exists;
// pgstore.New then checks that it is the store's table.
func pgExists(ctx context.Context, pool *pgxpool.Pool, table string) error {
	name := pgx.Identifier(strings.SplitN(table, ".", 2)).Sanitize()
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists); err != nil {
		return fmt.Errorf("postgres: look for table %s: %w", name, err)
	}
	if !exists {
		return fmt.Errorf("postgres: table %s does not exist in this database: check --table (the application's pgstore.WithTable) and the database in --store; the application creates the table when it starts, or a migration does (ratelimit schema): %w", name, errNotFound)
	}
	return nil
}

// redisExists checks that some key starts with prefix, scanning until it
// finds one (on every master of a cluster).
func redisExists(ctx context.Context, c redis.UniversalClient, prefix, where string) error {
	pattern := globEscape(prefix) + "*"
	found := errors.New("found")
	scan := func(ctx context.Context, node *redis.Client) error {
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			if len(keys) > 0 {
				return found
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	}
	switch {
	case errors.Is(err, found):
		return nil
	case err != nil:
		return fmt.Errorf("%s: look for keys with prefix %q: %w", where, prefix, err)
	}
	return fmt.Errorf("%s: no key starts with prefix %q: check --prefix (the application's redisstore.WithPrefix) and the database in --store; a store whose records have all expired has none either: %w", where, prefix, errNotFound)
}

// globEscape escapes the characters special in a Redis MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// isConnError reports whether err is a failure to reach a server, rather
// than one the server reported (a refused login, a bad query): a refused
// or reset connection, a host not found, or no answer in time (a server
// that accepts and never speaks, or another program on the port).
func isConnError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || errors.As(err, new(noServerError)) {
		return false
	}
	var (
		opErr  *net.OpError
		dnsErr *net.DNSError
		netErr net.Error
	)
	return errors.As(err, &opErr) || errors.As(err, &dnsErr) || errors.As(err, &netErr) && netErr.Timeout() ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}
