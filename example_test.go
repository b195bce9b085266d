package ratelimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
)

// The README's quick start: named limits declared once, calls by name and
// key. (A mock clock makes the output repeatable; production leaves
// WithClock out.)
func Example() {
	ctx := context.Background()
	mock := clock.NewMock()
	mock.Set(time.Date(2024, 1, 1, 9, 0, 0, 0, time.UTC))

	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"freeTrialSignUp": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour},
		"sendMessage":     {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 3},
	}, ratelimit.WithClock(mock))
	if err != nil {
		panic(err)
	}
	for i := range 4 {
		res, err := lim.Limit(ctx, "sendMessage", "user-42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("message %d: ok=%v remaining=%v retryAfter=%v\n", i+1, res.OK, res.Remaining, res.RetryAfter)
	}
	// Output:
	// message 1: ok=true remaining=2 retryAfter=0s
	// message 2: ok=true remaining=1 retryAfter=0s
	// message 3: ok=true remaining=0 retryAfter=0s
	// message 4: ok=false remaining=0 retryAfter=6s
}

// Rollover: a fixed window grants Rate tokens at the start of each window,
// and what is left over rolls over, up to Capacity.
func Example_rollover() {
	ctx := context.Background()
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	mock := clock.NewMock()
	store, _ := memstore.New()
	lim, _ := ratelimit.New(store, ratelimit.Limits{
		"api": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour, Capacity: 150, Start: start},
	}, ratelimit.WithClock(mock))

	for _, call := range []struct {
		at    time.Duration
		count float64
	}{{30 * time.Minute, 15}, {45 * time.Minute, 15}, {90 * time.Minute, 30}, {150 * time.Minute, 150}} {
		mock.Set(start.Add(call.at))
		res, _ := lim.Limit(ctx, "api", "team-1", ratelimit.Count(call.count))
		fmt.Printf("%v: use %v → ok=%v, %v left\n", call.at, call.count, res.OK, res.Remaining)
	}
	// Output:
	// 30m0s: use 15 → ok=true, 135 left
	// 45m0s: use 15 → ok=true, 120 left
	// 1h30m0s: use 30 → ok=true, 120 left
	// 2h30m0s: use 150 → ok=true, 0 left
}

// Reserving capacity: a job that must run, not be refused, takes tokens it
// cannot have yet and learns when it may run. A reservation that would owe
// more than MaxReserved is refused with the wait until it would fit.
func Example_reserve() {
	ctx := context.Background()
	mock := clock.NewMock()
	store, _ := memstore.New()
	lim, _ := ratelimit.New(store, ratelimit.Limits{
		"llm": {Kind: ratelimit.TokenBucket, Rate: 40000, Period: time.Minute, MaxReserved: 20000},
	}, ratelimit.WithClock(mock))

	for _, tokens := range []float64{30000, 20000, 25000} {
		res, _ := lim.Limit(ctx, "llm", "", ratelimit.Count(tokens), ratelimit.WithReserve())
		fmt.Printf("%v tokens: ok=%v reserved=%v retryAfter=%v\n", tokens, res.OK, res.Reserved(), res.RetryAfter)
	}
	// Output:
	// 30000 tokens: ok=true reserved=false retryAfter=0s
	// 20000 tokens: ok=true reserved=true retryAfter=15s
	// 25000 tokens: ok=false reserved=false retryAfter=22.5s
}

// Callers who prefer errors use Result.Err: errors.Is matches ErrLimited,
// errors.As gives the name, key and retry-after.
func ExampleResult_Err() {
	ctx := context.Background()
	store, _ := memstore.New()
	lim, _ := ratelimit.New(store, ratelimit.Limits{
		"login": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Minute, Start: time.UnixMilli(0)},
	}, ratelimit.WithClock(clock.NewMock()))

	for range 2 {
		res, err := lim.Limit(ctx, "login", "alice@example.com")
		if err != nil {
			panic(err)
		}
		var le *ratelimit.LimitError
		if err := res.Err(); errors.As(err, &le) {
			fmt.Printf("limited: %v; %q may retry in %v\n", errors.Is(err, ratelimit.ErrLimited), le.Key, le.RetryAfter)
		} else {
			fmt.Println("logged in")
		}
	}
	// Output:
	// logged in
	// limited: true; "alice@example.com" may retry in 1m0s
}

// Value reports the tokens available now without spending any.
func ExampleLimiter_Value() {
	ctx := context.Background()
	mock := clock.NewMock()
	store, _ := memstore.New()
	lim, _ := ratelimit.New(store, ratelimit.Limits{
		"export": {Kind: ratelimit.FixedWindow, Rate: 5, Period: time.Hour, Start: time.UnixMilli(0)},
	}, ratelimit.WithClock(mock))
	mock.Add(20 * time.Minute)
	_, _ = lim.Limit(ctx, "export", "acme", ratelimit.Count(2))
	st, _ := lim.Value(ctx, "export", "acme")
	fmt.Printf("%v tokens, next grant at %s\n", st.Remaining, st.NextGrant.UTC().Format("15:04"))
	// Output:
	// 3 tokens, next grant at 01:00
}

