package main

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/duration"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
	"github.com/ratelimit-go/ratelimit/internal/rfc3339"
	"github.com/spf13/pflag"
)

// limitFlags select one limit: from a limits file (--limits, --name) or
// given inline (--kind, --rate, ...).
type limitFlags struct {
	file, name               string
	kind                     string
	rate, capacity, reserved float64
	period                   time.Duration
	shards                   int
	start                    string
	fs                       *pflag.FlagSet // to tell the flags given
	simulated                bool           // simulate's: no --start aligns windows to the simulation's start
}

// noStart says what a fixed window without --start is, for the errors
// of a --start that would be taken for none.
func (f *limitFlags) noStart() string {
	if f.simulated {
		return "windows aligned to the simulation's start, 00:00:00"
	}
	return "windows at a phase of each key"
}

// inlineFlags are the flags of an inline limit, which a limits file
// replaces.
var inlineFlags = []string{"kind", "rate", "period", "capacity", "max-reserved", "shards", "start"}

func (f *limitFlags) register(fs *pflag.FlagSet) {
	f.fs = fs
	fs.StringVar(&f.file, "limits", "", "a limits file, JSON or YAML (.json, .yaml, .yml)")
	fs.StringVar(&f.name, "name", "", "the limit's name (in the limits file, or for an inline limit)")
	fs.StringVar(&f.kind, "kind", "", `inline limit: "fixed window" or "token bucket"`)
	fs.Var((*decimalFloat)(&f.rate), "rate", "inline limit: tokens granted per period")
	fs.Var((*exactDuration)(&f.period), "period", "inline limit: window length or refill period (e.g. 1m, 1h)")
	fs.Var((*decimalFloat)(&f.capacity), "capacity", "inline limit: most tokens held (default: rate)")
	fs.Var((*decimalFloat)(&f.reserved), "max-reserved", "inline limit: most tokens owed by reservations (default: unlimited)")
	fs.Var((*decimalInt)(&f.shards), "shards", "inline limit: records the limit is split into")
	fs.StringVar(&f.start, "start", "", "inline fixed window: RFC 3339 time its windows are aligned to")
}

// limit returns the selected limit's name and config, validated.
func (f *limitFlags) limit() (string, ratelimit.Config, error) {
	if err := f.emptyFile(); err != nil {
		return "", ratelimit.Config{}, err
	}
	if f.file != "" {
		if err := f.fileOnly(); err != nil {
			return "", ratelimit.Config{}, err
		}
		limits, err := loadLimits(f.file)
		if err != nil {
			return "", ratelimit.Config{}, err
		}
		cfg, ok := limits[f.name]
		switch {
		case !ok && !f.fs.Changed("name"):
			return "", ratelimit.Config{}, withoutName(f.file, limits)
		case !ok:
			return "", ratelimit.Config{}, notIn(f.name, f.file, limits)
		}
		return f.name, cfg, nil
	}
	if f.kind == "" {
		return "", ratelimit.Config{}, usagef("give a limit: --limits FILE --name NAME, or --kind, --rate and --period")
	}
	cfg := ratelimit.Config{Rate: f.rate, Period: f.period, Capacity: f.capacity, MaxReserved: f.reserved, Shards: f.shards}
	if err := cfg.Kind.UnmarshalText([]byte(f.kind)); err != nil {
		return "", cfg, usageError{err}
	}
	if f.start == "" && f.fs.Changed("start") {
		// It was taken for no --start: --start "$START" with $START unset
		// gave windows at a phase of each key, not aligned to a time.
		return "", cfg, usagef("--start \"\": give the RFC 3339 time the windows are aligned to, such as 2024-01-01T00:00:00Z, or leave --start out for %s", f.noStart())
	}
	if f.start != "" {
		t, err := rfc3339.Parse(f.start)
		if err != nil {
			return "", cfg, usagef("--start %q: write an RFC 3339 time such as 2024-01-01T00:00:00Z", f.start)
		}
		if t.IsZero() { // which a Config reads as no Start
			return "", cfg, usagef("--start %q is the zero time, which means no --start (%s): leave --start out for that, or give another time", f.start, f.noStart())
		}
		cfg.Start = t
	}
	if err := cfg.Validate(); err != nil {
		return "", cfg, usageError{inFlags(err)}
	}
	// The default names a limit whose --name is not given; --name "" is
	// the name "", as a limits file's and the library's names may be, and
	// as --name "" is with --limits: it was "limit", so that inspect and
	// reset looked at another limit's records than the one named.
	name := f.name
	if !f.fs.Changed("name") {
		name = defaultName
	}
	return name, cfg, nil
}

