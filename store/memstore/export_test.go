package memstore

import (
	"unsafe"
)

// A stripe fills one cache line, and so does a record.
var (
	_ [64]byte = [unsafe.Sizeof(stripe{})]byte{}
	_ [64]byte = [unsafe.Sizeof(record{})]byte{}
)

// ExpiryOf returns the expiry the store keeps for the record (name, key, 0),
// or -1 if it holds none.
func ExpiryOf(s *Store, name, key string) int64 {
	l := s.limitOf(name, 0, false)
	if l == nil {
		return -1
	}
	h := s.hash(key, l.salt)
	st := s.stripeOf(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	t := st.tab()
	if t == nil {
		return -1
	}
	i, found := t.find(h, l.id, key)
	if !found {
		return -1
	}
	r := &t.recs[i]
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.expires < deferredLimit {
		return s.expiry(r)
	}
	return r.expires
}

// Marks returns how many settlements' marks the store holds.
func Marks(s *Store) int {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	return len(s.marks)
}
