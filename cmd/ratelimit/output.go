package main

import (
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
	Name        string  `json:"name"`
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
	return limitJSON{Name: name, Kind: cfg.Kind.String(), Rate: cfg.Rate, PeriodMS: cfg.Period.Milliseconds(),
		Capacity: capacity, MaxReserved: cfg.MaxReserved, Shards: max(cfg.Shards, 1), Start: timeJSON(cfg.Start)}
}

// timeJSON returns t in RFC 3339, UTC, to the millisecond; nil (null) for
// the zero time.
func timeJSON(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
	return &s
}

// ms returns d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
