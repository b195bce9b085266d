// Package doctest keeps the Go blocks of the manual's pages the same as
// functions of tests, so that the compiler checks the blocks: each block
// is the body of a function, but its final return, which the page leaves
// out, and a test compares the two (Blocks, Bodies). A block's free names
// (ctx, lim, store, …) are its function's parameters. A contrib module,
// whose imports the library's module does not have, checks the blocks
// that use it in a test of its own, reading the page from ../../docs.
package doctest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// IntegrationsSections are the sections of docs/integrations.md whose Go
// blocks each contrib module's tests check, by the module's directory
// under contrib/. Every Go block of the page is in one of them
// (TestIntegrationsDocBlocksChecked).
var IntegrationsSections = map[string][]string{
	"otel":       {"### OpenTelemetry", "## Traces: spans around store calls"},
	"prometheus": {"### Prometheus"},
	"grpc":       {"## gRPC"},
}

// Blocks returns the Go blocks (```go) of the Markdown page at path that
// lie in the sections of the headings given (each a whole heading line,
// such as "### Prometheus"; a section runs to the next heading of its
// level or higher), in the page's order; with no headings, every Go block
// of the page.
func Blocks(t testing.TB, path string, headings ...string) []string {
	t.Helper()
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	in, level, fenced := len(headings) == 0, 0, false
	var block *strings.Builder
	for line := range strings.Lines(string(page)) {
		line = strings.TrimSuffix(line, "\n")
		switch {
		case block != nil && line == "```":
			if in {
				blocks = append(blocks, block.String())
			}
			block = nil
		case block != nil:
			block.WriteString(line + "\n")
		case strings.HasPrefix(line, "```"):
			fenced = !fenced
			if fenced && line == "```go" {
				block, fenced = &strings.Builder{}, false
			}
		case !fenced && strings.HasPrefix(line, "#"):
			n := len(line) - len(strings.TrimLeft(line, "#"))
			if len(headings) > 0 && in && n <= level {
				in = false
			}
			for _, h := range headings {
				if line == h {
					in, level = true, n
				}
			}
		}
	}
	if block != nil {
		t.Fatalf("%s: a Go block is not closed", path)
	}
	return blocks
}

// Bodies returns the bodies of the functions of the Go files given whose
// names start with prefix, in the files' order: the statements of each but
// a final return, with the comment that ends the last line, one tab of
// indentation taken off, as a block of a page writes them.
func Bodies(t testing.TB, prefix string, files ...string) []string {
	t.Helper()
	var bodies []string
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || !strings.HasPrefix(fn.Name.Name, prefix) || fn.Body == nil || len(fn.Body.List) == 0 {
				continue
			}
			stmts := fn.Body.List
			if _, ok := stmts[len(stmts)-1].(*ast.ReturnStmt); ok && len(stmts) > 1 {
				stmts = stmts[:len(stmts)-1] // the return the page leaves out
			}
			from := fset.Position(stmts[0].Pos()).Offset
			to := fset.Position(stmts[len(stmts)-1].End()).Offset
			if i := strings.IndexByte(string(src[to:]), '\n'); i >= 0 {
				to += i // and its comment
			}
			var body strings.Builder
			for line := range strings.Lines(string(src[from:to]) + "\n") {
				body.WriteString(strings.TrimPrefix(line, "\t"))
			}
			bodies = append(bodies, body.String())
		}
	}
	return bodies
}
