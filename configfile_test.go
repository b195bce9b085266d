package ratelimit_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func TestParseLimits(t *testing.T) {
	limits, err := ratelimit.ParseLimits([]byte(`{
		"sendMessage": {"kind": "token bucket", "rate": 10, "period": "1m", "capacity": 3},
		"signup": {"kind": "fixed window", "rate": 100, "period": "1h", "start": "2024-01-01T00:00:00Z", "failOpen": true},
		"llm": {"kind": "fixed_window", "rate": 40000, "period": "1m", "maxReserved": 20000, "shards": 4}
	}`))
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 10, Period: time.Minute, Capacity: 3}, limits["sendMessage"])
	assert.Equal(t, time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), limits["signup"].Start)
	assert.True(t, limits["signup"].FailOpen)
	assert.Equal(t, 4, limits["llm"].Shards)

	// A config survives a round trip.
	b, err := json.Marshal(limits)
	require.NoError(t, err)
	again, err := ratelimit.ParseLimits(b)
	require.NoError(t, err)
	for name, want := range limits {
		got := again[name]
		assert.True(t, want.Start.Equal(got.Start), name)
		want.Start, got.Start = time.Time{}, time.Time{} // same instant, maybe another location
		assert.Equal(t, want, got, name)
	}

	for _, bad := range []struct{ in, want string }{
		{`{"a": {"kind": "fixed window", "rate": 1, "period": "an hour"}}`, `period: "an hour" is not a duration`},
		{`{"a": {"kind": "leaky", "rate": 1, "period": "1h"}}`, `unknown kind`},
		{`{"a": {"kind": "fixed window", "rate": 1, "period": "1h", "capcity": 3}}`, `unknown field "capcity"`},
		{`{"a": {"kind": "fixed window", "rate": 0, "period": "1h"}}`, `limit "a": Rate is 0`},
		{`[1]`, `limits file`},
	} {
		_, err := ratelimit.ParseLimits([]byte(bad.in))
		require.Error(t, err, bad.in)
		assert.Contains(t, err.Error(), bad.want)
	}
}

// yaml.Unmarshal of a Config keeps every field (maxReserved and failOpen
// used to be dropped), refuses unknown ones, and says which line and
// field, as the file writes them, never Go type names.
func TestConfigYAML(t *testing.T) {
	var limits ratelimit.Limits
	require.NoError(t, yaml.Unmarshal([]byte(`
llm:
  kind: fixed window
  rate: 40000
  period: 1m
  maxReserved: 20000
  shards: 4
  failOpen: true
  start: 2024-01-01T00:00:00Z
`), &limits))
	want := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 40000, Period: time.Minute, MaxReserved: 20000,
		Shards: 4, FailOpen: true, Start: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)}
	assert.Equal(t, want, limits["llm"])

	// A round trip through YAML.
	b, err := yaml.Marshal(limits)
	require.NoError(t, err)
	again, err := ratelimit.ParseLimits(b)
	require.NoError(t, err)
	assert.True(t, again["llm"].Start.Equal(want.Start))

	for _, bad := range []struct{ in, want string }{
		{"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  max_reserved: 3\n", `line 5: unknown field "max_reserved" (did you mean "maxReserved"?)`},
		{"a:\n  kind: fixed window\n  rate: lots\n  period: 1h\n", `line 3: rate: "lots" is not a number`},
		{"a:\n  kind: fixed window\n  rate: 1\n  period: 60\n", `line 4: period: "60" is not a duration`},
		{"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  failOpen: sometimes\n", `line 5: failOpen: "sometimes" is not true or false`},
		{"a:\n  kind: fixed window\n  rate: 0\n  period: 1h\n", `line 1: limit "a": Rate is 0`},
		{"a: 3\n", `line 1: a limit is a mapping`},
		{"a:\n  kind: leaky\n  rate: 1\n  period: 1h\n", `line 2: kind: unknown kind "leaky": write "fixed window" or "token bucket"`},
	} {
		_, err := ratelimit.ParseLimits([]byte(bad.in))
		require.Error(t, err, bad.in)
		assert.Contains(t, err.Error(), bad.want)
		assert.NotContains(t, err.Error(), "ratelimit.", "no Go names")
		assert.NotContains(t, err.Error(), "float64")
		assert.Equal(t, 1, strings.Count(err.Error(), "ratelimit:"), "the prefix once: %v", err)
	}
	var ce *ratelimit.ConfigError
	_, err = ratelimit.ParseLimits([]byte("a:\n  kind: token bucket\n  rate: 0\n  period: 1h\n"))
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
}

// A limits file is one YAML document: limits after a "---" used to be
// dropped without a word, an invalid one included.
func TestParseLimitsOneDocument(t *testing.T) {
	for _, in := range []string{
		"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n---\nb:\n  kind: nope\n",
		"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n---\nb:\n  kind: fixed window\n  rate: 1\n  period: 1h\n",
		"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n---\n",
	} {
		limits, err := ratelimit.ParseLimits([]byte(in))
		require.Error(t, err, "got %v", limits)
		assert.Contains(t, err.Error(), "line 5: a second YAML document", in)
	}
	_, err := ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n---\nb: [\n"))
	assert.ErrorContains(t, err, "line 6: did not find expected node content")

	// A document start or end marker alone is still one document.
	for _, in := range []string{
		"---\na:\n  kind: fixed window\n  rate: 1\n  period: 1h\n",
		"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n...\n",
	} {
		_, err := ratelimit.ParseLimits([]byte(in))
		assert.NoError(t, err, in)
	}
}

// An alias (*x) reads as what its anchor (&x) names, and a merge
// ("<<: *x") as the fields it merges, under those given beside it, as
// yaml.Unmarshal reads them: ParseLimits refused an aliased limit with "a
// limit is a mapping of fields", and an aliased field as not a number.
func TestParseLimitsAliases(t *testing.T) {
	for _, in := range []string{
		"a: &x\n  kind: fixed window\n  rate: 1\n  period: 1h\nb: *x\n",
		"a:\n  kind: token bucket\n  rate: &r 5\n  period: &p 1m\nb:\n  kind: fixed window\n  rate: *r\n  period: *p\n",
		"a: &x\n  kind: fixed window\n  rate: 1\n  period: 1h\nb:\n  <<: *x\n  rate: 2\n",
		"a: &x\n  kind: fixed window\n  rate: 1\n  period: 1h\nc: &y\n  kind: token bucket\n  rate: 3\n  period: 1m\n  capacity: 7\nb:\n  <<: [*y, *x]\n  rate: 2\n",
		"<<: {a: {kind: fixed window, rate: 1, period: 1h}}\nb:\n  kind: token bucket\n  rate: 3\n  period: 1m\n",
	} {
		var viaYAML ratelimit.Limits
		require.NoError(t, yaml.Unmarshal([]byte(in), &viaYAML), in)
		limits, err := ratelimit.ParseLimits([]byte(in))
		require.NoError(t, err, in)
		assert.Equal(t, viaYAML, limits, in)
	}
	limits, err := ratelimit.ParseLimits([]byte("a: &x\n  kind: fixed window\n  rate: 1\n  period: 1h\nb:\n  <<: *x\n  rate: 2\n"))
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Hour}, limits["b"])

	for _, bad := range []struct{ in, want string }{
		{"a:\n  kind: &k fixed window\n  rate: 1\n  period: 1h\nb:\n  kind: fixed window\n  rate: *k\n  period: 1h\n", `limit "b": line 7: rate: "fixed window" is not a number`},
		{"a: &x\n  kind: fixed window\n  rate: 0\n  period: 1h\nb: *x\n", `limit "a": Rate is 0`},
		{"a:\n  <<: 3\n", `line 2: a merge (<<) takes a mapping`},
		{"a:\n  kind: fixed window\n  kind: token bucket\n", `line 3: field "kind" given twice`},
	} {
		_, err := ratelimit.ParseLimits([]byte(bad.in))
		assert.ErrorContains(t, err, bad.want, bad.in)
	}
}

// A mapping merged into itself, through an alias within its anchor, is
// an error, as it is to yaml.Unmarshal: ParseLimits followed the merge
// until the stack overflowed, a fatal error that no recover catches.
func TestParseLimitsMergeCycle(t *testing.T) {
	for _, in := range []string{
		"a: &x\n  kind: fixed window\n  rate: 1\n  period: 1h\n  <<: *x\n",
		"a: &x\n  kind: fixed window\n  rate: 1\n  period: 1h\n  <<: [{capacity: 2}, *x]\n",
		"a: &x\n  kind: fixed window\n  rate: 1\n  period: 1h\n  <<: {capacity: 2, <<: *x}\n",
		"&x\na:\n  kind: fixed window\n  rate: 1\n<<: *x\n",
	} {
		_, err := ratelimit.ParseLimits([]byte(in))
		assert.ErrorContains(t, err, "line 5: a merge (<<) of a mapping into itself", in)
		var limits ratelimit.Limits
		assert.Error(t, yaml.Unmarshal([]byte(in), &limits), in)
	}
}

