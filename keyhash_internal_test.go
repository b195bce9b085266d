package ratelimit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
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
