package ratelimit

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/duration"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
	"github.com/ratelimit-go/ratelimit/internal/rfc3339"

	"go.yaml.in/yaml/v3"
)

// Limits can be written in YAML or JSON, for ParseLimits, for the
// command-line tool, or for yaml.Unmarshal and json.Unmarshal of a Config
// (or of Limits) in an application's own configuration:
//
//	sendMessage:
//	  kind: token bucket
//	  rate: 10
//	  period: 1m
//	  capacity: 3
//	signup:
//	  kind: fixed window
//	  rate: 100
//	  period: 1h
//	  start: 2024-01-01T00:00:00Z
//	  failOpen: true
//
// or, in JSON, {"sendMessage": {"kind": "token bucket", "rate": 10,
// "period": "1m", "capacity": 3}, ...}. A file that is a JSON object is
// read by JSON's rules (its strings may hold any escape JSON allows, which
// YAML's do not), with the same fields and errors; ParseLimitsJSON reads
// JSON alone, and its syntax errors name the line and the column, where
// ParseLimits reads what is not JSON but YAML as YAML. Text that is not UTF-8
// is an error in JSON as in YAML, as is a JSON escape of half a surrogate
// pair alone ("a\ud800"), which is no character and which encoding/json
// reads as U+FFFD. json.Marshal and
// yaml.Marshal of a Config write this format, which reads back as the
// Config written, but for the location of Start (see MarshalJSON).
//
// The fields are kind ("fixed window" or "token bucket", in any case,
// with one space, _ or - between the words or none), rate, period (a
// Go duration: "1h", "90s", read exactly: one that is not a whole number
// of nanoseconds, such as 1.0000005ms, is an error), capacity,
// maxReserved, shards, start (an RFC 3339 time, held to RFC 3339 where
// time.Parse is not: an offset of +24:00 or +00:60, an hour of one digit
// or a comma before the fraction of a second is an error, and a
// lower-case t or z is read; as with time.Parse, a leap second (:60) is
// an error and a fraction's digits past the nanosecond are dropped; the
// zero time.Time, which means no start, is an error too) and failOpen (true or false, or y,
// yes, on, n, no and off unquoted, in lower case, capitalised or in
// capitals, as yaml.Unmarshal reads a bool); omitted fields
// take their zero values, and a field written without a value
// ("capacity:", null) is an error. An integer with a leading zero (010) is
// an error: yaml.Unmarshal reads it as YAML 1.1 does, the octal 8; octal
// is written 0o10. A number too close to 0 for a float64 (1e-400), which
// would read as 0, the default of capacity and maxReserved, is an error.
// An unknown field is an error, so that a misspelt one is not silently
// ignored; errors name the line and the field as written here. A limit name or a field name is text: a list, a mapping, null
// (~) or a name tagged !!binary is an error. Anchors, aliases and merges read as yaml.Unmarshal
// reads them ("<<: *defaults" gives the fields of defaults that the limit
// does not give), and a mapping merged into itself is an error, as it is
// there; a limit's keys, counting those of the mappings it merges,
// overridden ones included, are at most 100, so that merges through
// aliases cannot make a small file long to read, and merges nest at most
// 10,000 deep. A file is one YAML
// document: a second one, after a "---", is an error rather than ignored.

// configFile is a Config as files write it.
type configFile struct {
	Kind        driver.Kind `json:"kind" yaml:"kind"`
	Rate        float64     `json:"rate" yaml:"rate"`
	Period      string      `json:"period" yaml:"period"`
	Capacity    float64     `json:"capacity,omitempty" yaml:"capacity,omitempty"`
	MaxReserved float64     `json:"maxReserved,omitempty" yaml:"maxReserved,omitempty"`
	Shards      int         `json:"shards,omitempty" yaml:"shards,omitempty"`
	Start       *time.Time  `json:"start,omitempty" yaml:"start,omitempty"`
	FailOpen    bool        `json:"failOpen,omitempty" yaml:"failOpen,omitempty"`
}

func (c Config) file() (configFile, error) {
	f := configFile{Kind: c.Kind, Rate: c.Rate, Period: c.Period.String(), Capacity: c.Capacity,
		MaxReserved: c.MaxReserved, Shards: c.Shards, FailOpen: c.FailOpen}
	if !c.Start.IsZero() {
		start := c.Start.UTC()
		if y := start.Year(); y < 0 || y > 9999 {
			return f, fmt.Errorf("ratelimit: cannot encode start %v: an RFC 3339 time has a year from 0 to 9999", start)
		}
		f.Start = &start
	}
	return f, nil
}

// MarshalJSON writes c in the configuration file format. Start is written
// in UTC, so that it reads back as the same instant (time.Time.Equal) in
// UTC, without its location or monotonic clock reading; a Start outside
// the years 0 to 9999, which an RFC 3339 time cannot write, is an error.
func (c Config) MarshalJSON() ([]byte, error) {
	f, err := c.file()
	if err != nil {
		return nil, err
	}
	return json.Marshal(f)
}

// MarshalYAML writes c in the configuration file format, as MarshalJSON.
func (c Config) MarshalYAML() (any, error) { return c.file() }

