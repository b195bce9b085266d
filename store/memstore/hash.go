package memstore

import "math/bits"

// The hash of a record's key: a seeded multiply-and-fold hash after the
// design of wyhash (public domain), whose constants it uses, as Go's
// runtime hash does on 64-bit machines. maphash.String hashes as well, but through three calls (with
// AES, 67 instructions for a short key, 8% of a call); this takes about a
// third of that. Its seed is random per Store, so that which keys collide
// cannot be known outside the process.

// Odd constants with about as many bits set as clear, to mix the input.
const (
	mixA = 0xa0761d6478bd642f
	mixB = 0xe7037ed1a0b428db
	mixC = 0x8ebc6af09c88c6e3
)

// fold multiplies a by b in 128 bits and folds the product's halves
// together: each bit of the result depends on most bits of a and b.
func fold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// load64 reads s[0:8] as a little-endian number: one load, as the
// compiler merges the byte loads.
func load64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// load32 reads s[0:4] as a little-endian number.
func load32(s string) uint64 {
	_ = s[3]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24
}

// hashString returns the hash of s under seed. Keys of up to 16 bytes
// (the common ones) are read in at most two loads each way, overlapping
// when shorter; longer ones 16 bytes a round, then their last 16.
func hashString(seed uint64, s string) uint64 {
	n := len(s)
	var a, b uint64
	switch {
	case n > 16:
		t := s
		for len(t) > 16 {
			seed = fold(load64(t)^mixA, load64(t[8:])^seed)
			t = t[16:]
		}
		a, b = load64(s[n-16:]), load64(s[n-8:])
	case n >= 8:
		a, b = load64(s), load64(s[n-8:])
	case n >= 4:
		a, b = load32(s), load32(s[n-4:])
	case n > 0:
		a = uint64(s[0])<<16 | uint64(s[n>>1])<<8 | uint64(s[n-1])
	}
	return fold(mixB^uint64(n), fold(a^mixA, b^seed^mixC))
}
