package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// Limits can be written in JSON, the format the command-line tool reads
// (YAML files are converted to the same shape):
//
//	{
//	  "sendMessage": {"kind": "token bucket", "rate": 10, "period": "1m", "capacity": 3},
//	  "signup":      {"kind": "fixed window", "rate": 100, "period": "1h", "start": "2024-01-01T00:00:00Z"}
//	}
//
// Durations are Go durations ("1h", "90s"), kinds "fixed window" or "token
// bucket", start an RFC 3339 time; omitted fields take their zero values.

type configJSON struct {
	Kind        Kind       `json:"kind"`
	Rate        float64    `json:"rate"`
	Period      string     `json:"period"`
	Capacity    float64    `json:"capacity,omitempty"`
	MaxReserved float64    `json:"maxReserved,omitempty"`
	Shards      int        `json:"shards,omitempty"`
	Start       *time.Time `json:"start,omitempty"`
	FailOpen    bool       `json:"failOpen,omitempty"`
}

// MarshalJSON writes c in the configuration file format.
func (c Config) MarshalJSON() ([]byte, error) {
	j := configJSON{Kind: c.Kind, Rate: c.Rate, Period: c.Period.String(), Capacity: c.Capacity,
		MaxReserved: c.MaxReserved, Shards: c.Shards, FailOpen: c.FailOpen}
	if !c.Start.IsZero() {
		start := c.Start.UTC()
		j.Start = &start
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads c from the configuration file format. Unknown fields
// are an error, so that a misspelt field is not silently ignored. It does
// not validate: ParseLimits and New do.
func (c *Config) UnmarshalJSON(b []byte) error {
	var j configJSON
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&j); err != nil {
		return err
	}
	period, err := time.ParseDuration(j.Period)
	if err != nil {
		return fmt.Errorf("period %q: write a duration such as \"1m\" or \"1h30m\"", j.Period)
	}
	*c = Config{Kind: j.Kind, Rate: j.Rate, Period: period, Capacity: j.Capacity,
		MaxReserved: j.MaxReserved, Shards: j.Shards, FailOpen: j.FailOpen}
	if j.Start != nil {
		c.Start = *j.Start
	}
	return nil
}

// ParseLimits reads named limits from JSON (an object of name to config,
// as above) and validates every one.
func ParseLimits(data []byte) (Limits, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("ratelimit: limits file: %w", err)
	}
	limits := make(Limits, len(raw))
	for name, msg := range raw {
		var c Config
		if err := json.Unmarshal(msg, &c); err != nil {
			return nil, fmt.Errorf("ratelimit: limits file: limit %q: %w", name, err)
		}
		if err := c.validate(name); err != nil {
			return nil, err
		}
		limits[name] = c
	}
	return limits, nil
}