// An invalid config is refused when the limiter is built, with an error
// that names the limit and the field.
func ExampleNew_invalidConfig() {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	_, err = ratelimit.New(store, ratelimit.Limits{
		"search": {Kind: ratelimit.TokenBucket, Rate: 0, Period: time.Second},
	})
	fmt.Println(err)
	fmt.Println(errors.Is(err, ratelimit.ErrInvalidConfig))
	// Output:
	// ratelimit: limit "search": Rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000
	// true
}

// Scheduling a batch: 50 jobs against a limit of 10 per second. Each job
// reserves its token and runs when the token has been granted, instead of
// being refused.
func ExampleLimiter_Reserve() {
	ctx := context.Background()
	start := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	mock := clock.NewMock()
	mock.Set(start)
	store, _ := memstore.New()
	lim, _ := ratelimit.New(store, ratelimit.Limits{
		"email": {Kind: ratelimit.FixedWindow, Rate: 10, Period: time.Second, Start: start},
	}, ratelimit.WithClock(mock))

	var mu sync.Mutex
	ranAt := make([]time.Duration, 50)
	var wg sync.WaitGroup
	for job := range 50 {
		r, err := lim.Reserve(ctx, "email", "newsletter")
		if err != nil || !r.OK() {
			panic(fmt.Sprint("not reserved: ", err))
		}
		wg.Add(1)
		_, err = r.AfterFunc(func() {
			defer wg.Done()
			mu.Lock()
			ranAt[job] = mock.Now().Sub(start)
			mu.Unlock()
		})
		if err != nil {
			panic(err)
		}
	}
	mock.Add(5 * time.Second) // the mock clock fires the jobs in time order
	wg.Wait()
	for first := 0; first < 50; first += 10 {
		fmt.Printf("jobs %2d-%2d ran at %v\n", first+1, first+10, ranAt[first:first+10])
	}
	// Output:
	// jobs  1-10 ran at [0s 0s 0s 0s 0s 0s 0s 0s 0s 0s]
	// jobs 11-20 ran at [1s 1s 1s 1s 1s 1s 1s 1s 1s 1s]
	// jobs 21-30 ran at [2s 2s 2s 2s 2s 2s 2s 2s 2s 2s]
	// jobs 31-40 ran at [3s 3s 3s 3s 3s 3s 3s 3s 3s 3s]
	// jobs 41-50 ran at [4s 4s 4s 4s 4s 4s 4s 4s 4s 4s]
}

// Rotating the token key without dropping a queued job: a token signed
// with the old key still settles in a process that signs with the new key
// and accepts the old one (step 2 of the rotation in
// docs/reservations.md), and is refused once the old key is dropped, which
// is why step 3 waits until every token signed with it has expired.
func ExampleWithTokenKey_rotation() {
	ctx := context.Background()
	// Keys come from the secret store: 32 random bytes each.
	oldKey := []byte("the old token key, 32 random B..")
	newKey := []byte("the new token key, 32 random B..")
	limits := ratelimit.Limits{"jobs": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Second}}
	store, _ := memstore.New()

	// Before the rotation, a producer signs a job's token with the old key.
	producer, _ := ratelimit.New(store, limits, ratelimit.WithTokenKey(oldKey))
	r, _ := producer.Reserve(ctx, "jobs", "tenant-1")
	payload := r.Token().String() // queued with the job

	// Step 2: workers sign with the new key and accept the old one.
	worker, _ := ratelimit.New(store, limits, ratelimit.WithTokenKey(newKey, oldKey))
	tok, _ := ratelimit.ParseToken(payload)
	fmt.Println("step 2, use:", worker.Use(ctx, tok))

	// Step 3 too early: the old key is dropped while its tokens live.
	r, _ = producer.Reserve(ctx, "jobs", "tenant-1")
	tooEarly, _ := ratelimit.New(store, limits, ratelimit.WithTokenKey(newKey))
	err := tooEarly.Use(ctx, r.Token())
	fmt.Println("step 3 too early, refused:", errors.Is(err, ratelimit.ErrInvalidToken))
	// Output:
	// step 2, use: <nil>
	// step 3 too early, refused: true
}

// ParseLimitsJSON holds a file to JSON's rules, and says where it stops
// being JSON: here, at the comma after the last limit.
func ExampleParseLimitsJSON() {
	_, err := ratelimit.ParseLimitsJSON([]byte(`{
  "signup": {"kind": "fixed window", "rate": 100, "period": "1h"},
}`))
	fmt.Println(err)
	// Output:
	// ratelimit: limits file: line 3, column 1: not JSON: a comma before }: JSON allows none after the last member of an object or an array; remove it
}