// Merges through aliases, a few bytes each, read each mapping once: a
// mapping of ten aliases of one of ten aliases of ... (a "billion
// laughs") was walked once per path to its fields, ten times more for
// each level, and 40 levels would not finish.
func TestParseLimitsMergeBomb(t *testing.T) {
	bomb := "&l0 {rate: 1}"
	for i := 1; i <= 40; i++ {
		bomb = fmt.Sprintf("&l%d {<<: [%s%s]}", i, bomb, strings.Repeat(fmt.Sprintf(", *l%d", i-1), 9))
	}
	want := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}
	limits, err := ratelimit.ParseLimits([]byte("a: {kind: fixed window, period: 1h, <<: " + bomb + "}\n"))
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Limits{"a": want}, limits)

	// At the top, of limits.
	limits, err = ratelimit.ParseLimits([]byte("<<: " + strings.Replace(bomb, "{rate: 1}", "{a: {kind: fixed window, rate: 1, period: 1h}}", 1) + "\n"))
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Limits{"a": want}, limits)
}

// A limit's keys, counting those of the mappings it merges, are bounded:
// each limit merging an alias of one long list of mappings took as long
// to read as the list, so that a file of 2.5 MB, 50,000 limits merging a
// list of 5,000, took 20 s.
func TestParseLimitsMergeBound(t *testing.T) {
	list := "&list [" + strings.Repeat("{rate: 1}, ", 100) + "{rate: 2}]"
	in := "a: {kind: fixed window, period: 1h, <<: " + list + "}\nb: {kind: fixed window, period: 1h, <<: *list}\n"
	_, err := ratelimit.ParseLimits([]byte(in))
	assert.ErrorContains(t, err, `limit "a": line 1: more than 100 keys, counting those of the mappings merged (<<): a limit has 8 fields`)
	var limits ratelimit.Limits
	assert.ErrorContains(t, yaml.Unmarshal([]byte(in), &limits), "more than 100 keys")

	// Within the bound, as before.
	in = "a: {kind: fixed window, period: 1h, <<: [" + strings.Repeat("{rate: 1, capacity: 2}, ", 45) + "{rate: 3}]}\n"
	limits, err = ratelimit.ParseLimits([]byte(in))
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1, Capacity: 2, Period: time.Hour}, limits["a"])
}

// Merges into the mapping of limits nest at most 10,000 deep, as the YAML
// parser bounds a file's nesting: a chain of mappings each merging the
// one before, unbounded there, was walked by one call within another for
// each, and some 3,000,000 of them (a file of 100 MB) overflowed the
// stack, a fatal error rather than an error.
func TestParseLimitsMergeDepth(t *testing.T) {
	chain := func(n int) []byte {
		var b strings.Builder
		b.WriteString("m0: &m0 {a: {kind: fixed window, rate: 1, period: 1h}}\n")
		for i := 1; i < n; i++ {
			fmt.Fprintf(&b, "m%d: &m%d {<<: *m%d}\n", i, i, i-1)
		}
		fmt.Fprintf(&b, "<<: *m%d\n", n-1)
		return []byte(b.String())
	}
	_, err := ratelimit.ParseLimits(chain(10_001))
	assert.ErrorContains(t, err, "line 2: merges (<<) nested more than 10000 deep")
	// Within the bound, the limits read (and fail as limits: m0 is a
	// mapping of limits, not of fields).
	_, err = ratelimit.ParseLimits(chain(10_000))
	assert.ErrorContains(t, err, `limit "m0": line 1: unknown field "a"`)
}

// A limit name or a field name is text: a list or a mapping as a key
// was read as the name "", and a null one as "~" or "null", which
// yaml.Unmarshal of Limits drops.
func TestParseLimitsKeys(t *testing.T) {
	const limit = "{kind: fixed window, rate: 1, period: 1h}"
	for _, bad := range []struct{ in, want string }{
		{"a: " + limit + "\n? [b, c]\n: " + limit + "\n", `line 2: a limit name is a list: write text`},
		{"? {b: 1}\n: " + limit + "\n", `line 1: a limit name is a mapping: write text`},
		{"a: &x " + limit + "\n*x : " + limit + "\n", `line 2: a limit name is a mapping: write text`},
		{"~: " + limit + "\n", `line 1: a limit name is null ("~"): write another, or quote it`},
		{"null: " + limit + "\n", `line 1: a limit name is null ("null")`},
		{"a:\n  kind: fixed window\n  ? [rate]\n  : 1\n  period: 1h\n", `limit "a": line 3: a field name is a list: write text`},
		{"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  ~: 1\n", `limit "a": line 5: a field name is null ("~")`},
		// yaml.Unmarshal decodes a name tagged !!binary ("\xff"), where
		// it was read as its base64 text ("/w=="), another name.
		{"a: " + limit + "\n!!binary /w==: " + limit + "\n", `line 2: a limit name tagged !!binary: write text`},
		{"a:\n  kind: fixed window\n  !!binary cmF0ZQ==: 1\n", `limit "a": line 3: a field name tagged !!binary: write text`},
	} {
		limits, err := ratelimit.ParseLimits([]byte(bad.in))
		assert.ErrorContains(t, err, bad.want, "%q: got %v", bad.in, limits)
	}
	var c ratelimit.Config
	assert.ErrorContains(t, yaml.Unmarshal([]byte("kind: fixed window\n? [rate]\n: 1\n"), &c), "line 2: a field name is a list")

	// A quoted null, or another scalar, is a name like any.
	limits, err := ratelimit.ParseLimits([]byte("\"~\": " + limit + "\n'null': " + limit + "\n1: " + limit + "\ntrue: " + limit + "\n"))
	require.NoError(t, err)
	assert.Len(t, limits, 4)
	assert.Contains(t, limits, "~")
	assert.Contains(t, limits, "null")
	assert.Contains(t, limits, "1")
	assert.Contains(t, limits, "true")
}

// yaml.Unmarshal of Limits reads names as ParseLimits and json.Unmarshal
// do: a limit named null (~) was dropped without a word, one tagged
// !!binary declared as its decoded bytes, and a limit written null was a
// zero Config, where JSON and ParseLimits refuse each.
func TestLimitsYAMLNames(t *testing.T) {
	const limit = "{kind: fixed window, rate: 1, period: 1h}"
	for _, bad := range []struct{ in, want string }{
		{"~: " + limit + "\nb: " + limit + "\n", `limits: line 1: a limit name is null ("~"): write another, or quote it`},
		{"a: " + limit + "\n? !!null ''\n: " + limit + "\n", `limits: line 2: a limit name is null ("")`},
		{"a: " + limit + "\n!!binary /w==: " + limit + "\n", `limits: line 2: a limit name tagged !!binary: write text`},
		{"a: " + limit + "\nb: ~\n", `limits: limit "b": line 2: a limit is a mapping of fields`},
		{"a: " + limit + "\nb:\n", `limits: limit "b": line 2: a limit is a mapping of fields`},
		{"a: " + limit + "\na: " + limit + "\n", `limits: line 2: limit "a" given twice`},
		{"a: " + limit + "\nb: {kind: fixed window, rate: 1, period: 1h, rate: 2}\n", `limits: limit "b": line 2: field "rate" given twice`},
		{"- " + limit + "\n", `limits: line 1: write a mapping of limit names to their fields`},
	} {
		var limits ratelimit.Limits
		err := yaml.Unmarshal([]byte(bad.in), &limits)
		assert.ErrorContains(t, err, bad.want, "%q: got %v", bad.in, limits)
	}

	// Within an application's own document, merges included, as
	// ParseLimits reads it.
	var doc struct {
		Limits ratelimit.Limits `yaml:"limits"`
	}
	in := "defaults: &d {kind: token bucket, period: 1m}\nlimits:\n  a: {<<: *d, rate: 2}\n  \"~\": " + limit + "\n"
	require.NoError(t, yaml.Unmarshal([]byte(in), &doc))
	assert.Equal(t, ratelimit.Limits{
		"a": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute},
		"~": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour},
	}, doc.Limits)
	// yaml.Unmarshal gives no null to UnmarshalYAML: it sets Limits to
	// nil, as any map, where json.Unmarshal leaves them as they are.
	limits := ratelimit.Limits{"b": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}}
	require.NoError(t, yaml.Unmarshal([]byte("~\n"), &limits))
	assert.Nil(t, limits)
	doc.Limits = ratelimit.Limits{"b": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}}
	require.NoError(t, yaml.Unmarshal([]byte("limits: null\n"), &doc))
	assert.Nil(t, doc.Limits)
	doc.Limits = ratelimit.Limits{"b": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}}
	require.NoError(t, json.Unmarshal([]byte(`{"limits": null}`), &doc))
	assert.Len(t, doc.Limits, 1)
}

