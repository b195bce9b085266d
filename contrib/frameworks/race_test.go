//go:build race

package frameworks_test

// raceEnabled reports whether the tests run under the race detector,
// which drops items put in a sync.Pool at random.
const raceEnabled = true
