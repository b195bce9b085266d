package ratelimit_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/require"
)

// packageDocExample is the example of the package comment (doc.go),
// word for word, so that the compiler checks it:
// TestPackageDocExampleCompiles keeps the two the same.
func packageDocExample(ctx context.Context, userID string) error {
	store, err := memstore.New()
	if err != nil {
		return err
	}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"freeTrialSignUp": {Kind: ratelimit.FixedWindow, Rate: 100, Period: time.Hour},
		"sendMessage":     {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 3},
	})
	if err != nil {
		return err
	}
	res, err := lim.Limit(ctx, "sendMessage", userID)
	if err != nil {
		return err
	}
	if !res.OK {
		// refuse, and tell the client to come back after res.RetryAfter
	}
	return nil
}

// The package comment's example is packageDocExample's body, and so
// compiles. It called ratelimit.New(memstore.New(), …), but memstore.New
// returns (*Store, error): copied into a program, it did not compile.
func TestPackageDocExampleCompiles(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	var doc []string // the first code block of the package comment
	for _, line := range strings.Split(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "//\t"); ok {
			doc = append(doc, rest)
		} else if len(doc) > 0 {
			break
		}
	}
	require.NotEmpty(t, doc, "doc.go has no example")

	fset := token.NewFileSet()
	src, err = os.ReadFile("doc_test.go")
	require.NoError(t, err)
	f, err := parser.ParseFile(fset, "doc_test.go", src, 0)
	require.NoError(t, err)
	var body []string
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "packageDocExample" {
			// The statements but the final return nil, a tab less indented.
			stmts := fn.Body.List[:len(fn.Body.List)-1]
			from := fset.Position(stmts[0].Pos()).Offset
			to := fset.Position(stmts[len(stmts)-1].End()).Offset
			for _, line := range strings.Split(string(src[from:to]), "\n") {
				body = append(body, strings.TrimPrefix(line, "\t"))
			}
		}
	}
	require.Equal(t, strings.Join(body, "\n"), strings.Join(doc, "\n"), "doc.go's example is not packageDocExample's body")

	require.NoError(t, packageDocExample(context.Background(), "user-42"))
}
