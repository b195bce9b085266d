package storetest_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/ratelimit-go/ratelimit/store/storetest"
	"github.com/stretchr/testify/require"
)

// mystore stands for a store written elsewhere, built as this module's
// stores are: its New returns the store and an error.
var mystore = struct {
	New func(...memstore.Option) (*memstore.Store, error)
}{memstore.New}

// conformance is the example of the package comment and of
// docs/stores.md, named TestConformance there and with mystore.New's
// arguments left to the reader, so that the compiler checks it.
// (memstore's own tests run the suite.)
func conformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) ratelimit.Store {
		s, err := mystore.New() // a fresh, empty store; register cleanups with t.Cleanup
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

var _ = conformance

// The example of the package comment and of docs/stores.md is conformance,
// word for word. It returned mystore.New(...) from a function of one
// result, which does not compile for a store whose New returns an error
// too, as every store's of this module does.
func TestConformanceExample(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return string(b)
	}
	src := read("doc_test.go")
	start := strings.Index(src, "func conformance(")
	require.GreaterOrEqual(t, start, 0)
	end := strings.Index(src[start:], "\n}\n")
	require.GreaterOrEqual(t, end, 0)
	want := strings.NewReplacer("func conformance(", "func TestConformance(",
		"mystore.New()", "mystore.New(...)").Replace(src[start : start+end+3])

	var doc strings.Builder // the code block of the package comment
	for line := range strings.Lines(read("storetest.go")) {
		if rest, ok := strings.CutPrefix(line, "//\t"); ok {
			doc.WriteString(rest)
		} else if doc.Len() > 0 {
			break
		}
	}
	require.Equal(t, want, doc.String(), "the package comment's example is not conformance")

	page := read(filepath.Join("..", "..", "docs", "stores.md"))
	require.Contains(t, page, "```go\n"+want+"```\n", "docs/stores.md does not show conformance")
}
