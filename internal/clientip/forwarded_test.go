package clientip

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// forwardedLines reads Forwarded lines as one list of hops, leftmost first.
func forwardedLines(lines []string) []Hop {
	var hops []Hop
	for _, line := range lines {
		ForwardedHops(line, func(h Hop) { hops = append(hops, h) })
	}
	return hops
}

func TestForwardedSyntax(t *testing.T) {
	tests := []struct {
		line string
		want []string // "" for a hop that is not an address
	}{
		{`for=192.0.2.60;proto=http;by=203.0.113.43`, []string{"192.0.2.60"}},
		{`for="[2001:db8:cafe::17]:4711"`, []string{"2001:db8:cafe::17"}},
		{`for=192.0.2.43, for=198.51.100.17`, []string{"192.0.2.43", "198.51.100.17"}},
		{`For=192.0.2.43,FOR=198.51.100.17`, []string{"192.0.2.43", "198.51.100.17"}},
		{`for=unknown, for=_hidden`, []string{"", ""}},
		{`proto=https`, []string{""}},
		{`for=1.1.1.1;for=2.2.2.2`, []string{""}},
		{`for="1.1.1.1, for=2.2.2.2", for=3.3.3.3`, []string{"", "3.3.3.3"}},
		{`for="\"", for=3.3.3.3`, []string{"", "3.3.3.3"}},
		{`for="\1.1.1.1", for="1.1.1.1";by="\x"`, []string{"", "1.1.1.1"}}, // no proxy escapes an address
		{`for=", for=3.3.3.3`, []string{""}},
		{`for=1.1.1.1 junk, for=3.3.3.3`, []string{"", "3.3.3.3"}},
		{`, for=3.3.3.3`, []string{"", "3.3.3.3"}},
		{`for=[2001:db8::1]`, []string{"2001:db8::1"}},
		{`for=`, []string{""}},
	}
	for _, tt := range tests {
		var got []string
		for _, h := range forwardedLines([]string{tt.line}) {
			if h.OK {
				got = append(got, h.IP.String())
			} else {
				got = append(got, "")
			}
		}
		require.Equal(t, tt.want, got, "%s", tt.line)
	}
}
