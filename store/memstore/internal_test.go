package memstore

import (
	"fmt"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/stretchr/testify/require"
)

// A call that found its record in a table that has since been resized
// holds a stale copy: claim must refuse it, or the call's write is lost.
// So must it a slot that a delete's shift emptied or refilled.
func TestClaimRefusesAMovedRecord(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	p := driver.Params{Kind: ratelimit.TokenBucket, Rate: 10, Period: 1000, Capacity: 10}
	b := s.Bind("l", p, func(string) int64 { return 0 }).(*bound)
	h := s.hash("k", b.salt)
	st := s.stripeOf(h)
	_, err = b.Decide(t.Context(), "k", driver.ModeLimit, 1_000, 1, false)
	require.NoError(t, err)

	// The call probes: it reads the version and finds the record's slot.
	v := st.version.Load()
	tab := st.tab()
	i, found := tab.find(h, b.limit, "k")
	require.True(t, found)
	old := &tab.recs[i]

	// Meanwhile the stripe grows: the record moves to a new table.
	st.mu.Lock()
	st.resize(4 * len(tab.recs))
	st.mu.Unlock()

	require.Equal(t, moved, claim(st, old, v, "k"), "a stale copy was claimed")
	cur := st.lockRecord(h, b.limit, "k")
	require.NotNil(t, cur)
	require.NotSame(t, old, cur)
	cur.mu.Unlock()

	// A record displaced behind another moves back when the other goes.
	tab = st.tab()
	mask := uint32(len(tab.recs) - 1)
	var a, c string
	for n := 0; a == "" || c == ""; n++ {
		k := fmt.Sprint("x", n)
		kh := s.hash(k, b.salt)
		if s.stripeOf(kh) != st || uint32(kh)&mask != uint32(h)&mask {
			continue
		}
		if a == "" {
			a = k
		} else {
			c = k
		}
	}
	for _, k := range []string{a, c} {
		_, err = b.Decide(t.Context(), k, driver.ModeLimit, 1_000, 1, false)
		require.NoError(t, err)
	}
	ch := s.hash(c, b.salt)
	v = st.version.Load()
	i, found = tab.find(ch, b.limit, c)
	require.True(t, found)
	before := &tab.recs[i]
	require.NoError(t, s.Delete(t.Context(), []driver.RecordID{{Name: "l", Key: "k"}}))
	require.NotEqual(t, claimed, claim(st, before, v, c), "a slot the shift emptied or refilled was claimed")
}
