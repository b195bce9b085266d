package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/spf13/cobra"
)

// target is a (name, key) in a real store.
type target struct {
	lf     limitFlags
	sf     storeFlags
	key    string
	output output
	// checked makes the Limiter use the store through checkedStore, which
	// refuses records no release of the library writes.
	checked bool
	// precheck, if set, refuses what the command would be refused
	// whatever the store (a count the limit can never grant), before the
	// store is opened.
	precheck func(name string, cfg ratelimit.Config) error
	store    ratelimit.Store // set by limiter
	// anySeed takes --phase-seed whatever the limit (reset, which removes
	// every record of the key whatever its windows, takes inspect's flags
	// as they are); the other commands refuse it where it moves nothing.
	anySeed bool
}

func (t *target) register(cmd *cobra.Command, withKey bool) {
	t.lf.register(cmd.Flags())
	t.sf.register(cmd.Flags())
	if withKey {
		cmd.Flags().StringVar(&t.key, "key", "", "the key (a user, an IP, an API key); may be empty")
	}
}

// limiter opens the store and returns a Limiter on it with the selected
// limit, and its name.
func (t *target) limiter(ctx context.Context, acc access) (*ratelimit.Limiter, string, func(), error) {
	name, cfg, err := t.lf.limit()
	if err != nil {
		return nil, "", nil, err
	}
	if !t.anySeed {
		if err := t.sf.unusedPhaseSeed(ratelimit.Limits{name: cfg}, t.lf.file); err != nil {
			return nil, "", nil, err
		}
	}
	// The options are the command line's: one that New refuses (a short
	// --key-secret) is told before the store is opened, not behind a
	// store that cannot be reached.
	if err := checkOptions(t.sf.options()); err != nil {
		return nil, "", nil, usageError{err}
	}
	if t.precheck != nil {
		if err := t.precheck(name, cfg); err != nil {
			return nil, "", nil, err
		}
	}
	store, closeStore, err := t.sf.open(ctx, acc)
	if err != nil {
		return nil, "", nil, err
	}
	var read ratelimit.Store = store
	if t.checked {
		read = newCheckedStore(store)
	}
	opts := t.sf.options()
	if clk, ok := testClock(ctx); ok {
		opts = append(opts, ratelimit.WithClock(clk))
	}
	lim, err := ratelimit.New(read, ratelimit.Limits{name: cfg}, opts...)
	if err != nil {
		closeStore()
		return nil, "", nil, usageError{err}
	}
	t.store = store
	return lim, name, closeStore, nil
}

// checkOptions returns the error of ratelimit.New given opts, on a store
// in memory.
func checkOptions(opts []ratelimit.Option) error {
	m, err := memstore.New()
	if err != nil {
		return err
	}
	_, err = ratelimit.New(m, nil, opts...)
	return err
}

// checkCount returns the *ratelimit.CountError of a call of count tokens
// on the limit, reserving them or not, when the limit can never grant
// them, whatever its store holds; nil otherwise.
func checkCount(name string, cfg ratelimit.Config, count float64, reserve bool) error {
	m, err := memstore.New()
	if err != nil {
		return err
	}
	lim, err := ratelimit.New(m, ratelimit.Limits{name: cfg})
	if err != nil {
		return err
	}
	opts := []ratelimit.CallOption{ratelimit.Count(count)}
	if reserve {
		opts = append(opts, ratelimit.WithReserve())
	}
	_, err = lim.Check(context.Background(), name, "", opts...)
	var ce *ratelimit.CountError
	if errors.As(err, &ce) {
		return err
	}
	return nil
}

// checkedStore is a store whose Load refuses a record that no release of
// the library writes: tokens that are not a finite number within
// ±ratelimit.MaxTokens, or a time beyond ±driver.MaxTime (and a period).
// The stores read any number they find where a record belongs (NaN, 1e300,
// a time of 2^63 ms), written by something else or damaged, and the
// Limiter turns it into nonsense: NaN tokens, debts of 10^16, windows that
// start hundreds of millions of years away. inspect reads through it, to
// report such a record rather than print what it makes, and limit, to
// refuse to decide on one.
type checkedStore struct{ ratelimit.Store }

