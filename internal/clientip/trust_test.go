package clientip

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/clientip/clientiptest"
)

// largeList is a list of 131,072 trusted prefixes in no order: the /24s
// of 10.0.0.0/8 and the NAT64 /120s of 10.0.0.0/8's clients, which every
// check of Trust reads (the IPv4 and IPv6 covers, the translated /96s, the
// IPv4 clients the NAT64 ones stand for).
func largeList() []netip.Prefix {
	ps := append(clientiptest.Split(netip.MustParsePrefix("10.0.0.0/8"), 24),
		clientiptest.Split(netip.MustParsePrefix("64:ff9b::a00:0/104"), 120)...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
	return ps
}

// BenchmarkTrust measures Trust on a large list, which a service builds
// once, at its start, from a file of its proxies or a CDN's ranges.
func BenchmarkTrust(b *testing.B) {
	ps := largeList()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Trust(XForwardedFor, ps); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMergeIsTheRangesMerged: merge and lastAddr, which work on numbers,
// give what merging netip.Addr ranges gives, for random prefixes of both
// families (IPv4-mapped ones among the IPv6), of every length, many
// touching or overlapping, given in one list or split over several.
func TestMergeIsTheRangesMerged(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	// prefix returns a random prefix, masked, near one of a few bases so
	// that prefixes meet.
	bases := []netip.Addr{netip.MustParseAddr("10.0.0.0"), netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("0.0.0.0"),
		netip.MustParseAddr("64:ff9b::a00:0"), netip.MustParseAddr("::ffff:10.0.0.0"), netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
		netip.MustParseAddr("::"), netip.MustParseAddr("2001:db8:ffff:ffff:ffff:ffff:ffff:ff00")}
	prefix := func() netip.Prefix {
		a := bases[r.IntN(len(bases))]
		b := a.AsSlice()
		for range r.IntN(4) {
			b[len(b)-1-r.IntN(min(len(b), 3))] ^= byte(r.Uint32())
		}
		if r.IntN(4) == 0 {
			b[r.IntN(len(b))] ^= 1 << r.IntN(8)
		}
		a, _ = netip.AddrFromSlice(b)
		bits := a.BitLen() - r.IntN(min(a.BitLen(), 24)+1)
		if r.IntN(8) == 0 {
			bits = r.IntN(a.BitLen() + 1)
		}
		return netip.PrefixFrom(a, bits).Masked()
	}
	for range 2000 {
		ps := make([]netip.Prefix, r.IntN(40))
		for i := range ps {
			ps[i] = prefix()
			if got, want := lastAddr(ps[i]), refLastAddr(ps[i]); got != want {
				t.Fatalf("lastAddr(%v): got %v, want %v", ps[i], got, want)
			}
		}
		cut := r.IntN(len(ps) + 1)
		for _, first := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
			want := refMerge(ps, first)
			if got := merge(first, ps); !slices.Equal(got, want) {
				t.Fatalf("merge(%v, %v): got %v, want %v", first, ps, got, want)
			}
			if got := merge(first, ps[:cut], nil, ps[cut:]); !slices.Equal(got, want) {
				t.Fatalf("merge(%v, %v, %v): got %v, want %v", first, ps[:cut], ps[cut:], got, want)
			}
			if got, want := coversEvery(first, ps), len(want) == 1 && want[0].lo == first && !want[0].hi.Next().IsValid(); got != want {
				t.Fatalf("coversEvery(%v, %v): got %v, want %v", first, ps, got, want)
			}
		}
	}
	for _, c := range []struct {
		first netip.Addr
		ps    []netip.Prefix
	}{
		{netip.IPv4Unspecified(), clientiptest.Prefixes("0.0.0.0/0")},
		{netip.IPv4Unspecified(), clientiptest.Prefixes("128.0.0.0/1", "0.0.0.0/1")},
		{netip.IPv6Unspecified(), clientiptest.Prefixes("::/0")},
		{netip.IPv6Unspecified(), clientiptest.Prefixes("8000::/1", "::/1")},
	} {
		if !coversEvery(c.first, c.ps) {
			t.Errorf("coversEvery(%v, %v): got false", c.first, c.ps)
		}
	}
}

// refMerge and refLastAddr are merge and lastAddr as they were written on
// netip.Addr, before they worked on numbers.
func refMerge(ps []netip.Prefix, first netip.Addr) []span {
	var spans []span
	for _, p := range ps {
		if p.Addr().BitLen() == first.BitLen() {
			spans = append(spans, span{p.Masked().Addr(), refLastAddr(p)})
		}
	}
	slices.SortFunc(spans, func(a, b span) int { return a.lo.Compare(b.lo) })
	var out []span
	for _, s := range spans {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if next := last.hi.Next(); !next.IsValid() || !next.Less(s.lo) {
				if last.hi.Less(s.hi) {
					last.hi = s.hi
				}
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

func refLastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