// Limits written by yaml.Marshal read back by yaml.Unmarshal and
// ParseLimits, a limit named "<<" too: yaml.Marshal writes such a key
// plain, where it reads as a merge (<<: *defaults), so that the limits
// did not read back ("limit "kind": a limit is a mapping of fields").
func TestLimitsYAMLRoundTripMergeName(t *testing.T) {
	c := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}
	limits := ratelimit.Limits{"<<": c, "a": c, "<": c, "<<<": c}
	b, err := yaml.Marshal(limits)
	require.NoError(t, err)
	var back ratelimit.Limits
	require.NoError(t, yaml.Unmarshal(b, &back), "%s", b)
	assert.Equal(t, limits, back)
	parsed, err := ratelimit.ParseLimits(b)
	require.NoError(t, err, "%s", b)
	assert.Equal(t, limits, parsed)

	// Within an application's own document, and through a pointer.
	type app struct {
		Limits ratelimit.Limits  `yaml:"limits"`
		More   *ratelimit.Limits `yaml:"more"`
		None   ratelimit.Limits  `yaml:"none"`
	}
	b, err = yaml.Marshal(app{Limits: limits, More: &limits})
	require.NoError(t, err)
	var got app
	require.NoError(t, yaml.Unmarshal(b, &got), "%s", b)
	assert.Equal(t, limits, got.Limits)
	require.NotNil(t, got.More)
	assert.Equal(t, limits, *got.More)
	assert.Empty(t, got.None)
}

// Every field of a valid config reads back as written, in JSON and YAML;
// Start as the same instant, in UTC. A Start that an RFC 3339 time cannot
// write, before year 0 or after 9999, is refused: yaml.Marshal wrote one
// that ParseLimits refused to read ("10000-01-01T00:00:00Z is not a time").
func TestConfigRoundTrip(t *testing.T) {
	berlin := time.FixedZone("CET", 3600)
	for _, c := range []ratelimit.Config{
		{Kind: ratelimit.FixedWindow, Rate: 1e-9, Period: 1500 * time.Millisecond, Capacity: 1e15, Start: time.Date(2024, 1, 1, 0, 0, 0, 123456789, berlin)},
		{Kind: ratelimit.TokenBucket, Rate: 0.1, Period: ratelimit.MaxPeriod - time.Millisecond, Capacity: 1024 * 120563270520, MaxReserved: 1e15, Shards: ratelimit.MaxShards, FailOpen: true},
		{Kind: ratelimit.TokenBucket, Rate: 1e15, Period: 7*time.Hour + 3*time.Millisecond, Capacity: 0.1, MaxReserved: 0.3, Shards: 1},
		{Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Millisecond, Start: time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Millisecond, Start: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)},
		{Kind: ratelimit.FixedWindow, Rate: 3, Period: time.Millisecond, Start: time.Date(10000, 1, 1, 0, 30, 0, 0, berlin)},
	} {
		require.NoError(t, c.Validate())
		j, err := json.Marshal(ratelimit.Limits{"a": c})
		require.NoError(t, err)
		y, err := yaml.Marshal(ratelimit.Limits{"a": c})
		require.NoError(t, err)
		requireReadsBack(t, c, j, y)
	}

	for _, start := range []time.Time{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 12, 31, 0, 0, 0, 0, time.UTC)} {
		c := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour, Start: start}
		require.NoError(t, c.Validate())
		_, err := json.Marshal(c)
		assert.ErrorContains(t, err, "cannot encode start", start)
		_, err = yaml.Marshal(c)
		assert.ErrorContains(t, err, "cannot encode start", start)
	}
}

// requireReadsBack requires each document, limits of one limit "a"
// written from c, to read back as c, its Start as the same instant in UTC.
func requireReadsBack(t *testing.T, c ratelimit.Config, docs ...[]byte) {
	t.Helper()
	for _, b := range docs {
		limits, err := ratelimit.ParseLimits(b)
		require.NoError(t, err, "%s", b)
		got, want := limits["a"], c
		require.Equal(t, want.Start.UTC(), got.Start, "%s", b)
		got.Start, want.Start = time.Time{}, time.Time{}
		require.Equal(t, want, got, "%s", b)
	}
}

// A value of the wrong shape or size is named as such: a list or a
// mapping was shown as "" ("\"\" is not a number"), a number beyond a
// float64 was "not a number", and a whole number of shards above 2048,
// or beyond a float64, "not a whole number of shards".
func TestParseLimitsValueErrors(t *testing.T) {
	for _, bad := range []struct{ field, value, want string }{
		{"rate", "[1]", `rate: a list is not a number`},
		{"capacity", "{a: 1}", `capacity: a mapping is not a number`},
		{"rate", "1e400", `rate: "1e400" is out of range: a number of tokens is at most 1000000000000000`},
		{"maxReserved", "-1e400", `maxReserved: "-1e400" is out of range`},
		{"rate", `"1e400"`, `rate: "1e400" is not a number`},
		{"period", "[1h]", `period: a list is not a duration`},
		{"start", "{a: 1}", `start: a mapping is not a time`},
		{"failOpen", "[true]", `failOpen: a list is not true or false`},
		{"shards", "[4]", `shards: a list is not a number`},
		{"shards", "4.5", `shards: "4.5" is not a whole number of shards`},
		{"shards", "1e300", `shards: "1e300" is out of range: at most 1024 shards are supported`},
		{"shards", "1e400", `shards: "1e400" is out of range: at most 1024 shards are supported`},
		{"shards", "-1e400", `shards: "-1e400" is out of range: at most 1024 shards are supported`},
		{"shards", `"1e400"`, `shards: "1e400" is not a whole number of shards`},
		{"shards", "5000", `limit "a": Shards is 5000: at most 1024 shards are supported`},
		{"shards", "-5000", `limit "a": Shards is -5000: it must be 0 or 1`},
	} {
		fields := map[string]string{"kind": `"fixed window"`, "rate": "1", "period": `"1h"`, bad.field: bad.value}
		var y, j strings.Builder
		y.WriteString("a:\n")
		for _, f := range []string{"kind", "rate", "period", "shards", "capacity", "maxReserved", "start", "failOpen"} {
			if v, ok := fields[f]; ok {
				fmt.Fprintf(&y, "  %s: %s\n", f, v)
				fmt.Fprintf(&j, `, "%s": %s`, f, v)
			}
		}
		_, err := ratelimit.ParseLimits([]byte(y.String()))
		assert.ErrorContains(t, err, bad.want, y.String())
		if js := `{"a": {` + j.String()[2:] + `}}`; json.Valid([]byte(js)) {
			_, err := ratelimit.ParseLimits([]byte(js))
			assert.ErrorContains(t, err, bad.want, js)
		}
	}
}

// failOpen is true or false, or yes, no, on and off written plain, as
// yaml.Unmarshal reads a bool; quoted, as JSON writes strings, they are
// text, as "true" always was: "on" and "yes" were read as true and "no"
// and "off" as false, from JSON too.
func TestParseLimitsFailOpen(t *testing.T) {
	for in, want := range map[string]bool{"true": true, "false": false, "yes": true, "on": true, "no": false, "off": false, "!!bool true": true,
		"y": true, "N": false, "Yes": true, "OFF": false, "True": true, "FALSE": false} {
		limits, err := ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  failOpen: " + in + "\n"))
		require.NoError(t, err, in)
		assert.Equal(t, want, limits["a"].FailOpen, in)
	}
	limits, err := ratelimit.ParseLimits([]byte(`{"a": {"kind": "fixed window", "rate": 1, "period": "1h", "failOpen": true}}`))
	require.NoError(t, err)
	assert.True(t, limits["a"].FailOpen)

	for _, v := range []string{`"true"`, `"on"`, `"yes"`, `"off"`, `"no"`, `'on'`, `!!str on`, `1`, `tRuE`, `oN`, `yES`} {
		_, err := ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  failOpen: " + v + "\n"))
		assert.ErrorContains(t, err, "line 5: failOpen:", v)
		assert.ErrorContains(t, err, "is not true or false", v)
		if strings.HasPrefix(v, `"`) || v == "1" {
			_, err := ratelimit.ParseLimits([]byte(`{"a": {"kind": "fixed window", "rate": 1, "period": "1h", "failOpen": ` + v + `}}`))
			assert.ErrorContains(t, err, "is not true or false", v)
		}
	}
}

