package clientip

import (
	"net/netip"
	"strings"
)

// Hop is one entry of a forwarding list; OK is false for an entry that is
// not an address (unreadable, "unknown", an obfuscated identifier).
type Hop struct {
	IP netip.Addr
	OK bool
}

// ForwardedHops reads a Forwarded line (RFC 7239) as a list of elements,
// from the left, and gives add each element's hop, by its for= parameter.
// An element that breaks the syntax (an unclosed quote, a pair without
// "=", a repeated or missing for=) is a hop that is not an address; an
// unclosed quote takes the rest of its line with it, so that a client's
// stray quote can never make a proxy's appended element read as something
// else. A quoted value holding a quoted-pair (a backslash) is not an
// address either: no proxy escapes a character of one.
func ForwardedHops(s string, add func(Hop)) {
	i := 0
	for {
		// One element: pairs separated by ";", up to a "," outside quotes.
		var forValue string
		fors, bad := 0, false
		for {
			i = skipOWS(s, i)
			start := i
			for i < len(s) && isTokenChar(s[i]) {
				i++
			}
			name := s[start:i]
			if name == "" || i >= len(s) || s[i] != '=' {
				bad = true
				break
			}
			i++
			var value string
			if i < len(s) && s[i] == '"' {
				v, n, escaped, ok := quotedString(s[i:])
				if !ok {
					add(Hop{}) // unclosed quote: the rest of the line is one bad element
					return
				}
				value, i = v, i+n
				if escaped && strings.EqualFold(name, "for") {
					bad = true
				}
			} else {
				start := i
				for i < len(s) && isValueChar(s[i]) {
					i++
				}
				value = s[start:i]
				if value == "" {
					bad = true
					break
				}
			}
			if strings.EqualFold(name, "for") {
				fors++
				forValue = value
			}
			i = skipOWS(s, i)
			if i < len(s) && s[i] == ';' {
				i++
				continue
			}
			break
		}
		// Skip to the end of the element (past any garbage, outside quotes).
		for i < len(s) && s[i] != ',' {
			bad = true
			if s[i] == '"' {
				if _, n, _, ok := quotedString(s[i:]); ok {
					i += n
					continue
				}
				add(Hop{})
				return
			}
			i++
		}
		h := Hop{}
		if !bad && fors == 1 {
			h.IP, h.OK = ParseAddr(forValue)
		}
		add(h)
		if i >= len(s) {
			return
		}
		i++ // the ','
	}
}

// quotedString reads a quoted-string at the start of s: what it holds
// between its quotes, as written (quoted-pairs not undone), its length in
// s, whether it holds a quoted-pair, and whether it is closed.
func quotedString(s string) (value string, n int, escaped, ok bool) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '"':
			return s[1:i], i + 1, escaped, true
		case '\\':
			escaped = true
			i++
		}
	}
	return "", 0, false, false
}

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// IsToken reports whether s is a token of RFC 9110, as a header field
// name is: one or more tchars.
func IsToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isTokenChar(s[i]) {
			return false
		}
	}
	return s != ""
}

// isTokenChar reports whether c is a tchar of RFC 9110.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isValueChar reports whether c may appear in an unquoted parameter value:
// a tchar, or one of ":[]", which RFC 7239 asks to quote but some proxies
// do not.
func isValueChar(c byte) bool {
	return isTokenChar(c) || c == ':' || c == '[' || c == ']'
}
