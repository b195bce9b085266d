package ratelimit_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/doctest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Versions table of docs/integrations.md says what the go.mod files
// say: a row per module under contrib/, with its go line and versions it
// requires, and the library's go line in the text after it. It listed the
// versions of an upgrade that was reverted, with go 1.25.0 throughout, and
// said the library's go.mod said go 1.26.8.
func TestIntegrationsVersionsMatchGoMod(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return string(b)
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`)
	required := regexp.MustCompile(`(?m)^(?:require )?\s*([^\s()]+) (v\d\S*)`)
	version := regexp.MustCompile(`v\d+\.\d+\.\d+`)

	doc := read(filepath.Join("docs", "integrations.md"))
	i := strings.Index(doc, "\n## Versions\n")
	require.GreaterOrEqual(t, i, 0, "docs/integrations.md has a Versions section")
	sec := doc[i+1:]
	if j := strings.Index(sec[1:], "\n## "); j >= 0 {
		sec = sec[:j+1]
	}

	rows := map[string]bool{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if !strings.HasPrefix(line, "|") || len(cells) != 3 || strings.HasPrefix(cells[0], "-") {
			continue
		}
		name := strings.TrimSpace(cells[0])
		if name == "module" {
			continue
		}
		rows[name] = true
		path := filepath.Join("contrib", name, "go.mod")
		mod := read(path)
		assert.Equal(t, goLine.FindStringSubmatch(mod)[1], strings.Trim(strings.TrimSpace(cells[1]), "`"), "%s: the go line", path)
		versions := map[string]bool{}
		for _, m := range required.FindAllStringSubmatch(mod, -1) {
			versions[m[2]] = true
		}
		for _, v := range version.FindAllString(cells[2], -1) {
			assert.True(t, versions[v], "%s requires nothing at %s, which the table names", path, v)
		}
	}
	mods, err := filepath.Glob(filepath.Join("contrib", "*", "go.mod"))
	require.NoError(t, err)
	for _, m := range mods {
		assert.True(t, rows[filepath.Base(filepath.Dir(m))], "the table has no row for %s", m)
	}
	assert.Len(t, rows, len(mods))

	lib := regexp.MustCompile("the library's `go (\\S+)`").FindStringSubmatch(sec)
	require.NotNil(t, lib, "the Versions section names the library's go line")
	assert.Equal(t, goLine.FindStringSubmatch(read("go.mod"))[1], lib[1], "the library's go line")
}

// Every Go block of docs/integrations.md lies in a section whose blocks a
// contrib module's tests compile (doctest.IntegrationsSections): those of
// OpenTelemetry, Prometheus and gRPC assigned err and never read it, and
// the gRPC client's called a client it never made.
func TestIntegrationsDocBlocksChecked(t *testing.T) {
	page := filepath.Join("docs", "integrations.md")
	var checked []string
	for _, m := range []string{"otel", "prometheus", "grpc"} {
		sections := doctest.IntegrationsSections[m]
		require.NotEmpty(t, sections, "the sections of contrib/%s", m)
		checked = append(checked, doctest.Blocks(t, page, sections...)...)
	}
	assert.ElementsMatch(t, doctest.Blocks(t, page), checked)
	assert.Len(t, doctest.IntegrationsSections, 3)
}