// checkedClockStore is a checkedStore of a store with a clock of its own
// (--server-time), whose TimeSource it keeps: a wrapper without it hid
// the store's clock from the Limiter, which then judged inspect's records
// at this machine's time, not at the server's.
type checkedClockStore struct {
	checkedStore
	driver.TimeSource
}

// checkedRecordClockStore is a checkedClockStore of a store whose clock
// is its servers', one per record (a Redis Cluster's, driver.RecordClock),
// which it keeps too: a wrapper without it had the Limiter judge a key's
// records at the time of any of the servers, not of the key's.
type checkedRecordClockStore struct {
	checkedClockStore
	driver.RecordClock
}

// newCheckedStore returns store read through a checkedStore, with the
// store's TimeSource and RecordClock if it has them.
func newCheckedStore(store ratelimit.Store) ratelimit.Store {
	if ts, ok := store.(driver.TimeSource); ok {
		if rc, ok := store.(driver.RecordClock); ok {
			return checkedRecordClockStore{checkedClockStore{checkedStore{store}, ts}, rc}
		}
		return checkedClockStore{checkedStore{store}, ts}
	}
	return checkedStore{store}
}

// Load implements ratelimit.Store. A record that the store itself
// refuses as one no release writes (driver.ErrBadRecord: NaN tokens, a
// time beyond any call's, a string that is no record) is reported alike.
func (s checkedStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	if err := s.Store.Load(ctx, ids, out); err != nil {
		if errors.Is(err, driver.ErrBadRecord) {
			return fmt.Errorf("a record is not one this library writes: %w; "+
				"to start its limit full again, reset the key (ratelimit reset, with the same flags)", err)
		}
		return err
	}
	for i, id := range ids {
		if !out[i].Found {
			continue
		}
		if err := checkRecord(out[i].State); err != nil {
			return fmt.Errorf("the record of shard %d is not one this library writes: %w: "+
				"something else wrote it where a record belongs, or it is damaged; "+
				"reset the key (ratelimit reset, with the same flags) to start its limit full again", id.Shard, err)
		}
	}
	return nil
}

// maxRecordTime bounds the time of a record, in Unix milliseconds either
// side of the epoch: a call's time is within ±driver.MaxTime, and a fixed
// window's start at most a period before it.
const maxRecordTime = driver.MaxTime + int64(ratelimit.MaxPeriod/time.Millisecond)

// checkRecord returns an error saying what is wrong with st, a record's
// state as a store read it, when no release of the library writes it.
func checkRecord(st driver.State) error {
	if !(math.Abs(st.Remaining) <= ratelimit.MaxTokens) {
		return fmt.Errorf("it holds %s tokens, and a record holds from %s to %s",
			numtext.Format(st.Remaining), numtext.Format(-ratelimit.MaxTokens), numtext.Format(ratelimit.MaxTokens))
	}
	if st.TS < -maxRecordTime || st.TS > maxRecordTime {
		return fmt.Errorf("its time is %d ms from 1970, and a record's is within ±%d ms", st.TS, maxRecordTime)
	}
	return nil
}

// run runs f, a command on the Limiter of the selected limit in the
// store, opened with acc, within --timeout: opening the store, and every
// call of f on it, end by then.
func (t *target) run(cmd *cobra.Command, acc access, f func(ctx context.Context, lim *ratelimit.Limiter, name string) error) error {
	if err := t.sf.check(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeoutCause(cmd.Context(), t.sf.timeout, errTimeout)
	defer cancel()
	err := func() error {
		lim, name, closeStore, err := t.limiter(ctx, acc)
		if err != nil {
			return err
		}
		defer closeStore()
		return f(ctx, lim, name)
	}()
	return t.sf.timedOut(ctx, err)
}

func newInspect() *cobra.Command {
	t := target{checked: true}
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Show the state of a (name, key) in a store: tokens, window, next grant, debt, per shard",
		Example: `  ratelimit inspect --store redis://127.0.0.1:6379/0 --limits limits.json --name sendMessage --key user-42
  ratelimit inspect --store bolt://limits.db --kind "fixed window" --rate 100 --period 1h --name signup --key 203.0.113.9`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return t.run(cmd, mustExist, func(ctx context.Context, lim *ratelimit.Limiter, name string) error {
				at := now(ctx)
				st, err := lim.Value(ctx, name, t.key)
				if err != nil {
					return err
				}
				cfg, _ := lim.Config(name)
				storeKey, form := t.sf.storeKey(t.key)
				if t.output == jsonOutput {
					return writeJSON(cmd.OutOrStdout(), statusOf(name, t.key, storeKey, cfg, at, st))
				}
				printStatus(cmd.OutOrStdout(), name, t.key, storeKey, form, cfg, at, st)
				return nil
			})
		},
	}
	t.register(cmd, true)
	t.output.register(cmd.Flags())
	return cmd
}

