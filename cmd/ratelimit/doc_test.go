package main

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/testserver"
	"github.com/stretchr/testify/require"
)

// docExample is a command line of docs/cli.md and the output shown
// under it.
type docExample struct {
	line, output string
}

// docExamples returns the command lines ("$ ratelimit ...") of the code
// blocks of doc, each with the lines shown under it up to the next "$ ".
func docExamples(doc string) []docExample {
	var (
		examples []docExample
		in       bool
		cur      *docExample
	)
	for line := range strings.SplitSeq(doc, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			in, cur = !in, nil
		case !in:
		case strings.HasPrefix(line, "$ "):
			cur = nil
			if strings.HasPrefix(line, "$ ratelimit") {
				examples = append(examples, docExample{line: strings.TrimPrefix(line, "$ ")})
				cur = &examples[len(examples)-1]
			}
		case cur != nil:
			cur.output += line + "\n"
		}
	}
	return examples
}

// shellWords splits a command line as a shell does one of plain words
// and double-quoted strings.
func shellWords(line string) []string {
	var (
		words  []string
		word   strings.Builder
		quoted bool
		inWord bool
	)
	for _, r := range line {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words
}

// inDocsDir returns docs/cli.md and runs the rest of the test in a
// directory of its own holding the page's limits.yaml.
func inDocsDir(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(doc), "This `limits.yaml` is used below:\n\n```yaml\n")
	require.True(t, ok, "docs/cli.md shows no limits.yaml")
	limits, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(limits), 0o600))
	t.Chdir(dir)
	return string(doc)
}

// TestDocExamples: every example of docs/cli.md that needs no server
// (simulate, the errors, schema's, the help) prints what the page shows,
// run in a directory holding the page's limits.yaml. The steady pattern's
// retry-afters had stayed at 4.001s and 2.001s, from before the
// library's waits were exact, though the command printed 4s and 2s.
func TestDocExamples(t *testing.T) {
	doc := inDocsDir(t)

	var ran int
	for _, ex := range docExamples(doc) {
		args := shellWords(ex.line)[1:]
		// A store, a bench's or the version's figures, a shell's
		// redirection: not what this test can reproduce.
		if strings.Contains(ex.line, "--store") || strings.ContainsAny(ex.line, "<>|") ||
			args[0] == "bench" || args[0] == "--version" {
			continue
		}
		_, out, errOut := exec(args...)
		require.Equal(t, ex.output, out+errOut, "docs/cli.md: $ %s", ex.line)
		ran++
	}
	require.GreaterOrEqual(t, ran, 10, "the examples docs/cli.md shows")
}

// TestReadmeExample: the command README.md shows (go run ./cmd/ratelimit
// ...) prints the output shown under it, in the next code block. It
// lacked the line of the chart the command draws.
func TestReadmeExample(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(readme), "```sh\ngo run ./cmd/ratelimit ")
	require.True(t, ok, "README.md shows no command")
	line, rest, _ := strings.Cut(rest, "\n")
	_, rest, ok = strings.Cut(rest, "```\n\n```\n")
	require.True(t, ok, "README.md shows no output under %q", line)
	want, _, ok := strings.Cut(rest, "```\n")
	require.True(t, ok)
	t.Chdir(t.TempDir()) // for the chart
	code, out, errOut := exec(shellWords(line)...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, want, out, "README.md: go run ./cmd/ratelimit %s", line)
}

// TestDocExamplesStoreRefused: the examples of docs/cli.md of a store
// that refuses the command (a Redis port nothing listens on, a
// PostgreSQL login of a role that does not exist) print what the page
// shows. The refused login had stayed as an older pgx wrote it
// ("failed to connect to `host=127.0.0.1 user=nobody database=test`:
// server error (FATAL: …)"), not as the pgx of go.mod does.
func TestDocExamplesStoreRefused(t *testing.T) {
	pg, err := url.Parse(testserver.PostgresURL(t))
	require.NoError(t, err)
	doc := inDocsDir(t)

	var ran int
	for _, ex := range docExamples(doc) {
		switch {
		case strings.Contains(ex.line, "--store redis://127.0.0.1:1/"):
		case strings.Contains(ex.line, "--store postgres://nobody@127.0.0.1:5432/"):
			// The page's server: another one's address is in the message.
			if pg.Host != "127.0.0.1:5432" {
				continue
			}
		default:
			continue
		}
		_, out, errOut := exec(shellWords(ex.line)[1:]...)
		require.Equal(t, ex.output, out+errOut, "docs/cli.md: $ %s", ex.line)
		ran++
	}
	require.GreaterOrEqual(t, ran, 1, "the examples of a refusing store docs/cli.md shows")
}