// Limits kept in a file: ParseLimits reads YAML (or JSON) and validates
// every limit, as New does, so that a bad file is refused at start-up, or
// at a reload (SetLimits), with the limit, the line and the field.
func ExampleParseLimits() {
	limits, err := ratelimit.ParseLimits([]byte(`
signup:
  kind: fixed window
  rate: 100
  period: 1h
sendMessage:
  kind: token bucket
  rate: 10
  period: 1m
  capacity: 3
search:
  kind: token bucket
  rate: 20
  period: 1s
  failOpen: true
`))
	if err != nil {
		log.Fatal(err)
	}
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, limits)
	if err != nil {
		log.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(lim.Limits())) {
		cfg, _ := lim.Config(name)
		js, _ := json.Marshal(cfg) // the file's format, in JSON
		fmt.Printf("%s: %s\n", name, js)
	}

	_, err = ratelimit.ParseLimits([]byte("signup:\n  kind: fixed window\n  rate: 100\n  period: 1h\n  capacty: 150\n"))
	fmt.Println(err)
	// Output:
	// search: {"kind":"token bucket","rate":20,"period":"1s","failOpen":true}
	// sendMessage: {"kind":"token bucket","rate":10,"period":"1m0s","capacity":3}
	// signup: {"kind":"fixed window","rate":100,"period":"1h0m0s"}
	// ratelimit: limits file: limit "signup": line 5: unknown field "capacty" (did you mean "capacity"?): the fields are kind, rate, period, capacity, maxReserved, shards, start, failOpen
}

// A program reloading its limits tells a field the file format does not
// know (a typo, or Rate for rate) from a value refused, whose ConfigError
// names the same Field.
func ExampleParseLimits_unknownField() {
	for _, file := range []string{
		"signup:\n  kind: fixed window\n  rate: 100\n  period: 1h\n  Rate: 150\n",
		"signup:\n  kind: fixed window\n  rate: 0\n  period: 1h\n",
	} {
		_, err := ratelimit.ParseLimits([]byte(file))
		var ce *ratelimit.ConfigError
		if errors.As(err, &ce) {
			fmt.Printf("limit %s, field %s, unknown: %v\n", ce.Name, ce.Field, errors.Is(err, ratelimit.ErrUnknownField))
		}
	}
	// Output:
	// limit signup, field Rate, unknown: true
	// limit signup, field Rate, unknown: false
}

// A call spends Count tokens (1 by default) when they are there, and is
// refused, spending nothing, when they are not: RetryAfter says when the
// same call would succeed. Here an export costs one token per thousand
// rows, from a bucket of 10 that refills one token every 6 seconds.
func ExampleLimiter_Limit() {
	ctx := context.Background()
	mock := clock.NewMock()
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"export": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute},
	}, ratelimit.WithClock(mock))
	if err != nil {
		log.Fatal(err)
	}
	for _, rows := range []float64{6000, 6000, 4000} {
		res, err := lim.Limit(ctx, "export", "acme", ratelimit.Count(rows/1000))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%v rows: ok=%v remaining=%v retryAfter=%v\n", rows, res.OK, res.Remaining, res.RetryAfter)
	}
	// Output:
	// 6000 rows: ok=true remaining=4 retryAfter=0s
	// 6000 rows: ok=false remaining=4 retryAfter=12s
	// 4000 rows: ok=true remaining=0 retryAfter=0s
}

// Wait holds a job until its reserved tokens have been granted; a job
// whose deadline comes first does not wait for nothing: Wait gives up at
// once and hands its tokens back. (The mock clock stands in for time; with
// a mock, make deadlines with its WithTimeout.)
func ExampleReservation_Wait() {
	ctx := context.Background()
	mock := clock.NewMock()
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"llm": {Kind: ratelimit.TokenBucket, Rate: 40000, Period: time.Minute},
	}, ratelimit.WithClock(mock))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := lim.Limit(ctx, "llm", "", ratelimit.Count(40000)); err != nil { // the bucket is now empty
		log.Fatal(err)
	}

	r, err := lim.Reserve(ctx, "llm", "", ratelimit.Count(10000))
	if err != nil || !r.OK() {
		log.Fatal("not reserved: ", err)
	}
	fmt.Println("job 1 may run in", r.Delay())
	waited := make(chan error)
	go func() { waited <- r.Wait(ctx) }()
	mock.Add(15 * time.Second)
	fmt.Println("job 1 waited:", <-waited)

	r, err = lim.Reserve(ctx, "llm", "", ratelimit.Count(10000))
	if err != nil || !r.OK() {
		log.Fatal("not reserved: ", err)
	}
	deadline, cancel := mock.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = r.Wait(deadline)
	fmt.Println("job 2 due in", r.Delay(), "gave up:", errors.Is(err, context.DeadlineExceeded))
	st, err := lim.Value(ctx, "llm", "")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("tokens now:", st.Remaining)
	// Output:
	// job 1 may run in 15s
	// job 1 waited: <nil>
	// job 2 due in 15s gave up: true
	// tokens now: 0
}
