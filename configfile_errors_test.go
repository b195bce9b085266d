package ratelimit_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// Every error of a limits file matches ErrInvalidConfig, as the error of
// a limit the file gives a value Validate refuses does: a program that
// reloads its limits tells a bad file from its own failures by it. A
// typo, a value that is not a number, a field given twice used to match
// nothing, so that a reload loop checking errors.Is took a misspelt field
// for another failure than a bad config.
func TestParseLimitsErrorsAreInvalidConfig(t *testing.T) {
	for _, in := range []string{
		"",
		"- a\n",
		"a: 3\n",
		"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  capcity: 5\n",
		"a:\n  kind: fixed window\n  rate: lots\n  period: 1h\n",
		"a:\n  kind: fixed window\n  rate: 1\n  rate: 2\n  period: 1h\n",
		"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\na: {}\n",
		"a:\n  kind: fixed window\n  rate: 1\n  period:\n",
		"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n---\nb: {}\n",
		"a: [",
		`{"a": {"kind": "fixed window", "rate": 1, "period": "1h"},,}`,
		`{"a": {"kind": "fixed window", "rate": 1, "period": "1h"}}` + "\x00",
		"a:\n  kind: fixed window\n  rate: 0\n  period: 1h\n",
	} {
		_, err := ratelimit.ParseLimits([]byte(in))
		require.Error(t, err, "%q", in)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidConfig, "%q: %v", in, err)
		_, err = ratelimit.ParseLimitsJSON([]byte(in))
		require.Error(t, err, "%q", in)
		assert.ErrorIs(t, err, ratelimit.ErrInvalidConfig, "%q: %v", in, err)
	}
}

// An error of a field of a limit of the file is a *ConfigError to
// errors.As, naming the limit and the field, as the error of a value
// Validate refuses is: its Field is the Config's field (Rate for rate),
// or the field as written when the format has none of that name. Its text
// is the file's error, with the line, unchanged.
func TestParseLimitsFieldErrorsAreConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		in, field, text string
	}{
		{"sendMessage:\n  kind: token bucket\n  rate: 5\n  period: 1m\n  capcity: 5\n", "capcity",
			`ratelimit: limits file: limit "sendMessage": line 5: unknown field "capcity" (did you mean "capacity"?): the fields are kind, rate, period, capacity, maxReserved, shards, start, failOpen`},
		{"sendMessage:\n  kind: token bucket\n  rate: lots\n  period: 1m\n", "Rate",
			`ratelimit: limits file: limit "sendMessage": line 3: rate: "lots" is not a number`},
		{"sendMessage:\n  kind: token bucket\n  rate: 5\n  period: 1m\n  maxReserved: 010\n", "MaxReserved",
			`ratelimit: limits file: limit "sendMessage": line 5: maxReserved: "010" has a leading zero, which YAML reads as octal (8): write 10, or 0o10 if octal is meant`},
		{"sendMessage:\n  kind: token bucket\n  rate: 5\n  rate: 6\n  period: 1m\n", "Rate",
			`ratelimit: limits file: limit "sendMessage": line 4: field "rate" given twice`},
		{"sendMessage:\n  kind: token bucket\n  rate: 5\n  period:\n", "Period",
			`ratelimit: limits file: limit "sendMessage": line 4: period: no value: write one, or leave the field out for its default`},
		{`{"sendMessage": {"kind": "token bucket", "rate": 5, "period": 60}}`, "Period",
			`ratelimit: limits file: limit "sendMessage": line 1: period: "60" is not a duration: write one such as "1m" or "1h30m"`},
		{`{"sendMessage": {"kind": "token bucket", "rate": 5, "period": "1m", "failOpen": "yes"}}`, "FailOpen",
			`ratelimit: limits file: limit "sendMessage": line 1: failOpen: "yes" is not true or false`},
	} {
		_, err := ratelimit.ParseLimits([]byte(tc.in))
		require.EqualError(t, err, tc.text)
		var ce *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce, tc.in)
		assert.Equal(t, "sendMessage", ce.Name, tc.in)
		assert.Equal(t, tc.field, ce.Field, tc.in)
		assert.NotEmpty(t, ce.Problem, tc.in)
	}
}

