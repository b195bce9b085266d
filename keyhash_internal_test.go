package ratelimit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestKeyHasherSum checks sum against HMAC-SHA256 computed afresh, for
// keys shorter and longer than the chunk it writes them by, and from
// several goroutines at once (the pool).
func TestKeyHasherSum(t *testing.T) {
	secret := []byte("0123456789abcdef-secret")
	k := newKeyHasher(secret)
	want := func(key string) string {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(key))
		return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:keyHashBytes])
	}
	keys := []string{"", "a", "user-42", strings.Repeat("k", 63), strings.Repeat("k", 64), strings.Repeat("x", 1000)}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				for _, key := range keys {
					got := k.sum(key)
					assert.Len(t, got, keyHashLen)
					assert.Equal(t, want(key), got, "key of %d bytes", len(key))
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkKeyHasherSum measures the keyed hash of one short key alone.
func BenchmarkKeyHasherSum(b *testing.B) {
	k := newKeyHasher([]byte("0123456789abcdef0123456789abcdef"))
	b.ReportAllocs()
	for b.Loop() {
		_ = k.sum("user-1234567")
	}
}

// The digest form of a long key is "sha256:" and the key's SHA-256 in
// unpadded base64url, longKeyLen (50) bytes, as docs/api.md says; keys of
// up to maxRawKey (256) bytes reach the store as they are, with no
// allocation, and longer ones as their digest form.
func TestStoreKeyOfLongKeys(t *testing.T) {
	assert.Equal(t, 256, maxRawKey)
	assert.Equal(t, 50, longKeyLen)
	l := &Limiter{}
	for _, n := range []int{0, 1, longKeyLen, 255, 256} {
		key := strings.Repeat("k", n)
		assert.Equal(t, key, l.storeKey(key), "a key of %d bytes", n)
	}
	for _, n := range []int{257, 4096, 1 << 20} {
		key := strings.Repeat("k", n)
		sum := sha256.Sum256([]byte(key))
		want := "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:])
		got := l.storeKey(key)
		assert.Equal(t, want, got, "a key of %d bytes", n)
		assert.Len(t, got, longKeyLen)
	}
	// A key spelt as a digest form is given as its own digest form.
	lookalike := "sha256:" + strings.Repeat("A", 43)
	sum := sha256.Sum256([]byte(lookalike))
	assert.Equal(t, "sha256:"+base64.RawURLEncoding.EncodeToString(sum[:]), l.storeKey(lookalike))
	for _, short := range []string{strings.Repeat("k", maxRawKey), strings.Repeat("k", longKeyLen)} {
		assert.Zero(t, testing.AllocsPerRun(100, func() { _ = l.storeKey(short) }), "a short key allocates nothing")
	}
	h := &Limiter{keys: newKeyHasher([]byte("0123456789abcdef"))}
	long := strings.Repeat("k", 1000)
	assert.Equal(t, h.keys.sum(long), h.storeKey(long), "WithKeyHash: the keyed hash of the key as given")
}

// BenchmarkStoreKey measures the store key of a short key (as it is) and
// of a long one (its digest form).
func BenchmarkStoreKey(b *testing.B) {
	l := &Limiter{}
	for _, n := range []int{16, 1024} {
		key := strings.Repeat("k", n)
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = l.storeKey(key)
			}
		})
	}
}