// defaultName is the name of an inline limit without --name.
const defaultName = "limit"

// maxNamesListed bounds the names that the error of a --name not in the
// limits file lists: a file of thousands of limits made it a line of
// megabytes.
const maxNamesListed = 20

// notIn is the usage error of the limit name, which the limits file of
// path, holding limits, does not declare: it names the limit that differs
// from it by case alone, if one does, and otherwise lists the limits, at
// most maxNamesListed of them.
//
// When the name or a name written with it is beyond ASCII, all of them
// are written with those characters escaped (%+q: "caf\u00e9"): names are
// matched byte for byte, as the library matches them, and the same
// letters in another Unicode form ("cafe\u0301", an e and a combining
// accent) are another name, which %q wrote alike: "café" not in
// ["café"], one of ["café" "café"] for a file of both, or, for --name
// Kelvin and a file's Kelvin with a Kelvin sign (U+212A, which folds to
// k), did you mean "Kelvin"?
func notIn(name, path string, limits ratelimit.Limits) error {
	names := slices.Sorted(maps.Keys(limits))
	if len(names) == 0 {
		// It listed them: one of [].
		return usagef("limit %+q is not in %s, which declares no limit: give the limits file that declares it", name, path)
	}
	for _, n := range names {
		if strings.EqualFold(n, name) {
			if beyondASCII(name, n) {
				return usagef("limit %+q is not in %s: did you mean %+q? (names are matched as written, byte for byte: written with the characters beyond ASCII escaped%s)",
					name, path, n, otherForm)
			}
			return usagef("limit %q is not in %s: did you mean %q? (names are matched as written)", name, path, n)
		}
	}
	listed, more := names, ""
	if len(names) > maxNamesListed {
		listed, more = names[:maxNamesListed], fmt.Sprintf(" and %d more", len(names)-maxNamesListed)
	}
	if beyondASCII(append([]string{name}, listed...)...) {
		return usagef("limit %+q is not in %s: pass --name, one of %+q%s (written with the characters beyond ASCII escaped: names are matched byte for byte%s)",
			name, path, listed, more, otherForm)
	}
	return usagef("limit %q is not in %s: pass --name, one of %q%s", name, path, listed, more)
}

// withoutName is the usage error of --limits without --name, when the
// limits file of path, holding limits, declares no limit "": it lists the
// limits, as notIn does. It said that the limit "" was not in the file, a
// name that was not asked for.
func withoutName(path string, limits ratelimit.Limits) error {
	names := slices.Sorted(maps.Keys(limits))
	if len(names) == 0 {
		return usagef("--limits without --name: %s declares no limit: give the limits file that declares the limit, and pass --name", path)
	}
	listed, more := names, ""
	if len(names) > maxNamesListed {
		listed, more = names[:maxNamesListed], fmt.Sprintf(" and %d more", len(names)-maxNamesListed)
	}
	if beyondASCII(listed...) {
		return usagef("--limits without --name: pass --name, the limit of %s to use, one of %+q%s (written with the characters beyond ASCII escaped: names are matched byte for byte%s)",
			path, listed, more, otherForm)
	}
	return usagef("--limits without --name: pass --name, the limit of %s to use, one of %q%s", path, listed, more)
}

