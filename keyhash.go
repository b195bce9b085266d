package ratelimit

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"strings"
	"sync"
	"unsafe"
)

// MinKeySecret is the fewest bytes of secret WithKeyHash accepts, and of
// each key WithTokenKey is given (the signing key and each accepted one).
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

// maxRawKey is the longest key, in bytes, that the store is given as it
// is when no WithKeyHash is set. A longer one (a header, path segment or
// metadata value that a client chose) is given as its digest form,
// longKeyPrefix and the unkeyed SHA-256 of the key in unpadded base64url,
// longKeyLen bytes in all, so that what a store holds for one key is
// bounded whatever its length: a fresh key of a megabyte would otherwise
// make a record of a megabyte in Redis or in the process, kept until its
// bucket is full again. Keys up to maxRawKey keep the store key they had.
const maxRawKey = 256

// longKeyPrefix begins the store key of a key longer than maxRawKey, so
// that the digest form is recognisable where the store shows its keys
// (redis-cli, psql, bbolt, a token's store key). Because it is shown, a
// key of longKeyLen bytes that begins with it is given as its digest form
// too, never as it is: otherwise a client who saw the digest
// form of a long key could send it as a key of its own and spend from the
// long key's record without knowing the long key. So a store key of the
// digest form is always the digest of exactly one key.
const longKeyPrefix = "sha256:"

// longKeyLen is the length of the digest form: the prefix, then the 32
// bytes of a SHA-256 in 43 characters of unpadded base64url.
const longKeyLen = len(longKeyPrefix) + 43

// storeKey returns the key under which the store knows key: key itself,
// its digest form if it is longer than maxRawKey or spelt as a digest
// form (longKey), or its keyed hash (WithKeyHash), whatever its length. A
// short key costs a length check or two and no allocation.
func (l *Limiter) storeKey(key string) string {
	if l.keys == nil && len(key) <= maxRawKey && len(key) != longKeyLen {
		return key
	}
	return l.hashedKey(key)
}

// hashedKey is storeKey of a key that the store may not be given as it
// is: apart, so that storeKey is inlined into the hot path.
func (l *Limiter) hashedKey(key string) string {
	switch {
	case l.keys != nil:
		return l.keys.sum(key)
	case len(key) <= maxRawKey && !strings.HasPrefix(key, longKeyPrefix):
		return key // of longKeyLen bytes, not spelt as a digest form
	}
	return longKey(key)
}

// longKey returns the digest form of key: longKeyPrefix, then the SHA-256
// of key in unpadded base64url.
func longKey(key string) string {
	// The key's bytes as they are, not a copy: a long key may be large,
	// and Sum256 only reads them.
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(key), len(key)))
	var out [longKeyLen]byte
	copy(out[:], longKeyPrefix)
	base64.RawURLEncoding.Encode(out[len(longKeyPrefix):], sum[:])
	return string(out[:])
}
