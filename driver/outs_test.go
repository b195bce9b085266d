package driver_test

import (
	"errors"
	"math"
	"testing"

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
