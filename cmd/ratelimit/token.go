package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// tokenKeyEnv names the environment variable that gives the token key
// when --token-key-file does not. There is no flag of the key itself: a
// secret on the command line is in ps and the shell's history.
const tokenKeyEnv = "RATELIMIT_TOKEN_KEY"

// tokenKeyFlags give the keys of the application's ratelimit.WithTokenKey,
// which check the tags of signed tokens, and whether unsigned tokens are taken too (WithUnsignedTokensAccepted).
type tokenKeyFlags struct {
	files    []string
	unsigned bool
}

func (f *tokenKeyFlags) register(fs *pflag.FlagSet) {
	fs.Var((*fileList)(&f.files), "token-key-file", "a file holding the key of the application's ratelimit.WithTokenKey, as text (without a final line break); again for each key a rotation accepts (default: $"+tokenKeyEnv+")")
	fs.BoolVar(&f.unsigned, "unsigned-tokens-accepted", false, "with a token key, take unsigned tokens too, unchecked, as a Limiter given ratelimit.WithUnsignedTokensAccepted does; signed ones are still checked")
}

// fileList is a flag of files, given once for each.
type fileList []string

func (l *fileList) String() string { return strings.Join(*l, ",") }
func (l *fileList) Type() string   { return "file" }

func (l *fileList) Set(path string) error {
	if path == "" {
		return errors.New("give a file's path")
	}
	*l = append(*l, path)
	return nil
}

// maxTokenKeyFile is the most bytes of a --token-key-file the command
// reads: a key is some tens of bytes, and a file given by mistake (a log,
// a device) was read whole.
const maxTokenKeyFile = 64 << 10

// tokenKey is a token key and where it was read.
type tokenKey struct {
	from string // the file, or $RATELIMIT_TOKEN_KEY
	key  []byte
}

