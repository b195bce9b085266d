// Package ratelimit is a token-granting rate limiter with named limits and
// pluggable stores.
//
// Limits are declared once, by name, and called by name and key:
//
//	store, err := memstore.New()
//	if err != nil {
//		return err
//	}
//	lim, err := ratelimit.New(store, ratelimit.Limits{
//		"freeTrialSignUp": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour},
//		"sendMessage":     {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 3},
//	})
//	if err != nil {
//		return err
//	}
//	res, err := lim.Limit(ctx, "sendMessage", userID)
//	if err != nil && !errors.Is(err, ratelimit.ErrStoreUnavailable) {
//		return err // bad input, or ctx is done
//	}
//	if !res.OK {
//		return res.Err() // a *ratelimit.LimitError: come back after its RetryAfter
//	}
//
// A store that fails leaves the call to the limit's failure policy (see
// Stores, below): res is its decision, and err says why it had to decide.
//
// Limits may also come from a file, YAML or JSON (ParseLimits; for a file
// known to be JSON, ParseLimitsJSON), and change while the Limiter serves
// calls (SetLimits, SetLimit): a call sees the old set or the new one,
// never a mix.
//
// # Fixed windows and rollover
//
// A FixedWindow limit grants Rate tokens at the start of every window of
// length Period, capped at Capacity (Rate by default). Tokens not spent in
// one window roll over into the next, up to the cap: with Rate 100 and
// Capacity 150, a quiet hour lets the next one spend 150. A call spends
// Count tokens (1 by default) and is allowed when that many are there.
//
// # Token buckets
//
// A TokenBucket limit refills continuously, Rate tokens per Period, capped
// at Capacity; a call waits only as long as its missing tokens take to
// refill.
//
// # Phase
//
// Windows begin at Start + k·Period. Without Start, each key gets its own
// phase, derived from a hash of the limit's name and the key, so that the
// clients of many keys do not all retry at one instant; every process
// agrees on it without a read. A Start in the future only fixes the phase.
//
// # Keys
//
// A key is any string: empty, binary, megabytes long; two different
// (name, key) pairs never share a record. A key of up to 256 bytes is
// given to the store as it is. A longer one, such as a header or a path
// segment a client chose, is given as its digest form: "sha256:" and the
// SHA-256 of the key in unpadded base64url, 50 bytes, so that what a store
// keeps for one key is bounded whatever the key's length; so is a key
// spelt as a digest form, so that it never shares the record of the key
// whose digest it spells. WithKeyHash
// gives the store a keyed hash of every key instead. Results, errors and
// observer events carry the key as given, and Value and Reset take it.
//
// # Reservations
//
// A call with WithReserve may take tokens the bucket does not have yet: it
// is OK with a RetryAfter that says when they will have been granted, and
// the bucket owes them (MaxReserved bounds the debt). Later calls see the
// debt. Limiter.Reserve makes such a call and returns a Reservation, whose
// job waits for its time (Wait, AfterFunc) or hands the tokens back
// (Cancel).
//
// A reservation's Token, or the receipt of a charge (WithReceipt), lets
// any process settle it, once, whatever the retries and races: Use before
// running the job, Refund to drop it, Settle by the outcome. Settler names
// the settling attempt, so that a retry after a lost reply tells its own
// settlement from another's; WithTokenKey signs tokens, with keys that can
// be rotated without refusing queued ones. See docs/reservations.md.
//
// # Results and errors
//
// Being rate limited is not an error: Limit returns a Result whose OK is
// false and whose RetryAfter says how long until the same call would
// succeed. Result.Err turns it into a *LimitError for callers who prefer
// errors. Errors are for bad input (ErrUnknownLimit, ErrInvalidConfig,
// ErrInvalidCount), done contexts and store failures.
//
// # Stores
//
// The state of each (name, key) lives in a Store: store/memstore in
// memory, store/boltstore in an embedded file, store/redisstore and
// store/pgstore on servers shared by a fleet. The semantics are defined
// once, by the pure functions of state.go (Evaluate, TransitionInto); every
// store runs them or a native port proved equal to them by the
// store/storetest suite.
//
// When the store fails, each limit's failure policy decides the call
// (Config.FailOpen: refused by default): the Result is Degraded, and the
// error matches ErrStoreUnavailable. After a few failures in a row a
// breaker stops asking the store for a while (WithBreaker).
//
// # Time
//
// The Limiter reads time from an injected clock (WithClock); tests use a
// mock clock and never sleep. Inside the state, times are Unix
// milliseconds, and a clock that steps backwards neither mints nor removes
// tokens.
//
// # Further reading
//
// Package httplimit puts limits in front of a net/http handler; the
// modules under contrib bring gRPC interceptors, OpenTelemetry and
// Prometheus (docs/integrations.md). The manual,
// in the repository's docs directory, tours the API (docs/api.md), defines
// the model (docs/model.md), compares the stores (docs/stores.md) and says
// what running in production takes (docs/production.md): several limits at
// once, store failures, the deny cache, observability. The ratelimit
// command (cmd/ratelimit, docs/cli.md) simulates a limit and inspects,
// resets and load-tests real stores.
package ratelimit
