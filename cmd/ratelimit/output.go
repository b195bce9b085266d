package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/spf13/pflag"
)

// output is the format of a command's report: --output text or json.
type output string

const (
	textOutput output = "text"
	jsonOutput output = "json"
)

func (o *output) String() string { return string(*o) }
func (o *output) Type() string   { return "format" }

func (o *output) Set(s string) error {
	switch output(s) {
	case textOutput, jsonOutput:
		*o = output(s)
		return nil
	}
	return fmt.Errorf("write text or json")
}

func (o *output) register(fs *pflag.FlagSet) {
	*o = textOutput
	fs.VarP(o, "output", "o", "the report's format: text, or json for programs")
}

// writeJSON writes v as indented JSON and a newline.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// limitJSON is a limit in the JSON reports. Every field is set: the
// capacity and the shards as the limit has them, not as they were left
// to their defaults.
type limitJSON struct {
	Name        string  `json:"name"`        // lossy for a name not valid UTF-8: see NameBase64
	NameBase64  string  `json:"name_base64"` // the name's bytes, exactly
	Kind        string  `json:"kind"`
	Rate        float64 `json:"rate"`
	PeriodMS    int64   `json:"period_ms"`
	Capacity    float64 `json:"capacity"`
	MaxReserved float64 `json:"max_reserved"` // 0: unlimited
	Shards      int     `json:"shards"`
	Start       *string `json:"start"` // fixed window aligned to a time; null otherwise
}

func limitOf(name string, cfg ratelimit.Config) limitJSON {
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = cfg.Rate
	}
	return limitJSON{Name: name, NameBase64: keyBase64(name), Kind: cfg.Kind.String(), Rate: cfg.Rate, PeriodMS: cfg.Period.Milliseconds(),
		Capacity: capacity, MaxReserved: cfg.MaxReserved, Shards: max(cfg.Shards, 1), Start: timeJSON(cfg.Start)}
}

// timeJSON returns t as timeText writes it; nil (null) for the zero time.
func timeJSON(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := timeText(t)
	return &s
}

// timeText returns t in UTC to the millisecond: in RFC 3339
// (2024-01-01T00:00:00.000Z) for the years 0000 to 9999, the ones RFC 3339
// writes, and otherwise with ISO 8601's expanded year, a sign and six
// digits or more (+073326-09-11T20:14:45.248Z), as JavaScript's Date
// writes such a time. Go's Format writes the year's digits alone
// (73326-09-11T...), which no reader of RFC 3339 takes, and which sorts
// as text before the year 2024. A record of such a time is one the
// stores keep: a call's time may be as far as driver.MaxTime from 1970.
func timeText(t time.Time) string {
	t = t.UTC()
	year := t.Year()
	if year >= 0 && year <= 9999 {
		return t.Format("2006-01-02T15:04:05.000Z07:00")
	}
	sign := "+"
	if year < 0 {
		sign, year = "-", -year
	}
	return fmt.Sprintf("%s%06d%s", sign, year, t.Format("-01-02T15:04:05.000Z07:00"))
}

// keyBase64 returns key's bytes in standard base64, for the JSON reports;
// a limit's name's too. A key or a name is any bytes, and JSON text is
// UTF-8: encoding/json writes each byte of a key that is not valid UTF-8
// as U+FFFD, so that "key" alone reads alike for "\xff", "\xfe" and
// "\uFFFD".
func keyBase64(key string) string { return base64.StdEncoding.EncodeToString([]byte(key)) }

// ms returns d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
