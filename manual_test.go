package ratelimit_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// manualPages are the pages of the manual whose names and example outputs
// the tests below check: README.md and docs/, but docs/performance.md, a
// record of measurements made with the code of their day.
func manualPages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md"}
	for _, glob := range []string{"docs/*.md", "docs/stores/*.md"} {
		m, err := filepath.Glob(glob)
		require.NoError(t, err)
		pages = append(pages, m...)
	}
	pages = slices.DeleteFunc(pages, func(p string) bool { return p == filepath.Join("docs", "performance.md") })
	require.Greater(t, len(pages), 10)
	return pages
}

// mdBlock is a fenced code block of a page, with the paragraphs of text
// around it.
type mdBlock struct {
	info, text    string
	before, after string // the paragraph just before the block, and just after
	line          int
}

// mdBlocks splits a page into its fenced code blocks and its prose (the
// text outside the blocks).
func mdBlocks(page string) (blocks []mdBlock, prose string) {
	var (
		b     strings.Builder
		in    *mdBlock
		para  []string // the paragraph being read
		prev  []string // the last paragraph ended
		owner *mdBlock // the block whose after-paragraph para is
	)
	endPara := func() {
		if len(para) > 0 {
			if owner != nil {
				owner.after = strings.Join(para, "\n")
				owner = nil
			}
			prev, para = para, nil
		}
	}
	for i, line := range strings.Split(page, "\n") {
		fence := strings.HasPrefix(strings.TrimLeft(line, " "), "```") // also a list item's
		switch {
		case in != nil && fence:
			blocks = append(blocks, *in)
			owner = &blocks[len(blocks)-1]
			in, prev = nil, nil
		case in != nil:
			in.text += line + "\n"
		case fence:
			endPara()
			in = &mdBlock{info: strings.TrimPrefix(strings.TrimLeft(line, " "), "```"), before: strings.Join(prev, "\n"), line: i + 1}
			owner = nil // a block right after another has no paragraph between
		case strings.TrimSpace(line) == "":
			endPara()
			b.WriteString("\n")
		default:
			para = append(para, line)
			b.WriteString(line + "\n")
		}
	}
	endPara()
	return blocks, b.String()
}

// manualPackages maps the package names the manual qualifies names with
// to their directories.
var manualPackages = map[string]string{
	"ratelimit":     ".",
	"driver":        "driver",
	"httplimit":     "httplimit",
	"memstore":      "store/memstore",
	"boltstore":     "store/boltstore",
	"redisstore":    "store/redisstore",
	"pgstore":       "store/pgstore",
	"janitor":       "store/janitor",
	"storetest":     "store/storetest",
	"ratelimitgrpc": "contrib/grpc",
	"ratelimitotel": "contrib/otel",
	"ratelimitprom": "contrib/prometheus",
}

// exportedNames returns the exported names a package's files declare: its
// functions, types, variables and constants, and T.M for each method,
// field and interface method M of a type T.
func exportedNames(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	names := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					names[d.Name.Name] = true
					continue
				}
				recv := d.Recv.List[0].Type
				if s, ok := recv.(*ast.StarExpr); ok {
					recv = s.X
				}
				if id, ok := recv.(*ast.Ident); ok {
					names[id.Name+"."+d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							names[n.Name] = true
						}
					case *ast.TypeSpec:
						names[s.Name.Name] = true
						var fields *ast.FieldList
						switch ty := s.Type.(type) {
						case *ast.StructType:
							fields = ty.Fields
						case *ast.InterfaceType:
							fields = ty.Methods
						}
						if fields == nil {
							continue
						}
						for _, f := range fields.List {
							for _, n := range f.Names {
								names[s.Name.Name+"."+n.Name] = true
							}
						}
					}
				}
			}
		}
	}
	return names
}

