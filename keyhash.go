package ratelimit

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"sync"
)

// MinKeySecret is the fewest bytes of secret WithKeyHash accepts, and of
// key WithTokenKey accepts.
const MinKeySecret = 16

// Keyed hashes are HMAC-SHA256 cut to keyHashBytes (128 bits: distinct
// keys of one secret never meet by chance), written in unpadded base64url,
// keyHashLen characters.
const (
	keyHashBytes = 16
	keyHashLen   = 22
)

// keyHasher computes the keyed hashes of WithKeyHash. An HMAC is not safe
// for concurrent use, so each call borrows one from a pool.
type keyHasher struct {
	macs sync.Pool // of *keyMAC
}

// keyMAC is an HMAC with buffers of its own, so that writing a key and
// reading the sum allocate nothing.
type keyMAC struct {
	h     hash.Hash
	chunk [64]byte
	sum   [sha256.Size]byte
}

func newKeyHasher(secret []byte) *keyHasher {
	secret = bytes.Clone(secret) // the caller's slice may change
	k := &keyHasher{}
	k.macs.New = func() any { return &keyMAC{h: hmac.New(sha256.New, secret)} }
	return k
}

// sum returns the keyed hash of key.
func (k *keyHasher) sum(key string) string {
	m := k.macs.Get().(*keyMAC)
	m.h.Reset()
	for len(key) > 0 {
		n := copy(m.chunk[:], key)
		m.h.Write(m.chunk[:n])
		key = key[n:]
	}
	m.h.Sum(m.sum[:0])
	var out [keyHashLen]byte
	base64.RawURLEncoding.Encode(out[:], m.sum[:keyHashBytes])
	k.macs.Put(m)
	return string(out[:])
}

// storeKey returns the key under which the store knows key: key itself,
// or its keyed hash (WithKeyHash).
func (l *Limiter) storeKey(key string) string {
	if l.keys == nil {
		return key
	}
	return l.keys.sum(key)
}