// otherForm ends notIn's reason to escape the characters beyond ASCII.
const otherForm = ", and the same letters in another Unicode form, NFC or NFD, are another name"

// beyondASCII reports whether any of ss holds a character beyond ASCII,
// or a byte that is not UTF-8.
func beyondASCII(ss ...string) bool {
	for _, s := range ss {
		for i := 0; i < len(s); i++ {
			if s[i] > unicode.MaxASCII {
				return true
			}
		}
	}
	return false
}

// emptyFile refuses --limits "": it was taken for no --limits, so that
// --limits "$LIMITS" with $LIMITS unset ran the inline limit of the flags
// beside it, which --limits refuses, or asked for a limit that was given.
func (f *limitFlags) emptyFile() error {
	if f.file == "" && f.fs != nil && f.fs.Changed("limits") {
		return usagef("--limits \"\": give the limits file, such as --limits limits.yaml, or leave --limits out for an inline limit (--kind, --rate, --period)")
	}
	return nil
}

// fileOnly refuses the flags of an inline limit beside --limits.
func (f *limitFlags) fileOnly() error {
	var given []string
	for _, name := range inlineFlags {
		if f.fs.Changed(name) {
			given = append(given, "--"+name)
		}
	}
	if len(given) > 0 {
		return usagef("give a limit either by --limits and --name or inline (--kind, --rate, --period, ...), not both: %s with --limits", strings.Join(given, ", "))
	}
	return nil
}

// all returns the limits the flags declare, for a command that settles
// tokens, which name the limits they charged: every limit of the limits
// file, or the one limit given inline, named by --name.
func (f *limitFlags) all() (ratelimit.Limits, error) {
	if err := f.emptyFile(); err != nil {
		return nil, err
	}
	if f.file == "" && f.kind == "" {
		// limit's own hint said to give --name with --limits, which the
		// next check refuses here.
		return nil, usagef("give the application's limits: --limits FILE, every limit of which is declared, or one limit inline, named as the token names it: --kind, --rate, --period and --name")
	}
	if f.file == "" {
		name, cfg, err := f.limit()
		if err != nil {
			return nil, err
		}
		return ratelimit.Limits{name: cfg}, nil
	}
	if f.fs.Changed("name") {
		return nil, usagef("--name with --limits: a token names the limits it charged, and every limit of %s is declared: leave --name out", f.file)
	}
	if err := f.fileOnly(); err != nil {
		return nil, err
	}
	return loadLimits(f.file)
}

// loadLimits reads a limits file: YAML, or JSON of the same shape. Its
// every error is fileError's: "--limits FILE: ...".
func loadLimits(path string) (ratelimit.Limits, error) {
	// A .json file is held to JSON's rules, with JSON's errors: read as
	// YAML, which reads JSON too, a comma after the last member passed,
	// and a file that was not JSON got YAML's error.
	parse, mapping := ratelimit.ParseLimits, "a mapping"
	switch strings.ToLower(filepath.Ext(path)) {
	case ".json":
		parse, mapping = ratelimit.ParseLimitsJSON, "a JSON object"
	case ".yaml", ".yml":
	default:
		if !stream(path) {
			return nil, usageError{fileError(path, "name it .json, .yaml or .yml, or pipe it in (--limits /dev/stdin), which is read as YAML", nil)}
		}
		// A pipe's or a device's name says nothing of what it gives:
		// /dev/stdin, /dev/fd/63 of bash's <(...), a named pipe. It is
		// read as YAML, which reads JSON too. It was refused for its name.
	}
	data, err := readLimitsFile(path)
	if err != nil {
		return nil, err
	}
	limits, err := parse(data)
	switch {
	case err != nil && len(bytes.TrimSpace(bytes.TrimPrefix(data, []byte("\uFEFF")))) == 0:
		// The library says to write a mapping, as of a file that holds
		// something else: nothing was given, which is what to say.
		return nil, fileError(path, emptyFile(path, mapping), err)
	case err != nil:
		return nil, fileError(path, inFile(err).Error(), err)
	}
	return limits, nil
}