// statusJSON is the report of inspect --output json.
type statusJSON struct {
	Limit       limitJSON   `json:"limit"`
	Key         string      `json:"key"`        // lossy for a key not valid UTF-8: see KeyBase64
	KeyBase64   string      `json:"key_base64"` // the key's bytes, exactly
	StoreKey    string      `json:"store_key"`  // the key as the store knows it
	At          *string     `json:"at"`
	Tokens      float64     `json:"tokens"`
	Debt        float64     `json:"debt"`
	Capacity    float64     `json:"capacity"`
	WindowStart *string     `json:"window_start"` // fixed window; null for a token bucket
	NextGrant   *string     `json:"next_grant"`   // fixed window; null for a token bucket
	Shards      []shardJSON `json:"shards"`
}

// shardJSON is one shard in statusJSON.
type shardJSON struct {
	Index       int     `json:"index"`
	Stored      bool    `json:"stored"`
	Tokens      float64 `json:"tokens"`
	Debt        float64 `json:"debt"`
	WindowStart *string `json:"window_start"`
	NextGrant   *string `json:"next_grant"`
}

func statusOf(name, key, storeKey string, cfg ratelimit.Config, at time.Time, st ratelimit.Status) statusJSON {
	s := statusJSON{Limit: limitOf(name, cfg), Key: key, KeyBase64: keyBase64(key), StoreKey: storeKey, At: timeJSON(at), Tokens: st.Remaining, Debt: max(-st.Remaining, 0),
		Capacity: st.Capacity, WindowStart: timeJSON(st.WindowStart), NextGrant: timeJSON(st.NextGrant), Shards: []shardJSON{}}
	for _, sh := range st.Shards {
		s.Shards = append(s.Shards, shardJSON{Index: sh.Index, Stored: sh.Stored, Tokens: sh.Remaining, Debt: max(-sh.Remaining, 0),
			WindowStart: timeJSON(sh.WindowStart), NextGrant: timeJSON(sh.NextGrant)})
	}
	return s
}

// printStatus prints inspect's report. storeKey is the key as the store
// knows it, and form what it is of key (storeFlags.storeKey).
func printStatus(out io.Writer, name, key, storeKey, form string, cfg ratelimit.Config, at time.Time, st ratelimit.Status) {
	fmt.Fprintln(out, describe(name, cfg))
	fmt.Fprintf(out, "key %q at %s\n", key, at.UTC().Format(time.RFC3339))
	switch form {
	case "keyed hash":
		fmt.Fprintf(out, "stored as %q, its keyed hash (--key-secret)\n", storeKey)
	case "digest":
		if len(key) <= maxRawKey {
			fmt.Fprintf(out, "stored as %q, its digest: the key is spelt as a digest form, which only a digest is stored as\n", storeKey)
			break
		}
		fmt.Fprintf(out, "stored as %q, its digest: the key has %d bytes, more than %d\n", storeKey, len(key), maxRawKey)
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shard\tstored\ttokens\tdebt\twindow start\tnext grant\t")
	for _, sh := range st.Shards {
		fmt.Fprintf(tw, "%d\t%v\t%s\t%s\t%s\t%s\t\n", sh.Index, sh.Stored, num(sh.Remaining), num(max(-sh.Remaining, 0)),
			stamp(sh.WindowStart), stamp(sh.NextGrant))
	}
	if len(st.Shards) > 1 {
		fmt.Fprintf(tw, "all\t\t%s\t%s\t%s\t%s\t\n", num(st.Remaining), num(max(-st.Remaining, 0)), stamp(st.WindowStart), stamp(st.NextGrant))
	}
	tw.Flush()
	fmt.Fprintf(out, "\ntokens now %s of capacity %s\n", num(st.Remaining), num(st.Capacity))
}

// stamp returns t as timeText writes it, for a table; "-" for the zero
// time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return timeText(t)
}