// JSON is read by JSON's rules: the YAML parser, which read it before,
// refuses valid JSON strings such as a surrogate pair escape (what
// encoders write for a character outside the BMP), \/ and \u0000.
func TestParseLimitsJSONStrings(t *testing.T) {
	const limit = `{"kind": "fixed window", "rate": 1, "period": "1h"}`
	for _, in := range []string{
		`{"caf\u00e9 \ud83d\ude80": ` + limit + `}`,
		`{"a\/b": ` + limit + `, "c\u0000d": ` + limit + `}`,
		"{\"line\u2028separator\u0085\": " + limit + "}",
		"\uFEFF{\"bom\": " + limit + "}",
		`{"a": {"kind": "fixed\u0020window", "rate": 1e1, "period": "1\u0068"}}`,
	} {
		var viaJSON ratelimit.Limits
		require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(in, "\uFEFF")), &viaJSON), in)
		limits, err := ratelimit.ParseLimits([]byte(in))
		require.NoError(t, err, in)
		assert.Equal(t, viaJSON, limits, in)
	}
	limits, err := ratelimit.ParseLimits([]byte(`{"\ud83d\ude80": ` + limit + `}`))
	require.NoError(t, err)
	assert.Contains(t, limits, "🚀")

	// Read as YAML where JSON does not read it all: a trailing comma, a
	// number ending in its point, a comment after the object. (A leading
	// zero is refused: TestParseLimitsLeadingZero.)
	for _, in := range []string{`{"a": ` + limit + `,}`, `{"a": {"kind": "fixed window", "rate": 1., "period": "1h"}}`, `{"a": ` + limit + `} # one`} {
		limits, err := ratelimit.ParseLimits([]byte(in))
		require.NoError(t, err, in)
		assert.Equal(t, 1.0, limits["a"].Rate, in)
	}

	// Errors still name the line, the limit and the field.
	for _, bad := range []struct{ in, want string }{
		{"{\n  \"a\": {\"kind\": \"fixed window\", \"rate\": 1, \"period\": \"1h\"},\n  \"b\": {\n    \"kind\": \"fixed window\",\n    \"rate\": \"lots\",\n    \"period\": \"1h\"}\n}", `limit "b": line 5: rate: "lots" is not a number`},
		{"{\n  \"a\": {\"kind\": \"fixed window\", \"rate\": 1, \"period\": \"1h\"},\n\n  \"b\": {\"kind\": \"fixed window\", \"rate\": 0, \"period\": \"1h\"}\n}", `line 4: limit "b": Rate is 0`},
		{"{\"a\": " + limit + ",\n \"a\": " + limit + "}", `line 2: limit "a" given twice`},
		{"{\"a\": {\"kind\": \"fixed window\",\n \"rapt\": 1}}", `line 2: unknown field "rapt"`},
		{"{a: {kind: fixed window,\n rate: lots, period: 1h}}", `line 2: rate: "lots" is not a number`}, // YAML
		// Not JSON, though it starts as JSON: read as YAML, with its errors,
		// as when json.Valid told them apart.
		{"{\"a\": " + limit + "} x", `yaml: did not find expected <document start>`},
		{"{\"a\": " + limit + "} {}", `yaml: did not find expected <document start>`},
		{"{\"a\": " + limit + "}\n---\n{}", `line 2: a second YAML document`},
		{"{\"a\": " + limit + "}\x00", `yaml: control characters are not allowed`},
		{"{\"a\": {\"kind\": \"fixed window\", \"rate\": 1 \"period\": \"1h\"}}", `yaml: did not find expected ',' or '}'`},
		{strings.Repeat("[", 10001) + strings.Repeat("]", 10001), `yaml: exceeded max depth of 10000`},
		{strings.Repeat("[", 10000) + strings.Repeat("]", 10000), `write a mapping of limit names`}, // JSON
	} {
		_, err := ratelimit.ParseLimits([]byte(bad.in))
		assert.ErrorContains(t, err, bad.want, bad.in)
	}

	// json.Unmarshal of Limits refuses a name given twice too, rather than
	// keep the last; null leaves the map as it is, and a map given is
	// added to, as for any map.
	var twice ratelimit.Limits
	err = json.Unmarshal([]byte("{\"a\": "+limit+",\n \"\\u0061\": "+limit+"}"), &twice)
	assert.ErrorContains(t, err, `line 2: limit "a" given twice`)
	err = json.Unmarshal([]byte(`{"a": {"kind": "fixed window", "rapt": 1}}`), &twice)
	assert.ErrorContains(t, err, `limit "a"`)
	assert.ErrorContains(t, err, `unknown field "rapt"`)
	assert.ErrorContains(t, json.Unmarshal([]byte(`[1]`), &twice), "write an object")
	kept := ratelimit.Limits{"b": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Hour}}
	require.NoError(t, json.Unmarshal([]byte(`null`), &kept))
	require.NoError(t, json.Unmarshal([]byte(`{"a": `+limit+`}`), &kept))
	assert.Equal(t, ratelimit.Limits{
		"a": {Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour},
		"b": {Kind: ratelimit.FixedWindow, Rate: 2, Period: time.Hour},
	}, kept)

	// json.Unmarshal of a Config reads its strings as JSON too.
	var c ratelimit.Config
	require.NoError(t, json.Unmarshal([]byte(`{"kind": "token\u0020bucket", "rate": 1, "period": "1m", "start": "2024-01-01T00:00:00Z"}`), &c))
	assert.Equal(t, ratelimit.TokenBucket, c.Kind)
	err = json.Unmarshal([]byte(`{"kind": "\ud83d\ude80", "rate": 1, "period": "1m"}`), &c)
	assert.ErrorContains(t, err, "🚀")
}

// JSON null leaves a Config as it is, as json.Unmarshal does for any value
// (and for Limits) and yaml.Unmarshal for a Config: it was an error ("a
// limit is a mapping of fields"). A limit written null is still one.
func TestConfigJSONNull(t *testing.T) {
	var s struct {
		A ratelimit.Config `json:"a" yaml:"a"`
		B ratelimit.Config `json:"b" yaml:"b"`
	}
	kept := ratelimit.Config{Kind: ratelimit.FixedWindow, Rate: 1, Period: time.Hour}
	s.A = kept
	require.NoError(t, json.Unmarshal([]byte(`{"a": null, "b": {"kind": "token bucket", "rate": 2, "period": "1m"}}`), &s))
	assert.Equal(t, kept, s.A)
	assert.Equal(t, ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute}, s.B)
	require.NoError(t, yaml.Unmarshal([]byte("a: null\n"), &s))
	assert.Equal(t, kept, s.A)

	var limits ratelimit.Limits
	assert.ErrorContains(t, json.Unmarshal([]byte(`{"a": null}`), &limits), `limit "a": line 1: a limit is a mapping`)
	_, err := ratelimit.ParseLimits([]byte(`{"a": null}`))
	assert.ErrorContains(t, err, `limit "a": line 1: a limit is a mapping`)
}

// An unknown field a letter or two off a field's name is told which field
// it may mean, as one in another case or with separators was; "capcity"
// and "perid" were given no suggestion.
func TestParseLimitsDidYouMean(t *testing.T) {
	for name, want := range map[string]string{
		"capcity": "capacity", "perid": "period", "maxReserve": "maxReserved", "Max_Reservd": "maxReserved",
		"shard": "shards", "failOpn": "failOpen", "fail_open": "failOpen", "strat": "start", "rtae": "rate", "knid": "kind",
		"burst": "", "limit": "", "window": "", "x": "", strings.Repeat("capacity", 20): "",
	} {
		_, err := ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  " + name + ": 1\n"))
		require.Error(t, err, name)
		if want == "" {
			assert.NotContains(t, err.Error(), "did you mean", name)
			continue
		}
		assert.ErrorContains(t, err, fmt.Sprintf(`line 5: unknown field %q (did you mean %q?)`, name, want))
	}
}

// A field written without a value (capacity:, or null) is an error, as
// an empty period always was; an empty capacity, maxReserved, shards or
// failOpen used to mean the default without a word.
func TestParseLimitsNullField(t *testing.T) {
	for _, f := range []string{"kind", "rate", "period", "capacity", "maxReserved", "shards", "start", "failOpen"} {
		fields := map[string]string{"kind": "token bucket", "rate": "1", "period": "1h"}
		fields[f] = ""
		var b strings.Builder
		b.WriteString("a:\n")
		for _, name := range []string{"kind", "rate", "period", "capacity", "maxReserved", "shards", "start", "failOpen"} {
			if v, ok := fields[name]; ok {
				b.WriteString("  " + name + ": " + v + "\n")
			}
		}
		_, err := ratelimit.ParseLimits([]byte(b.String()))
		assert.ErrorContains(t, err, f+": no value", b.String())
	}
	_, err := ratelimit.ParseLimits([]byte(`{"a": {"kind": "token bucket", "rate": 1, "period": "1h", "capacity": null}}`))
	assert.ErrorContains(t, err, `line 1: capacity: no value`)
	_, err = ratelimit.ParseLimits([]byte("a:\n  kind: token bucket\n  rate: 1\n  period: 1h\n  shards: ~\n"))
	assert.ErrorContains(t, err, `line 5: shards: no value`)
}

// A period past time.Duration's range is said to be too long, not "not a
// duration".
func TestParseLimitsPeriodOutOfRange(t *testing.T) {
	for _, p := range []string{"3000000h", "9999999999999999999ns", "-3000000h", "1.5e3h0s"} {
		_, err := ratelimit.ParseLimits([]byte("a:\n  kind: token bucket\n  rate: 1\n  period: " + p + "\n"))
		want := `line 4: period: "` + p + `" is out of range: a period is from 1ms to 876576h0m0s (100 years)`
		if p == "1.5e3h0s" {
			want = `line 4: period: "` + p + `" is not a duration`
		}
		assert.ErrorContains(t, err, want, p)
	}
}

