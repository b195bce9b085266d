package boltstore_test

import (
	"path/filepath"
	"testing"

	"github.com/ratelimit-go/ratelimit/store/boltstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
)

// go test -run '^$' -bench . ./store/boltstore

func BenchmarkLimit(b *testing.B) {
	s, err := boltstore.Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchmarkLimit(b, s)
}
