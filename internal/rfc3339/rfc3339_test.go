package rfc3339

import (
	"errors"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, s := range []string{
		"2024-01-01T00:00:00Z", "2024-01-01T23:59:59.999999999Z", "2024-01-01T00:00:00+23:59",
		"2024-01-01T00:00:00-00:00", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59.5+05:30",
	} {
		got, err := Parse(s)
		want, _ := time.Parse(time.RFC3339Nano, s)
		if err != nil || !got.Equal(want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{
		"2024-01-01T00:00:00+24:00", "2024-01-01T00:00:00-24:00", "2024-01-01T00:00:00+00:60",
		"2024-01-01T0:00:00Z", "2024-01-01T00:00:00,5Z", "2024-01-01T0:00:00+01:00",
	} {
		if _, err := Parse(s); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q): got %v, want ErrSyntax", s, err)
		}
	}
	for _, s := range []string{"", "2024-01-01T00:00:00-99:00", "2024-01-01", "2024-01-01T00:00:00", "2024-01-01 00:00:00Z", "x"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q): got no error", s)
		}
	}
}