// keys returns the token keys given: those of the files of
// --token-key-file, or else the one of the environment; none when none
// is given.
func (f *tokenKeyFlags) keys() ([]tokenKey, error) {
	var keys []tokenKey
	for _, path := range f.files {
		data, err := readFileAtMost(path, maxTokenKeyFile)
		if errors.Is(err, errTooLarge) {
			return nil, usagef("--token-key-file %s: larger than %d KiB: is it the token key? give the file that holds the key alone", path, maxTokenKeyFile>>10)
		}
		if err != nil {
			return nil, fmt.Errorf("--token-key-file: %w", err)
		}
		keys = append(keys, tokenKey{from: path, key: trimLineBreak(data)})
	}
	if len(f.files) == 0 {
		if v, ok := os.LookupEnv(tokenKeyEnv); ok {
			if v == "" {
				return nil, usagef("$%s is set and empty: give it the token key, or unset it to leave the tags of tokens unchecked", tokenKeyEnv)
			}
			keys = append(keys, tokenKey{from: "$" + tokenKeyEnv, key: []byte(v)})
		}
	}
	if f.unsigned && len(keys) == 0 {
		return nil, usagef("--unsigned-tokens-accepted without a token key: without one, every token is taken unchecked, signed or not; give the token key (--token-key-file, or $%s), or leave the flag out", tokenKeyEnv)
	}
	for i, k := range keys {
		if len(k.key) < ratelimit.MinKeySecret {
			return nil, usagef("the token key of %s has %d bytes, fewer than %d, which ratelimit.WithTokenKey refuses: give the key the application's Limiters are given, in full",
				k.from, len(k.key), ratelimit.MinKeySecret)
		}
		for _, o := range keys[:i] {
			if bytes.Equal(k.key, o.key) {
				return nil, usagef("the token key of %s is the same as that of %s: give each key of a rotation once", k.from, o.from)
			}
		}
	}
	// The library's own checks too (a key of zero bytes alone, two keys
	// HMAC takes for one), as the application's New would make them.
	if len(keys) > 0 {
		m, err := memstore.New()
		if err != nil {
			return nil, err
		}
		if _, err := ratelimit.New(m, nil, tokenKeyOptions(keys, f.unsigned)...); errors.Is(err, ratelimit.ErrInvalidOption) {
			return nil, usagef("the token keys (%s): %v", keyOrigins(keys), err)
		} else if err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// keyOrigins names where keys came from, in order.
func keyOrigins(keys []tokenKey) string {
	from := make([]string, len(keys))
	for i, k := range keys {
		from[i] = k.from
	}
	return strings.Join(from, ", ")
}

// keyBytes returns the bytes of keys.
func keyBytes(keys []tokenKey) [][]byte {
	all := make([][]byte, len(keys))
	for i, k := range keys {
		all[i] = k.key
	}
	return all
}

// tokenKeyOptions returns the Limiter options of keys: WithTokenKey, the
// first signing and the others accepted, and WithUnsignedTokensAccepted
// with unsigned; none without keys.
func tokenKeyOptions(keys []tokenKey, unsigned bool) []ratelimit.Option {
	if len(keys) == 0 {
		return nil
	}
	all := keyBytes(keys)
	opts := []ratelimit.Option{ratelimit.WithTokenKey(all[0], all[1:]...)}
	if unsigned {
		opts = append(opts, ratelimit.WithUnsignedTokensAccepted())
	}
	return opts
}

// trimLineBreak returns b without a final line break (\n or \r\n), which
// an editor or echo adds to a file of one line.
func trimLineBreak(b []byte) []byte {
	b, ok := bytes.CutSuffix(b, []byte("\n"))
	if ok {
		b, _ = bytes.CutSuffix(b, []byte("\r"))
	}
	return b
}

// settlerFlag is --settler: the ID of ratelimit.Settler, 16 bytes written
// as 32 hex digits or as a UUID.
type settlerFlag struct {
	id  [16]byte
	set bool
}

func (s *settlerFlag) String() string {
	if !s.set {
		return ""
	}
	return hex.EncodeToString(s.id[:])
}

func (s *settlerFlag) Type() string { return "hex" }

func (s *settlerFlag) Set(v string) error {
	digits := v
	if len(v) == 36 && v[8] == '-' && v[13] == '-' && v[18] == '-' && v[23] == '-' {
		digits = strings.ReplaceAll(v, "-", "")
	}
	b, err := hex.DecodeString(digits)
	if err != nil || len(b) != len(s.id) {
		return errors.New("write 16 bytes as 32 hex digits, or a UUID (8-4-4-4-12 hex digits)")
	}
	if bytes.Equal(b, make([]byte, len(s.id))) {
		return errors.New("an all-zero ID names no settler: give the ID of this settling attempt, or leave --settler out")
	}
	copy(s.id[:], b)
	s.set = true
	return nil
}

// options returns the settle options of the flag.
func (s *settlerFlag) options() []ratelimit.SettleOption {
	if !s.set {
		return nil
	}
	return []ratelimit.SettleOption{ratelimit.Settler(s.id)}
}

// givenToken is a token as the command was given it.
type givenToken struct {
	text  string
	where string // "token 2" of the arguments, "line 3" of standard input
	err   error  // what is wrong with the line of standard input, before the token is read
}

// parse reads the token.
func (g givenToken) parse() (*ratelimit.Token, error) {
	if g.err != nil {
		return nil, g.err
	}
	return ratelimit.ParseToken(g.text)
}

// longLineHead is how much of a line too long for a token its report
// shows (givenToken.text): enough to find the line.
const longLineHead = 64

// maxTokenLine bounds a line of standard input: more than the text form
// of the longest token (64 KiB, in base64).
const maxTokenLine = 128 << 10

// checkTokenArgs refuses a command line that gives no token, or - beside
// tokens.
func checkTokenArgs(args []string) error {
	switch {
	case len(args) == 0:
		return usagef("give a token (its text form, as Token.String writes it), or - to read tokens from standard input, one per line")
	case len(args) > 1 && slices.Contains(args, "-"):
		return usagef("- reads the tokens from standard input: give it alone, not beside tokens")
	}
	return nil
}

// fromStdin reports whether args ask for the tokens of standard input.
func fromStdin(args []string) bool { return len(args) == 1 && args[0] == "-" }

// stdinOnce refuses two readers of standard input: the tokens of -, and
// a limits file or a token key's file named as standard input
// (/dev/stdin). The first to read it takes all of it, and the next finds
// nothing: --token-key-file /dev/stdin beside - read the tokens as the
// key, then said "no token on standard input"; a limits file read first
// left a token key of 0 bytes.
func stdinOnce(args []string, limitsFile string, keyFiles []string) error {
	type file struct{ flag, what string }
	var files []file
	if isStdin(limitsFile) {
		files = append(files, file{"--limits " + limitsFile, "limits file"})
	}
	for _, path := range keyFiles {
		if isStdin(path) {
			files = append(files, file{"--token-key-file " + path, "token key's file"})
		}
	}
	switch {
	case len(files) > 0 && fromStdin(args):
		return usagef("%s with -: both read standard input: give the %s by its name, or the tokens as arguments", files[0].flag, files[0].what)
	case len(files) > 1:
		return usagef("%s with %s: both read standard input: give one of the files by its name", files[0].flag, files[1].flag)
	}
	return nil
}

// eachToken calls f with each token of args in turn (spaces around it
// trimmed), or, for -, of stdin, one per line (blank lines skipped, spaces
// around a token and a byte-order mark before the first trimmed), until f
// returns an error. A line longer than maxTokenLine is given to f with its
// error, and the lines after it are read.
func eachToken(args []string, stdin io.Reader, f func(givenToken) error) error {
	if !fromStdin(args) {
		for i, a := range args {
			// As a line of standard input: a token pasted with a space,
			// "$TOKEN ", was refused as "illegal base64 data at input
			// byte 99", where the same line on standard input was read.
			if err := f(givenToken{text: strings.TrimSpace(a), where: fmt.Sprintf("token %d", i+1)}); err != nil {
				return err
			}
		}
		return nil
	}
	rd := bufio.NewReader(stdin)
	line, n := 0, 0
	for {
		raw, long, err := readLine(rd)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("standard input, line %d: %w", line+1, err)
		}
		if len(raw) > 0 || !errors.Is(err, io.EOF) {
			line++
			g := givenToken{where: fmt.Sprintf("line %d", line)}
			if line == 1 {
				raw = bytes.TrimPrefix(raw, []byte("\ufeff"))
			}
			if long {
				g.text = strings.ToValidUTF8(string(raw[:min(len(raw), longLineHead)]), "\ufffd")
				g.err = fmt.Errorf("longer than %d bytes, and no token is that long: give one token per line: %w", maxTokenLine, ratelimit.ErrInvalidToken)
			} else {
				g.text = strings.TrimSpace(string(raw))
			}
			if g.text != "" || long {
				n++
				if err := f(g); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if n == 0 {
		return errors.New("no token on standard input: give one token per line")
	}
	return nil
}

// readLine reads a line of rd and returns it without its line break (\n
// or \r\n), and whether it is longer than maxTokenLine, when it returns
// at most maxTokenLine+2 bytes of it, having read the rest; err is io.EOF
// at the end of the input, after its last line.
func readLine(rd *bufio.Reader) (line []byte, long bool, err error) {
	size := 0
	for {
		chunk, err := rd.ReadSlice('\n')
		size += len(chunk)
		if room := maxTokenLine + 2 - len(line); room > 0 {
			line = append(line, chunk[:min(len(chunk), room)]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if size > maxTokenLine+2 {
			return line, true, err
		}
		line, _ = bytes.CutSuffix(line, []byte("\n"))
		line, _ = bytes.CutSuffix(line, []byte("\r"))
		return line, len(line) > maxTokenLine, err
	}
}

// The outcomes of a token, in the JSON reports ("outcome") and the
// summary of a command given many tokens.
const (
	outRead           = "read" // inspect: the token reads, and its tag verifies if checked
	outSettled        = "settled"
	outAlreadySettled = "already settled"
	outExpired        = "expired"
	outInvalid        = "invalid"
	outUnknownLimit   = "unknown limit"
	outFailed         = "failed"
)

var outcomes = []string{outRead, outSettled, outAlreadySettled, outExpired, outInvalid, outUnknownLimit, outFailed}

// errStop ends a command given many tokens before the rest: the store
// failed.
var errStop = errors.New("stop")

// batch accounts for the tokens of a token command and makes its exit
// code, that of its worst outcome. Given one token, the command reports
// a problem with it as its error; given many (or -), it reports each on
// standard error as it comes, and ends with a summary.
type batch struct {
	many   bool
	stderr io.Writer
	n      int
	counts map[string]int
	code   int
	err    error  // the problem of a lone token
	stop   string // where the command stopped (errStop)
}

func newBatch(args []string, stderr io.Writer) *batch {
	return &batch{many: len(args) > 1 || fromStdin(args), stderr: stderr, counts: map[string]int{}}
}

// severity orders exit codes from the best to the worst.
func severity(code int) int {
	switch code {
	case 0:
		return 0
	case exitSettled:
		return 1
	case exitExpired:
		return 2
	}
	return 3
}

// add counts a token of outcome, whose exit code is code, and reports
// err, what was wrong with it (nil if nothing was).
func (b *batch) add(g givenToken, outcome string, code int, err error) {
	b.n++
	b.counts[outcome]++
	if severity(code) > severity(b.code) {
		b.code = code
	}
	switch {
	case err == nil:
	case b.many:
		fmt.Fprintln(b.stderr, message(fmt.Errorf("%s: %w", g.where, err)))
	default:
		b.err = err
	}
}

// end returns the command's error, given err, the error that ended the
// tokens early (errStop after a store failure, or one reading them).
func (b *batch) end(err error) error {
	if !b.many {
		switch {
		case errors.Is(err, errStop):
			return b.err
		case err != nil:
			return err
		case b.code == 0:
			return nil
		}
		return exitError{b.code, b.err}
	}
	var parts []string
	for _, o := range outcomes {
		if n := b.counts[o]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, o))
		}
	}
	sum := fmt.Sprintf("%d tokens: %s", b.n, strings.Join(parts, ", "))
	if b.n == 1 {
		sum = "1 token: " + strings.Join(parts, ", ")
	}
	switch {
	case errors.Is(err, errStop):
		return fmt.Errorf("%s; stopped at %s, where the store failed: the tokens after it were not read: run the command again with them, once the store answers (a token settled since says already settled)", sum, b.stop)
	case err != nil && b.n == 0:
		return err
	case err != nil:
		return fmt.Errorf("%s; then %w", sum, err)
	case b.code == 0:
		return nil
	}
	return exitError{b.code, errors.New(sum)}
}

// itemJSON is a shard a token charged, in the JSON reports.
type itemJSON struct {
	Limit       string  `json:"limit"`        // lossy for a name not valid UTF-8: see LimitBase64
	LimitBase64 string  `json:"limit_base64"` // the limit's name's bytes, exactly
	Shard       int     `json:"shard"`
	Amount      float64 `json:"amount"`
}

func itemsOf(tok *ratelimit.Token) []itemJSON {
	items := []itemJSON{}
	if tok == nil {
		return items
	}
	for _, it := range tok.Items() {
		items = append(items, itemJSON{Limit: it.Name, LimitBase64: keyBase64(it.Name), Shard: it.Shard, Amount: it.Amount})
	}
	return items
}

// tokenID returns the token's ID in hex.
func tokenID(tok *ratelimit.Token) string {
	id := tok.ID()
	return hex.EncodeToString(id[:])
}

// nameText returns a limit's name as the text reports write it: as it is,
// or quoted as Go quotes a string when it holds a space, a quote or a
// character that is not printable (a token's names are any bytes, and a
// forged one's may hold a terminal's escapes).
func nameText(name string) string {
	if name == "" || strings.IndexFunc(name, func(r rune) bool {
		return r == '"' || r == '\\' || r == unicode.ReplacementChar || !unicode.IsGraphic(r) || unicode.IsSpace(r)
	}) >= 0 {
		return strconv.Quote(name)
	}
	return name
}

// charges returns what the token charged, limit by limit: "signup 50,
// sendMessage 1".
func charges(tok *ratelimit.Token) string {
	var (
		names []string
		parts []string
	)
	for _, it := range tok.Items() {
		if !slices.Contains(names, it.Name) {
			names = append(names, it.Name)
			parts = append(parts, nameText(it.Name)+" "+num(tok.Charged(it.Name)))
		}
	}
	return strings.Join(parts, ", ")
}

// digestForm reports whether a store key is the digest form of a key
// longer than 256 bytes (docs/api.md#keys): "sha256:" and 43 characters
// of unpadded base64url.
func digestForm(key string) bool {
	rest, ok := strings.CutPrefix(key, "sha256:")
	return ok && len(rest) == 43 && base64URL(rest)
}

// hashLike reports whether a store key has the shape of a keyed hash of
// WithKeyHash: 22 characters of unpadded base64url.
func hashLike(key string) bool { return len(key) == 22 && base64URL(key) }

func base64URL(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	}) < 0
}

func newToken() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Look into a reservation's or a receipt's token, or settle it by hand: inspect, refund, use, settle",
		Args:  cobra.ArbitraryArgs,
		RunE:  helpOrUnknown("token", "run 'ratelimit token --help' for its commands"),
	}
	cmd.SuggestionsMinimumDistance = 2
	cmd.AddCommand(newTokenInspect(), newTokenSettle("refund"), newTokenSettle("use"), newTokenSettle("settle"))
	return cmd
}

