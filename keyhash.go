package ratelimit

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"sync"
)

// MinKeySecret is the fewest bytes of secret WithKeyHash accepts.
const MinKeySecret = 16

// Keyed hashes are HMAC-SHA256 cut to keyHashBytes (128 bits: distinct
// keys of one secret never meet by chance), written in unpadded base64url,
// keyHashLen characters.
const (
	keyHashBytes = 16
	keyHashLen   = 22
)

// WithKeyHash makes the Limiter give the store, in place of each key, a
// keyed hash of it: HMAC-SHA256 of the key under secret, its first 16
// bytes written in 22 characters of unpadded base64url. API keys, user
// IDs and addresses then appear neither in the store's record names
// (Redis keys, PostgreSQL rows, bbolt keys) nor in what the store logs or
// replicates; what the Limiter returns (Result.Key, LimitError) and tells
// its Observer keeps the key as given.
//
// Every process sharing a store must use the same secret, and so must
// the ratelimit command's inspect and reset (--key-secret, or the
// RATELIMIT_KEY_SECRET environment variable), which read and reset a key
// by its clear form. Changing the secret, or turning hashing on or off,
// starts every key afresh: its records are then others, and the old ones
// expire unused. A fixed window's derived phase comes from the hashed key,
// so it changes too. The secret must hold at least MinKeySecret bytes (32
// random ones are best); a shorter one makes New fail with an error
// matching ErrInvalidOption. See docs/production.md for what hashing
// costs.
func WithKeyHash(secret []byte) Option {
	return func(l *Limiter) {
		if len(secret) < MinKeySecret {
			l.optErr = fmt.Errorf("ratelimit: WithKeyHash: the secret has %d bytes, fewer than %d: use at least %d random bytes (32 from crypto/rand are best), the same in every process sharing the store: %w",
				len(secret), MinKeySecret, MinKeySecret, ErrInvalidOption)
			return
		}
		l.keys = newKeyHasher(secret)
	}
}

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
