package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"reflect"
	"strings"

	"github.com/ratelimit-go/ratelimit/internal/clientip"
)

// ErrInvalidOption is matched (errors.Is) by the error of ClientIP or New
// when an option cannot work as given.
var ErrInvalidOption = errors.New("httplimit: invalid option")

// DefaultIPv6Prefix is the prefix length an IPv6 client is keyed by unless
// IPv6Prefix says otherwise: a /64 is the smallest network a site is
// usually given, so one client can take any of its 2^64 addresses.
const DefaultIPv6Prefix = clientip.DefaultIPv6Prefix

// ProxyHeader names the header field a deployment's proxies write the
// client's address into: XForwardedFor, Forwarded, or a SingleIPHeader.
// The zero ProxyHeader names none and is refused by TrustProxies.
type ProxyHeader struct {
	name string
	kind clientip.Kind
}

var (
	// XForwardedFor is the X-Forwarded-For list, to which each proxy
	// appends the address it received the request from (nginx with
	// $proxy_add_x_forwarded_for, AWS ALB, Google Cloud load balancers,
	// Cloudflare, Envoy and Istio gateways, Traefik, Go's
	// httputil.ReverseProxy). Several header lines are read as one list,
	// in order.
	XForwardedFor = ProxyHeader{name: "X-Forwarded-For", kind: clientip.XForwardedFor}
	// Forwarded is the Forwarded list of RFC 7239, read by its for=
	// parameters. Choose it only if every trusted proxy appends to it
	// (HAProxy's "option forwarded", for one): most proxies pass the
	// client's own Forwarded through untouched.
	Forwarded = ProxyHeader{name: "Forwarded", kind: clientip.Forwarded}
)

// SingleIPHeader names a header that holds one address, which the proxy
// sets and overwrites whatever the client sent: X-Real-IP (nginx with
// proxy_set_header X-Real-IP $remote_addr), CF-Connecting-IP
// (Cloudflare), True-Client-IP. X-Forwarded-For and Forwarded are lists:
// use XForwardedFor or Forwarded for them. TrustProxies refuses Host,
// Transfer-Encoding and Trailer, which net/http takes out of
// Request.Header: no request's value would ever be read.
func SingleIPHeader(name string) ProxyHeader {
	return ProxyHeader{name: http.CanonicalHeaderKey(strings.TrimSpace(name)), kind: clientip.SingleIP}
}

// String returns the header's name.
func (h ProxyHeader) String() string { return h.name }

// IPOption configures ClientIP: TrustProxies, IPv6Prefix.
type IPOption struct {
	apply clientip.Option
}

// TrustProxies makes ClientIP read header, but only from the proxies at
// the trusted prefixes, and only what they wrote: when the connection's
// peer is trusted, a list header (XForwardedFor, Forwarded) is read from
// the right, past the addresses of trusted proxies, and the first address
// that is not one is the client; a SingleIPHeader is taken as it is. An
// unreadable, obfuscated or missing value stops the walk at the last
// trusted address, which becomes the key. List every proxy in front of the
// service: load balancers, CDN ranges, sidecars. A proxy that connects
// through a Unix socket has no address: TrustUnixSocket trusts it, and
// then the prefixes may be none.
//
// A trusted address is believed about who the client is, so a prefix
// that holds clients lets each of them choose its key. Prefixes wider
// than any network of proxies are refused: an IPv4 prefix shorter than /8
// (0.0.0.0/1, ::ffff:0:0/97), an IPv6 one shorter than /28 outside the
// unique local fc00::/7 and link-local fe80::/10 ranges (2a00::/16), one
// that trusts the IPv4 clients of NAT64 translators or Teredo as such an
// IPv4 prefix would (64:ff9b::/96, 64:ff9b:1::/96, 2001::/32), prefixes
// that together hold a whole /96 of those ranges (the 256 /104s of
// 64:ff9b::/96), and prefixes that together trust every IPv4 or every
// IPv6 address, counting for IPv4 the NAT64, 6to4 (2002::/16) and Teredo
// addresses keyed as the IPv4 clients they stand for (IPv4 /8s of one
// half beside the NAT64 /104s of the other, the /28s of 2002::/16).
func TrustProxies(header ProxyHeader, trusted ...netip.Prefix) IPOption {
	return IPOption{func(c *clientip.Config) error { return c.TrustProxies(header.name, header.kind, trusted) }}
}

// ipOptions are the words of the errors of httplimit's IPOptions, and
// the header names it cannot read.
var ipOptions = &clientip.Package{Name: "httplimit", Carrier: "header", Err: ErrInvalidOption, CheckName: checkHeaderName}

