package frameworks_test

// must returns v, and panics with err when a constructor that cannot fail
// with the arguments a test gives it fails all the same.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
