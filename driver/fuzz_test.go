package driver_test

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/ratelimit-go/ratelimit/driver"
)

// fuzzReader takes the fields of an op from the bytes of a fuzz input,
// each number either one of the values at the edges of CheckOp's rules or
// raw bits, and zero once the bytes run out.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) u64() uint64 {
	var buf [8]byte
	n := copy(buf[:], r.b)
	r.b = r.b[n:]
	return binary.LittleEndian.Uint64(buf[:])
}

var fuzzTimes = []int64{0, 1, -1, driver.MaxTime, driver.MaxTime + 1, -driver.MaxTime, -driver.MaxTime - 1,
	math.MaxInt64, math.MinInt64, 36524 * 24 * 3600 * 1000, 36524*24*3600*1000 + 1, 1_700_000_000_000}

var fuzzFloats = []float64{0, math.Copysign(0, -1), 1, -1, 1e-8, math.Nextafter(1e-8, 0), 1e15, math.Nextafter(1e15, 2e15),
	1e-9 / 1024, math.Nextafter(1e-9/1024, 0), math.NaN(), math.Inf(1), math.Inf(-1), math.MaxFloat64,
	math.SmallestNonzeroFloat64, driver.Noise}

func (r *fuzzReader) int64() int64 {
	if c := r.byte(); int(c) < len(fuzzTimes) {
		return fuzzTimes[c]
	}
	return int64(r.u64())
}

func (r *fuzzReader) float() float64 {
	if c := r.byte(); int(c) < len(fuzzFloats) {
		return fuzzFloats[c]
	}
	return math.Float64frombits(r.u64())
}

func (r *fuzzReader) op() *driver.Op {
	op := &driver.Op{Mode: driver.Mode(r.byte() % 4), Now: r.int64(), Reserve: r.byte()&1 == 1}
	for range r.byte() % 12 { // beyond 8, CheckOp compares records through a map
		it := driver.Item{Name: string(rune('a' + r.byte()%16)), Key: string(rune('k' + r.byte()%2)),
			Count: r.float(), At: r.int64(), Run: r.int64()}
		for range r.byte() % 4 {
			it.Shards = append(it.Shards, driver.Shard{Index: int(int8(r.byte())) * 9, Params: driver.Params{
				Kind: driver.Kind(r.byte() % 4), Rate: r.float(), Period: r.int64(),
				Capacity: r.float(), MaxReserved: r.float(), Phase: r.int64(),
			}})
		}
		op.Items = append(op.Items, it)
	}
	if c := r.byte(); c&1 == 1 {
		op.Settle = &driver.Settlement{Kind: driver.SettleKind(c >> 1 % 4), Until: r.int64()}
	}
	return op
}

// validOp states the rules of CheckOp's doc comment, one by one, as
// plainly as they read.
func validOp(op *driver.Op) bool {
	within := func(t int64) bool { return t >= -driver.MaxTime && t <= driver.MaxTime }
	inRange := func(v, lo, hi float64) bool { return !math.IsNaN(v) && v >= lo && v <= hi }
	refund := op.Mode == driver.ModeRefund
	if op.Mode != driver.ModeLimit && op.Mode != driver.ModeCheck && !refund || !within(op.Now) {
		return false
	}
	type record struct {
		name  string
		shard int
	}
	seen := map[record]bool{}
	for _, it := range op.Items {
		if it.Key != op.Items[0].Key || !inRange(it.Count, 0, math.MaxFloat64) {
			return false
		}
		if !refund && it.Count != 0 && !inRange(it.Count, 1e-8, 1e15) {
			return false
		}
		if refund && (!within(it.At) || !within(it.Run)) {
			return false
		}
		if n := len(it.Shards); n < 1 || n > 2 || refund && n != 1 {
			return false
		}
		for _, sh := range it.Shards {
			p := sh.Params
			if sh.Index < 0 || sh.Index >= driver.MaxShards || seen[record{it.Name, sh.Index}] {
				return false
			}
			seen[record{it.Name, sh.Index}] = true
			if p.Kind != driver.FixedWindow && p.Kind != driver.TokenBucket ||
				p.Period < 1 || p.Period > 36524*24*3600*1000 || p.Phase < 0 || p.Phase >= p.Period ||
				!inRange(p.Rate, 1e-9/1024, 1e15) || !inRange(p.Capacity, 0, 1e15) || !inRange(p.MaxReserved, 0, 1e15) {
				return false
			}
		}
		if len(it.Shards) == 2 {
			a, b := it.Shards[0].Params, it.Shards[1].Params
			a.Phase, b.Phase = 0, 0
			if a != b {
				return false
			}
		}
	}
	if st := op.Settle; st != nil {
		if !refund || len(op.Items) == 0 || st.Kind != driver.SettleCancel && st.Kind != driver.SettleUse || !within(st.Until) {
			return false
		}
	}
	return true
}

// FuzzCheckOp: whatever the op, CheckOp and CheckOut return without a
// panic, accept exactly the ops that keep the rules their doc comment
// lists, and refuse the others with an error matching ErrInvalidOp.
func FuzzCheckOp(f *testing.F) {
	// Valid ops: a limit, a settled refund, a sharded reservation and a
	// check of two items, each byte of a number an index into fuzzTimes or
	// fuzzFloats.
	f.Add([]byte{0, 11, 0, 1, 0, 0, 2, 0, 0, 1, 0, 2, 2, 1, 2, 0, 0, 0})
	f.Add([]byte{2, 11, 0, 1, 0, 0, 2, 11, 11, 1, 0, 1, 2, 9, 2, 0, 0, 3, 11})
	f.Add([]byte{0, 11, 1, 1, 0, 0, 2, 0, 0, 2, 0, 2, 2, 1, 2, 0, 0, 1, 2, 2, 1, 2, 0, 0, 0})
	f.Add([]byte{1, 11, 0, 2, 0, 0, 4, 0, 0, 1, 0, 2, 2, 1, 2, 0, 0, 1, 0, 6, 0, 0, 1, 0, 2, 2, 1, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		op := (&fuzzReader{b}).op()
		err := driver.CheckOp(op)
		if want := validOp(op); want != (err == nil) {
			t.Fatalf("CheckOp(%+v) = %v, and the rules of its doc comment say valid: %v", op, err, want)
		}
		if err != nil && !errors.Is(err, driver.ErrInvalidOp) {
			t.Fatalf("CheckOp(%+v) = %v, which does not match ErrInvalidOp", op, err)
		}
		if got := driver.CheckOut(op, make([]driver.Decision, len(op.Items))); (got == nil) != (err == nil) {
			t.Fatalf("CheckOut(%+v) = %v, CheckOp %v", op, got, err)
		}
	})
}