// checkHeaderName returns the error of a SingleIPHeader name (canonical)
// that no request's header fields carry, or nil.
func checkHeaderName(name string) error {
	if !clientip.IsToken(name) {
		return fmt.Errorf("httplimit: TrustProxies: header name %q is not a header field name: %w", name, ErrInvalidOption)
	}
	if out, ok := takenOut[name]; ok {
		return fmt.Errorf("httplimit: TrustProxies: net/http moves %s out of a request's header fields, into %s, and no proxy writes an address into it: "+
			"name the header the proxy writes the client's address into, such as X-Real-IP: %w", name, out[0], ErrInvalidOption)
	}
	return nil
}

// TrustUnixSocket makes ClientIP trust the peer of a request that came
// over a Unix socket as one of the proxies of TrustProxies: a reverse
// proxy on the same machine that connects to the service through the
// socket (nginx with proxy_pass http://unix:/run/app.sock, HAProxy,
// Caddy, a sidecar). Such a peer has no IP address (net/http's RemoteAddr
// is "@" or ""), and without this option ClientIP finds no key for its
// requests, which are refused with ErrNoKey (400).
//
// TrustProxies must be given too: it says which header the proxy writes,
// and lists the prefixes of any proxies in front of it, if any (none, when
// the proxy on the socket is the only one). The header is read as from a
// trusted address: the first untrusted address from the right is the
// client. Where the key would be the peer's (no header, an unreadable
// value right of every address), it is UnixPeerKey, one key for every
// such request.
//
// Trust is never implied by the peer having no address: anyone who can
// connect to the socket chooses the header, so give it only when the
// socket's permissions keep all but the proxy out. A request came over a
// Unix socket when its server's listener was (http.LocalAddrContextKey in
// its context, as net/http and golang.org/x/net/http2 set it, names a Unix
// address) and RemoteAddr is no IP address: one that is, such as a
// PROXY protocol listener's, is keyed as before. A client on the socket
// names its own end, though, and may name it as an address and port (it
// binds its socket to the path "10.0.0.5:80" before it connects), which
// RemoteAddr then reads as: net/http gives the name alone, which cannot be
// told from a PROXY listener's address, and that client chooses its key,
// or poses as a trusted proxy, with or without this option. Keep a Unix
// socket's permissions to the proxy whenever the service listens on one.
func TrustUnixSocket() IPOption {
	return IPOption{(*clientip.Config).TrustUnixSocket}
}

// UnixPeerKey is the key ClientIP with TrustUnixSocket gives a request
// from the trusted peer on a Unix socket that names no client: no header,
// or a value it cannot read right of every address. It is the name nginx
// gives such a peer ($remote_addr), and no IP address's key.
const UnixPeerKey = clientip.UnixPeer

// IPv6Prefix keys an IPv6 client by its network of the given prefix length
// (1 to 128) instead of DefaultIPv6Prefix; 128 keys every address apart.
// Given twice, even alike, it is refused, as TrustProxies is: which width
// was meant cannot be told, and each keys every IPv6 client differently.
func IPv6Prefix(bits int) IPOption {
	return IPOption{func(c *clientip.Config) error { return c.IPv6Prefix(bits) }}
}

// ClientIP returns a KeyFunc that keys a request by its client's IP
// address: an IPv4 address as it is, an IPv6 address by its /64 network
// (IPv6Prefix changes the width). An IPv4-mapped address, or one of the
// NAT64 prefix 64:ff9b::/96, 6to4 (2002::/16) or Teredo (2001::/32), is
// keyed as the IPv4 address it holds, and one of the local-use NAT64
// prefix 64:ff9b:1::/48 as itself: one IPv4 client, one key.
//
// With no options, the client is the connection's peer (RemoteAddr) and
// no header is read: a client cannot choose its own key. Behind proxies,
// TrustProxies says which header they write and which addresses are
// theirs; nothing else is ever read, so a header the proxies pass through
// from the client is never mistaken for theirs.
//
// The KeyFunc fails with ErrNoKey when RemoteAddr is not an IP address
// (a test request without one, or a request over a Unix socket, unless
// TrustUnixSocket trusts its peer).
func ClientIP(opts ...IPOption) (KeyFunc, error) {
	c, err := clientip.Build(ipOptions, "ClientIP", opts, func(o IPOption) clientip.Option { return o.apply })
	if err != nil {
		return nil, err
	}
	if err := c.ClientIP(); err != nil {
		return nil, err
	}
	return clientIPKey{c}.key, nil
}

// bareClientIP returns the KeyFunc of ClientIP with no option, New's
// default.
func bareClientIP() KeyFunc {
	k, _ := ClientIP() // no option: no error
	return k
}