// fileError is an error about the limits file at path, in the one shape
// of them all: "--limits path: " and what, what was wrong and what to do,
// or the library's error, which says "limits file: line 3: ..." on its
// own, kept whole. It unwraps to err, if not nil. They came in three
// shapes: "limits file path: ...", "path: limits file: ..." and
// "--limits: open path: ...".
func fileError(path, what string, err error) error {
	what = strings.TrimPrefix(what, prefix)
	msg := fmt.Sprintf("--limits %s: %s", path, what)
	if err == nil {
		return errors.New(msg)
	}
	return &flagError{msg: msg, err: err}
}

// emptyFile says what to do of the limits file at path, which holds no
// more than white space: write the limits, in mapping, or, for standard
// input or another pipe, which may have been left out of the command
// line (--limits /dev/stdin without < limits.yaml), pipe them in.
func emptyFile(path, mapping string) string {
	switch {
	case isStdin(path):
		return "standard input is empty: pipe the limits file in, such as --limits /dev/stdin < limits.yaml"
	case stream(path):
		return "nothing was read from it: pipe the limits file in, such as --limits /dev/stdin < limits.yaml"
	}
	return "the file is empty: write the limits in it, " + mapping + " of limit names to their fields"
}

// stream reports whether path is a file that a name does not describe:
// a pipe or a device (/dev/stdin of a pipe, bash's <(...), a named
// pipe), or a name of the command's own standard input or another file
// it has open (/dev/stdin, /dev/fd/N), which is a regular file when the
// shell redirects one in (< limits.yaml). A directory, or a path that is
// not there, is none.
func stream(path string) bool {
	if clean := filepath.Clean(path); isStdin(clean) || strings.HasPrefix(clean, "/dev/fd/") || strings.HasPrefix(clean, "/proc/self/fd/") {
		return true
	}
	fi, err := os.Stat(path)
	return err == nil && !fi.Mode().IsRegular() && !fi.IsDir()
}

// isStdin reports whether path names the command's standard input.
func isStdin(path string) bool {
	switch filepath.Clean(path) {
	case "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0":
		return true
	}
	return false
}

// maxLimitsFile is the most bytes of a limits file the command reads: a
// limit is a few lines, and a file of tens of thousands of limits fits;
// the parser's tree of a file takes many times its size. Without a
// bound, a file given by mistake (a log, a dump, a link to /dev/zero) was
// read whole into memory before the parser could refuse it.
const maxLimitsFile = 4 << 20

// errLimitsTooLarge is the error of a limits file of more than
// maxLimitsFile bytes.
var errLimitsTooLarge = fmt.Errorf("larger than %d MiB, the most a limits file may be: is it the limits file? a limits file declares limits, a few lines each", maxLimitsFile>>20)

// readLimitsFile reads the limits file at path, of at most maxLimitsFile
// bytes. An error of the system's is told as fileError tells it, with
// what to do: "--limits: open limits.yml: no such file or directory" named
// the flag apart from the file, and "limits file big.yaml: larger than
// 4 MiB" named no flag.
func readLimitsFile(path string) ([]byte, error) {
	data, err := readFileAtMost(path, maxLimitsFile)
	if err == nil {
		return data, nil
	}
	if errors.Is(err, errTooLarge) {
		return nil, fileError(path, errLimitsTooLarge.Error(), errLimitsTooLarge)
	}
	what := err.Error()
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		what = pe.Err.Error() // its path is the one named
	}
	switch fi, serr := os.Stat(path); {
	case errors.Is(err, fs.ErrNotExist):
		what += ": check the path of the limits file"
	case errors.Is(err, fs.ErrPermission):
		what += ": give a limits file the command may read"
	case serr == nil && fi.IsDir():
		what += ": give the limits file, not its directory"
	}
	return nil, fileError(path, what, err)
}