// MarshalYAML writes l as yaml.Marshal writes a map of limit names to
// configs, but for a limit named "<<", which it quotes: yaml.Marshal
// writes that key plain, where it reads as a merge (<<: *defaults), so
// that the limits did not read back.
func (l Limits) MarshalYAML() (any, error) {
	var n yaml.Node
	if err := n.Encode(map[string]Config(l)); err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			k.Tag, k.Style = "!!str", yaml.DoubleQuotedStyle
		}
	}
	return &n, nil
}

// UnmarshalJSON reads c from the configuration file format. It does not
// validate: ParseLimits and New do. JSON null leaves c as it is, as
// json.Unmarshal does for any value, and yaml.Unmarshal for a null Config;
// a limit of a limits file (Limits, ParseLimits) written null is an error.
// json.Unmarshal gives c its value alone, so that the lines its errors
// name are counted from the value's first, not the document's.
func (c *Config) UnmarshalJSON(b []byte) error {
	doc, err := jsonDocument(b)
	if err != nil {
		return invalid(fmt.Errorf("limit config: %w", err))
	}
	n := doc.Content[0] // a document of one value
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	return c.UnmarshalYAML(n)
}

// UnmarshalJSON reads l from a JSON object of limit names to configs, as
// json.Unmarshal of a map would, into l's map if it has one, except that a
// name given twice is an error, as in YAML and ParseLimits, rather than
// the last one taking its place unseen. It does not validate: ParseLimits
// and New do. JSON null leaves l as it is. As for a Config, the lines its
// errors name are counted from the value's first line, not the
// document's.
func (l *Limits) UnmarshalJSON(b []byte) error {
	doc, err := jsonDocument(b)
	if err != nil {
		return invalid(fmt.Errorf("limits: %w", err))
	}
	n := doc.Content[0] // a document of one value
	switch {
	case n.Kind == yaml.ScalarNode && n.Tag == "!!null":
		return nil
	case n.Kind != yaml.MappingNode:
		return invalid(fmt.Errorf("limits: line %d: write an object of limit names to their fields", n.Line))
	}
	return l.read(n)
}

// UnmarshalYAML reads l from a mapping of limit names to configs, into
// l's map if it has one, by the rules of ParseLimits: a name that is null
// (~), tagged !!binary or given twice, or a limit written null, is an
// error, where yaml.Unmarshal of a plain map dropped a limit named ~
// without a word and declared one named !!binary /w== as the byte 0xff.
// Names are text, as in JSON: a name that is not UTF-8, which
// yaml.Marshal writes tagged !!binary, does not read back. It does not
// validate: ParseLimits and New do. A null is not given to it:
// yaml.Unmarshal sets l to nil, as it sets any map, where json.Unmarshal
// leaves l as it is (UnmarshalJSON).
func (l *Limits) UnmarshalYAML(n *yaml.Node) error {
	if n = resolve(n); n.Kind != yaml.MappingNode {
		return invalid(fmt.Errorf("limits: line %d: write a mapping of limit names to their fields", n.Line))
	}
	return l.read(n)
}

// read reads l from n, a mapping of limit names to configs, for
// UnmarshalJSON and UnmarshalYAML.
func (l *Limits) read(n *yaml.Node) error {
	entries, err := mappingFields(n, "limit", 0)
	if err != nil {
		return invalid(fmt.Errorf("limits: %w", err))
	}
	if *l == nil {
		*l = make(Limits, len(entries))
	}
	for _, e := range entries {
		name := resolve(e.key).Value
		var c Config
		if err := c.UnmarshalYAML(e.val); err != nil {
			return fmt.Errorf("limits: %w", inLimit(name, err))
		}
		(*l)[name] = c
	}
	return nil
}

// configField is a field of the file format, and how it is read.
type configField struct {
	name string
	read func(c *Config, n *yaml.Node) error
}

