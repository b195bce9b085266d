package clientip

import (
	"net/netip"
	"strings"
)

// ParseAddr reads an IP address, with or without a port, brackets or
// quotes: 192.0.2.1, 192.0.2.1:443, 2001:db8::1, [2001:db8::1]:443,
// "[2001:db8::1]:443". An IPv4-mapped IPv6 address reads as IPv4, and a
// zone is dropped.
//
// It allocates nothing, whatever s holds: a forwarding list may hold any
// number of values that are not addresses, and netip.ParseAddr and
// net.SplitHostPort allocate the error that says so. isAddr and
// splitHostPort answer as they do, without it.
func ParseAddr(s string) (netip.Addr, bool) {
	s = strings.Trim(strings.TrimSpace(s), `"`)
	host := s
	if !isAddr(host) {
		var ok bool
		if host, ok = splitHostPort(s); !ok || !isAddr(host) {
			if !strings.HasPrefix(s, "[") || !strings.HasSuffix(s, "]") {
				return netip.Addr{}, false
			}
			if host = s[1 : len(s)-1]; !isAddr(host) {
				return netip.Addr{}, false
			}
		}
	}
	ip, err := netip.ParseAddr(host)
	if err != nil { // cannot happen: isAddr(host)
		return netip.Addr{}, false
	}
	return ip.Unmap().WithZone(""), true
}

// splitHostPort returns the host of net.SplitHostPort(s), and whether it
// returns no error.
func splitHostPort(s string) (string, bool) {
	i := strings.LastIndexByte(s, ':') // the port starts after the last colon
	if i < 0 {
		return "", false
	}
	host, j, k := s[:i], 0, 0
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 || end+1 != i { // "]:" must end the host
			return "", false
		}
		host, j, k = s[1:end], 1, end+1
	} else if strings.IndexByte(host, ':') >= 0 {
		return "", false
	}
	if strings.IndexByte(s[j:], '[') >= 0 || strings.IndexByte(s[k:], ']') >= 0 {
		return "", false
	}
	return host, true
}

// isAddr reports whether netip.ParseAddr(s) returns no error.
func isAddr(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '.':
			return isIPv4(s)
		case ':':
			return isIPv6(s)
		case '%':
			return false
		}
	}
	return false
}

// isIPv4 reports whether s is an IPv4 address in dotted decimal, as
// netip.ParseAddr reads one: four decimal octets of at most 255, without
// leading zeros.
func isIPv4(s string) bool {
	dots, val, digits := 0, 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case '0' <= c && c <= '9':
			if digits == 1 && val == 0 {
				return false // a leading zero
			}
			val = val*10 + int(c-'0')
			digits++
			if val > 255 {
				return false
			}
		case c == '.':
			if digits == 0 || i == len(s)-1 || dots == 3 {
				return false
			}
			dots++
			val, digits = 0, 0
		default:
			return false
		}
	}
	return dots == 3
}

// isIPv6 reports whether s is an IPv6 address, with or without a zone, as
// netip.ParseAddr reads one.
func isIPv6(s string) bool {
	if i := strings.IndexByte(s, '%'); i >= 0 {
		if i == len(s)-1 {
			return false // an empty zone
		}
		s = s[:i]
	}
	ellipsis := false
	if strings.HasPrefix(s, "::") {
		ellipsis, s = true, s[2:]
		if s == "" {
			return true
		}
	}
	n := 0 // bytes of the address read
	for n < 16 {
		digits := 0
		for digits < len(s) && isHexDigit(s[digits]) {
			digits++
		}
		if digits == 0 || digits > 4 {
			return false
		}
		if digits < len(s) && s[digits] == '.' {
			// An IPv4 address ends it, in place of the last two groups.
			if !ellipsis && n != 12 || n+4 > 16 || !isIPv4(s) {
				return false
			}
			n, s = n+4, ""
			break
		}
		n += 2
		if s = s[digits:]; s == "" {
			break
		}
		if s[0] != ':' || len(s) == 1 {
			return false
		}
		if s = s[1:]; s[0] == ':' {
			if ellipsis {
				return false // a second "::"
			}
			if ellipsis, s = true, s[1:]; s == "" {
				break
			}
		}
	}
	if s != "" {
		return false
	}
	// Without "::", eight groups; with it, fewer, for it stands for one
	// at least.
	return (n == 16) != ellipsis
}

func isHexDigit(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