// BenchmarkParseLimitsJSON reads a JSON limits file of 50 limits.
func BenchmarkParseLimitsJSON(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("{\n")
	for i := range 50 {
		if i > 0 {
			sb.WriteString(",\n")
		}
		fmt.Fprintf(&sb, `  "limit%d": {"kind": "token bucket", "rate": %d, "period": "1m", "capacity": %d, "maxReserved": 10, "failOpen": true}`, i, 10+i, 20+i)
	}
	sb.WriteString("\n}\n")
	data := []byte(sb.String())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ratelimit.ParseLimits(data); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzParseLimits reads any input without a panic, and limits it reads
// are written by json.Marshal and yaml.Marshal as files that read back as
// the same limits (Start as the same instant, in UTC).
func FuzzParseLimits(f *testing.F) {
	for _, s := range []string{
		"a: &x\n  kind: fixed window\n  rate: 1\n  period: 1h\nb: *x\n",
		"a: &x\n  kind: fixed window\n  rate: 1\n  period: 1h\nb:\n  <<: *x\n  rate: 2\n",
		"a: &x\n  kind: fixed window\n  rate: 1\n  period: 1h\n  <<: *x\n",
		`{"a": {"kind": "token bucket", "rate": 10, "period": "1m", "capacity": 3, "shards": 2, "failOpen": true}}`,
		"a: {kind: fixed window, rate: 1.5e-3, period: 1500ms, start: 2024-01-01T00:00:00.5+01:00, maxReserved: 3, capacity: 2}\n",
		"\uFEFF{\"\\ud83d\\ude80\": {\"kind\": \"fixed_window\", \"rate\": 1e15, \"period\": \"876576h\"}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		limits, err := ratelimit.ParseLimits(data)
		if err != nil {
			return
		}
		for _, marshal := range []func(any) ([]byte, error){json.Marshal, yaml.Marshal} {
			b, err := marshal(limits)
			require.NoError(t, err)
			again, err := ratelimit.ParseLimits(b)
			require.NoError(t, err, "%s", b)
			require.Len(t, again, len(limits), "%s", b)
			for name, c := range limits {
				got, ok := again[name]
				require.True(t, ok, "%q in %s", name, b)
				require.Equal(t, c.Start.UTC(), got.Start, "%s", b)
				c.Start, got.Start = time.Time{}, time.Time{}
				require.Equal(t, c, got, "%s", b)
			}
		}
	})
}

// FuzzConfigRoundTrip writes valid configs of any fields with json.Marshal
// and yaml.Marshal, and reads them back as written (Start as the same
// instant, in UTC), or they are refused when written.
func FuzzConfigRoundTrip(f *testing.F) {
	f.Add(uint8(1), 1.0, int64(1000), 0.0, 0.0, 0, int64(1700000000), int64(123456789), int32(3600), false)
	f.Add(uint8(2), 1e-9, int64(1), 1e15, 1e15, 1024, int64(0), int64(0), int32(0), true)
	f.Add(uint8(1), 0.1, int64(ratelimit.MaxPeriod/time.Millisecond), 0.3, 0.0, 3, int64(253402300800), int64(0), int32(-60), false)
	f.Fuzz(func(t *testing.T, kind uint8, rate float64, periodMS int64, capacity, maxReserved float64, shards int, sec, nsec int64, zone int32, failOpen bool) {
		c := ratelimit.Config{Kind: ratelimit.Kind(kind), Rate: rate, Period: time.Duration(periodMS) * time.Millisecond,
			Capacity: capacity, MaxReserved: maxReserved, Shards: shards, FailOpen: failOpen}
		if sec != 0 || nsec != 0 {
			c.Start = time.Unix(sec, nsec).In(time.FixedZone("", int(zone%(24*3600))))
		}
		if c.Validate() != nil {
			return
		}
		j, jerr := json.Marshal(ratelimit.Limits{"a": c})
		y, yerr := yaml.Marshal(ratelimit.Limits{"a": c})
		if year := c.Start.UTC().Year(); !c.Start.IsZero() && (year < 0 || year > 9999) {
			require.ErrorContains(t, jerr, "cannot encode start")
			require.ErrorContains(t, yerr, "cannot encode start")
			return
		}
		require.NoError(t, jerr)
		require.NoError(t, yerr)
		requireReadsBack(t, c, j, y)
	})
}

// An integer written with a leading zero is refused: YAML 1.1, as
// yaml.Unmarshal reads it, takes 010 for the octal 8, where YAML 1.2 and
// the reader mean 10. A rate of 010 was a rate of 8, without a word, and
// so was one in a file that starts as JSON (read as YAML: JSON has no
// leading zeros). Octal written as YAML 1.2 writes it, 0o10, is 8.
func TestParseLimitsLeadingZero(t *testing.T) {
	for _, bad := range []struct{ field, value, want string }{
		{"rate", "010", `line 3: rate: "010" has a leading zero, which YAML reads as octal (8): write 10, or 0o10 if octal is meant`},
		{"rate", "+010", `rate: "+010" has a leading zero, which YAML reads as octal (8): write +10, or +0o10 if octal is meant`},
		{"capacity", "0_10", `capacity: "0_10" has a leading zero, which YAML reads as octal (8): write 10, or 0o10 if octal is meant`},
		{"maxReserved", "0777", `maxReserved: "0777" has a leading zero, which YAML reads as octal (511): write 777, or 0o777 if octal is meant`},
		{"shards", "010", `shards: "010" has a leading zero, which YAML reads as octal (8): write 10, or 0o10 if octal is meant`},
		{"shards", "-010", `shards: "-010" has a leading zero, which YAML reads as octal (-8): write -10, or -0o10 if octal is meant`},
		{"rate", "!!int 012", `rate: "012" has a leading zero, which YAML reads as octal (10): write 12, or 0o12 if octal is meant`},
		{"rate", "01", `rate: "01" has a leading zero, which YAML reads as octal (1): write 1, or 0o1 if octal is meant`},
		{"rate", "09", `rate: "09" has a leading zero: write 9`},
		{"rate", "00", `rate: "00" has a leading zero: write 0`},
	} {
		fields := map[string]string{"kind": "fixed window", "rate": "1", "period": "1h", bad.field: bad.value}
		var b strings.Builder
		b.WriteString("a:\n")
		for _, f := range []string{"kind", "rate", "period", "capacity", "maxReserved", "shards"} {
			if v, ok := fields[f]; ok {
				fmt.Fprintf(&b, "  %s: %s\n", f, v)
			}
		}
		_, err := ratelimit.ParseLimits([]byte(b.String()))
		assert.ErrorContains(t, err, bad.want, b.String())
	}
	// A file that starts as JSON, with a leading zero, is read as YAML:
	// the same error.
	_, err := ratelimit.ParseLimits([]byte(`{"a": {"kind": "fixed window", "rate": 010, "period": "1h"}}`))
	assert.ErrorContains(t, err, `limit "a": line 1: rate: "010" has a leading zero, which YAML reads as octal (8): write 10`)
	var c ratelimit.Config
	assert.ErrorContains(t, yaml.Unmarshal([]byte("kind: fixed window\nrate: 010\nperiod: 1h\n"), &c), `line 2: rate: "010" has a leading zero`)
	assert.Error(t, json.Unmarshal([]byte(`{"kind": "fixed window", "rate": 010, "period": "1h"}`), &c), "not JSON")

	// What has no leading zero, or is text, reads as it did.
	for in, want := range map[string]float64{"0o10": 8, "0x10": 16, "10": 10, "0": 0, "0_": 0, "0.5": 0.5, "010.5": 10.5, "010e1": 100, "1_000": 1000} {
		limits, err := ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  capacity: " + in + "\n"))
		require.NoError(t, err, in)
		assert.Equal(t, want, limits["a"].Capacity, in)
	}
	_, err = ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  period: 1h\n  rate: \"010\"\n"))
	assert.ErrorContains(t, err, `rate: "010" is not a number`)
}

