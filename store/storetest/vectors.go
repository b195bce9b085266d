package storetest

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// vectorsJSON is a copy of the project's golden vectors (shared/conformance),
// computed by the reference implementation; a test checks it has not
// drifted from the original.
//
//go:embed testdata/vectors.json
var vectorsJSON []byte

// VectorsJSON returns the embedded golden vectors, as published.
func VectorsJSON() []byte { return vectorsJSON }

// Scenario is one golden scenario: a limit driven through steps.
type Scenario struct {
	Name        string      `json:"name"`
	Description string      `json:"description"`
	Config      VectorLimit `json:"config"`
	Steps       []Step      `json:"steps"`
}

// VectorLimit is a scenario's config as the vectors write it.
type VectorLimit struct {
	Kind        string   `json:"kind"`
	Rate        float64  `json:"rate"`
	PeriodMS    int64    `json:"period_ms"`
	Capacity    *float64 `json:"capacity"`
	MaxReserved *float64 `json:"maxReserved"`
	StartMS     *int64   `json:"start_ms"`
}

// Step is one call of a scenario and what the reference answered.
type Step struct {
	NowMS   int64   `json:"now_ms"`
	Op      string  `json:"op"` // "limit" (also empty), "check" or "reset"
	Count   float64 `json:"count"`
	Reserve bool    `json:"reserve"`
	Expect  Expect  `json:"expect"`
}

// Expect is the reference's answer to a step.
type Expect struct {
	// OK is whether the call was granted; nil for a call refused as
	// invalid (Error).
	OK *bool `json:"ok"`
	// RetryAfter is the wait in milliseconds, as the reference computed
	// it (not rounded up); nil for none.
	RetryAfter *float64 `json:"retryAfter_ms"`
	// Error is the reference's error for a call it refuses as invalid (a
	// count above the capacity); nil otherwise.
	Error json.RawMessage `json:"error"`
	// Computed is the state the reference computed for the call, kept
	// only when the call is granted: Value is its tokens.
	Computed *struct {
		Value float64 `json:"value"`
	} `json:"computed"`
	// Differs, when not empty, says why the step is written to this
	// library's rules rather than the reference's (docs/departures.md).
	Differs string `json:"differs"`
}

// Scenarios decodes the embedded golden vectors.
func Scenarios() ([]Scenario, error) {
	var ss []Scenario
	if err := json.Unmarshal(vectorsJSON, &ss); err != nil {
		return nil, fmt.Errorf("storetest: decode vectors: %w", err)
	}
	return ss, nil
}

// Config converts the scenario's config to a ratelimit.Config.
func (v VectorLimit) Config() (ratelimit.Config, error) {
	var c ratelimit.Config
	if err := c.Kind.UnmarshalText([]byte(v.Kind)); err != nil {
		return c, err
	}
	c.Rate = v.Rate
	c.Period = time.Duration(v.PeriodMS) * time.Millisecond
	if v.Capacity != nil {
		c.Capacity = *v.Capacity
	}
	if v.MaxReserved != nil {
		c.MaxReserved = *v.MaxReserved
	}
	if v.StartMS != nil {
		c.Start = time.UnixMilli(*v.StartMS)
	}
	return c, nil
}