// errTooLarge is the error of readFileAtMost for a file larger than it
// reads.
var errTooLarge = errors.New("file too large")

// readFileAtMost reads the file at path, of at most most bytes, or returns
// errTooLarge: its size is checked before it is read, and what is read is
// bounded, for a file whose size is not known ahead (a pipe, a device).
func readFileAtMost(path string, most int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > most {
		return nil, errTooLarge
	}
	data, err := io.ReadAll(io.LimitReader(f, most+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > most {
		return nil, errTooLarge
	}
	return data, nil
}

// configFlags are the flags of an inline limit by the Config field each
// sets.
var configFlags = map[string]string{"Kind": "--kind", "Rate": "--rate", "Period": "--period", "Capacity": "--capacity",
	"MaxReserved": "--max-reserved", "Shards": "--shards", "Start": "--start"}

// fileFields are the fields of a limits file by the Config field each
// reads.
var fileFields = map[string]string{"Kind": "kind", "Rate": "rate", "Period": "period", "Capacity": "capacity",
	"MaxReserved": "maxReserved", "Shards": "shards", "Start": "start"}

// configField matches the name of a Config field in a ConfigError's text.
var configField = regexp.MustCompile(`\b(Kind|Rate|Period|Capacity|MaxReserved|Shards|Start)\b`)

// inFlags returns err, the error of an inline limit's Config.Validate, in
// the words of the command line: a *ratelimit.ConfigError names the
// Config's fields (Rate, MaxReserved), which are the flags --rate and
// --max-reserved here. It still matches ratelimit.ErrInvalidConfig.
func inFlags(err error) error {
	var ce *ratelimit.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	flag, ok := configFlags[ce.Field]
	if !ok {
		return err
	}
	problem := configField.ReplaceAllStringFunc(ce.Problem, func(field string) string { return configFlags[field] })
	return &flagError{msg: flag + " " + problem, err: err}
}

// inFile returns err, the error of ParseLimits, in the words of the
// limits file when it is a limit's *ratelimit.ConfigError, which names
// the Config's fields (Capacity, MaxReserved) where the file has capacity
// and maxReserved. Its text ends with the ConfigError's, after the line;
// only that end is rewritten, so that a limit's name that reads as a
// field is left as it is, and named as the library names it (a long one
// cut). It still matches ratelimit.ErrInvalidConfig.
func inFile(err error) error {
	var ce *ratelimit.ConfigError
	if !errors.As(err, &ce) { // every limit's is named, the limit "" too
		return err
	}
	field, ok := fileFields[ce.Field]
	was := strings.TrimPrefix(ce.Error(), "ratelimit: ")
	what := ce.Field + " " + ce.Problem
	if !ok || !strings.HasSuffix(err.Error(), was) || !strings.HasSuffix(was, what) {
		return err
	}
	problem := configField.ReplaceAllStringFunc(ce.Problem, func(f string) string { return fileFields[f] })
	return &flagError{msg: strings.TrimSuffix(err.Error(), what) + field + " " + problem, err: err}
}

// countUsage returns err, an error of a call, as a usage error in the
// command line's words when it is the count that the limit refuses
// (*ratelimit.CountError: not a number ≥ 0, or more than the limit can
// ever grant): what is the count as the command line gave it, such as
// "--count 4" or "--at \"1s=4\": count 4", and reserve the way to reserve on
// it ("--reserve"), "" when there is none. The library names the Config's
// fields and its call option (Capacity, WithReserve()); an inline limit's
// fields are flags here, a limits file's are written as the file writes
// them (capacity). Other errors are returned as they are.
func (f *limitFlags) countUsage(what, reserve string, err error) error {
	var ce *ratelimit.CountError
	if !errors.As(err, &ce) {
		return err
	}
	problem := ce.Problem
	if reserve == "" {
		problem = strings.Replace(problem, ", split the call, or ask with WithReserve()", ", or split the call", 1)
	} else {
		problem = strings.ReplaceAll(problem, "WithReserve()", reserve)
	}
	if f.file == "" {
		problem = configField.ReplaceAllStringFunc(problem, func(field string) string { return configFlags[field] })
		problem = shardsHint.ReplaceAllString(problem, "give --shards $1 or fewer")
	} else {
		problem = configField.ReplaceAllStringFunc(problem, func(field string) string { return fileFields[field] })
	}
	return usageError{&flagError{msg: what + " " + problem, err: err}}
}

// shardsHint matches the advice of a CountError of a sharded limit to
// use fewer shards, and their number.
var shardsHint = regexp.MustCompile(`use at most (\d+) shards`)

// flagError is an error of a flag's value, told in its own words, that
// unwraps to the error it tells.
type flagError struct {
	msg string
	err error
}

func (e *flagError) Error() string { return e.msg }
func (e *flagError) Unwrap() error { return e.err }

// exactDuration is a flag of a duration read exactly (duration.Parse), as
// the limits file reads one: pflag's Duration truncates what is finer than
// a nanosecond, so that --period 1.0000005ms was a period of 1ms.
type exactDuration time.Duration

// String returns the duration; 0 as "0", which pflag takes for no default
// in the help, as it takes a Duration's "0s".
func (d *exactDuration) String() string {
	if *d == 0 {
		return "0"
	}
	return time.Duration(*d).String()
}

func (d *exactDuration) Type() string { return "duration" }

func (d *exactDuration) Set(s string) error {
	v, err := duration.Parse(s)
	switch {
	case errors.Is(err, duration.ErrNotWhole):
		return fmt.Errorf("the duration %w", err)
	case errors.Is(err, duration.ErrRange):
		return fmt.Errorf("the duration %w: a duration is at most %v, some 292 years", err, time.Duration(math.MaxInt64))
	}
	if err != nil {
		return err
	}
	*d = exactDuration(v)
	return nil
}

// decimalInt is a flag of a whole number written in decimal: pflag's Int
// reads 010 as the octal 8 and 0x10 as 16. A leading zero is refused, as
// in a limits file; a sign, + or -, is read, as there (docs/cli.md).
type decimalInt int

func (n *decimalInt) String() string { return strconv.Itoa(int(*n)) }
func (n *decimalInt) Type() string   { return "int" }

func (n *decimalInt) Set(s string) error {
	if err := checkDecimal(s); err != nil {
		return err
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("out of range")
	}
	*n = decimalInt(v)
	return nil
}

// decimalUint64 is a flag of a whole number from 0 to math.MaxUint64
// written in decimal, as decimalInt: pflag's Uint64 reads 010 as the octal
// 8 too.
type decimalUint64 uint64

func (n *decimalUint64) String() string { return strconv.FormatUint(uint64(*n), 10) }
func (n *decimalUint64) Type() string   { return "uint" }

func (n *decimalUint64) Set(s string) error {
	if err := checkDecimal(s); err != nil {
		return err
	}
	digits := strings.TrimLeft(s, "+-")
	v, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || v != 0 && strings.HasPrefix(s, "-") {
		return fmt.Errorf("give a whole number from 0 to %d", uint64(math.MaxUint64))
	}
	*n = decimalUint64(v)
	return nil
}

// decimalFloat is a flag of a number written in decimal, with an
// exponent if any (10, 0.5, 1e3): pflag's Float64 reads Go's syntax, so
// that the typo 1_0 was 10 and 0x1p3 was 8. A leading zero is refused,
// as decimalInt refuses it. NaN and Inf are read, for the limit's rules
// or the count's to refuse in their own words.
type decimalFloat float64

func (f *decimalFloat) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 64) }
func (f *decimalFloat) Type() string   { return "float" }