// configFields are the fields of the file format.
var configFields = []configField{
	{"kind", func(c *Config, n *yaml.Node) error {
		if n.Kind != yaml.ScalarNode {
			return errors.New(`write "fixed window" or "token bucket"`)
		}
		if err := c.Kind.UnmarshalText([]byte(n.Value)); err != nil {
			msg := strings.TrimPrefix(err.Error(), "ratelimit: ") // named once, by the caller
			return errors.New(strings.Replace(msg, strconv.Quote(n.Value), written(n.Value), 1))
		}
		return nil
	}},
	{"rate", func(c *Config, n *yaml.Node) error { return readNumber(n, &c.Rate) }},
	{"period", func(c *Config, n *yaml.Node) error {
		_, err := time.ParseDuration(n.Value)
		if n.Kind == yaml.ScalarNode && err != nil && durationSyntax.MatchString(n.Value) {
			return fmt.Errorf("%s is out of range: a period is from 1ms to %v (100 years)", written(n.Value), MaxPeriod)
		}
		if n.Kind != yaml.ScalarNode || err != nil {
			return fmt.Errorf("%s is not a duration: write one such as \"1m\" or \"1h30m\"", shown(n))
		}
		d, err := duration.Exact(n.Value)
		if err != nil {
			return fmt.Errorf("%s %w: a period is a whole number of milliseconds, from 1ms to %v (100 years)", written(n.Value), err, MaxPeriod)
		}
		c.Period = d
		return nil
	}},
	{"capacity", func(c *Config, n *yaml.Node) error { return readNumber(n, &c.Capacity) }},
	{"maxReserved", func(c *Config, n *yaml.Node) error { return readNumber(n, &c.MaxReserved) }},
	{"shards", func(c *Config, n *yaml.Node) error {
		var f float64
		var lz *leadingZeroError
		_, perr := strconv.ParseFloat(n.Value, 64)
		switch err := readNumber(n, &f); {
		case err != nil && (n.Kind != yaml.ScalarNode || errors.As(err, &lz)):
			return err
		case err != nil && n.Style&quotedStyle == 0 && errors.Is(perr, strconv.ErrRange):
			f = math.Inf(1) // beyond a float64: out of range below
		case err != nil || f != math.Trunc(f):
			return fmt.Errorf("%s is not a whole number of shards", written(n.Value))
		}
		if math.Abs(f) > math.MaxInt32 {
			return fmt.Errorf("%s is out of range: at most %d shards are supported", written(n.Value), MaxShards)
		}
		c.Shards = int(f) // Validate refuses more than MaxShards
		return nil
	}},
	{"start", func(c *Config, n *yaml.Node) error {
		t, err := rfc3339.Parse(n.Value)
		if n.Kind != yaml.ScalarNode || err != nil {
			return fmt.Errorf("%s is not a time: write an RFC 3339 time such as 2024-01-01T00:00:00Z", shown(n))
		}
		if t.IsZero() { // which Config reads as no Start
			return fmt.Errorf("%s is the zero time, which means no start (a phase derived per key): leave start out for that, or write another time", written(n.Value))
		}
		c.Start = t
		return nil
	}},
	{"failOpen", func(c *Config, n *yaml.Node) error {
		// Plain, yes, no, on and off are read as yaml.Unmarshal reads them
		// into a bool; quoted, as in JSON, they are text, as "true" is.
		var b bool
		if n.Kind != yaml.ScalarNode || n.Style&quotedStyle != 0 && n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
			return fmt.Errorf("%s is not true or false", shown(n))
		}
		c.FailOpen = b
		return nil
	}},
}

// durationSyntax matches what time.ParseDuration reads, of any size: a
// duration it refuses though it matches is out of its range.
var durationSyntax = regexp.MustCompile(`^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$`)

// quotedStyle marks a scalar written as text: quoted, as JSON strings
// are, or tagged.
const quotedStyle = yaml.DoubleQuotedStyle | yaml.SingleQuotedStyle | yaml.TaggedStyle

func readNumber(n *yaml.Node, x *float64) error {
	if n.Kind == yaml.ScalarNode && n.Decode(x) == nil {
		if *x == 0 && !isZero(n.Value) {
			// 0 is the default of capacity and maxReserved: a number
			// written for a bound must not read as none.
			return fmt.Errorf("%s is too close to 0 for a float64, which reads it as 0: write 0 if that is meant, or a number of at least %s", written(n.Value), numtext.Format(math.SmallestNonzeroFloat64))
		}
		return leadingZero(n.Value)
	}
	if _, err := strconv.ParseFloat(n.Value, 64); n.Kind == yaml.ScalarNode && n.Style&quotedStyle == 0 && errors.Is(err, strconv.ErrRange) {
		return fmt.Errorf("%s is out of range: a number of tokens is at most %s", written(n.Value), numtext.Format(MaxTokens))
	}
	return fmt.Errorf("%s is not a number", shown(n))
}

// isZero reports whether s, a number that reads as 0, is written as a
// zero, rather than as a number too small for a float64 (1e-400): no
// digit of its mantissa is other than 0.
func isZero(s string) bool {
	s = strings.ToLower(strings.TrimLeft(s, "+-"))
	if strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0o") || strings.HasPrefix(s, "0b") {
		return true // an integer: 0 only when written so
	}
	mantissa, _, _ := strings.Cut(s, "e")
	return !strings.ContainsAny(mantissa, "123456789")
}

// leadingZeroSyntax matches an integer written with a leading zero, its
// underscores removed: its sign, and its digits after the zeros.
var leadingZeroSyntax = regexp.MustCompile(`^([-+]?)0+([0-9]*)$`)

// leadingZero refuses a number, as written, that is an integer with a
// leading zero: yaml.Unmarshal reads 010 as YAML 1.1 does, the octal 8,
// where YAML 1.2, JSON's rules and a reader mean 10. Octal is written
// 0o10, as YAML 1.2 writes it.
func leadingZero(s string) error {
	plain := strings.ReplaceAll(s, "_", "")
	m := leadingZeroSyntax.FindStringSubmatch(plain)
	if m == nil || len(plain) == len(m[1])+1 { // 0, +0, -0
		return nil
	}
	sign, digits := m[1], m[2]
	if len(s) > maxWritten {
		return &leadingZeroError{fmt.Sprintf("%s has a leading zero: write it without its leading zeros, or after 0o if octal is meant", written(s))}
	}
	if digits == "" || strings.Trim(digits, "01234567") != "" { // 00, 08: as decimal
		return &leadingZeroError{fmt.Sprintf("%q has a leading zero: write %s%s", s, sign, cmp.Or(digits, "0"))}
	}
	octal := "octal"
	if v, err := strconv.ParseInt(sign+digits, 8, 64); err == nil {
		octal = fmt.Sprintf("octal (%d)", v)
	}
	return &leadingZeroError{fmt.Sprintf("%q has a leading zero, which YAML reads as %s: write %s%s, or %s0o%s if octal is meant",
		s, octal, sign, digits, sign, digits)}
}

// leadingZeroError is the error of leadingZero.
type leadingZeroError struct{ msg string }