// Every name the manual's prose gives with its package (`driver.ExpiryGrace`,
// `ratelimit.Settler`, `driver.RecordID.AppendKey`) is one that package
// declares. docs/architecture.md sent store authors to driver.FullAt, which
// is ratelimit.FullAt.
func TestManualNamesExist(t *testing.T) {
	qualified := regexp.MustCompile(`\b([a-z]+)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)
	code := regexp.MustCompile("`[^`\n]+`")
	known := map[string]map[string]bool{}
	checked := 0
	for _, page := range manualPages(t) {
		src, err := os.ReadFile(page)
		require.NoError(t, err)
		_, prose := mdBlocks(string(src))
		for _, span := range code.FindAllString(prose, -1) {
			for _, m := range qualified.FindAllStringSubmatch(span, -1) {
				dir, ok := manualPackages[m[1]]
				if !ok {
					continue
				}
				if known[dir] == nil {
					known[dir] = exportedNames(t, dir)
				}
				name := m[2]
				if m[3] != "" && !known[dir][name+"."+m[3]] {
					// pkg.T.M where M is a member of T, or pkg.F followed by
					// a word of another kind.
					name += "." + m[3]
				}
				assert.True(t, known[dir][name], "%s: %s names %s.%s, which package %s does not declare", page, span, m[1], name, dir)
				checked++
			}
		}
	}
	require.Greater(t, checked, 100)
}

// exampleOutput returns the text that the // Output: comment of the
// example fn declares in the Go file src, and whether src declares fn.
func exampleOutput(src, fn string) (string, bool) {
	_, body, ok := strings.Cut(src, "\nfunc "+fn+"() {\n")
	if !ok {
		return "", false
	}
	body, _, _ = strings.Cut(body, "\n}\n")
	_, out, ok := strings.Cut(body, "\t// Output:\n")
	if !ok {
		return "", true
	}
	var b strings.Builder
	for line := range strings.Lines(out) {
		line = strings.TrimPrefix(strings.TrimPrefix(line, "\t//"), " ")
		b.WriteString(line)
	}
	return strings.TrimSuffix(b.String(), "\n") + "\n", true
}

// A page that shows what an example prints (a block of plain text after,
// or else before, a paragraph that names the example, `ExampleX`, or links
// its test file) shows that example's // Output:, which go test checks.
// Without the name, the block is the output of one of the examples of the
// file the paragraph links; without the link, of the test file the page
// linked last, or else of an example of that name anywhere in the repository.
// Nothing checked the pages' copies of the examples' output.
func TestManualExampleOutputs(t *testing.T) {
	exampleName := regexp.MustCompile("`(Example\\w*)`")
	testFile := regexp.MustCompile(`\]\(([^)#\s]+_test\.go)\)`)
	exampleFunc := regexp.MustCompile(`(?m)^func (Example\w*)\(\) \{$`)
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return string(b)
	}
	// everywhere finds an example by its name in the repository's test
	// files, when the page names no file.
	everywhere := func(fn string) []string {
		var found []string
		err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
				return err
			}
			if _, ok := exampleOutput(read(path), fn); ok {
				found = append(found, path)
			}
			return nil
		})
		require.NoError(t, err)
		return found
	}
	checked := 0
	for _, page := range manualPages(t) {
		src := read(page)
		blocks, _ := mdBlocks(src)
		lines := strings.Split(src, "\n")
		for _, b := range blocks {
			// The test file the page linked last, before the block.
			var lastFile string
			for _, line := range lines[:b.line-1] {
				for _, m := range testFile.FindAllStringSubmatch(line, -1) {
					lastFile = filepath.Join(filepath.Dir(page), m[1])
				}
			}
			if b.info != "" {
				continue
			}
			para := b.before
			if para == "" {
				para = b.after
			}
			names := exampleName.FindAllStringSubmatch(para, -1)
			links := testFile.FindAllStringSubmatch(para, -1)
			if len(names) == 0 && len(links) == 0 {
				continue
			}
			var files []string
			for _, l := range links {
				files = append(files, filepath.Join(filepath.Dir(page), l[1]))
			}
			if len(files) == 0 && lastFile != "" {
				files = []string{lastFile}
			}
			var outputs []string
			for _, n := range names {
				in := files
				if len(in) == 0 || !slices.ContainsFunc(in, func(f string) bool { _, ok := exampleOutput(read(f), n[1]); return ok }) {
					in = everywhere(n[1])
				}
				require.NotEmpty(t, in, "%s:%d: no test file declares %s", page, b.line, n[1])
				for _, f := range in {
					if out, ok := exampleOutput(read(f), n[1]); ok {
						outputs = append(outputs, out)
					}
				}
			}
			if len(names) == 0 {
				for _, f := range files {
					s := read(f)
					for _, m := range exampleFunc.FindAllStringSubmatch(s, -1) {
						out, _ := exampleOutput(s, m[1])
						outputs = append(outputs, out)
					}
				}
			}
			assert.Contains(t, outputs, b.text, "%s:%d: the block is not the output of the example named or linked before it:\n%s", page, b.line, para)
			checked++
		}
	}
	require.GreaterOrEqual(t, checked, 12, "the example outputs the manual shows")
}