func (f *decimalFloat) Set(s string) error {
	v, err := parseDecimalFloat(s)
	if err != nil {
		return err
	}
	*f = decimalFloat(v)
	return nil
}

// givenFloat is a decimalFloat flag that keeps the text it was given,
// for an error about its value to quote it as the command line wrote it:
// --count 1e300, not the 1e+300 that formatting the number writes.
type givenFloat struct {
	v    *float64
	text string // as given; "" until set
}

// String returns the text given, or the value: the default, in the help.
func (f *givenFloat) String() string {
	switch {
	case f.text != "":
		return f.text
	case f.v == nil: // pflag's zero value, to tell a default from none
		return "0"
	}
	return strconv.FormatFloat(*f.v, 'g', -1, 64)
}

func (f *givenFloat) Type() string { return "float" }

func (f *givenFloat) Set(s string) error {
	v, err := parseDecimalFloat(s)
	if err != nil {
		return err
	}
	*f.v, f.text = v, s
	return nil
}

// decimalNumber matches a number in decimal: a sign, digits with a
// fractional part or none (10, 10., 0.5, .5), and an exponent or none.
var decimalNumber = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$`)

// errNotDecimal is the error of a number that is not written in decimal.
var errNotDecimal = errors.New("write a number in decimal, such as 10, 0.5 or 1e3")

// parseDecimalFloat reads s, a number in decimal (decimalFloat), and
// returns an error saying what to write when it is not one.
func parseDecimalFloat(s string) (float64, error) {
	if !decimalNumber.MatchString(s) {
		switch strings.ToLower(strings.TrimLeft(s, "+-")) {
		case "nan", "inf", "infinity":
			return strconv.ParseFloat(s, 64)
		}
		return 0, errNotDecimal
	}
	digits := strings.TrimLeft(s, "+-")
	if len(digits) > 1 && digits[0] == '0' && digits[1] >= '0' && digits[1] <= '9' {
		plain := strings.TrimLeft(digits, "0")
		if plain == "" || plain[0] == '.' || plain[0] == 'e' || plain[0] == 'E' {
			plain = "0" + plain
		}
		return 0, fmt.Errorf("%q has a leading zero: write %s%s", s, s[:len(s)-len(digits)], plain)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		// Of digits alone, an error is one of range: 1e400. The bound is
		// written short: %g of math.MaxFloat64 is 1.7976931348623157e+308.
		return 0, fmt.Errorf("%q is out of range: a float64 holds numbers up to about 1.8e308 in size: write a smaller one", s)
	}
	if mantissa, _, _ := strings.Cut(strings.ToLower(digits), "e"); v == 0 && strings.ContainsAny(mantissa, "123456789") {
		// 0 is the default of --capacity and --max-reserved, and a count
		// of 0 asks for nothing: a number written as more must not read
		// as that, as in a limits file (ratelimit.ParseLimits).
		return 0, fmt.Errorf("%q is too close to 0 for a float64, which reads it as 0: write 0 if that is meant, or a number of at least %s", s, numtext.Format(math.SmallestNonzeroFloat64))
	}
	return v, nil
}

// checkDecimal returns an error saying what to write when s is not a
// whole number in decimal digits, with an optional sign and no leading
// zero.
func checkDecimal(s string) error {
	digits := strings.TrimLeft(s, "+-")
	switch {
	case len(digits) > 1 && digits[0] == '0' && allDigits(digits):
		return fmt.Errorf("%q has a leading zero: write %s%s", s, s[:len(s)-len(digits)], cmp.Or(strings.TrimLeft(digits, "0"), "0"))
	case len(s)-len(digits) > 1 || !allDigits(digits):
		return errors.New("write a whole number in decimal, such as 4")
	}
	return nil
}