func (e *leadingZeroError) Error() string { return e.msg }

// fieldNames lists the file format's fields, for messages.
func fieldNames() string {
	names := make([]string, len(configFields))
	for i, f := range configFields {
		names[i] = f.name
	}
	return strings.Join(names, ", ")
}

// unknownFieldError is the error of the field key, which the file format
// does not know, written at line.
func unknownFieldError(key string, line int) error {
	fix := fmt.Sprintf("%s: the fields are %s", didYouMean(key), fieldNames())
	return newFieldError(key, "is an unknown field"+fix, fmt.Sprintf("line %d: unknown field %s%s", line, written(key), fix))
}

// UnmarshalYAML reads c from the configuration file format. It does not
// validate: ParseLimits and New do.
func (c *Config) UnmarshalYAML(n *yaml.Node) error {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		return invalid(fmt.Errorf("line %d: a limit is a mapping of fields (%s)", n.Line, fieldNames()))
	}
	fields, err := mappingFields(n, "field", maxLimitKeys)
	if err != nil {
		return invalid(err)
	}
	*c = Config{}
	for _, f := range fields {
		key := resolve(f.key)
		j := fieldIndex(key.Value)
		if j < 0 {
			return unknownFieldError(key.Value, f.key.Line)
		}
		val := resolve(f.val)
		if val.Kind == yaml.ScalarNode && val.ShortTag() == "!!null" {
			const problem = "no value: write one, or leave the field out for its default"
			return newFieldError(key.Value, "has "+problem, fmt.Sprintf("line %d: %s: %s", f.val.Line, key.Value, problem))
		}
		if err := configFields[j].read(c, val); err != nil {
			return newFieldError(key.Value, err.Error(), fmt.Sprintf("line %d: %s: %v", f.val.Line, key.Value, err))
		}
	}
	return nil
}

// fieldError is the error of a field of a limit, as the file format
// tells it, with its line. It unwraps to a *ConfigError naming the field
// (and, once inLimit has named it, the limit), so that it matches
// ErrInvalidConfig and errors.As finds the limit and the field, as in the
// error of a value Validate refuses.
type fieldError struct {
	msg string
	ce  *ConfigError
}

func (e *fieldError) Error() string { return e.msg }
func (e *fieldError) Unwrap() error { return e.ce }

// newFieldError returns the fieldError of the field written as key: its
// ConfigError's Field is the Config's field that key reads (Rate for
// rate), or key as written when the format has none of that name.
func newFieldError(key, problem, msg string) error {
	ce := &ConfigError{Field: key, Problem: problem, written: true}
	if j := fieldIndex(key); j >= 0 {
		ce.Field, ce.written = configFields[j].goName(), false
	}
	return &fieldError{msg: msg, ce: ce}
}

// inLimit returns err, an error of Config.UnmarshalYAML, as the error of
// the limit called name: its text after the limit's name, and its
// ConfigError, if any, naming the limit.
func inLimit(name string, err error) error {
	var fe *fieldError
	if errors.As(err, &fe) {
		fe.ce.Name, fe.ce.named = name, name == ""
	}
	return fmt.Errorf("limit %s: %w", written(name), err)
}

// invalid returns err, an error of the file format, matching
// ErrInvalidConfig: every error of a limits file does, so that a program
// reloading its limits tells a bad file from its own failures.
func invalid(err error) error {
	if errors.Is(err, ErrInvalidConfig) {
		return err
	}
	return &invalidError{err}
}

// invalidError is an error of the file format that matches
// ErrInvalidConfig (invalid).
type invalidError struct{ err error }

func (e *invalidError) Error() string        { return e.err.Error() }
func (e *invalidError) Unwrap() error        { return e.err }
func (e *invalidError) Is(target error) bool { return target == ErrInvalidConfig }

// resolve follows n to the node it stands for when it is an alias (*x),
// so that an alias reads as what its anchor (&x) names, as yaml.Unmarshal
// reads it.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// shown returns how an error shows the value n: as written, or as the
// list or mapping it is.
func shown(n *yaml.Node) string {
	switch resolve(n).Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	}
	return written(n.Value)
}

// written returns s, a value or a name as the file writes it, or a limit's
// name as a caller gives it, quoted for an error by quoteCut, cut to its
// first maxWritten bytes, so that a file of a line of megabytes, or a name
// as long, does not make an error as long. Every error of the package that
// shows a limit's name shows it by written, so that each reads alike.
func written(s string) string { return quoteCut(s, maxWritten) }

// quoteCut returns s quoted for an error (strconv.Quote: control
// characters and bytes that are not UTF-8 escaped, so that they do not
// reach a terminal) and, when it is longer than most bytes, cut to its
// first most (at a character's start: cutAt), followed by its length. The
// errors of the package show a name, a key or a file's field by it alone
// (LimitError, ConfigError), so that each shows alike.
func quoteCut(s string, most int) string {
	if len(s) <= most {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%q… (%d bytes)", s[:cutAt(s, most)], len(s))
}

// cutAt returns where to cut s, longer than most bytes, to keep at most
// most bytes of it: most, or the start of a character whose UTF-8
// encoding most would split. Bytes that are not UTF-8 are cut anywhere,
// so that text of them (a name of bytes 0x80) is not cut to nothing, as
// backing up to a character's start did.
func cutAt(s string, most int) int {
	for i := most; i > 0 && i > most-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i-1]) {
			if r, n := utf8.DecodeRuneInString(s[i-1:]); r != utf8.RuneError || n > 1 {
				if i-1+n > most {
					return i - 1
				}
			}
			return most
		}
	}
	return most
}

