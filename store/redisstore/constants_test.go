package redisstore

import (
	"strings"
	"testing"
)

// Every constant of ratelimit.lua is written in from package driver: none
// is left as a placeholder, in the library or in the script.
func TestLuaConstantsFromGo(t *testing.T) {
	for _, code := range []string{lib.code, lib.script} {
		if i := strings.Index(code, "{{"); i >= 0 {
			t.Fatalf("a placeholder is left in the Lua code: %q", code[i:min(len(code), i+40)])
		}
	}
	for _, want := range []string{"local NOISE = 1e-09\n", "local MAX_RETRY = 9223372036854\n", "local PAIR_TRIES = 4\n", "local WAIT_TRIES = 3\n"} {
		if !strings.Contains(lib.code, want) {
			t.Errorf("the Lua code lacks %q", want)
		}
	}
}
