package clientip

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseAddr checks that ParseAddr, which allocates nothing, reads what
// netip.ParseAddr and net.SplitHostPort read.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"192.0.2.1", "192.0.2.1:443", "2001:db8::1", "[2001:db8::1]:443", `"[2001:db8::1]:443"`,
		"[192.0.2.1]", "fe80::1%eth0", "::ffff:192.0.2.1", "1:2:3:4:5:6:7::", "::1:2:3:4:5:6:7", "1:2:3:4:5:6:1.2.3.4",
		"::1.2.3.4", "01.2.3.4", "1.2.3.256", "1:2:3:4:5:6:7:8::", ":1::", "1::2:", "::", "%x", "::%", "[::1]:_obf", "1.2.3.4:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, err := netip.ParseAddr(s)
		require.Equal(t, err == nil, isAddr(s), "isAddr(%q); netip: %v", s, err)
		host, _, err := net.SplitHostPort(s)
		got, ok := splitHostPort(s)
		require.Equal(t, err == nil, ok, "splitHostPort(%q); net: %v", s, err)
		if ok {
			require.Equal(t, host, got, "splitHostPort(%q)", s)
		}
		want, wantOK := ParseAddrByNet(s)
		ip, ok := ParseAddr(s)
		require.Equal(t, wantOK, ok, "ParseAddr(%q)", s)
		require.Equal(t, want, ip, "ParseAddr(%q)", s)
	})
}

// ParseAddrByNet is ParseAddr written with netip.ParseAddr and
// net.SplitHostPort.
func ParseAddrByNet(s string) (netip.Addr, bool) {
	s = strings.Trim(strings.TrimSpace(s), `"`)
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.Unmap().WithZone(""), true
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil {
			return ip.Unmap().WithZone(""), true
		}
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if ip, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return ip.Unmap().WithZone(""), true
		}
	}
	return netip.Addr{}, false
}

func TestParseAddrAllocatesNothing(t *testing.T) {
	for _, s := range []string{"", "x", "1", "1.2.3", "::::", "[::1", "1.2.3.4:5:6", "unknown", "192.0.2.1", "[2001:db8::1]:443"} {
		require.Zero(t, testing.AllocsPerRun(10, func() { ParseAddr(s) }), "ParseAddr(%q)", s)
	}
}