// inspectJSON is the report of token inspect --output json, one per
// token.
type inspectJSON struct {
	Token          string     `json:"token"`   // as given
	Outcome        string     `json:"outcome"` // read or invalid
	Error          string     `json:"error"`   // why invalid; empty otherwise
	At             *string    `json:"at"`      // when it was looked at: what expired is judged at
	ID             string     `json:"id"`
	StoreKey       string     `json:"store_key"`
	StoreKeyBase64 string     `json:"store_key_base64"`
	StoreKeyForm   string     `json:"store_key_form"` // key, digest or keyed hash
	KeyMatches     *bool      `json:"key_matches"`    // with --key; null without
	ChargedAt      *string    `json:"charged_at"`
	RunAt          *string    `json:"run_at"`
	ExpiresAt      *string    `json:"expires_at"`
	Expired        bool       `json:"expired"`
	Signed         bool       `json:"signed"`
	Verified       *bool      `json:"verified"`    // with a token key; null without
	VerifiedBy     string     `json:"verified_by"` // the key's file, or $RATELIMIT_TOKEN_KEY
	CarriesUse     bool       `json:"carries_use"`
	Items          []itemJSON `json:"items"`
}

func newTokenInspect() *cobra.Command {
	var (
		keys tokenKeyFlags
		sf   storeFlags // --key-secret alone
		key  string
		out  output
	)
	cmd := &cobra.Command{
		Use:   "inspect TOKEN... | -",
		Short: "Print what a token says, without a store: store key, limits, shards and amounts, times, tag, carried use",
		Example: `  ratelimit token inspect "$TOKEN"
  ratelimit token inspect --token-key-file /run/secrets/token-key --key user-42 "$TOKEN"
  psql -Atc "SELECT token FROM outbox WHERE NOT enqueued" | ratelimit token inspect - -o json`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkTokenArgs(args); err != nil {
				return err
			}
			if err := stdinOnce(args, "", keys.files); err != nil {
				return err
			}
			tkeys, err := keys.keys()
			if err != nil {
				return err
			}
			if err := sf.checkKeySecret(); err != nil {
				return err
			}
			if s := sf.secret(); s != "" && len(s) < ratelimit.MinKeySecret {
				return usagef("the key secret (--key-secret, or $%s) has %d bytes, fewer than %d, which ratelimit.WithKeyHash refuses: give the application's secret in full",
					keySecretEnv, len(s), ratelimit.MinKeySecret)
			}
			withKey := cmd.Flags().Changed("key")
			b := newBatch(args, cmd.ErrOrStderr())
			first := true
			err = eachToken(args, cmd.InOrStdin(), func(g givenToken) error {
				at := time.Now()
				r := inspectJSON{Token: g.text, Outcome: outRead, At: timeJSON(at), Items: []itemJSON{}}
				tok, err := g.parse()
				if err != nil {
					r.Outcome, r.Error = outInvalid, message(err)
					b.add(g, outInvalid, exitFailure, err)
					if out == jsonOutput {
						return writeJSON(cmd.OutOrStdout(), r)
					}
					return nil
				}
				r.ID, r.StoreKey, r.StoreKeyBase64 = tokenID(tok), tok.Key(), keyBase64(tok.Key())
				r.StoreKeyForm = "key"
				switch {
				case digestForm(tok.Key()):
					r.StoreKeyForm = "digest"
				case sf.secret() != "":
					r.StoreKeyForm = "keyed hash"
				}
				var storeKey, form string
				if withKey {
					storeKey, form = sf.storeKey(key)
					match := storeKey == tok.Key()
					r.KeyMatches = &match
				}
				r.ChargedAt, r.RunAt, r.ExpiresAt = timeJSON(tok.ChargedAt()), timeJSON(tok.RunAt()), timeJSON(tok.Expires())
				r.Expired = at.UnixMilli() > tok.Expires().UnixMilli()
				r.Signed, r.CarriesUse, r.Items = tok.Signed(), tok.CarriesUse(), itemsOf(tok)
				var verr error
				if len(tkeys) > 0 && !(keys.unsigned && !tok.Signed()) {
					ok := false
					for _, k := range tkeys {
						if tok.Verify(k.key) == nil {
							ok, r.VerifiedBy = true, k.from
							break
						}
					}
					r.Verified = &ok
					if !ok {
						all := keyBytes(tkeys)
						verr = tok.Verify(all[0], all[1:]...)
						r.Outcome, r.Error = outInvalid, message(verr)
					}
				}
				if verr != nil {
					b.add(g, outInvalid, exitFailure, verr)
				} else {
					b.add(g, outRead, 0, nil)
				}
				if out == jsonOutput {
					return writeJSON(cmd.OutOrStdout(), r)
				}
				if !first {
					fmt.Fprintln(cmd.OutOrStdout())
				}
				first = false
				printToken(cmd.OutOrStdout(), tok, at, r, tkeys, keys.unsigned, withKey, key, storeKey, form)
				return nil
			})
			return b.end(err)
		},
	}
	keys.register(cmd.Flags())
	sf.registerKeySecret(cmd.Flags())
	cmd.Flags().StringVar(&key, "key", "", "a key, to tell whether the token is of it (with --key-secret if the application hashes keys)")
	out.register(cmd.Flags())
	return cmd
}

