package ratelimit

import (
	"math/rand/v2"
	"sync"
)

// Phase of a fixed window without Start: hash(name, key, shard) mod Period,
// with an optional per-deployment seed. A stable, well-mixed hash (FNV-1a
// over the length-prefixed fields, then the splitmix64 finalizer) spreads
// the phases uniformly across keys, every process agrees on it without a
// read, and a record dropped when full is re-created with the same windows.

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvString(h uint64, s string) uint64 {
	h = fnvUint(h, uint64(len(s)))
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

func fnvUint(h, v uint64) uint64 {
	for i := 0; i < 8; i++ {
		h ^= v & 0xff
		h *= fnvPrime
		v >>= 8
	}
	return h
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// phaseHash returns the derived phase of a record in [0, period).
func phaseHash(seed uint64, name, key string, shard int, period int64) int64 {
	h := fnvUint(fnvOffset, seed)
	h = fnvString(h, name)
	h = fnvString(h, key)
	h = fnvUint(h, uint64(shard))
	return int64(mix64(h) % uint64(period))
}

// floorMod returns a mod m in [0, m).
func floorMod(a, m int64) int64 {
	r := a % m
	if r < 0 {
		r += m
	}
	return r
}

// picker chooses the two shards a call evaluates.
type picker struct {
	mu  sync.Mutex
	src rand.Source // nil: the runtime's goroutine-safe generator
}

// pick returns two distinct shards in [0, n), n ≥ 2, uniformly.
func (p *picker) pick(n int) (a, b int) {
	var x, y uint64
	if p.src == nil {
		x, y = rand.Uint64(), rand.Uint64()
	} else {
		p.mu.Lock()
		x, y = p.src.Uint64(), p.src.Uint64()
		p.mu.Unlock()
	}
	a = int(x % uint64(n))
	b = int(y % uint64(n-1))
	if b >= a {
		b++
	}
	return a, b
}
