package driver_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
)

// BenchmarkCheckOut measures the check every Apply makes before anything
// else, on the op of one limit (Limit) and of three (LimitAll).
func BenchmarkCheckOut(b *testing.B) {
	p := driver.Params{Kind: driver.FixedWindow, Rate: 100, Period: 60_000, Capacity: 100, MaxReserved: 1e15, Phase: 1234}
	item := func(name string) driver.Item {
		return driver.Item{Name: name, Key: "user-42", Count: 1, Shards: []driver.Shard{{Params: p}}}
	}
	for _, c := range []struct {
		name  string
		items []driver.Item
	}{
		{"1item", []driver.Item{item("api")}},
		{"3items", []driver.Item{item("second"), item("minute"), item("hour")}},
	} {
		b.Run(c.name, func(b *testing.B) {
			op := &driver.Op{Now: 1_700_000_000_000, Items: c.items}
			out := make([]driver.Decision, len(c.items))
			b.ReportAllocs()
			for b.Loop() {
				if err := driver.CheckOut(op, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A refund's At is a time like Now, and is held to the same bounds: the
// stores compute what the record was granted since At, which Go's int64
// arithmetic overflows for an At of math.MinInt64 (a refund of 1 token
// gave back the whole capacity), Lua's doubles round and PostgreSQL's
// bigints refuse. Outside a refund, At is unused and not checked.
func TestCheckOpRefusesARefundChargedBeyondMaxTime(t *testing.T) {
	p := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: 1000, Capacity: 10, MaxReserved: 1e15}
	op := func(mode driver.Mode, at int64) *driver.Op {
		return &driver.Op{Mode: mode, Now: 1_700_000_000_000, Items: []driver.Item{
			{Name: "a", Key: "k", Count: 1, At: at, Shards: []driver.Shard{{Params: p}}}}}
	}
	for _, at := range []int64{math.MinInt64, -driver.MaxTime - 1, driver.MaxTime + 1, math.MaxInt64} {
		err := driver.CheckOp(op(driver.ModeRefund, at))
		if !errors.Is(err, driver.ErrInvalidOp) {
			t.Errorf("a refund charged at %d: got %v, want ErrInvalidOp", at, err)
		}
		for _, m := range []driver.Mode{driver.ModeLimit, driver.ModeCheck} {
			if err := driver.CheckOp(op(m, at)); err != nil {
				t.Errorf("mode %d with an unused At of %d: %v", m, at, err)
			}
		}
	}
	for _, at := range []int64{-driver.MaxTime, 0, driver.MaxTime} {
		if err := driver.CheckOp(op(driver.ModeRefund, at)); err != nil {
			t.Errorf("a refund charged at %d: %v", at, err)
		}
	}
}

// A settlement's Until is a time like Now, and is held to the same
// bounds: redisstore's mark of one kept until math.MaxInt64 failed the
// script (an expiry Redis cannot hold), after the marks of the ops
// before it in the script were written, where memstore and pgstore kept
// it.
func TestCheckOpRefusesASettlementKeptBeyondMaxTime(t *testing.T) {
	p := driver.Params{Kind: driver.TokenBucket, Rate: 10, Period: 1000, Capacity: 10, MaxReserved: 1e15}
	op := func(until int64) *driver.Op {
		return &driver.Op{Mode: driver.ModeRefund, Now: 1_700_000_000_000,
			Settle: &driver.Settlement{Kind: driver.SettleCancel, Until: until},
			Items:  []driver.Item{{Name: "a", Key: "k", Count: 1, At: 1_700_000_000_000, Shards: []driver.Shard{{Params: p}}}}}
	}
	for _, until := range []int64{math.MinInt64, -driver.MaxTime - 1, driver.MaxTime + 1, math.MaxInt64} {
		if err := driver.CheckOp(op(until)); !errors.Is(err, driver.ErrInvalidOp) {
			t.Errorf("a settlement kept until %d: got %v, want ErrInvalidOp", until, err)
		}
	}
	for _, until := range []int64{-driver.MaxTime, 0, driver.MaxTime} {
		if err := driver.CheckOp(op(until)); err != nil {
			t.Errorf("a settlement kept until %d: %v", until, err)
		}
	}
}

// A count above 0 and below ratelimit.MinCount, or above
// ratelimit.MaxTokens, is one no call may ask, of one shard or two: the
// Limiter refuses it before it builds an op (CountError), and so must
// every store that is given one through the driver contract. Below
// MinCount, a decision forgives a shortfall below Noise, so such a count
// would be granted on an empty bucket, again and again. MinCount and
// MaxTokens themselves are asked of a limit at the bounds. A refund hands
// back what a charge took, a share of a shard's maybe: its count is bound
// by neither.
func TestCheckOpBoundsTheCount(t *testing.T) {
	p := driver.Params{Kind: driver.TokenBucket, Rate: 1e15, Period: 1, Capacity: 1e15, MaxReserved: 1e15}
	op := func(mode driver.Mode, reserve bool, shards int, count float64) *driver.Op {
		it := driver.Item{Name: "a", Key: "k", Count: count, At: 1_700_000_000_000}
		for i := range shards {
			it.Shards = append(it.Shards, driver.Shard{Index: i, Params: p})
		}
		return &driver.Op{Mode: mode, Now: 1_700_000_000_000, Reserve: reserve, Items: []driver.Item{it}}
	}
	refused := []float64{
		math.SmallestNonzeroFloat64, driver.Noise, 2 * driver.Noise, math.Nextafter(ratelimit.MinCount, 0),
		math.Nextafter(ratelimit.MaxTokens, math.Inf(1)), 2 * ratelimit.MaxTokens, 1e300, math.MaxFloat64,
	}
	asked := []float64{0, ratelimit.MinCount, 1, math.Nextafter(ratelimit.MaxTokens, 0), ratelimit.MaxTokens}
	for _, c := range []struct {
		name    string
		mode    driver.Mode
		reserve bool
		shards  int
	}{
		{"a limit", driver.ModeLimit, false, 1},
		{"a reservation", driver.ModeLimit, true, 1},
		{"a sharded limit", driver.ModeLimit, false, 2},
		{"a sharded reservation", driver.ModeLimit, true, 2},
		{"a check", driver.ModeCheck, false, 1},
		{"a sharded check of a reservation", driver.ModeCheck, true, 2},
	} {
		for _, count := range refused {
			if err := driver.CheckOp(op(c.mode, c.reserve, c.shards, count)); !errors.Is(err, driver.ErrInvalidOp) {
				t.Errorf("%s of %v: got %v, want ErrInvalidOp", c.name, count, err)
			}
		}
		for _, count := range asked {
			if err := driver.CheckOp(op(c.mode, c.reserve, c.shards, count)); err != nil {
				t.Errorf("%s of %v: %v", c.name, count, err)
			}
		}
	}
	for _, count := range append(refused, asked...) {
		if err := driver.CheckOp(op(driver.ModeRefund, false, 1, count)); err != nil {
			t.Errorf("a refund of %v: %v", count, err)
		}
	}
}

// TestCheckParamsIsCheckOpsRuleForParams: CheckParams accepts exactly the
// params CheckOp accepts on an op's shard, and its error matches
// ErrInvalidOp and says which bound the params break.
func TestCheckParamsIsCheckOpsRuleForParams(t *testing.T) {
	good := driver.Params{Kind: driver.FixedWindow, Rate: 10, Period: 1000, Capacity: 10}
	for name, p := range map[string]driver.Params{
		"good":             good,
		"kind":             {Kind: 9, Rate: 10, Period: 1000, Capacity: 10},
		"period 0":         {Kind: driver.FixedWindow, Rate: 10, Capacity: 10},
		"phase":            {Kind: driver.FixedWindow, Rate: 10, Period: 1000, Capacity: 10, Phase: 1000},
		"rate NaN":         {Kind: driver.TokenBucket, Rate: math.NaN(), Period: 1000, Capacity: 10},
		"capacity -1":      {Kind: driver.TokenBucket, Rate: 10, Period: 1000, Capacity: -1},
		"max reserved Inf": {Kind: driver.TokenBucket, Rate: 10, Period: 1000, Capacity: 10, MaxReserved: math.Inf(1)},
	} {
		op := &driver.Op{Mode: driver.ModeCheck, Items: []driver.Item{{Name: "l", Key: "k", Shards: []driver.Shard{{Params: p}}}}}
		err := driver.CheckParams(p)
		if opErr := driver.CheckOp(op); (err == nil) != (opErr == nil) {
			t.Errorf("%s: CheckParams %v, CheckOp %v", name, err, opErr)
		}
		if name == "good" {
			continue
		}
		if !errors.Is(err, driver.ErrInvalidOp) {
			t.Errorf("%s: %v does not match ErrInvalidOp", name, err)
		}
	}
}

// TestCheckErrorsWriteNumbersAsAUserDoes: the counts and params an error
// of CheckOp or CheckParams quotes, and their bounds, read as a user
// writes them and as the root package's errors write them: %v wrote a
// count of 1e300 as 1e+300, MaxTokens as 1e+15 and MinCount as 1e-08.
func TestCheckErrorsWriteNumbersAsAUserDoes(t *testing.T) {
	p := driver.Params{Kind: driver.TokenBucket, Rate: 10, Period: 1000, Capacity: 10}
	op := func(count float64) *driver.Op {
		return &driver.Op{Mode: driver.ModeLimit, Items: []driver.Item{{Name: "l", Key: "k", Count: count, Shards: []driver.Shard{{Params: p}}}}}
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{driver.CheckOp(op(1e300)), "has a count of 1e300, above 1000000000000000 (ratelimit.MaxTokens)"},
		{driver.CheckOp(op(1.5e-9)), "has a count of 1.5e-9, above 0 and below 1e-8 (ratelimit.MinCount)"},
		{driver.CheckOp(op(1.5e-9)), "give 0 or at least 1e-8"},
		{driver.CheckOp(op(math.Inf(1))), "has a count of +Inf: give a finite number"},
		{driver.CheckParams(driver.Params{Kind: driver.TokenBucket, Rate: 1e300, Period: 1000}),
			"rate 1e300: give a rate from 9.765625e-13 to 1000000000000000 tokens per period"},
		{driver.CheckParams(driver.Params{Kind: driver.TokenBucket, Rate: 10, Period: 1000, Capacity: 8388607.5e9}),
			"capacity 8388607500000000: give a capacity from 0 to 1000000000000000 tokens"},
		{driver.CheckParams(driver.Params{Kind: driver.TokenBucket, Rate: 10, Period: 1000, MaxReserved: -8388607}),
			"max reserved -8388607: give a number of tokens from 0 (unlimited) to 1000000000000000"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("got %v, want an error with %q", c.err, c.want)
		}
	}
}

// TestCheckRefusesANilOp: a nil op, given to Apply or within a batch, is
// an invalid op (ErrInvalidOp, wrapped, naming its place in a batch), not
// a panic: every store calls CheckOut or CheckOuts before it looks at the
// op, and the checks read op.Items, which panicked on a nil op.
func TestCheckRefusesANilOp(t *testing.T) {
	valid := &driver.Op{Now: 1_700_000_000_000}
	for _, c := range []struct {
		name  string
		check func() error
		want  string
	}{
		{"CheckOp", func() error { return driver.CheckOp(nil) }, "nil op"},
		{"CheckOut", func() error { return driver.CheckOut(nil, nil) }, "nil op"},
		{"CheckOut with an out", func() error { return driver.CheckOut(nil, make([]driver.Decision, 1)) }, "nil op"},
		{"CheckOuts", func() error { return driver.CheckOuts([]*driver.Op{nil}, [][]driver.Decision{nil}) }, "op 0 of the batch"},
		{"CheckOuts after a valid op", func() error {
			return driver.CheckOuts([]*driver.Op{valid, nil}, [][]driver.Decision{nil, nil})
		}, "op 1 of the batch"},
	} {
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s of a nil op panicked: %v", c.name, r)
				}
			}()
			err = c.check()
		}()
		if !errors.Is(err, driver.ErrInvalidOp) {
			t.Errorf("%s of a nil op: got %v, want ErrInvalidOp", c.name, err)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s of a nil op: got %q, want it to say %q", c.name, err, c.want)
		}
	}
	// A batch whose outs are of the wrong length is refused so first.
	if err := driver.CheckOuts([]*driver.Op{nil}, nil); !errors.Is(err, driver.ErrOutLength) {
		t.Errorf("CheckOuts of a nil op and no outs: got %v, want ErrOutLength", err)
	}
}