// A period is read exactly, and one that is not a whole number of
// nanoseconds is refused: time.ParseDuration truncates each unit's
// fraction, computed in float64, and drops decimals beyond its range, so
// that 1.0000005ms was a period of 1ms without a word, and 0.5ns one of 0
// ("Period is 0s").
func TestParseLimitsPeriodExact(t *testing.T) {
	for _, p := range []string{"0.5ns", "1.0000005ms", "1ms0.5ns", "1.5ns", "0.0000000015s", "1.00000000000000000001s",
		"0." + strings.Repeat("0", 200) + "1s", "1.5μs0.0000001ns", "0." + strings.Repeat("1", 120) + "m"} {
		want := `line 4: period: "` + p + `" is not a whole number of nanoseconds: a period is a whole number of milliseconds, from 1ms to 876576h0m0s (100 years)`
		for _, doc := range []string{"a:\n  kind: token bucket\n  rate: 1\n  period: " + p + "\n",
			"{\"a\": {\"kind\": \"token bucket\",\n \"rate\": 1,\n\n \"period\": \"" + p + "\"}}"} {
			_, err := ratelimit.ParseLimits([]byte(doc))
			assert.ErrorContains(t, err, want, doc)
		}
	}
	for p, want := range map[string]time.Duration{
		"0.5000000000000h":                30 * time.Minute,
		"1.5000000000000000000000000000s": 1500 * time.Millisecond,
		"2.000001s":                       2000001 * time.Microsecond, // whole nanoseconds: Validate refuses it
		"0.5ns0.5ns":                      time.Nanosecond,
		"1h0.5m":                          time.Hour + 30*time.Second,
		"0.001h":                          3600 * time.Millisecond,
		"-1.5s":                           -1500 * time.Millisecond,
		"+.5s":                            500 * time.Millisecond,
		"0":                               0,
	} {
		var c ratelimit.Config
		require.NoError(t, yaml.Unmarshal([]byte("kind: token bucket\nrate: 1\nperiod: "+p+"\n"), &c), p)
		assert.Equal(t, want, c.Period, p)
	}
}

// A start at the zero time.Time, 0001-01-01T00:00:00Z however written, is
// refused: a Config reads it as no Start, a phase derived per key, so
// that windows the file aligned to it fell elsewhere, key by key, without
// a word. A millisecond later is a start like any other.
func TestParseLimitsZeroStart(t *testing.T) {
	for _, start := range []string{"0001-01-01T00:00:00Z", "0001-01-01T01:00:00+01:00", "0000-12-31T23:00:00-01:00"} {
		for _, doc := range []string{"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  start: " + start + "\n",
			`{"a": {"kind": "fixed window", "rate": 1, "period": "1h",` + "\n\n\n\n" + `"start": "` + start + `"}}`} {
			_, err := ratelimit.ParseLimits([]byte(doc))
			assert.ErrorContains(t, err, `line 5: start: "`+start+`" is the zero time, which means no start (a phase derived per key): leave start out for that, or write another time`, doc)
		}
	}
	limits, err := ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  start: 0001-01-01T00:00:00.001Z\n"))
	require.NoError(t, err)
	assert.Equal(t, time.Date(1, 1, 1, 0, 0, 0, 1e6, time.UTC), limits["a"].Start)
}

// A number too close to 0 for a float64, which reads as 0, is refused
// rather than taken for the field's default: "maxReserved: 1e-400" gave
// a bound on debt of 0, which means none at all, and "capacity: 1e-400"
// a capacity of Rate, without a word.
func TestParseLimitsNumberBelowFloat64(t *testing.T) {
	for _, bad := range []struct{ field, value string }{
		{"capacity", "1e-400"},
		{"maxReserved", "1e-400"},
		{"maxReserved", "-2.5e-330"},
		{"rate", "0.000001e-400"},
		{"capacity", "1E-400"},
	} {
		in := fmt.Sprintf("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  %s: %s\n", bad.field, bad.value)
		js := fmt.Sprintf(`{"kind": "fixed window", "rate": 1, "period": "1h", %q: %s}`, bad.field, bad.value)
		if bad.field == "rate" {
			in = fmt.Sprintf("a:\n  kind: fixed window\n  period: 1h\n  capacity: 1\n  rate: %s\n", bad.value)
			js = fmt.Sprintf(`{"kind": "fixed window", "period": "1h", "rate": %s}`, bad.value)
		}
		_, err := ratelimit.ParseLimits([]byte(in))
		assert.ErrorContains(t, err, fmt.Sprintf(`line 5: %s: %q is too close to 0 for a float64, which reads it as 0`, bad.field, bad.value), in)
		var c ratelimit.Config
		assert.ErrorContains(t, json.Unmarshal([]byte(js), &c), "too close to 0", bad.value)
	}
	_, err := ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  shards: 1e-400\n"))
	assert.ErrorContains(t, err, `shards: "1e-400" is not a whole number of shards`)
	// Zero written any way, and the least float64, read as they are.
	for in, want := range map[string]float64{"0": 0, "-0": 0, "0.0": 0, "0e-400": 0, "0x0": 0, ".0e5": 0, "4.9e-324": 5e-324} {
		limits, err := ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  maxReserved: " + in + "\n"))
		require.NoError(t, err, in)
		assert.Equal(t, want, limits["a"].MaxReserved, in)
	}
}

// A limit of the file without a kind is told what to write in the file,
// not the Go constants.
func TestParseLimitsWithoutKind(t *testing.T) {
	for _, doc := range []string{"signup:\n  rate: 3\n  period: 1m\n", `{"signup": {"rate": 3, "period": "1m"}}`} {
		_, err := ratelimit.ParseLimits([]byte(doc))
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
		assert.Contains(t, err.Error(), `line 1: limit "signup": Kind is not set: write kind: fixed window, or kind: token bucket`)
		assert.NotContains(t, err.Error(), "ratelimit.FixedWindow")
	}
}

// JSON text that is not UTF-8 is an error, as it is in YAML: encoding/json
// reads each byte that is not UTF-8 as U+FFFD, so that a limit named
// "a\xff" was declared as "a\uFFFD", a name no call gives, and the names
// "a\xff" and "a\xfe" were one name given twice.
func TestParseLimitsJSONNotUTF8(t *testing.T) {
	const limit = `{"kind": "fixed window", "rate": 1, "period": "1h"}`
	for _, in := range []string{
		"{\"a\xff\": " + limit + "}",
		"{\n\"ok\": " + limit + ",\n\"a\xfe\": " + limit + "}",
		"\uFEFF{\"a\xc3\": " + limit + "}",
	} {
		limits, err := ratelimit.ParseLimits([]byte(in))
		require.Error(t, err, "%q: got %v", in, limits)
		assert.ErrorContains(t, err, "is not UTF-8", in)
		assert.ErrorContains(t, err, fmt.Sprintf("line %d:", 1+strings.Count(in, "\n")), in)

		var viaJSON ratelimit.Limits
		err = json.Unmarshal([]byte(strings.TrimPrefix(in, "\uFEFF")), &viaJSON)
		assert.ErrorContains(t, err, "is not UTF-8", in)
	}
	var c ratelimit.Config
	err := json.Unmarshal([]byte("{\"kind\": \"fixed window\", \"rate\": 1, \"period\": \"1h\", \"f\xffo\": 1}"), &c)
	assert.ErrorContains(t, err, "is not UTF-8")
	// Text that is: the names read as written.
	limits, err := ratelimit.ParseLimits([]byte(`{"café": ` + limit + `}`))
	require.NoError(t, err)
	assert.Contains(t, limits, "café")
}

// A lone surrogate escape (\ud800) is refused, as text that is not UTF-8
// is: encoding/json reads it as U+FFFD, so that a limit named "a\ud800"
// was declared as "a\uFFFD", which no call names. A pair, and an escaped
// backslash before a "u", are not one.
func TestParseLimitsJSONLoneSurrogate(t *testing.T) {
	const limit = `{"kind": "fixed window", "rate": 1, "period": "1h"}`
	for _, c := range []struct{ in, escape string }{
		{`{"a\ud800": ` + limit + `}`, `\ud800`},
		{`{"a\uDFFF": ` + limit + `}`, `\uDFFF`},
		{`{"a\ude80\ud83d": ` + limit + `}`, `\ude80`},
		{`{"a\ud83d\ud83d\ude80": ` + limit + `}`, `\ud83d`},
		{`{"a\ud83dx": ` + limit + `}`, `\ud83d`},
		{"{\n\"ok\": " + limit + ",\n\"\\ud800\": " + limit + "}", `\ud800`},
		{`{"a": {"kind": "fixed window\udc00", "rate": 1, "period": "1h"}}`, `\udc00`},
	} {
		limits, err := ratelimit.ParseLimits([]byte(c.in))
		require.Error(t, err, "%s: got the limits %v", c.in, slices.Collect(maps.Keys(limits)))
		assert.ErrorContains(t, err, "line "+fmt.Sprint(1+strings.Count(c.in, "\n"))+": "+c.escape+" is half of a surrogate pair", c.in)

		var viaJSON ratelimit.Limits
		assert.ErrorContains(t, json.Unmarshal([]byte(c.in), &viaJSON), c.escape+" is half of a surrogate pair", c.in)
	}
	for in, name := range map[string]string{
		`{"\ud83d\ude80": ` + limit + `}`:           "🚀",
		`{"a\\ud800": ` + limit + `}`:               `a\ud800`,
		`{"\ufffd": ` + limit + `}`:                 "\uFFFD",
		"{\"\uFFFD\\ud83d\\ude80\": " + limit + "}": "\uFFFD🚀",
	} {
		limits, err := ratelimit.ParseLimits([]byte(in))
		require.NoError(t, err, in)
		assert.Contains(t, limits, name, in)
	}
}