// The entry points a reader meets first each have a runnable example whose
// // Output: go test checks, as go doc shows it beside the name: New and
// Limit (the package's Example, the README's quick start), Limit with a
// count, Reserve, Wait, and the HTTP middleware. Limit and Wait had none.
func TestEntryPointsHaveExamples(t *testing.T) {
	exampleFunc := regexp.MustCompile(`(?m)^func (Example\w*)\(\) \{$`)
	outputs := map[string]map[string]string{} // directory, example: output
	for _, dir := range []string{".", "httplimit"} {
		files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		require.NoError(t, err)
		outputs[dir] = map[string]string{}
		for _, f := range files {
			src, err := os.ReadFile(f)
			require.NoError(t, err)
			for _, m := range exampleFunc.FindAllStringSubmatch(string(src), -1) {
				if out, ok := exampleOutput(string(src), m[1]); ok {
					outputs[dir][m[1]] = out
				}
			}
		}
	}
	for _, want := range []struct{ dir, example string }{
		{".", "Example"},
		{".", "ExampleLimiter_Limit"},
		{".", "ExampleLimiter_Reserve"},
		{".", "ExampleReservation_Wait"},
		{"httplimit", "Example"},
		{"httplimit", "ExampleMiddleware_Wrap"},
	} {
		out, ok := outputs[want.dir][want.example]
		if assert.True(t, ok, "package %s has no %s", want.dir, want.example) {
			assert.NotEmpty(t, strings.TrimSpace(out), "%s/%s has no // Output:", want.dir, want.example)
		}
	}
}

// The README's plain go test runs the packages that need no server: none
// of their tests reaches Redis or PostgreSQL (a client of either, the
// stores on them, or the helper that finds their servers), so that it
// passes on a machine without them.
func TestReadmeTestCommandNeedsNoServer(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	var pkgs []string
	for line := range strings.Lines(string(readme)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "go test "); ok {
			pkgs = strings.Fields(rest)
			break
		}
	}
	require.NotEmpty(t, pkgs, "README.md shows no go test command")
	server := regexp.MustCompile(`"github\.com/(redis/go-redis|jackc/pgx)|/store/(redisstore|pgstore)"|/internal/testserver"`)
	for _, pkg := range pkgs {
		require.False(t, strings.HasPrefix(pkg, "-"), "README.md: go test %s: a flag where packages were expected", pkg)
		files, err := filepath.Glob(filepath.Join(pkg, "*_test.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, "README.md: go test %s: no tests there", pkg)
		for _, f := range files {
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			require.NoError(t, err)
			for _, imp := range file.Imports {
				assert.False(t, server.MatchString(imp.Path.Value), "README.md: go test %s: %s imports %s, which needs a server", pkg, f, imp.Path.Value)
			}
		}
	}
}