// maxWritten is the most bytes of a value or a name that an error of the
// file format shows: more than any value a reader could mean (a period
// of a hundred decimals is refused, and shown whole), less than a line of
// a screen or two.
const maxWritten = 256

// field is one key and its value in a mapping.
type field struct{ key, val *yaml.Node }

// mappingFields lists the fields of the mapping n, with those of the
// mappings it merges ("<<: *defaults") that it does not give itself, as
// yaml.Unmarshal reads a struct: a key of n wins over a merged one, and an
// earlier merged mapping over a later one. A key n gives twice is an
// error, naming it as a what ("field", "limit"); a field the format does
// not know given twice, that of an unknown field. A mapping merged again
// (through another alias of its anchor) is read once: it can give nothing
// new. A mapping merged into itself, through an alias within its own
// anchor, is an error, as it is to yaml.Unmarshal. With most > 0, more
// than most keys, counting those of n and of every mapping merged, those
// overridden included, are an error.
func mappingFields(n *yaml.Node, what string, most int) ([]field, error) {
	w := fieldWalk{what: what, seen: map[string]bool{}, walked: map[*yaml.Node]bool{n: false}, most: most}
	if err := w.walk(n); err != nil {
		return nil, err
	}
	return w.fields, nil
}

// fieldWalk walks a mapping and those it merges, depth first, in order:
// the first of the keys it meets wins.
type fieldWalk struct {
	what   string
	seen   map[string]bool     // the keys met
	walked map[*yaml.Node]bool // the mappings met: false while being walked
	fields []field
	most   int // the most keys to meet, if > 0
	met    int // the keys met, those of merges and overridden ones included
	depth  int // the merges being walked, one within another
}

// maxMergeDepth bounds the merges walked one within another, as the YAML
// parser bounds a file's nesting: a chain of mappings, each merging the
// one before, nests through aliases without it, and millions of them
// overflowed the stack.
const maxMergeDepth = 10000

// maxLimitKeys bounds the keys of a limit, counting those of the mappings
// it merges: merges through aliases of a long list of mappings, a few
// bytes each, made reading each limit as long as reading the list, so
// that a file of 2.5 MB took 20 s. A limit has 8 fields.
const maxLimitKeys = 100

func (w *fieldWalk) walk(n *yaml.Node) error {
	own := make(map[string]int, len(n.Content)/2) // a key's first line
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if w.met++; w.most > 0 && w.met > w.most {
			return fmt.Errorf("line %d: more than %d keys, counting those of the mappings merged (<<): a limit has %d fields", key.Line, w.most, len(configFields))
		}
		if key.Kind == yaml.ScalarNode && key.ShortTag() == "!!merge" {
			merges = append(merges, val)
			continue
		}
		k := resolve(key)
		switch {
		case k.Kind != yaml.ScalarNode:
			return fmt.Errorf("line %d: a %s name is %s: write text", key.Line, w.what, shown(k))
		case k.ShortTag() == "!!null":
			return fmt.Errorf("line %d: a %s name is null (%s): write another, or quote it", key.Line, w.what, written(k.Value))
		case k.ShortTag() == "!!binary":
			// yaml.Unmarshal decodes it, to bytes that need not be text;
			// its Value is the base64, another name.
			return fmt.Errorf("line %d: a %s name tagged !!binary: write text", key.Line, w.what)
		}
		name := k.Value
		if first, ok := own[name]; ok {
			if w.what == "field" && fieldIndex(name) < 0 {
				// Unknown, which giving it once would not mend: said as
				// when it is given once.
				return unknownFieldError(name, first)
			}
			msg := fmt.Sprintf("line %d: %s %s given twice", key.Line, w.what, written(name))
			if w.what == "field" {
				return newFieldError(name, "is given twice", msg)
			}
			return errors.New(msg)
		}
		own[name] = key.Line
		if !w.seen[name] {
			w.seen[name] = true
			w.fields = append(w.fields, field{key, val})
		}
	}
	for _, val := range merges {
		var from []*yaml.Node
		switch v := resolve(val); v.Kind {
		case yaml.MappingNode:
			from = []*yaml.Node{v}
		case yaml.SequenceNode:
			from = v.Content
		}
		if len(from) == 0 {
			return fmt.Errorf("line %d: a merge (<<) takes a mapping or a list of mappings", val.Line)
		}
		for _, m := range from {
			if m = resolve(m); m.Kind != yaml.MappingNode {
				return fmt.Errorf("line %d: a merge (<<) takes a mapping or a list of mappings", val.Line)
			}
			done, met := w.walked[m]
			switch {
			case met && !done:
				return fmt.Errorf("line %d: a merge (<<) of a mapping into itself (the mapping of line %d)", val.Line, m.Line)
			case met:
				continue // all its keys are met already
			}
			if w.depth++; w.depth > maxMergeDepth {
				return fmt.Errorf("line %d: merges (<<) nested more than %d deep", val.Line, maxMergeDepth)
			}
			w.walked[m] = false
			if err := w.walk(m); err != nil {
				return err
			}
			w.walked[m] = true
			w.depth--
		}
	}
	return nil
}

