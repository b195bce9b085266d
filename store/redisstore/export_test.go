package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
)

// CallerError is s.callerError, for the tests of the shape of its errors.
func CallerError(s *Store, ctx context.Context, err error) error { return s.callerError(ctx, err) }

// Batchers returns how many batchers s keeps: one per server called lately.
func Batchers(s *Store) int {
	if s.nodes == nil {
		return 1
	}
	return s.nodes.Len()
}

// PreviousLibrary returns the name and the code of the library the
// release before the time function loaded: the same ratelimit.lua,
// registering the decision function alone, named by the digest of the
// file alone.
func PreviousLibrary() (name, code string) {
	src := luaConstants.Replace(luaSource)
	sum := sha1.Sum([]byte(src))
	name = "ratelimit_" + hex.EncodeToString(sum[:8])
	return name, "#!lua name=" + name + "\n" + src + "\nredis.register_function{function_name='" + name +
		"', callback=apply, flags={'allow-cross-slot-keys'}}\n"
}

// SetProbeEvery sets how many calls of s go by script, for a load of its
// library refused, before one tries the function (probeEvery); before
// its first call.
func SetProbeEvery(s *Store, n uint64) { s.probeEvery = n }

// OnLoad has fn called each time a call of s that found the library
// missing had it loaded, or its load refused, before the call goes again.
func OnLoad(s *Store, fn func()) { s.hooks.loaded = fn }

// LeaveScripts is s.leaveScripts: what another call does meanwhile that
// finds the library (probe) or a script refused.
func LeaveScripts(s *Store) bool { return s.leaveScripts() }
