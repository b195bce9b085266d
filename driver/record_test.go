package driver_test

import (
	"math"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
)

// TestCheckState: CheckState accepts every finite number of tokens (debts
// of unbounded reservations, and values above a capacity lowered since,
// included) at a time from MinRecordTime to MaxTime, and refuses NaN,
// the infinities and times beyond.
func TestCheckState(t *testing.T) {
	for _, st := range []driver.State{
		{Remaining: 0, TS: 0},
		{Remaining: -1e300, TS: 1_700_000_000_000},
		{Remaining: math.MaxFloat64, TS: driver.MaxTime},
		{Remaining: -math.MaxFloat64, TS: driver.MinRecordTime},
		{Remaining: math.SmallestNonzeroFloat64, TS: -driver.MaxTime},
	} {
		if err := driver.CheckState(st); err != nil {
			t.Errorf("CheckState(%+v) = %v, want nil", st, err)
		}
	}
	for _, st := range []driver.State{
		{Remaining: math.NaN(), TS: 0},
		{Remaining: math.Inf(1), TS: 0},
		{Remaining: math.Inf(-1), TS: 0},
		{Remaining: 5, TS: driver.MaxTime + 1},
		{Remaining: 5, TS: driver.MinRecordTime - 1},
		{Remaining: 5, TS: math.MaxInt64},
		{Remaining: 5, TS: math.MinInt64},
	} {
		if err := driver.CheckState(st); err == nil {
			t.Errorf("CheckState(%+v) = nil, want an error", st)
		}
	}
}

// TestRecordTimesAreWithinBounds: the earliest and latest times a record
// can be written with, a fixed window of the longest period whose window
// starts as early as it can before the earliest now, and a call at the
// latest now, are within CheckState's bounds.
func TestRecordTimesAreWithinBounds(t *testing.T) {
	period := ratelimit.MaxPeriod.Milliseconds()
	now := -driver.MaxTime
	phase := ((now+1)%period + period) % period // now is the last ms of its window
	p := driver.Params{Kind: driver.FixedWindow, Rate: 1, Period: period, Capacity: 1, Phase: phase}
	var d driver.Decision
	st := ratelimit.TransitionInto(&d, &p, driver.State{}, false, now, 1, false)
	if !d.OK || st.TS != driver.MinRecordTime+1 {
		t.Fatalf("the earliest window: got %+v (%+v), want a grant and a time of MinRecordTime+1 (%d)", st, d, driver.MinRecordTime+1)
	}
	if err := driver.CheckState(st); err != nil {
		t.Errorf("the earliest window's record: %v", err)
	}
	p.Kind = driver.TokenBucket
	st = ratelimit.TransitionInto(&d, &p, driver.State{}, false, driver.MaxTime, 1, false)
	if err := driver.CheckState(st); err != nil || st.TS != driver.MaxTime {
		t.Errorf("the latest record: %+v: %v", st, err)
	}
}