// json.Unmarshal and yaml.Unmarshal of Limits within an application's
// own configuration give the same errors: matching ErrInvalidConfig, and
// a *ConfigError naming the limit and the field for an error of a field.
func TestLimitsUnmarshalErrorsAreConfigErrors(t *testing.T) {
	var app struct {
		Limits ratelimit.Limits `json:"limits" yaml:"limits"`
	}
	err := json.Unmarshal([]byte(`{"limits": {"signup": {"kind": "fixed window", "rate": 1, "period": "1h", "capcity": 5}}}`), &app)
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	var ce *ratelimit.ConfigError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "signup", ce.Name)
	assert.Equal(t, "capcity", ce.Field)

	err = yaml.Unmarshal([]byte("limits:\n  signup:\n    kind: fixed window\n    rate: x\n    period: 1h\n"), &app)
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "signup", ce.Name)
	assert.Equal(t, "Rate", ce.Field)
	assert.Contains(t, err.Error(), `limits: limit "signup": line 4: rate: "x" is not a number`)

	// A Config alone has no name.
	var c ratelimit.Config
	err = json.Unmarshal([]byte(`{"kind": "fixed window", "rate": 1, "period": "1h", "shards": 1.5}`), &c)
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "", ce.Name)
	assert.Equal(t, "Shards", ce.Field)
	assert.EqualError(t, err, `line 1: shards: "1.5" is not a whole number of shards`)
}

// The ConfigError of an unknown field shows the field as the file's error
// does: quoted, so that a control character in it does not reach a
// terminal, and cut to its first 256 bytes, as a limit's name is; Field
// keeps it whole.
func TestParseLimitsUnknownFieldConfigErrorText(t *testing.T) {
	long := strings.Repeat("k", 10000)
	for field, want := range map[string]string{
		"capcity": `ratelimit: limit "a": "capcity" is an unknown field (did you mean "capacity"?): the fields are kind, rate, period, capacity, maxReserved, shards, start, failOpen`,
		// Rate, unknown where rate is known, reads as the Config's field:
		// it is quoted all the same.
		"Rate":      `ratelimit: limit "a": "Rate" is an unknown field (did you mean "rate"?): the fields are kind, rate, period, capacity, maxReserved, shards, start, failOpen`,
		`"\e[31mx"`: `ratelimit: limit "a": "\x1b[31mx" is an unknown field: the fields are kind, rate, period, capacity, maxReserved, shards, start, failOpen`,
		long:        `ratelimit: limit "a": "` + strings.Repeat("k", 256) + `"… (10000 bytes) is an unknown field: the fields are kind, rate, period, capacity, maxReserved, shards, start, failOpen`,
	} {
		_, err := ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  ? " + field + "\n  : 5\n"))
		var ce *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, want, ce.Error())
		assert.NotContains(t, ce.Field, `"`, "the field as written, unquoted")
	}
}

// A name or an unknown field of bytes that are not UTF-8, longer than 256
// bytes, is shown by its first 256 bytes, escaped: cutting back to a
// character's start, which none of them is, cut it to nothing (""). A
// character is still not split, and a newline is escaped.
func TestConfigErrorCutsBytesNotUTF8(t *testing.T) {
	notUTF8 := strings.Repeat("\x80", 300)
	shown := strconv.Quote(notUTF8[:256]) + "… (300 bytes)"
	err := &ratelimit.ConfigError{Name: notUTF8, Field: notUTF8, Problem: "is an unknown field"}
	assert.Equal(t, "ratelimit: limit "+shown+": "+shown+" is an unknown field", err.Error())

	for field, want := range map[string]string{
		strings.Repeat("a", 255) + "é":                              strings.Repeat("a", 255),
		strings.Repeat("a", 253) + "😀":                              strings.Repeat("a", 253),
		strings.Repeat("a", 252) + "😀x":                             strings.Repeat("a", 252) + "😀",
		strings.Repeat("a", 255) + "\xe2\x82":                       strings.Repeat("a", 255) + "\xe2",
		strings.Repeat("a", 254) + "\xe2x" + strings.Repeat("b", 9): strings.Repeat("a", 254) + "\xe2x",
		"a\nb" + strings.Repeat("c", 300):                           "a\nb" + strings.Repeat("c", 253),
	} {
		err := &ratelimit.ConfigError{Field: field, Problem: "is an unknown field"}
		assert.Equal(t, fmt.Sprintf("ratelimit: invalid config: %q… (%d bytes) is an unknown field", want, len(field)), err.Error())
	}
}