// A JSON file counts its lines as the YAML parser does, whatever its line
// ends: CRLF, or CR alone (as old Mac files end them), which the JSON
// reader did not count, so that each error of such a file said line 1.
func TestParseLimitsJSONLineEnds(t *testing.T) {
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		js := strings.ReplaceAll("{\n\"a\": {\"kind\": \"fixed window\",\n\"rate\": 1,\n\"period\": \"1h\",\n\"bogus\": 1}}", "\n", eol)
		_, err := ratelimit.ParseLimits([]byte(js))
		assert.ErrorContains(t, err, `limit "a": line 5: unknown field "bogus"`, "%q", eol)
		yml := strings.ReplaceAll("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  bogus: 1\n", "\n", eol)
		_, err = ratelimit.ParseLimits([]byte(yml))
		assert.ErrorContains(t, err, `limit "a": line 5: unknown field "bogus"`, "YAML, %q", eol)
		_, err = ratelimit.ParseLimits([]byte(strings.ReplaceAll("{\n\"a\":\n\n\"\xff\"}", "\n", eol)))
		assert.ErrorContains(t, err, "line 4: byte 0xff is not UTF-8", "%q", eol)
	}
}

// A value or a name of the file is shown in an error cut to its first 256
// bytes, with its length, as LimitError shows a key: a file of one line
// of megabytes (a value pasted whole, a dump given by mistake) made an
// error line as long, which the command-line tool wrote whole.
func TestParseLimitsLongValuesInErrors(t *testing.T) {
	long := strings.Repeat("é", 5000) // 10,000 bytes
	digits := strings.Repeat("7", 10000)
	for _, tc := range []struct{ in, want string }{
		{"a: {kind: " + long + ", rate: 1, period: 1m}", `kind: unknown kind "` + strings.Repeat("é", 128) + `"… (10000 bytes): write "fixed window" or "token bucket"`},
		{"a: {kind: fixed window, rate: 1, period: " + long + "}", `period: "` + strings.Repeat("é", 128) + `"… (10000 bytes) is not a duration`},
		{"a: {kind: fixed window, rate: 1, period: " + digits + "h}", `period: "` + digits[:256] + `"… (10001 bytes) is out of range`},
		{"a: {kind: fixed window, rate: 1, period: 1." + digits + "ms}", `period: "1.` + digits[:254] + `"… (10004 bytes) is not a whole number of nanoseconds`},
		{"a: {kind: fixed window, rate: " + long + ", period: 1m}", `rate: "` + strings.Repeat("é", 128) + `"… (10000 bytes) is not a number`},
		{"a: {kind: fixed window, rate: 1e" + digits + ", period: 1m}", `rate: "1e` + digits[:254] + `"… (10002 bytes) is out of range`},
		{"a: {kind: fixed window, rate: 1e-" + digits + ", period: 1m}", `rate: "1e-` + digits[:253] + `"… (10003 bytes) is too close to 0`},
		{"a: {kind: fixed window, rate: 0" + strings.Repeat("1", 300) + ", period: 1m}", `rate: "0` + strings.Repeat("1", 255) + `"… (301 bytes) has a leading zero: write it without its leading zeros, or after 0o if octal is meant`},
		{"a: {kind: fixed window, rate: 1, period: 1m, shards: " + long + "}", `shards: "` + strings.Repeat("é", 128) + `"… (10000 bytes) is not a whole number of shards`},
		{"a: {kind: fixed window, rate: 1, period: 1m, shards: x" + long + "}", `shards: "x` + strings.Repeat("é", 127) + `"… (10001 bytes) is not a whole number of shards`}, // cut before the é it would split
		{"a: {kind: fixed window, rate: 1, period: 1m, shards: " + digits + "}", `shards: "` + digits[:256] + `"… (10000 bytes) is out of range`},
		{"a: {kind: fixed window, rate: 1, period: 1m, start: [" + long + "]}", `start: a list is not a time`},
		{"a: {kind: fixed window, rate: 1, period: 1m, start: " + long + "}", `start: "` + strings.Repeat("é", 128) + `"… (10000 bytes) is not a time`},
		{"a: {kind: fixed window, rate: 1, period: 1m, failOpen: " + long + "}", `failOpen: "` + strings.Repeat("é", 128) + `"… (10000 bytes) is not true or false`},
		{"a:\n  kind: fixed window\n  ? " + long + "\n  : 1\n", `unknown field "` + strings.Repeat("é", 128) + `"… (10000 bytes): the fields are`},
		{"? " + long + "\n: {kind: fixed window, rate: 1, period: 1m, bogus: 1}", `limit "` + strings.Repeat("é", 128) + `"… (10000 bytes): line 2: unknown field "bogus"`},
		{"? " + long + "\n: {kind: fixed window, rate: 1, period: 1m}\n? " + long + "\n: {}", `line 3: limit "` + strings.Repeat("é", 128) + `"… (10000 bytes) given twice`},
	} {
		_, err := ratelimit.ParseLimits([]byte(tc.in))
		require.Error(t, err, tc.want)
		assert.Less(t, len(err.Error()), 700, tc.want)
		assert.ErrorContains(t, err, tc.want)
		var limits ratelimit.Limits
		err = yaml.Unmarshal([]byte(tc.in), &limits)
		require.Error(t, err, tc.want)
		assert.Less(t, len(err.Error()), 700, tc.want)
	}
}

// A limit's name is cut in the error of its config, as in every other
// error of the file format: a limits file with a name of megabytes whose
// config New would refuse (rate: 0) made an error as long, which the
// command-line tool wrote whole. The ConfigError keeps the name whole.
func TestParseLimitsLongNamesInErrors(t *testing.T) {
	long := strings.Repeat("é", 5000) // 10,000 bytes
	cut := `"` + strings.Repeat("é", 128) + `"… (10000 bytes)`
	for _, in := range []string{
		"? " + long + "\n: {kind: fixed window, rate: 0, period: 1m}\n",
		`{"` + long + `": {"kind": "fixed window", "rate": 0, "period": "1m"}}`,
	} {
		_, err := ratelimit.ParseLimits([]byte(in))
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
		assert.EqualError(t, err, "ratelimit: limits file: line 1: limit "+cut+": Rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000")
		var ce *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, long, ce.Name, "the name whole")
		assert.Equal(t, "Rate", ce.Field)
	}
	_, err := ratelimit.New(must(memstore.New()), ratelimit.Limits{long: {Kind: ratelimit.FixedWindow, Period: time.Minute}})
	assert.EqualError(t, err, "ratelimit: limit "+cut+": Rate is 0: it must be a number of tokens from 1e-9 to 1000000000000000")
}

// A zero start written with a long fraction of a second, and a name
// tagged !!null, are cut in an error as any other value or name: they
// were shown whole.
func TestParseLimitsLongZeroStartAndNullName(t *testing.T) {
	long := strings.Repeat("é", 5000) // 10,000 bytes
	cut := `"` + strings.Repeat("é", 128) + `"… (10000 bytes)`
	zeros := strings.Repeat("0", 10000)
	for _, tc := range []struct{ in, want string }{
		{"a: {kind: fixed window, rate: 1, period: 1m, start: 0001-01-01T00:00:00." + zeros + "Z}",
			`start: "0001-01-01T00:00:00.` + zeros[:236] + `"… (10021 bytes) is the zero time`},
		{"? !!null " + long + "\n: {kind: fixed window, rate: 1, period: 1m}", `line 1: a limit name is null (` + cut + `)`},
		{"a: {kind: fixed window, rate: 1, period: 1m, ? !!null " + long + ": 1}", `line 1: a field name is null (` + cut + `)`},
	} {
		_, err := ratelimit.ParseLimits([]byte(tc.in))
		require.Error(t, err, tc.want)
		assert.Less(t, len(err.Error()), 700, tc.want)
		assert.ErrorContains(t, err, tc.want)
	}
}

// ParseLimitsJSON says, of JSON that is not an object of limits, or of a
// limit that is not an object, that a JSON object is expected, in JSON's
// words: it said "a mapping", YAML's. ParseLimits, which reads YAML too,
// still says a mapping.
func TestParseLimitsJSONNotObject(t *testing.T) {
	const fields = "(kind, rate, period, capacity, maxReserved, shards, start, failOpen)"
	for _, c := range []struct{ in, want string }{
		{`[]`, `ratelimit: limits file: write a JSON object of limit names to their fields`},
		{`[{"a": {"kind": "token bucket", "rate": 1, "period": "1s"}}]`, `ratelimit: limits file: write a JSON object of limit names to their fields`},
		{`"a"`, `ratelimit: limits file: write a JSON object of limit names to their fields`},
		{`null`, `ratelimit: limits file: write a JSON object of limit names to their fields`},
		{`{"a": []}`, `ratelimit: limits file: limit "a": line 1: a limit is a JSON object of fields ` + fields},
		{"{\n\"a\": null}", `ratelimit: limits file: limit "a": line 2: a limit is a JSON object of fields ` + fields},
	} {
		_, err := ratelimit.ParseLimitsJSON([]byte(c.in))
		assert.EqualError(t, err, c.want, c.in)
		_, err = ratelimit.ParseLimits([]byte(c.in))
		assert.ErrorContains(t, err, "mapping", c.in)
	}
	// A name given twice is told first, as before.
	_, err := ratelimit.ParseLimitsJSON([]byte(`{"a": {"kind": "token bucket", "rate": 1, "period": "1s"}, "a": 3}`))
	assert.EqualError(t, err, `ratelimit: limits file: line 1: limit "a" given twice`)
}

