package ratelimit_test

import (
	"context"
	"errors"
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
	if err != nil && !errors.Is(err, ratelimit.ErrStoreUnavailable) {
		return err // bad input, or ctx is done
	}
	if !res.OK {
		return res.Err() // a *ratelimit.LimitError: come back after its RetryAfter
	}
	return nil
}

// packageDocDecide is the end of the package comment's example, word for
// word, from the call of Limit: TestPackageDocExampleCompiles keeps it
// the same, and TestPackageDocExampleRefuses runs it until it refuses.
func packageDocDecide(ctx context.Context, lim *ratelimit.Limiter, userID string) error {
	res, err := lim.Limit(ctx, "sendMessage", userID)
	if err != nil && !errors.Is(err, ratelimit.ErrStoreUnavailable) {
		return err // bad input, or ctx is done
	}
	if !res.OK {
		return res.Err() // a *ratelimit.LimitError: come back after its RetryAfter
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
	// body returns the statements of the function named but the final
	// return nil, a tab less indented, with the comment of the last line.
	body := func(name string) string {
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == name {
				stmts := fn.Body.List[:len(fn.Body.List)-1]
				from := fset.Position(stmts[0].Pos()).Offset
				to := fset.Position(stmts[len(stmts)-1].End()).Offset
				to += strings.IndexByte(string(src[to:]), '\n')
				var lines []string
				for _, line := range strings.Split(string(src[from:to]), "\n") {
					lines = append(lines, strings.TrimPrefix(line, "\t"))
				}
				return strings.Join(lines, "\n")
			}
		}
		t.Fatalf("no function %s", name)
		return ""
	}
	require.Equal(t, body("packageDocExample"), strings.Join(doc, "\n"), "doc.go's example is not packageDocExample's body")
	require.True(t, strings.HasSuffix(strings.Join(doc, "\n"), "\n"+body("packageDocDecide")),
		"doc.go's example does not end with packageDocDecide's body")

	require.NoError(t, packageDocExample(context.Background(), "user-42"))
}

// TestPackageDocExampleDecides requires the package comment's example to
// return an error when the call is refused, and to follow the limit's
// failure policy when the store fails: it returned err, which is nil when
// refused, and the store's error whatever the policy had decided.
func TestPackageDocExampleDecides(t *testing.T) {
	ctx := context.Background()
	newLimiter := func(store ratelimit.Store, failOpen bool) *ratelimit.Limiter {
		lim, err := ratelimit.New(store, ratelimit.Limits{
			"sendMessage": {Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 3, FailOpen: failOpen},
		}, ratelimit.WithLogger(nil))
		require.NoError(t, err)
		return lim
	}

	// The example's limit refuses the fourth message.
	lim := newLimiter(must(memstore.New()), false)
	for range 3 {
		require.NoError(t, packageDocDecide(ctx, lim, "user-42"))
	}
	err := packageDocDecide(ctx, lim, "user-42")
	var limited *ratelimit.LimitError
	require.ErrorAs(t, err, &limited)
	require.ErrorIs(t, err, ratelimit.ErrLimited)
	require.Positive(t, limited.RetryAfter)

	// The store fails: the policy decides.
	store := &flakyStore{Store: must(memstore.New())}
	store.fail.Store(true)
	require.NoError(t, packageDocDecide(ctx, newLimiter(store, true), "user-42"), "failing open")
	require.ErrorIs(t, packageDocDecide(ctx, newLimiter(store, false), "user-42"), ratelimit.ErrLimited, "failing closed")

	// Bad input is returned as it is.
	require.ErrorIs(t, packageDocDecide(ctx, must(ratelimit.New(must(memstore.New()), ratelimit.Limits{})), "user-42"),
		ratelimit.ErrUnknownLimit)
}