func newReset() *cobra.Command {
	t := target{anySeed: true}
	cmd := &cobra.Command{
		Use:     "reset",
		Short:   "Forget the state of a (name, key) in a store: the next call finds a full bucket",
		Example: `  ratelimit reset --store postgres://postgres@127.0.0.1:5432/test --limits limits.yaml --name signup --key 203.0.113.9`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return t.run(cmd, mustExist, func(ctx context.Context, lim *ratelimit.Limiter, name string) error {
				if err := lim.Reset(ctx, name, t.key); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "reset %s for key %q\n", nameText(name), t.key)
				return nil
			})
		},
	}
	t.register(cmd, true)
	return cmd
}

func newLimit() *cobra.Command {
	var (
		t         = target{checked: true}
		count     float64
		countFlag = givenFloat{v: &count}
		reserve   bool
		check     bool
	)
	cmd := &cobra.Command{
		Use:   "limit",
		Short: "Take tokens from a (name, key) in a store, as the application would, and print the decision",
		Example: `  ratelimit limit --store redis://127.0.0.1:6379/0 --limits limits.yaml --name signup --key 203.0.113.9 --count 60
  ratelimit limit --store bolt://limits.db --limits limits.yaml --name sendMessage --key user-42 --check`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return t.run(cmd, mayCreate, func(ctx context.Context, lim *ratelimit.Limiter, name string) error {
				// The records are read first, to refuse one that no release
				// writes, as inspect does: the call would decide on nonsense
				// (denied, retry after 0s) and report NaN tokens.
				if _, err := lim.Value(ctx, name, t.key); err != nil {
					return err
				}
				opts := []ratelimit.CallOption{ratelimit.Count(count)}
				if reserve {
					opts = append(opts, ratelimit.WithReserve())
				}
				call := lim.Limit
				if check {
					call = lim.Check
				}
				res, err := call(ctx, name, t.key, opts...)
				if err != nil {
					return t.lf.countUsage("--count "+countFlag.String(), "--reserve", err)
				}
				if t.output == jsonOutput {
					cfg, _ := lim.Config(name)
					return writeJSON(cmd.OutOrStdout(), decisionJSON{Limit: limitOf(name, cfg), Key: t.key, KeyBase64: keyBase64(t.key), Count: count,
						Check: check, Reserve: reserve, Outcome: outcome(res), OK: res.OK, RetryAfterMS: ms(res.RetryAfter),
						Remaining: res.Remaining, ResetMS: ms(res.ResetAfter)})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s of %s for key %q, retry after %v\n", outcome(res), num(count), nameText(name), t.key, res.RetryAfter)
				return nil
			})
		},
	}
	t.register(cmd, true)
	t.output.register(cmd.Flags())
	count = 1
	cmd.Flags().Var(&countFlag, "count", "tokens to take")
	cmd.Flags().BoolVar(&reserve, "reserve", false, "reserve the tokens if they are not there yet")
	cmd.Flags().BoolVar(&check, "check", false, "only check: decide without taking anything")
	t.precheck = func(name string, cfg ratelimit.Config) error {
		return t.lf.countUsage("--count "+countFlag.String(), "--reserve", checkCount(name, cfg, count, reserve))
	}
	return cmd
}

// decisionJSON is the report of limit --output json.
type decisionJSON struct {
	Limit        limitJSON `json:"limit"`
	Key          string    `json:"key"`        // lossy for a key not valid UTF-8: see KeyBase64
	KeyBase64    string    `json:"key_base64"` // the key's bytes, exactly
	Count        float64   `json:"count"`
	Check        bool      `json:"check"`
	Reserve      bool      `json:"reserve"`
	Outcome      string    `json:"outcome"` // allowed, reserved or denied
	OK           bool      `json:"ok"`      // allowed or reserved
	RetryAfterMS float64   `json:"retry_after_ms"`
	Remaining    float64   `json:"remaining"`
	ResetMS      float64   `json:"reset_ms"`
}