// goName returns the name of the Config field that f reads: its name in
// the file, capitalised (rate, Rate; maxReserved, MaxReserved).
func (f configField) goName() string { return strings.ToUpper(f.name[:1]) + f.name[1:] }

func fieldIndex(name string) int {
	for i, f := range configFields {
		if f.name == name {
			return i
		}
	}
	return -1
}

// didYouMean suggests the field a misspelt name stands for: written in
// another case or with separators ("max_reserved", "FailOpen"), or a
// letter or two off ("capcity", "perid").
func didYouMean(name string) string {
	fold := func(s string) string {
		return strings.ToLower(strings.NewReplacer("_", "", "-", "", " ", "").Replace(s))
	}
	best, bestDist := "", 0
	for _, f := range configFields {
		d := editDistance(fold(f.name), fold(name))
		if d <= 1+len(f.name)/4 && (best == "" || d < bestDist) {
			best, bestDist = f.name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance returns the least number of letters to insert, delete,
// replace or swap with the next to make a into b.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return max(len(a), len(b)) // not a field's name, and not worth the time
	}
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// ParseLimits reads named limits from YAML or JSON (a mapping of name to
// config, as above) and validates every one. An error names the line and
// the limit as written; a field the file misspells or repeats is named as
// written, and one whose value Config.Validate refuses by its Go name
// (Rate for rate, MaxReserved for maxReserved), as New would say it.
//
// Every error matches ErrInvalidConfig, a file that is not YAML or JSON
// too, so that a program reloading its limits tells a bad file from its
// own failures. The error of a limit's field (a value the file format or
// Validate refuses, a field unknown, given twice or without a value) is a
// *ConfigError to errors.As, naming the limit and the field: the Config's
// (Rate for rate), or the field as written when the format has none of
// that name ("capcity"). Its text is the file's error, with the line. The
// same holds for the errors of the UnmarshalJSON and UnmarshalYAML methods
// of Limits and of Config (whose ConfigError names no limit), though not
// for the decoder's own, of a syntax error of the document around them.
//
// Text that starts as a JSON object does ({ or [, after white space) is
// read as JSON, and otherwise as YAML. YAML's flow mappings start so too,
// and YAML is a superset of JSON: such text that is not JSON but is YAML
// ({a: 1}, or a comma after the last member) is read as YAML; text that is
// neither is refused with JSON's error, naming its line and column, and
// YAML's. A file known to be JSON, such as one named .json, is better read
// by ParseLimitsJSON, which holds it to JSON's rules alone.
func ParseLimits(data []byte) (Limits, error) {
	var doc yaml.Node
	var err error
	var (
		notUTF8 *notUTF8Error
		lone    *loneSurrogateError
		syntax  *jsonSyntaxError
	)
	if !looksJSON(data) {
		doc, err = parseDocument(data)
	} else if doc, err = jsonDocument(data); err != nil && !errors.As(err, &notUTF8) && !errors.As(err, &lone) {
		jsonErr := err
		if doc, err = parseDocument(data); err != nil && errors.As(jsonErr, &syntax) {
			err = fmt.Errorf("%w (nor is it YAML: %v)", jsonErr, err)
		}
	}
	if err != nil {
		return nil, invalid(fmt.Errorf("ratelimit: limits file: %w", err))
	}
	return parseLimits(data, doc, "a mapping")
}

// ParseLimitsJSON reads named limits from JSON, as ParseLimits does, but
// by JSON's rules (RFC 8259) alone: text that is not one JSON value, such
// as an object with a comma after its last member, a name in single quotes
// or none, or a byte after the value (a NUL a tool left), is an error,
// which names the line and the column where the text stops being JSON,
// where ParseLimits would read such text as YAML, or refuse it with
// YAML's error too. errors.As finds in such an error the
// *json.SyntaxError, whose Offset counts from the start of data, after
// a byte order mark if there is one. Text that is JSON but not an object
// of limits (an array), or a limit that is not an object, is told that a
// JSON object is expected, where ParseLimits says a mapping.
func ParseLimitsJSON(data []byte) (Limits, error) {
	doc, err := jsonDocument(data)
	if err != nil {
		return nil, invalid(fmt.Errorf("ratelimit: limits file: %w", err))
	}
	return parseLimits(data, doc, "a JSON object")
}

// parseLimits reads and validates the limits of doc, the document that
// data is read as, for ParseLimits and ParseLimitsJSON. mapping names
// what the file and each limit are to be, in the words of its format: a
// mapping, or for JSON alone, a JSON object.
func parseLimits(data []byte, doc yaml.Node, mapping string) (Limits, error) {
	if len(bytes.TrimSpace(data)) == 0 || doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, invalid(fmt.Errorf("ratelimit: limits file: write %s of limit names to their fields", mapping))
	}
	entries, err := mappingFields(doc.Content[0], "limit", 0)
	if err != nil {
		return nil, invalid(fmt.Errorf("ratelimit: limits file: %w", err))
	}
	limits := make(Limits, len(entries))
	for _, e := range entries {
		name := resolve(e.key).Value
		if v := resolve(e.val); v.Kind != yaml.MappingNode && mapping != "a mapping" {
			return nil, invalid(fmt.Errorf("ratelimit: limits file: limit %s: line %d: a limit is %s of fields (%s)", written(name), v.Line, mapping, fieldNames()))
		}
		var c Config
		if err := c.UnmarshalYAML(e.val); err != nil {
			return nil, fmt.Errorf("ratelimit: limits file: %w", inLimit(name, err))
		}
		if err := c.validate(name, true); err != nil {
			var ce *ConfigError
			if errors.As(err, &ce) && ce.Field == "Kind" && c.Kind == 0 {
				// The Go constants are no help to a file's author.
				ce.Problem = `is not set: write kind: fixed window, or kind: token bucket`
			}
			return nil, &lineError{line: e.key.Line, err: err}
		}
		limits[name] = c
	}
	return limits, nil
}

// parseDocument reads data as one YAML document. yaml.Unmarshal reads the
// first of several and drops the rest, so that limits after a "---" would
// be silently ignored: a second document is an error.
func parseDocument(data []byte) (yaml.Node, error) {
	var doc, more yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return doc, err
	}
	switch err := dec.Decode(&more); {
	case errors.Is(err, io.EOF):
		return doc, nil
	case err != nil:
		return doc, err
	default:
		return doc, fmt.Errorf("line %d: a second YAML document: a limits file is one document, write every limit in one mapping", more.Line)
	}
}