// printToken prints token inspect's report of tok, looked at at, whose
// JSON report is r. keys are the token keys given, and unsigned says
// whether unsigned tokens are taken under them; withKey says whether --key
// was, key is its value, and storeKey and form what the store knows it as
// (storeFlags.storeKey).
func printToken(w io.Writer, tok *ratelimit.Token, at time.Time, r inspectJSON, keys []tokenKey, unsigned, withKey bool, key, storeKey, form string) {
	line := func(label, format string, args ...any) {
		fmt.Fprintf(w, "%-12s %s\n", label, fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(w, "token %s\n", r.ID)
	switch sk := tok.Key(); {
	case r.StoreKeyForm == "digest":
		line("store key", "%q, the digest form of a key longer than %d bytes, or of one spelt as a digest form", sk, maxRawKey)
	case r.StoreKeyForm == "keyed hash":
		line("store key", "%q, the keyed hash of a key (--key-secret)", sk)
	case hashLike(sk):
		line("store key", "%q, which has the form of a keyed hash: the application's key, or its keyed hash if the application hashes keys (WithKeyHash)", sk)
	default:
		line("store key", "%q", sk)
	}
	if withKey {
		var how string
		switch form {
		case "keyed hash":
			how = " (by its keyed hash, --key-secret)"
		case "digest":
			how = " (by its digest form)"
		}
		if *r.KeyMatches {
			line("key", "%q: the token's%s", key, how)
		} else {
			line("key", "%q: not the token's: the store knows it as %q", key, storeKey)
		}
	}
	line("charged at", "%s", timeText(tok.ChargedAt()))
	line("job runs at", "%s", timeText(tok.RunAt()))
	if r.Expired {
		line("expires at", "%s: expired (on this machine's clock)", timeText(tok.Expires()))
	} else {
		line("expires at", "%s, in %v", timeText(tok.Expires()), tok.Expires().Sub(at).Round(time.Second))
	}
	switch {
	case !tok.Signed() && len(keys) == 0:
		line("signed", "no")
	case !tok.Signed() && unsigned:
		line("signed", "no: taken unchecked (--unsigned-tokens-accepted), as a Limiter given WithUnsignedTokensAccepted takes it")
	case !tok.Signed():
		line("signed", "no: a Limiter with a token key refuses it (unless WithUnsignedTokensAccepted: --unsigned-tokens-accepted)")
	case len(keys) == 0:
		line("signed", "yes, not checked: give the token key to check it (--token-key-file, or $%s)", tokenKeyEnv)
	case *r.Verified:
		line("signed", "yes, and the tag is valid under the token key of %s", escapeControls(r.VerifiedBy)) // a file's path, as given
	default:
		line("signed", "yes, and the tag is NOT valid under the token key given: forged or altered, or signed with another key")
	}
	if tok.CarriesUse() {
		line("carries use", "yes: taken after its job was let run; settling it does nothing")
	} else {
		line("carries use", "no")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "limit\tshard\tamount\t")
	for _, it := range tok.Items() {
		fmt.Fprintf(tw, "%s\t%d\t%s\t\n", nameText(it.Name), it.Shard, num(it.Amount))
	}
	tw.Flush()
}

// settleJSON is the report of token refund, use and settle --output json, one
// per token.
type settleJSON struct {
	Token          string     `json:"token"`  // as given
	Action         string     `json:"action"` // refund, use or settle
	Used           *float64   `json:"used"`   // settle: --used; null for refund and use
	Outcome        string     `json:"outcome"`
	SettledAs      *string    `json:"settled_as"` // already settled: used, canceled or unknown; null otherwise
	Error          string     `json:"error"`      // why not settled; empty when settled
	ID             string     `json:"id"`
	StoreKey       string     `json:"store_key"`
	StoreKeyBase64 string     `json:"store_key_base64"`
	RunAt          *string    `json:"run_at"`
	ExpiresAt      *string    `json:"expires_at"`
	Items          []itemJSON `json:"items"`
}

// settledAs returns how a token was settled before, by the kind of the
// store's mark.
func settledAs(k driver.SettleKind) string {
	switch k {
	case driver.SettleUse:
		return "used"
	case driver.SettleCancel:
		return "canceled"
	}
	return "unknown"
}

// verifyTag checks tok's tag under keys, as the Limiter would, in the
// command line's words; nil without keys, and for an unsigned token when
// unsigned ones are accepted.
func verifyTag(tok *ratelimit.Token, keys []tokenKey, unsigned bool) error {
	if len(keys) == 0 || unsigned && !tok.Signed() {
		return nil
	}
	all := keyBytes(keys)
	err := tok.Verify(all[0], all[1:]...)
	if err != nil && !tok.Signed() {
		return fmt.Errorf("to settle it unchecked, if the application takes unsigned tokens, give --unsigned-tokens-accepted: %w", err)
	}
	return err
}

// undeclared returns an error when tok charges a limit that limits do
// not declare, or a shard the limit does not have: the library's
// ErrUnknownLimit, told in the words of the command line.
func undeclared(tok *ratelimit.Token, limits ratelimit.Limits, file string) error {
	var inline string // the name of the inline limit, without a file
	for name := range limits {
		inline = name
	}
	for _, it := range tok.Items() {
		cfg, ok := limits[it.Name]
		if !ok && file != "" {
			return fmt.Errorf("the token charges limit %q, which %s does not declare: give --limits the application's limits file, with the limit as it was when the token was charged; nothing was settled: %w",
				it.Name, file, ratelimit.ErrUnknownLimit)
		}
		if !ok {
			return fmt.Errorf("the token charges limit %q, and the inline limit is named %q: give the limit inline with --name %q and its --kind, --rate, --period, or --limits with the application's limits file; nothing was settled: %w",
				it.Name, inline, it.Name, ratelimit.ErrUnknownLimit)
		}
		if shards := max(cfg.Shards, 1); it.Shard >= shards && file != "" {
			return fmt.Errorf("the token charges shard %d of limit %q, which %s declares with shards %d: give --limits the application's limits file, with the limit's shards at least %d to settle this token (its shards may have been lowered since the charge); nothing was settled: %w",
				it.Shard, it.Name, file, shards, it.Shard+1, ratelimit.ErrUnknownLimit)
		} else if it.Shard >= shards {
			return fmt.Errorf("the token charges shard %d of limit %q, which is declared here with --shards %d: give --shards as the application declares the limit, at least %d to settle this token (its shards may have been lowered since the charge); nothing was settled: %w",
				it.Shard, it.Name, shards, it.Shard+1, ratelimit.ErrUnknownLimit)
		}
	}
	return nil
}

func newTokenSettle(action string) *cobra.Command {
	var (
		lf      limitFlags
		sf      storeFlags
		keys    tokenKeyFlags
		settler settlerFlag
		out     output
		used    float64
		usedArg = givenFloat{v: &used}
	)
	short, example, done := "Hand a token's tokens back, once: its job will not run (Limiter.Refund)",
		`  ratelimit token refund --store redis://127.0.0.1:6379/0 --limits limits.yaml "$TOKEN"
  ratelimit token refund --store postgres://app@db/app --limits limits.yaml --token-key-file /run/secrets/token-key - < purged.txt`,
		"refunded"
	if action == "use" {
		short, example, done = "Mark a token used, once: its job may run, and its tokens are spent (Limiter.Use)",
			`  ratelimit token use --store redis://127.0.0.1:6379/0 --limits limits.yaml "$TOKEN"
  ratelimit token use --store bolt://limits.db --kind "token bucket" --rate 10 --period 1m --name llm --settler 6f1c2d3e4a5b46c7d8e9f0a1b2c3d4e5 "$TOKEN"`,
			"used"
	}
	if action == "settle" {
		short, example, done = "Settle a token by its outcome, once: the tokens used are spent, the rest handed back (Limiter.Settle)",
			`  ratelimit token settle --store redis://127.0.0.1:6379/0 --limits limits.yaml --used 1200 "$TOKEN"
  ratelimit token settle --store postgres://app@db/app --limits limits.yaml --used 0.5 --settler 6f1c2d3e4a5b46c7d8e9f0a1b2c3d4e5 "$TOKEN"`,
			"settled"
	}
	cmd := &cobra.Command{
		Use:   action + " TOKEN... | -",
		Short: short,
		Long: short + `.

It settles each token once, through the store's mark of settled tokens,
as any process of the application would, with the limits the token
charged declared (--limits, or one limit inline). Exit status: 0 when
every token was settled now, 3 when one was settled before (nothing
done), 4 when one had expired (nothing done), 1 for an invalid token or
another failure, 2 for a usage error; given many tokens, the worst.`,
		Example: example,
		Args:    cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("key-secret") {
				return usagef("--key-secret: token %s takes no key secret: a token holds its key as the store knows it, a keyed hash where the application hashes keys; leave --key-secret out", action)
			}
			if err := checkTokenArgs(args); err != nil {
				return err
			}
			if err := stdinOnce(args, lf.file, keys.files); err != nil {
				return err
			}
			if action == "settle" {
				switch {
				case !cmd.Flags().Changed("used"):
					return usagef("give --used N: the tokens the job used of each limit the token charged (0 hands them all back, as token refund does)")
				case !(used >= 0) || math.IsInf(used, 1):
					return usagef("--used %s: give the tokens used, a finite number ≥ 0 (0 hands them all back)", &usedArg)
				}
			}
			limits, err := lf.all()
			if err != nil {
				return err
			}
			if err := sf.unusedPhaseSeed(limits, lf.file); err != nil {
				return err
			}
			tkeys, err := keys.keys()
			if err != nil {
				return err
			}
			if err := sf.check(); err != nil {
				return err
			}
			var (
				lim       *ratelimit.Limiter
				closeFn   = func() {}
				b         = newBatch(args, cmd.ErrOrStderr())
				settleOpt = settler.options()
			)
			defer func() { closeFn() }()
			// The store is opened for the first token that reads, within
			// --timeout: a command given none opens nothing.
			open := func() error {
				ctx, cancel := context.WithTimeoutCause(cmd.Context(), sf.timeout, errTimeout)
				defer cancel()
				store, closeStore, err := sf.open(ctx, mustExist)
				if err != nil {
					return sf.timedOut(ctx, err)
				}
				closeFn = closeStore
				opts := append(tokenKeyOptions(tkeys, keys.unsigned), ratelimit.WithPhaseSeed(sf.phaseSeed))
				lim, err = ratelimit.New(store, limits, opts...)
				if err != nil {
					return usageError{err}
				}
				return nil
			}
			err = eachToken(args, cmd.InOrStdin(), func(g givenToken) error {
				r := settleJSON{Token: g.text, Action: action, Items: []itemJSON{}}
				if action == "settle" {
					r.Used = &used
				}
				report := func(outcome string, code int, err error) error {
					r.Outcome = outcome
					if err != nil {
						r.Error = message(err)
					}
					b.add(g, outcome, code, err)
					if out == jsonOutput {
						return writeJSON(cmd.OutOrStdout(), r)
					}
					return nil
				}
				tok, err := g.parse()
				if err != nil {
					return report(outInvalid, exitFailure, err)
				}
				r.ID, r.StoreKey, r.StoreKeyBase64 = tokenID(tok), tok.Key(), keyBase64(tok.Key())
				r.RunAt, r.ExpiresAt, r.Items = timeJSON(tok.RunAt()), timeJSON(tok.Expires()), itemsOf(tok)
				if err := verifyTag(tok, tkeys, keys.unsigned); err != nil {
					return report(outInvalid, exitFailure, err)
				}
				if err := undeclared(tok, limits, lf.file); err != nil {
					return report(outUnknownLimit, exitFailure, err)
				}
				if lim == nil {
					if err := open(); err != nil {
						var u usageError
						if errors.As(err, &u) {
							return err
						}
						// As a store that fails: the token is reported,
						// and the command stops at it.
						if err := report(outFailed, exitFailure, err); err != nil {
							return err
						}
						b.stop = g.where
						return errStop
					}
				}
				ctx, cancel := context.WithTimeoutCause(cmd.Context(), sf.timeout, errTimeout)
				defer cancel()
				switch action {
				case "use":
					err = lim.Use(ctx, tok, settleOpt...)
				case "settle":
					err = lim.Settle(ctx, tok, used, settleOpt...)
				default:
					err = lim.Refund(ctx, tok, settleOpt...)
				}
				err = sf.timedOut(ctx, err)
				var se *ratelimit.SettledError
				switch {
				case err == nil:
					if out != jsonOutput {
						fmt.Fprintf(cmd.OutOrStdout(), "%s token %s: %s for store key %q", done, r.ID, charges(tok), tok.Key())
						switch action {
						case "use":
							fmt.Fprintf(cmd.OutOrStdout(), "; its job may run at %s", timeText(tok.RunAt()))
						case "settle":
							fmt.Fprintf(cmd.OutOrStdout(), "; used %s of each limit's charge, the rest handed back", num(used))
						}
						fmt.Fprintln(cmd.OutOrStdout())
					}
					return report(outSettled, 0, nil)
				case errors.As(err, &se):
					as := settledAs(se.Kind)
					r.SettledAs = &as
					if tok.CarriesUse() {
						err = fmt.Errorf("the token carries its use, taken after its job was let run: %w", err)
					}
					return report(outAlreadySettled, exitSettled, err)
				case errors.Is(err, ratelimit.ErrTokenExpired):
					return report(outExpired, exitExpired, err)
				case errors.Is(err, ratelimit.ErrInvalidToken):
					return report(outInvalid, exitFailure, err)
				case errors.Is(err, ratelimit.ErrUnknownLimit):
					return report(outUnknownLimit, exitFailure, err)
				case errors.Is(err, driver.ErrBadRecord):
					// The token's own mark, which the store cannot read: the
					// others may settle.
					return report(outFailed, exitFailure, err)
				}
				if err := report(outFailed, exitFailure, err); err != nil {
					return err
				}
				b.stop = g.where
				return errStop
			})
			return b.end(err)
		},
	}
	lf.register(cmd.Flags())
	cmd.Flags().Lookup("name").Usage = "an inline limit's name, as the token names it (with --limits, every limit of the file is declared)"
	sf.registerStore(cmd.Flags())
	// Refused with the reason, rather than as an unknown flag, as the
	// other store commands take it: a script that gives every store
	// command the same flags learns why this one needs no secret.
	cmd.Flags().String("key-secret", "", "not taken: a token holds its key as the store knows it")
	_ = cmd.Flags().MarkHidden("key-secret")
	keys.register(cmd.Flags())
	cmd.Flags().Var(&settler, "settler", "the ID of this settling attempt (ratelimit.Settler): 32 hex digits or a UUID; the same again in a retry, which then finds its own settlement")
	if action == "settle" {
		cmd.Flags().Var(&usedArg, "used", "the tokens the job used, of each limit the token charged: spent, and the rest handed back; 0 hands all back (refund), the charge or more spends all (use)")
	}
	out.register(cmd.Flags())
	return cmd
}