// ParseLimitsJSON holds a file to JSON's rules, and its errors name the
// line and the column where the text stops being JSON: read as YAML, a
// comma after the last member passed, and other slips had YAML's error
// ("yaml: line 1: did not find expected ',' or '}'"), of no column and
// often of the wrong line. ParseLimits still reads such text as YAML, its
// superset, when it is YAML, and gives JSON's error when it is neither.
func TestParseLimitsJSONSyntax(t *testing.T) {
	const limit = `{"kind": "token bucket", "rate": 1, "period": "1s"}`
	for _, c := range []struct {
		in, want string
		yaml     bool // ParseLimits reads it as YAML
	}{
		{`{"a": ` + limit + `,}`, `line 1, column 59: not JSON: a comma before }: JSON allows none after the last member of an object or an array; remove it`, true},
		{"{\n  \"a\": {\"kind\": \"token bucket\", \"rate\": 1, \"period\": \"1s\",\n  }\n}", `line 3, column 3: not JSON: a comma before }`, true},
		{`{"a": ` + limit + "}\x00", `line 1, column 59: not JSON: byte 0x00 after the JSON value: write one JSON object, with nothing after it but white space`, false},
		{`{"a": ` + limit + "}\n\n{}", `line 3, column 1: not JSON: '{' after the JSON value`, false},
		{"{\n\"é\": {\"kind\": \"token bucket\", \"rate\": 1 \"period\": \"1s\"}}", `line 2, column 41: not JSON: invalid character '"' after object key:value pair`, false},
		{`{"a": {"kind": "token bucket", 'rate': 1, "period": "1s"}}`, `line 1, column 32: not JSON: invalid character '\'' looking for beginning of object key string`, true},
		{`{"a": {"kind": "token bucket", "rate": 1, "period": 1s}}`, `line 1, column 54: not JSON: invalid character 's' after object key:value pair`, true},
		{`{"a": ` + limit, `line 1, column 58: not JSON: the JSON ends before its value does`, false},
		{" \n", `line 2, column 1: not JSON: the file is empty`, false},
	} {
		limits, err := ratelimit.ParseLimitsJSON([]byte(c.in))
		require.Error(t, err, "%q: got %v", c.in, limits)
		assert.Equal(t, "ratelimit: limits file: "+c.want, err.Error()[:min(len(err.Error()), len("ratelimit: limits file: ")+len(c.want))], "%q", c.in)

		limits, err = ratelimit.ParseLimits([]byte(c.in))
		switch {
		case c.yaml:
			assert.NoError(t, err, "%q", c.in)
			assert.Contains(t, limits, "a", "%q", c.in)
		case strings.TrimSpace(c.in) != "":
			require.Error(t, err, "%q: got %v", c.in, limits)
			assert.ErrorContains(t, err, c.want, "%q", c.in)
			assert.ErrorContains(t, err, "(nor is it YAML: yaml: ", "%q", c.in)
		}
	}
	limits, err := ratelimit.ParseLimitsJSON([]byte("\uFEFF{\"a\": " + limit + "}\n"))
	require.NoError(t, err)
	assert.Equal(t, ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 1, Period: time.Second}, limits["a"])
	_, err = ratelimit.ParseLimitsJSON([]byte(`{"a": {"kind": "token bucket", "rate": 0, "period": "1s"}}`))
	assert.ErrorContains(t, err, `ratelimit: limits file: line 1: limit "a": Rate is 0`)

	// Limits.UnmarshalJSON, called as a decoder of another format may call
	// it, without json.Unmarshal's check before it, says where too.
	var l ratelimit.Limits
	assert.EqualError(t, l.UnmarshalJSON([]byte(`{"a": `+limit+`,}`)),
		"limits: line 1, column 59: not JSON: a comma before }: JSON allows none after the last member of an object or an array; remove it")
}

// FuzzParseLimitsJSON reads any input without a panic; what it reads is
// JSON, read as ParseLimits reads it, and what it refuses for its syntax
// names a line and a column within the text.
func FuzzParseLimitsJSON(f *testing.F) {
	for _, s := range []string{
		`{"a": {"kind": "token bucket", "rate": 10, "period": "1m", "capacity": 3, "shards": 2, "failOpen": true}}`,
		`{"a": {"kind": "token bucket", "rate": 1, "period": "1s"},}`,
		"\uFEFF{\"\\ud83d\\ude80\": {\"kind\": \"fixed_window\", \"rate\": 1e15, \"period\": \"876576h\"}}",
		"{\"a\": {\"kind\": \"fixed window\", \"rate\": 1, \"period\": \"1s\"}}\x00",
		"{\n\"a\": {\"kind\": \"fixed window\", \"rate\": \"1\", \"period\": \"1s\", \"x\": {\"y\": [1]}}}",
		`{"a": {"kind": "fixed window", "rate": 1, "rate": 2, "period": "1s"}}`,
		`{"a": {"kind": "fixed window", "rate": 1e400, "period": "1s"}}`,
		`{"a": {"kind": "fixed window", "rate": NaN, "period": "1s"}}`,
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		limits, err := ratelimit.ParseLimitsJSON(data)
		if err == nil {
			require.True(t, json.Valid(bytes.TrimPrefix(data, []byte("\uFEFF"))), "read %q, not JSON", data)
			again, err := ratelimit.ParseLimits(data)
			require.NoError(t, err, "%q", data)
			require.Equal(t, limits, again, "%q", data)
			return
		}
		var line, column int
		if _, scanErr := fmt.Sscanf(err.Error(), "ratelimit: limits file: line %d, column %d: not JSON:", &line, &column); scanErr == nil {
			text := bytes.TrimPrefix(data, []byte("\uFEFF"))
			lines := strings.Split(strings.ReplaceAll(strings.ReplaceAll(string(text), "\r\n", "\n"), "\r", "\n"), "\n")
			require.LessOrEqual(t, line, len(lines), "%q: %v", data, err)
			require.GreaterOrEqual(t, line, 1, "%q: %v", data, err)
			require.GreaterOrEqual(t, column, 1, "%q: %v", data, err)
			require.LessOrEqual(t, column, utf8.RuneCountInString(lines[line-1])+1, "%q: %v", data, err)
		}
	})
}

// A JSON syntax error is still a *json.SyntaxError to errors.As, as
// Limits.UnmarshalJSON's and Config.UnmarshalJSON's were before their
// errors named the line and the column, with the offset of the byte at
// fault in the whole text.
func TestParseLimitsJSONSyntaxErrorAs(t *testing.T) {
	bad := []byte(`{"a": {"kind": "token bucket", "rate": 1 "period": "1s"}}`)
	var l ratelimit.Limits
	var se *json.SyntaxError
	require.ErrorAs(t, l.UnmarshalJSON(bad), &se)
	assert.Equal(t, int64(42), se.Offset)

	var c ratelimit.Config
	require.ErrorAs(t, c.UnmarshalJSON(bad[6:len(bad)-1]), &se)
	assert.Equal(t, int64(36), se.Offset)

	_, err := ratelimit.ParseLimitsJSON(bad)
	require.ErrorAs(t, err, &se)
	assert.Equal(t, int64(42), se.Offset)
	assert.ErrorContains(t, err, "line 1, column 42: not JSON: ")
}

// A character of several bytes where JSON stops is named as it is:
// encoding/json names its first byte as a character of its own, so that
// the curly quotes a text editor puts in said 'â', and a second byte
// order mark 'ï'.
func TestParseLimitsJSONSyntaxNamesCharacter(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"{\u201ca\u201d: {}}", `line 1, column 2: not JSON: invalid character '“' looking for beginning of object key string`},
		{"{\n  \"a\": \u201cfixed window\u201d}", `line 2, column 8: not JSON: invalid character '“' looking for beginning of value`},
		{"\uFEFF\uFEFF{}", `line 1, column 1: not JSON: invalid character '\ufeff' looking for beginning of value`},
		{"{} \u00e9", `line 1, column 4: not JSON: 'é' after the JSON value: write one JSON object, with nothing after it but white space`},
		{"{} \u200b", `line 1, column 4: not JSON: '\u200b' after the JSON value`},
	} {
		_, err := ratelimit.ParseLimitsJSON([]byte(c.in))
		assert.ErrorContains(t, err, "ratelimit: limits file: "+c.want, "%q", c.in)
	}
}