// The ConfigError of an unknown field matches ErrUnknownField, so that a
// program tells it from the error of a field of the Config with one
// errors.Is, also where the field as written reads as one of the Config's
// (Rate, where the file's field is rate; "Rate " with a space): Field
// alone cannot tell them apart. The error of a known field does not.
func TestParseLimitsUnknownFieldIsErrUnknownField(t *testing.T) {
	for _, tc := range []struct {
		in, field string
		unknown   bool
	}{
		{"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  Rate: 5\n", "Rate", true},
		{"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  \"Rate \": 5\n", "Rate ", true},
		{"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  capcity: 5\n", "capcity", true},
		{"a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  capcity: 5\n  capcity: 5\n", "capcity", true},
		{`{"a": {"kind": "fixed window", "rate": 1, "period": "1h", "Rate": 5}}`, "Rate", true},
		{"a:\n  kind: fixed window\n  rate: lots\n  period: 1h\n", "Rate", false},
		{"a:\n  kind: fixed window\n  rate: 0\n  period: 1h\n", "Rate", false},
		{"a:\n  kind: fixed window\n  rate: 1\n  rate: 1\n  period: 1h\n", "Rate", false},
		{"a:\n  kind: fixed window\n  rate:\n  period: 1h\n", "Rate", false},
	} {
		_, err := ratelimit.ParseLimits([]byte(tc.in))
		require.ErrorIs(t, err, ratelimit.ErrInvalidConfig, tc.in)
		var ce *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce, tc.in)
		assert.Equal(t, "a", ce.Name, tc.in)
		assert.Equal(t, tc.field, ce.Field, tc.in)
		assert.Equal(t, tc.unknown, errors.Is(err, ratelimit.ErrUnknownField), "%q: %v", tc.in, err)
		assert.Equal(t, tc.unknown, errors.Is(ce, ratelimit.ErrUnknownField), "%q: %v", tc.in, ce)
		if tc.unknown {
			assert.Contains(t, ce.Error(), strconv.Quote(tc.field)+" is ", tc.in)
		}
	}

	// A Config read alone, and the ConfigError of Validate.
	var c ratelimit.Config
	err := json.Unmarshal([]byte(`{"kind": "fixed window", "rate": 1, "period": "1h", "Period": "1m"}`), &c)
	require.ErrorIs(t, err, ratelimit.ErrUnknownField)
	err = ratelimit.Config{Kind: ratelimit.FixedWindow, Period: time.Hour}.Validate()
	require.ErrorIs(t, err, ratelimit.ErrInvalidConfig)
	require.NotErrorIs(t, err, ratelimit.ErrUnknownField)
}

// An unknown field given twice is reported as unknown, as when given once,
// at its first line, with the fields the format knows: its error matches
// ErrUnknownField, and said only that it was given twice, so that the fix
// it asked for (give it once) left the file refused for another reason.
// A known field given twice is reported as given twice.
func TestParseLimitsUnknownFieldGivenTwice(t *testing.T) {
	once := "a:\n  kind: fixed window\n  rate: 1\n  period: 1h\n  capcity: 5\n"
	_, want := ratelimit.ParseLimits([]byte(once))
	require.ErrorIs(t, want, ratelimit.ErrUnknownField)
	for _, in := range []string{
		once + "  capcity: 5\n",
		once + "  capacity: 5\n  capcity: 6\n",
	} {
		_, err := ratelimit.ParseLimits([]byte(in))
		require.ErrorIs(t, err, ratelimit.ErrUnknownField, in)
		assert.Equal(t, want.Error(), err.Error(), in)
		var ce, wantCE *ratelimit.ConfigError
		require.ErrorAs(t, err, &ce)
		require.ErrorAs(t, want, &wantCE)
		assert.Equal(t, wantCE.Error(), ce.Error(), in)
	}
	_, err := ratelimit.ParseLimitsJSON([]byte(`{"a": {"kind": "fixed window", "rate": 1, "period": "1h", "Rate": 5, "Rate": 6}}`))
	require.ErrorIs(t, err, ratelimit.ErrUnknownField)
	assert.Contains(t, err.Error(), `unknown field "Rate" (did you mean "rate"?)`)

	_, err = ratelimit.ParseLimits([]byte("a:\n  kind: fixed window\n  rate: 1\n  rate: 1\n  period: 1h\n"))
	require.NotErrorIs(t, err, ratelimit.ErrUnknownField)
	assert.Contains(t, err.Error(), `line 4: field "rate" given twice`)
}