// clientIPKey is a ClientIP KeyFunc. The options and the reading of the
// header are package clientip's, which ratelimitgrpc.ClientIP shares: a
// client is keyed alike over HTTP and gRPC.
type clientIPKey struct{ c *clientip.Config }

func (k clientIPKey) key(r *http.Request) (string, error) {
	peer, ok := clientip.ParseAddr(r.RemoteAddr)
	if !ok {
		if !overUnixSocket(r) {
			return "", fmt.Errorf("httplimit: remote address %q is not an IP address: %w", r.RemoteAddr, ErrNoKey)
		}
		if !k.c.TrustsUnix() {
			return "", fmt.Errorf("httplimit: the request came over a Unix socket, whose peer (%q) has no IP address: "+
				"if a proxy connects through the socket, trust it with TrustUnixSocket and TrustProxies: %w", r.RemoteAddr, ErrNoKey)
		}
		return k.c.UnixKey(r.Header.Values), nil
	}
	return k.c.Key(peer, r.Header.Values), nil
}

// overUnixSocket reports whether r came over a Unix socket: whether the
// server's listener, as net/http puts it in the request's context, is
// one.
func overUnixSocket(r *http.Request) bool {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return ok && local != nil && clientip.IsUnix(local.Network())
}

// Header keys a request by the value of a header, such as an API key.
// A request without it, or with several lines of it, is refused through
// the error handler with ErrNoKey (400 by default): a proxy that adds its
// line to those a client sent (rather than replace them) puts the
// client's first, and which line is whose cannot be told, as
// ratelimitgrpc.Metadata refuses several values. Spaces around name are
// ignored.
//
// An empty name, or one that is not a header field name, is carried by no
// request, and would refuse every one: New refuses a KeyFunc of Header
// given one, with an error matching ErrInvalidOption. So it does Host,
// Transfer-Encoding and Trailer, which net/http takes out of a request's
// header fields (into Request.Host, TransferEncoding and Trailer): to key
// by the host a client asked for, give WithKey a KeyFunc that returns
// r.Host. (Wrapped in a
// KeyFunc of your own, which New cannot see into, it answers every
// request 500, logged at error level: the fault is the configuration's.)
func Header(name string) KeyFunc {
	switch n := strings.TrimSpace(name); {
	case n == "":
		return badKey{fmt.Errorf("httplimit: Header was given an empty header name, which no request carries: "+
			"name the header that holds the key, such as Header(\"X-API-Key\"): %w", ErrInvalidOption)}.key
	case !clientip.IsToken(n):
		return badKey{fmt.Errorf("httplimit: Header(%q): %q is not a header field name, which no request carries: "+
			"name the header that holds the key, such as Header(\"X-API-Key\"): %w", name, n, ErrInvalidOption)}.key
	case takenOut[http.CanonicalHeaderKey(n)] != [2]string{}:
		out := takenOut[http.CanonicalHeaderKey(n)]
		return badKey{fmt.Errorf("httplimit: Header(%q): net/http moves %s out of a request's header fields, into %s, so that no request carries it there: %s: %w",
			name, http.CanonicalHeaderKey(n), out[0], out[1], ErrInvalidOption)}.key
	default:
		name = n
	}
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		vs := r.Header[name]
		switch {
		case len(vs) == 0 || len(vs) == 1 && vs[0] == "":
			return "", fmt.Errorf("httplimit: header %s is missing: %w", name, ErrNoKey)
		case len(vs) > 1:
			return "", fmt.Errorf("httplimit: header %s is sent %d times, not once: %w", name, len(vs), ErrNoKey)
		}
		return vs[0], nil
	}
}

// takenOut are the header fields net/http's server removes from
// Request.Header, by canonical name: where it puts each instead, and what
// to do.
var takenOut = map[string][2]string{
	"Host":              {"Request.Host", "to key by the host a client asked for, give WithKey(func(r *http.Request) (string, error) { return r.Host, nil })"},
	"Transfer-Encoding": {"Request.TransferEncoding", "it says how the body is framed, not who sent it: key by another header"},
	"Trailer":           {"Request.Trailer", "it names trailer fields, not who sent the request: key by another header"},
}

