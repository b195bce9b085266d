package driver_test

import (
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