// looksJSON reports whether data starts as a JSON object or array does.
// JSON is read as JSON: the YAML parser refuses some valid JSON strings (a
// surrogate pair escape such as \ud83d\ude80, which encoders write for a
// character outside the BMP, \/ and \u0000).
func looksJSON(data []byte) bool {
	data = bytes.TrimSpace(bytes.TrimPrefix(data, []byte("\uFEFF")))
	return len(data) > 0 && (data[0] == '{' || data[0] == '[')
}

// jsonDocument reads data, JSON, as the YAML node tree the YAML parser
// makes of it, with the strings decoded by JSON's rules and the nodes'
// lines, so that the readers of the fields and their errors are the same
// for both. It refuses what json.Valid refuses: data that is not one JSON
// value, with nothing but white space after it, nested at most
// jsonMaxDepth deep. It refuses too data that is not UTF-8, as the YAML
// parser does, and as JSON's rules (RFC 8259) do: encoding/json reads
// each byte that is not UTF-8 as U+FFFD, so that a limit named "a\xff"
// was declared as "a\uFFFD", which no call names.
func jsonDocument(data []byte) (yaml.Node, error) {
	data = bytes.TrimPrefix(data, []byte("\uFEFF"))
	if !utf8.Valid(data) {
		return yaml.Node{}, notUTF8At(data)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	off, line := 0, 1
	nextLine := func() int { // the line of the next token
		end := int(dec.InputOffset())
		for end < len(data) && strings.IndexByte(" \t\r\n:,", data[end]) >= 0 {
			end++
		}
		line += lineBreaks(data[off:end])
		off = end
		return line
	}
	depth := 0
	var value func() (*yaml.Node, error)
	value = func() (*yaml.Node, error) {
		n := &yaml.Node{Kind: yaml.ScalarNode, Line: nextLine()}
		start := int(dec.InputOffset())
		tok, err := dec.Token()
		if err != nil {
			return nil, jsonSyntax(data, err)
		}
		switch tok := tok.(type) {
		case json.Delim:
			if depth++; depth > jsonMaxDepth {
				return nil, fmt.Errorf("JSON nested more than %d deep", jsonMaxDepth)
			}
			defer func() { depth-- }()
			n.Kind, n.Tag, n.Style = yaml.MappingNode, "!!map", yaml.FlowStyle
			if tok == '[' {
				n.Kind, n.Tag = yaml.SequenceNode, "!!seq"
			}
			for dec.More() {
				child, err := value()
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, child)
			}
			if _, err := dec.Token(); err != nil {
				return nil, jsonSyntax(data, err)
			}
		case string:
			// encoding/json reads a lone surrogate escape as U+FFFD.
			if strings.ContainsRune(tok, utf8.RuneError) {
				if esc, ok := loneSurrogate(data[start:dec.InputOffset()]); ok {
					return nil, &loneSurrogateError{line: n.Line, escape: esc}
				}
			}
			n.Tag, n.Style, n.Value = "!!str", yaml.DoubleQuotedStyle, tok
		case json.Number:
			n.Value = tok.String()
			n.Tag = n.ShortTag()
		case bool:
			n.Tag, n.Value = "!!bool", strconv.FormatBool(tok)
		case nil:
			n.Tag, n.Value = "!!null", "null"
		}
		return n, nil
	}
	root, err := value()
	if err != nil {
		return yaml.Node{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return yaml.Node{}, jsonSyntax(data, err)
	}
	return yaml.Node{Kind: yaml.DocumentNode, Line: root.Line, Content: []*yaml.Node{root}}, nil
}

// jsonSyntax returns the error of data, which the JSON decoder refused
// with err, as a *jsonSyntaxError naming the line and the column where
// data stops being JSON. The decoder's own offsets are not those of the
// document (they count from the value it was reading), so json.Unmarshal's
// check of the whole text, whose offset is that of the byte at fault, or
// the end, gives the place; its message the rest, but where a plainer one
// says what to do.
func jsonSyntax(data []byte, err error) error {
	var se *json.SyntaxError
	if !errors.As(json.Unmarshal(data, new(json.RawMessage)), &se) {
		return err // not a syntax error (json.Unmarshal reads data)
	}
	at := min(int(se.Offset), len(data))
	if at > 0 && se.Error() != "unexpected end of JSON input" {
		at-- // the offset is past the byte at fault
	}
	e := &jsonSyntaxError{line: 1 + lineBreaks(data[:at]), msg: se.Error(), err: se}
	if at < len(data) && data[at] >= utf8.RuneSelf {
		// encoding/json names the first byte of a character of several
		// as a character of its own: 'â' for the curly quote “.
		e.msg = strings.Replace(e.msg, strconv.QuoteRune(rune(data[at])), quoteChar(data[at:]), 1)
	}
	lineStart := bytes.LastIndexAny(data[:at], "\r\n") + 1
	e.column = 1 + utf8.RuneCount(data[lineStart:at])
	before := bytes.TrimRight(data[:at], " \t\r\n")
	switch {
	case len(bytes.TrimSpace(data)) == 0:
		e.msg = "the file is empty: write a JSON object of limit names to their fields"
	case at == len(data):
		e.msg = "the JSON ends before its value does: close every string with \", every { with } and every [ with ]"
	case strings.HasSuffix(se.Error(), "after top-level value"):
		e.msg = fmt.Sprintf("%s after the JSON value: write one JSON object, with nothing after it but white space", quoteChar(data[at:]))
	case (data[at] == '}' || data[at] == ']') && bytes.HasSuffix(before, []byte(",")):
		e.msg = fmt.Sprintf("a comma before %c: JSON allows none after the last member of an object or an array; remove it", data[at])
	}
	return e
}

// quoteChar shows the first character of b, UTF-8 text, for an error:
// quoted, as it is where it is printable and escaped otherwise ('\u200b'),
// and an ASCII control (a NUL) by its value.
func quoteChar(b []byte) string {
	r, _ := utf8.DecodeRune(b)
	if r < 0x20 || r == 0x7f {
		return fmt.Sprintf("byte 0x%02x", r)
	}
	return strconv.QuoteRune(r)
}

// jsonSyntaxError is the error of text that is not JSON, with the line
// and the column, in characters from 1, where it stops being JSON. It
// unwraps to encoding/json's error, whose Offset is that of the byte at
// fault in the whole text: errors.As finds a *json.SyntaxError, as it did
// in the decoder's error this one replaced.
type jsonSyntaxError struct {
	line, column int
	msg          string
	err          *json.SyntaxError
}

func (e *jsonSyntaxError) Error() string {
	return fmt.Sprintf("line %d, column %d: not JSON: %s", e.line, e.column, e.msg)
}

func (e *jsonSyntaxError) Unwrap() error { return e.err }

// loneSurrogate returns the first escape of a surrogate (\ud800 to
// \udfff) in raw, a JSON string as written, that is not one half of a
// pair: a high one followed by a low one.
func loneSurrogate(raw []byte) (string, bool) {
	hex := func(i int) (rune, bool) { // the \uXXXX at raw[i:], if any
		if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
		return rune(v), err == nil
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		r, ok := hex(i)
		if !ok {
			i++ // another escape, \\ among them
			continue
		}
		if utf16.IsSurrogate(r) {
			if low, ok := hex(i + 6); r < 0xdc00 && ok && low >= 0xdc00 && low <= 0xdfff {
				i += 11 // the pair
				continue
			}
			return string(raw[i : i+6]), true
		}
		i += 5
	}
	return "", false
}

// loneSurrogateError is the error of a JSON string holding a lone
// surrogate escape, which encoding/json reads as U+FFFD: a limit named
// "a\ud800" was declared as "a\uFFFD", which no call names.
type loneSurrogateError struct {
	line   int
	escape string
}

func (e *loneSurrogateError) Error() string {
	return fmt.Sprintf("line %d: %s is half of a surrogate pair, alone, which is no character: write the character itself, or both halves of its pair (\\ud83d\\ude80)", e.line, e.escape)
}

// notUTF8Error is the error of JSON text that is not UTF-8.
type notUTF8Error struct {
	line int
	b    byte // the first byte that is not UTF-8
}

func (e *notUTF8Error) Error() string {
	return fmt.Sprintf("line %d: byte %#x is not UTF-8: JSON text is UTF-8; write the file in UTF-8", e.line, e.b)
}

// notUTF8At returns the error of data, which is not UTF-8, naming the
// line of its first byte that is not.
func notUTF8At(data []byte) error {
	i := 0
	for i < len(data) {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size <= 1 {
			break
		}
		i += size
	}
	return &notUTF8Error{line: 1 + lineBreaks(data[:i]), b: data[i]}
}

// lineBreaks counts the line breaks of b as the YAML parser counts them,
// so that the lines of a JSON file are those of the same file read as
// YAML: LF, CRLF, and CR alone.
func lineBreaks(b []byte) int {
	return bytes.Count(b, []byte("\n")) + bytes.Count(b, []byte("\r")) - bytes.Count(b, []byte("\r\n"))
}

// jsonMaxDepth is the deepest nesting json.Valid accepts.
const jsonMaxDepth = 10000

// lineError is a validation error of a limits file, with its line. It
// unwraps to the *ConfigError.
type lineError struct {
	line int
	err  error
}

func (e *lineError) Error() string {
	return fmt.Sprintf("ratelimit: limits file: line %d: %s", e.line, strings.TrimPrefix(e.err.Error(), "ratelimit: "))
}

func (e *lineError) Unwrap() error { return e.err }
