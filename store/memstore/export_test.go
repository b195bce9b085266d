package memstore

import "hash/maphash"

// ExpiryOf returns the expiry the store keeps for the record (name, key, 0),
// or -1 if it holds none.
func ExpiryOf(s *Store, name, key string) int64 {
	l := s.limitOf(name, 0, false)
	if l == nil {
		return -1
	}
	h := maphash.String(s.keySeed, key) ^ l.salt
	st := s.stripeOf(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	i, found := st.find(h, l.id, key)
	if !found {
		return -1
	}
	if st.slots[i].expires < deferredLimit {
		return s.expiry(&st.slots[i])
	}
	return st.slots[i].expires
}
