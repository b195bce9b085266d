package memstore

import (
	"fmt"
	"math/bits"
	"testing"
)

// TestHashStringSpreads checks that hashString spreads keys alike but for
// a digit or a length over the stripes (its top bits) and the home slots
// (its low bits), and that every bit of a short key moves about half the
// bits of its hash.
func TestHashStringSpreads(t *testing.T) {
	for _, seed := range []uint64{0, 1, 0x9e3779b97f4a7c15} {
		const n = 1 << 16
		var stripes [1 << stripeBits]int
		slots := make(map[uint64]int)
		for i := range n {
			key := fmt.Sprint("user-", i)
			if i%3 == 0 {
				key = fmt.Sprintf("tenant-%08d/route/%d", i, i%7) // over 16 bytes
			}
			h := hashString(seed, key)
			stripes[h>>(64-stripeBits)]++
			slots[h&(1<<20-1)]++
		}
		mean := n / len(stripes)
		for i, c := range stripes {
			if c < mean*8/10 || c > mean*12/10 {
				t.Errorf("seed %#x: stripe %d holds %d of %d keys, not within 20%% of %d", seed, i, c, n, mean)
			}
		}
		// 65,536 keys in 2^20 slots: about 63,600 distinct slots expected.
		if len(slots) < 63_000 {
			t.Errorf("seed %#x: %d keys took %d distinct 20-bit slots, want about 63,600", seed, n, len(slots))
		}
	}
	for _, key := range []string{"a", "abc", "user-1", "user-1234", "0123456789abcdef", "a key longer than 16 bytes"} {
		h := hashString(7, key)
		for i := range len(key) * 8 {
			b := []byte(key)
			b[i/8] ^= 1 << (i % 8)
			if d := bits.OnesCount64(h ^ hashString(7, string(b))); d < 12 || d > 52 {
				t.Errorf("key %q: flipping bit %d changed %d bits of its hash, want about 32", key, i, d)
			}
		}
		if hashString(7, key) == hashString(8, key) {
			t.Errorf("key %q: the same hash under seeds 7 and 8", key)
		}
	}
}
