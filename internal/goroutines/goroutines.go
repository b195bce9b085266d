// Package goroutines lists the goroutines of the process that run a given
// function, for tests that check a Close ended what it started. It
// imports nothing but the standard library, so that any test may use it
// without adding to its module's requirements.
package goroutines

import (
	"runtime"
	"strings"
)

// CoalesceWorker is the function of internal/coalesce that sends a
// store's calls in the background, one goroutine per destination.
const CoalesceWorker = "internal/coalesce.work["

// Running returns the goroutines ("goroutine 12") whose stack holds fn, a
// function's name as a stack trace writes it, idle or not.
func Running(fn string) []string {
	buf := make([]byte, 1<<20)
	for len(buf) == runtime.Stack(buf, true) {
		buf = make([]byte, 2*len(buf))
	}
	var ids []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, fn) {
			ids = append(ids, strings.SplitN(g, " [", 2)[0])
		}
	}
	return ids
}
