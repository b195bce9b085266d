package testserver

import (
	"runtime"
	"strings"
)

// CoalesceWorkers returns the goroutines ("goroutine 12") that run the
// workers of internal/coalesce, which send a store's calls in the
// background, idle or not: a test of a store's Close checks that the
// workers it started are gone.
func CoalesceWorkers() []string {
	buf := make([]byte, 1<<20)
	for len(buf) == runtime.Stack(buf, true) {
		buf = make([]byte, 2*len(buf))
	}
	var ids []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "internal/coalesce.work[") {
			ids = append(ids, strings.SplitN(g, " [", 2)[0])
		}
	}
	return ids
}