// PathValue keys a request by a wildcard of its http.ServeMux pattern
// (r.PathValue), such as {tenant} in "/t/{tenant}/", or a route parameter
// a router put in the request's path values (chi, echo v5, and gin
// through an adapter that copies its parameters, docs/http.md).
//
// ServeMux gives a wildcard unescaped. A router that matches the escaped
// path (chi, echo, and gin with UseRawPath and UnescapePathValues off),
// when the request's path holds an escape other than the one Go would
// write (r.URL.RawPath is set: /t/%61cme/), gives it as written:
// /t/%61cme/ and /t/%61%63me/ would each be keyed apart from /t/acme/, a
// fresh budget for each spelling of one tenant. A value that holds a "%"
// and is the parameter's segment as written in the escaped path is
// therefore unescaped; one that does not unescape is kept. The segment is
// the one the request's pattern (r.Pattern: ServeMux's {tenant}, chi's
// {tenant}, echo's and gin's :tenant, a catch-all to the end, which gin
// starts with its slash) gives the parameter: a ServeMux wildcard,
// unescaped, may be written as it is in another segment (/t/a%2541/a%41
// is tenant a%41), and is not unescaped again. Where no pattern names the
// parameter (chi before v5.2.2 sets none), a value found as written
// anywhere in the escaped path is unescaped.
//
// An empty name is no wildcard's, and would refuse every request: New
// refuses a KeyFunc of PathValue given one, as it does Header's.
func PathValue(name string) KeyFunc {
	if name == "" {
		return badKey{fmt.Errorf("httplimit: PathValue was given an empty name, which no wildcard has: "+
			"name the wildcard that holds the key, such as PathValue(\"tenant\") for /t/{tenant}/: %w", ErrInvalidOption)}.key
	}
	return func(r *http.Request) (string, error) {
		v := r.PathValue(name)
		if v == "" {
			return "", fmt.Errorf("httplimit: path value %s is empty: %w", name, ErrNoKey)
		}
		if r.URL != nil && r.URL.RawPath != "" && strings.IndexByte(v, '%') >= 0 && asWritten(r.URL.RawPath, r.Pattern, name, v) {
			if u, err := url.PathUnescape(v); err == nil {
				return u, nil
			}
		}
		return v, nil
	}
}

// asWritten reports whether v, the path value name of a request whose
// escaped path is raw and whose pattern is pattern, is written as it is
// in raw where the pattern puts the parameter: a router's value, given
// as written, rather than ServeMux's, unescaped. A pattern that does not
// name the parameter says nothing of where it is: v is looked for in the
// whole of raw. One whose literal segments before the parameter's are
// not raw's (a handler under http.StripPrefix sees a shorter path than
// the router matched) cannot say where it is either: v is taken as
// unescaped, as ServeMux gives it.
func asWritten(raw, pattern, name, v string) bool {
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		pattern = pattern[i:] // without ServeMux's method and host
	} else {
		pattern = ""
	}
	segs := strings.Split(pattern, "/")
	at, rest := -1, false
	for i, s := range segs {
		switch {
		case s == "{"+name+"}", s == ":"+name, strings.HasPrefix(s, "{"+name+":") && strings.HasSuffix(s, "}"):
			at = i
		case s == "{"+name+"...}", s == "*"+name, name == "*" && s == "*":
			at, rest = i, true
		default:
			continue
		}
		break
	}
	if at < 0 {
		return strings.Contains(raw, v)
	}
	written := strings.Split(raw, "/")
	if len(written) <= at {
		return false
	}
	for i, s := range segs[:at] {
		if !isParam(s) && unescaped(s) != unescaped(written[i]) {
			return false
		}
	}
	if rest {
		// gin's catch-all (*name) starts with the slash before it, as
		// httprouter's; echo's and chi's (*) do not.
		w := strings.Join(written[at:], "/")
		return w == v || strings.HasPrefix(segs[at], "*") && len(v) == len(w)+1 && v[0] == '/' && v[1:] == w
	}
	return written[at] == v
}

// isParam reports whether s, a segment of a route pattern, holds a
// parameter, which any segment of a path matches.
func isParam(s string) bool {
	return strings.ContainsAny(s, "{}") || strings.HasPrefix(s, ":") || strings.HasPrefix(s, "*")
}

// unescaped returns the segment s unescaped, or s if it does not unescape.
func unescaped(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

// badKey is the KeyFunc of Header or PathValue given a name no request
// can carry: a configuration error, which New finds (keyError) and
// returns. New cannot see into a KeyFunc of the caller's that calls it:
// then err answers every request 500 (errorStatus), not 400, for the fault
// is not the client's.
type badKey struct{ err error }

func (b badKey) key(*http.Request) (string, error) { return "", b.err }

// badKeyCode identifies the method value badKey.key among KeyFuncs: every
// method value of one method runs the same code.
var badKeyCode = reflect.ValueOf(badKey{}.key).Pointer()

// keyError returns the configuration error of f if f is a badKey's, and
// nil for any other KeyFunc, which it does not call.
func keyError(f KeyFunc) error {
	if reflect.ValueOf(f).Pointer() != badKeyCode {
		return nil
	}
	_, err := f(nil) // badKey.key, which reads no request
	return err
}
