package ratelimitgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/numtext"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// PushbackTrailer is the trailer in which a refused call also carries its
// retry delay, in whole milliseconds: gRPC's own retry policy (a service
// config retryPolicy whose retryableStatusCodes include the code) waits
// that long before its next attempt.
const PushbackTrailer = "grpc-retry-pushback-ms"

// MaxPushback is the longest delay the pushback trailer (PushbackTrailer)
// carries: 2,147,483,647 milliseconds, about 24.8 days, the most a client
// that reads it as a 32-bit integer reads (grpc-java, which takes a value
// it cannot read for "do not retry"). A longer wait is sent as
// MaxPushback; the RetryInfo detail carries it whole.
const MaxPushback = math.MaxInt32 * time.Millisecond

// Interceptor limits the calls of a gRPC server. Build it with New, and
// install Unary and Stream; it is safe for concurrent use. One New did not
// build (the zero Interceptor, or a nil one) limits by nothing, and lets
// no call through: it answers each Internal, and its Limit returns an
// error matching ErrInvalidOption.
type Interceptor struct {
	lim      *ratelimit.Limiter
	defaults []string
	methods  map[string][]string
	key      KeyFunc
	// messages says whose stream messages are decided (WithStreamMessages):
	// nil, none; empty, every stream's; otherwise the named methods'.
	messages map[string]bool
	logger   *slog.Logger // nil: slog.Default() at the time of logging
	// spaced spaces the lines of each kind a flood can bring (spacedRefused,
	// spacedDeadline, spacedInternal), on logClock.
	spaced   [spacedKinds]spacedLog
	logClock logClock
	// flushing is set while a timer is set to call flush.
	flushing atomic.Bool
}

// logInterval is the least time between two log lines of one kind
// (spaced): with the breaker open every call is refused at once, and a
// flood of callers with short deadlines, or a broken KeyFunc, fails every
// call; a line each would flood the log.
const logInterval = time.Second

// The kinds of log lines written at most once a logInterval, each on its
// own spacedLog, so that a flood of one kind never holds back the first
// line of another.
const (
	spacedRefused  = iota // refused: the store is unavailable, the limits fail closed
	spacedDeadline        // not decided: the caller's deadline passed
	spacedInternal        // not decided: any other error (codes.Internal)
	spacedKinds
)

// spacedLog spaces the log lines of one kind: a line is written when no
// line of its kind was written for an interval (the first one of a flood,
// so), and it counts the lines of its kind not written since the line
// before (suppressed). An interval after the last line not written, a
// timer (Interceptor.flush) writes a last line that counts those of the
// flood's end. It holds no lock: in a flood, every call comes through
// here at once.
type spacedLog struct {
	level slog.Level
	code  codes.Code
	// over is the message of the line that counts the end of a flood.
	over string
	// next is the time, in nanoseconds since logClock.start, from which a
	// line may be written again.
	next atomic.Int64
	// last is the time, in nanoseconds since logClock.start, of the last
	// line not written.
	last atomic.Int64
	// suppressed counts the lines not written since the last one.
	suppressed atomic.Int64
}

// logClock is the time the spaced log lines are counted on.
type logClock struct {
	clock clock.Clock
	start time.Time // the origin of spacedLog's times, on clock
}

// now returns the time since start: monotonic, so that a step of the wall
// clock moves nothing.
func (c *logClock) now() int64 { return int64(c.clock.Since(c.start)) }

// occurred records a line of r's kind at now: it reports whether to write
// it and, if so, how many were not written since the last line.
func (r *spacedLog) occurred(now int64) (write bool, suppressed int64) {
	if !r.take(now) {
		r.last.Store(now)
		r.suppressed.Add(1)
		return false, 0
	}
	return true, r.suppressed.Swap(0)
}

// ended returns, at now, how many lines of r's kind were not written once
// none occurred for an interval and a line may be written; otherwise 0,
// and how long until then (0 when no line is waiting to be counted).
func (r *spacedLog) ended(now int64) (suppressed int64, wait time.Duration) {
	if r.suppressed.Load() == 0 {
		return 0, 0
	}
	if due := max(r.last.Load()+int64(logInterval), r.next.Load()); now < due {
		return 0, time.Duration(due - now)
	}
	if !r.take(now) {
		// A line was written at now, with the count: any not written
		// since are later, and counted an interval on.
		return 0, logInterval
	}
	return r.suppressed.Swap(0), 0
}

// take reports whether a line may be written at now, and if so holds the
// next one back for an interval.
func (r *spacedLog) take(now int64) bool {
	next := r.next.Load()
	return now >= next && r.next.CompareAndSwap(next, now+int64(logInterval))
}

// Option configures an Interceptor in New.
type Option func(*Interceptor) error

// WithKey sets how a call's key is found (default: PeerIP with no options,
// the peer's IP address). It refuses, with an error matching
// ErrInvalidOption, a KeyFunc of Metadata given a name no call carries.
//
// A limit's records are named by the limit and the key alone: callers of
// the Limiter that decide one limit by keys of different kinds share its
// budget wherever their keys are equal, so that a client sending the
// metadata x-api-key: 203.0.113.7 to an Interceptor keyed by Metadata
// spends the budget of the client at 203.0.113.7 in one keyed by PeerIP.
// Give each KeyFunc a limit of its own, or prefix its keys.
func WithKey(f KeyFunc) Option {
	return func(i *Interceptor) error {
		if f == nil {
			return fmt.Errorf("ratelimitgrpc: WithKey was given a nil KeyFunc: %w", ErrInvalidOption)
		}
		if err := keyError(f); err != nil {
			return err
		}
		i.key = f
		return nil
	}
}

// WithMethod decides the calls of one method by the named limits instead
// of the default ones. fullMethod is as gRPC names it,
// "/package.Service/Method". With no names, the method is not limited (a
// health check, say). A call whose path its client sent without the
// leading slash, which grpc-go serves as the method it names when strict
// path checking is off, is decided as the method's.
func WithMethod(fullMethod string, names ...string) Option {
	return func(i *Interceptor) error {
		if !validMethod(fullMethod) {
			return fmt.Errorf("ratelimitgrpc: WithMethod(%q): a method is named \"/package.Service/Method\": %w", fullMethod, ErrInvalidOption)
		}
		if _, dup := i.methods[fullMethod]; dup {
			return fmt.Errorf("ratelimitgrpc: WithMethod(%q) is given twice: name its limits once: %w", fullMethod, ErrInvalidOption)
		}
		i.methods[fullMethod] = slices.Clone(names)
		return nil
	}
}

// WithStreamMessages decides each message a client sends on a stream as
// one more call, not the stream's open alone: the open is decided as
// before, and pays for the stream's first message; every message after it
// costs one token of the same limits, by the same key, both found once
// when the stream opens. A stream of n messages thus costs what n unary
// calls do, and a client can no longer open one long-lived stream and
// send through it what the limits refuse as calls. Without it (the
// default), a stream is decided once, when it opens, whatever it carries.
//
// With no names, every client-streaming and bidirectional stream the
// Interceptor limits is decided so; with names, only the streams of the
// methods named, as gRPC names them ("/package.Service/Method"), each of
// which must be limited. A server-streaming call carries one message, the
// first, and is decided as before. New does not know the server's
// methods: a name of a unary method, or of none (a typo), decides nothing
// and is no error; the methods of grpc.Server's GetServiceInfo whose
// IsClientStream is true are those worth naming. Only Stream decides
// messages: Limit, under go-grpc-middleware's stream interceptor, decides
// the open alone.
//
// A message refused is read and dropped: the handler's RecvMsg (Recv of
// the generated code) returns, instead of it, and with the message given
// to it reset (a protocol buffer message's Reset), the status a unary call
// would get (ResourceExhausted with a RetryInfo detail; Unavailable when
// the store is down and the limits fail closed, whose refusals are logged
// as the calls' are) as an error. The stream is not ended by the
// interceptor: a handler that returns the error, as most do, ends it with
// that status, and then the trailer grpc-retry-pushback-ms (PushbackTrailer)
// goes with it; one that goes on reading gets the next message if the
// limits grant it, and no pushback is sent with the status it ends with.
// The decision is made with the stream's context: once the client is gone
// or the deadline has passed, RecvMsg returns Canceled or
// DeadlineExceeded, and nothing is spent.
func WithStreamMessages(fullMethods ...string) Option {
	return func(i *Interceptor) error {
		if i.messages != nil {
			return fmt.Errorf("ratelimitgrpc: WithStreamMessages is given twice: give it once, with every method: %w", ErrInvalidOption)
		}
		i.messages = make(map[string]bool, len(fullMethods))
		for _, m := range fullMethods {
			if !validMethod(m) {
				return fmt.Errorf("ratelimitgrpc: WithStreamMessages(%q): a method is named \"/package.Service/Method\": %w", m, ErrInvalidOption)
			}
			if i.messages[m] {
				return fmt.Errorf("ratelimitgrpc: WithStreamMessages names method %q twice: name it once: %w", m, ErrInvalidOption)
			}
			i.messages[m] = true
		}
		return nil
	}
}

// WithLogger sets where the interceptor logs the calls it could not
// decide (default: slog.Default()). The key is never logged, but the
// error is, and a store's error within it is the store's own: one for a
// record the store cannot read names the record's key, unless the
// Limiter hashes keys (ratelimit.WithKeyHash).
//
// What is logged, and how often:
//
//   - a call refused because the store is unavailable and its limits fail
//     closed: Warn, code Unavailable;
//   - a call whose deadline passed while it was decided: Warn, code
//     DeadlineExceeded;
//   - a call not decided for any other error (a KeyFunc's, the Limiter's):
//     Error, code Internal;
//   - a call canceled by its client, or carrying no key: Debug, code
//     Canceled or InvalidArgument, a line each.
//
// The first three come in floods (with the Limiter's breaker open every
// call is refused at once; callers with short deadlines in front of a slow
// store, or a broken KeyFunc, fail every call) and a line a call would
// flood the log: each of the three is logged at most once a second, each
// apart from the others, with the count of the lines of its kind not
// written since the line before (suppressed); a second after the last
// line not written, a last line counts those of the flood's end, whether
// or not a call comes then. The Debug lines are the clients' doing and
// written only when Debug is enabled, for diagnosis: a line each. Stream
// messages (WithStreamMessages) are logged as calls are, and share their
// spacing.
func WithLogger(l *slog.Logger) Option {
	return func(i *Interceptor) error {
		if l == nil {
			return fmt.Errorf("ratelimitgrpc: WithLogger was given a nil logger: %w", ErrInvalidOption)
		}
		i.logger = l
		return nil
	}
}

// New returns an Interceptor that decides every call by the named limits
// of lim (all or nothing, as Limiter.LimitAll), except the methods that
// WithMethod names. Every limit must be declared in ratelimit.New and able
// to grant one token. With no names, only the methods WithMethod names are
// limited.
func New(lim *ratelimit.Limiter, names []string, opts ...Option) (*Interceptor, error) {
	if lim == nil {
		return nil, fmt.Errorf("ratelimitgrpc: New needs a *ratelimit.Limiter: %w", ErrInvalidOption)
	}
	key, _ := PeerIP()
	i := &Interceptor{lim: lim, defaults: slices.Clone(names), methods: make(map[string][]string), key: key}
	i.spaced = [spacedKinds]spacedLog{
		spacedRefused: {level: slog.LevelWarn, code: codes.Unavailable,
			over: "ratelimitgrpc: calls refused while the store was unavailable were not all logged"},
		spacedDeadline: {level: slog.LevelWarn, code: codes.DeadlineExceeded,
			over: "ratelimitgrpc: calls whose deadline passed while they were decided were not all logged"},
		spacedInternal: {level: slog.LevelError, code: codes.Internal,
			over: "ratelimitgrpc: calls not decided for an internal error were not all logged"},
	}
	i.setLogClock(clock.New())
	for k, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("ratelimitgrpc: New was given a nil Option (option %d): leave it out, or pass the option it was meant to be: %w", k+1, ErrInvalidOption)
		}
		if err := o(i); err != nil {
			return nil, err
		}
	}
	if err := i.check("the default limits", i.defaults); err != nil {
		return nil, err
	}
	limited := len(i.defaults) > 0
	for m, ns := range i.methods {
		if err := i.check("method "+m, ns); err != nil {
			return nil, err
		}
		limited = limited || len(ns) > 0
	}
	if !limited {
		return nil, fmt.Errorf("ratelimitgrpc: New limits nothing: name default limits or give WithMethod with limits: %w", ErrInvalidOption)
	}
	for m := range i.messages {
		if len(i.limits(m)) == 0 {
			return nil, fmt.Errorf("ratelimitgrpc: WithStreamMessages(%q): the method is not limited, so neither are its messages: "+
				"give it limits with WithMethod, or name default limits: %w", m, ErrInvalidOption)
		}
	}
	return i, nil
}

// check validates the limits of one method: declared, named once, and
// able to grant the one token a call costs.
func (i *Interceptor) check(what string, names []string) error {
	for k, n := range names {
		if slices.Contains(names[:k], n) {
			return fmt.Errorf("ratelimitgrpc: %s name limit %q twice: name it once: %w", what, n, ratelimit.ErrInvalidConfig)
		}
		cfg, ok := i.lim.Config(n)
		if !ok {
			return fmt.Errorf("ratelimitgrpc: %s: limit %q is not declared in the Limiter: declare it in ratelimit.New: %w", what, n, ratelimit.ErrUnknownLimit)
		}
		if most := mostAtOnce(cfg); most < 1 {
			return fmt.Errorf("ratelimitgrpc: %s: limit %q can never grant a call: a call costs 1 token and the limit grants at most %s at once: "+
				"set its Capacity to 1 or more: %w", what, n, numtext.Format(most), ratelimit.ErrInvalidConfig)
		}
	}
	return nil
}

// mostAtOnce is the largest count one call of a limit may ask for: its
// capacity, or for a sharded limit the share of the two shards a call
// draws on.
func mostAtOnce(cfg ratelimit.Config) float64 {
	c := cfg.Capacity
	if c == 0 {
		c = cfg.Rate
	}
	if n := cfg.Shards; n > 1 {
		return 2 * c / float64(n)
	}
	return c
}

func validMethod(m string) bool {
	svc, method, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
	return strings.HasPrefix(m, "/") && ok && svc != "" && method != "" && !strings.Contains(method, "/")
}

// Unary returns the unary server interceptor.
func (i *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if st, pushback := i.decide(ctx, info.FullMethod); st != nil {
			if pushback != nil {
				_ = grpc.SetTrailer(ctx, pushback) // fails only outside a server call
			}
			return nil, st.Err()
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor. A stream is decided once,
// when it opens, as one call; with WithStreamMessages, each message the
// client sends after the first is decided too.
func (i *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, method := ss.Context(), info.FullMethod
		if i.notBuilt() {
			return i.refuseNotBuilt(ctx, method).st.Err()
		}
		names := i.limits(method)
		if len(names) == 0 {
			return handler(srv, ss)
		}
		key, err := i.keyOf(ctx)
		if err != nil {
			return i.fail(ctx, &callUnit, method, err).Err()
		}
		if st, pushback := i.charge(ctx, &callUnit, method, names, key); st != nil {
			if pushback != nil {
				ss.SetTrailer(pushback)
			}
			return st.Err()
		}
		if !info.IsClientStream || !i.decidesMessages(method) {
			return handler(srv, ss)
		}
		ms := &messageStream{ServerStream: ss, ic: i, method: method, names: names, key: key}
		err = handler(srv, ms)
		// The pushback goes with the refusal it is for: trailers are
		// sent when the handler returns, with its status, and a handler
		// that went on after a refusal ends with another.
		if r := ms.refused.Load(); r != nil && err != nil && isRefusal(err, r.err) {
			ss.SetTrailer(r.pushback)
		}
		return err
	}
}

// isRefusal reports whether err, a stream handler's, is or wraps refusal,
// the error of a message RecvMsg refused. An error whose Is or Unwrap
// panics (a typed nil: a *T that is nil returned as an error) is taken
// for another: its panic is recovered here, where gRPC would recover
// none and one stream ended the server's process, and the error goes to
// gRPC as the handler returned it.
func isRefusal(err, refusal error) (is bool) {
	defer func() {
		if recover() != nil {
			is = false
		}
	}()
	return errors.Is(err, refusal)
}

// Limit decides one call, for the rate-limit interceptors of
// github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit,
// whose Limiter interface it implements: it returns nil when the call may
// go on, and otherwise an error those interceptors answer with
// ResourceExhausted, their text and the error's (which names no key and no
// internal detail). The error's GRPCStatus is the status Unary would have
// answered, with its RetryInfo, for a caller that uses it directly.
//
// The method is the server call's (grpc.Method); on a client, where there
// is none, the default limits decide, and the KeyFunc must not need a
// peer (WithKey). A client call made while serving one, with a context
// derived from the served call's, carries that call's method and peer:
// there WithMethod and PeerIP see the served call, not the outgoing one.
//
// Limit sets no trailer: those interceptors drop the error's status, and
// with it the RetryInfo, so that a refusal reaches the client without its
// delay. Under the server's interceptors, give them ServerLimiter, which
// also sends the delay in the pushback trailer, as Unary does.
func (i *Interceptor) Limit(ctx context.Context) error {
	method, _ := grpc.Method(ctx)
	if i.notBuilt() {
		return i.refuseNotBuilt(ctx, method)
	}
	if st, _ := i.decide(ctx, method); st != nil {
		return &limitError{st: st}
	}
	return nil
}

// ServerLimiter is an Interceptor as the Limiter of the server
// interceptors of go-grpc-middleware's ratelimit package
// (UnaryServerInterceptor, StreamServerInterceptor): its Limit decides a
// call as the Interceptor's does and, when it refuses the call for a
// while, sends the delay in the trailer grpc-retry-pushback-ms
// (PushbackTrailer), which gRPC's retry policy waits out. Those
// interceptors answer with a status of their own, without the RetryInfo
// detail Unary sends: but for the words of its message, the trailer is
// where a client finds the delay.
//
// Get one from Interceptor.ServerLimiter. It is for the server's
// interceptors only: the middleware's client interceptors call Limit with
// an outgoing call's context, which, for a call made while serving one, is
// the served call's, and the trailer would go with the status the served
// call's handler chooses. Give them the Interceptor itself.
type ServerLimiter struct{ i *Interceptor }

// ServerLimiter returns i as the Limiter of go-grpc-middleware's server
// interceptors that sends the pushback trailer of a refusal.
func (i *Interceptor) ServerLimiter() ServerLimiter { return ServerLimiter{i} }

// Limit decides the call whose context ctx is, as Interceptor.Limit does,
// and sets the call's pushback trailer when it refuses it for a while: a
// refusal, or a store failure whose limits fail closed (the breaker's
// cool-down). Outside a server call no trailer can be set, and none is.
func (l ServerLimiter) Limit(ctx context.Context) error {
	if l.i == nil {
		return fmt.Errorf("ratelimitgrpc: a zero ServerLimiter decides no call: get one from Interceptor.ServerLimiter: %w", ErrInvalidOption)
	}
	method, _ := grpc.Method(ctx)
	if l.i.notBuilt() {
		return l.i.refuseNotBuilt(ctx, method)
	}
	st, pushback := l.i.decide(ctx, method)
	if st == nil {
		return nil
	}
	if pushback != nil {
		_ = grpc.SetTrailer(ctx, pushback) // fails only outside a server call
	}
	return &limitError{st: st}
}

// limitError is the error of Limit: the status's message as its text.
type limitError struct {
	st  *status.Status
	err error // what the status does not say (errNotBuilt), or nil
}

func (e *limitError) Error() string { return e.st.Message() }

// Unwrap returns the error the status stands for, if it is to be matched
// (errNotBuilt matches ErrInvalidOption); nil for a refusal.
func (e *limitError) Unwrap() error { return e.err }

// GRPCStatus returns the status the interceptors answer.
func (e *limitError) GRPCStatus() *status.Status { return e.st }

// decide decides one call of method. It returns nil when the call may go
// on, and otherwise the status to answer with and, for a wait, the
// pushback trailer.
func (i *Interceptor) decide(ctx context.Context, method string) (*status.Status, metadata.MD) {
	if i.notBuilt() {
		return i.refuseNotBuilt(ctx, method).st, nil
	}
	names := i.limits(method)
	if len(names) == 0 {
		return nil, nil
	}
	key, err := i.keyOf(ctx)
	if err != nil {
		return i.fail(ctx, &callUnit, method, err), nil
	}
	return i.charge(ctx, &callUnit, method, names, key)
}

// errNotBuilt is the error of a call through an Interceptor that New did
// not build: the zero Interceptor, or a nil one.
var errNotBuilt = fmt.Errorf("ratelimitgrpc: the Interceptor was not built by New, and has no limits to decide a call by: "+
	"build it with New, and check New's error: %w", ErrInvalidOption)

// notBuiltLogged is set once a call through an Interceptor not built by
// New was logged: the mistake is the program's, the same for every call,
// and one line says it.
var notBuiltLogged atomic.Bool

// notBuilt reports whether i was not built by New: nil, or the zero
// Interceptor, which has neither a Limiter nor a KeyFunc. Such an
// Interceptor refuses every call rather than let it through unlimited.
func (i *Interceptor) notBuilt() bool { return i == nil || i.lim == nil || i.key == nil }

// refuseNotBuilt answers a call through an Interceptor not built by New:
// Internal, with no detail, and the first such call logged at Error.
func (i *Interceptor) refuseNotBuilt(ctx context.Context, method string) *limitError {
	if notBuiltLogged.CompareAndSwap(false, true) {
		logger := slog.Default()
		if i != nil {
			logger = i.loggerOrDefault()
		}
		logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelError, callUnit.notDecided, slog.String("method", method),
			slog.String("code", codes.Internal.String()), slog.String("error", errNotBuilt.Error()))
	}
	return &limitError{st: status.New(codes.Internal, "rate limit: internal error"), err: errNotBuilt}
}

// limits returns the names of the limits that decide the calls of method.
func (i *Interceptor) limits(method string) []string {
	if names, ok := i.methods[fullMethod(method)]; ok {
		return names
	}
	return i.defaults
}

// decidesMessages reports whether the messages of method's streams are
// decided (WithStreamMessages).
func (i *Interceptor) decidesMessages(method string) bool {
	return i.messages != nil && (len(i.messages) == 0 || i.messages[fullMethod(method)])
}

// fullMethod returns the name of a call's method as WithMethod and
// WithStreamMessages take it, "/package.Service/Method". The name is the
// call's path as its client sent it, which grpc-go serves without its
// leading slash too (before v1.79.3, and since with
// GRPC_GO_EXPERIMENTAL_DISABLE_STRICT_PATH_CHECKING): looked up as sent,
// such a call of a method was decided by the default limits, or by none.
func fullMethod(m string) string {
	if m != "" && m[0] != '/' {
		return "/" + m
	}
	return m
}

// unit is what the interceptor decides, a call or a stream's message, as
// its log lines name it.
type unit struct {
	refused    string // the line of a refusal for an unavailable store
	notDecided string // the line of an error
}

var (
	callUnit = unit{
		refused:    "ratelimitgrpc: call refused: the store is unavailable and the limits fail closed",
		notDecided: "ratelimitgrpc: call not decided",
	}
	messageUnit = unit{
		refused:    "ratelimitgrpc: stream message refused: the store is unavailable and the limits fail closed",
		notDecided: "ratelimitgrpc: stream message not decided",
	}
)

// charge spends one token of the named limits for key: a call of method,
// or a message of its stream (u). It returns nil when the call may go on,
// and otherwise the status to answer with and, for a wait, the pushback
// trailer.
func (i *Interceptor) charge(ctx context.Context, u *unit, method string, names []string, key string) (*status.Status, metadata.MD) {
	var (
		res ratelimit.Result
		err error
	)
	if len(names) == 1 {
		res, err = i.lim.Limit(ctx, names[0], key)
	} else {
		res, err = i.lim.LimitAll(ctx, key, names)
	}
	switch {
	case errors.Is(err, ratelimit.ErrStoreUnavailable):
		if res.OK {
			return nil, nil // the limits fail open
		}
		// They fail closed: the service cannot decide, which is its
		// failure, not the client's excess.
		i.logSpaced(ctx, spacedRefused, u.refused, method, err)
		return refusal(codes.Unavailable, "rate limit unavailable", res.RetryAfter)
	case err != nil:
		return i.fail(ctx, u, method, err), nil
	case !res.OK:
		return refusal(codes.ResourceExhausted, "rate limit exceeded", res.RetryAfter)
	}
	return nil, nil
}

// refusal is the status of a refused call, with a RetryInfo detail and a
// pushback trailer when there is a wait.
func refusal(code codes.Code, msg string, wait time.Duration) (*status.Status, metadata.MD) {
	if wait <= 0 {
		return status.New(code, msg), nil
	}
	st := status.New(code, msg+": retry after "+wait.String())
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
		st = withInfo // cannot fail: RetryInfo marshals
	}
	// Rounded up without adding to wait: the longest wait a Result
	// reports (driver.MaxRetryAfter ms) is within a millisecond of the
	// longest time.Duration, and wait + 999999 ns overflowed to a negative
	// pushback.
	ms := wait / time.Millisecond
	if wait%time.Millisecond != 0 {
		ms++
	}
	ms = min(ms, MaxPushback/time.Millisecond)
	return st, metadata.Pairs(PushbackTrailer, strconv.FormatInt(int64(ms), 10))
}

// fail answers a call, or a stream's message (u), that could not be
// decided: it logs the error and returns a status that carries none of
// its words (they may name limits, their configuration and internal
// addresses). The lines of Canceled and InvalidArgument are at Debug, the
// client's doing, written for each call when Debug is enabled; those of
// DeadlineExceeded and Internal, which a flood of calls brings as a flood
// of lines, are spaced (spacedLog).
func (i *Interceptor) fail(ctx context.Context, u *unit, method string, err error) *status.Status {
	// Every error matched here is in failTargets, which readError matches
	// a KeyFunc's error against within the recovery of its call.
	switch ctxErr := ctx.Err(); {
	case ctxErr != nil && errors.Is(err, context.Canceled):
		i.log(ctx, slog.LevelDebug, u.notDecided, method, codes.Canceled, err)
		return status.New(codes.Canceled, "call canceled")
	case ctxErr != nil && errors.Is(err, context.DeadlineExceeded):
		i.logSpaced(ctx, spacedDeadline, u.notDecided, method, err)
		return status.New(codes.DeadlineExceeded, "deadline exceeded")
	case errors.Is(err, ErrNoKey):
		i.log(ctx, slog.LevelDebug, u.notDecided, method, codes.InvalidArgument, err)
		return status.New(codes.InvalidArgument, "rate limit: the call carries no key")
	}
	i.logSpaced(ctx, spacedInternal, u.notDecided, method, err)
	return status.New(codes.Internal, "rate limit: internal error")
}

// failTargets are the errors fail matches an error against (errors.Is).
var failTargets = [...]error{context.Canceled, context.DeadlineExceeded, ErrNoKey}

// log logs a call the interceptor answered for want of a decision: its
// method, the status code and the error, and any attributes more.
func (i *Interceptor) log(ctx context.Context, level slog.Level, msg, method string, code codes.Code, err error, more ...slog.Attr) {
	logger := i.loggerOrDefault()
	ctx = context.WithoutCancel(ctx)
	if logger.Enabled(ctx, level) {
		attrs := append([]slog.Attr{slog.String("method", method), slog.String("code", code.String()), slog.String("error", err.Error())}, more...)
		logger.LogAttrs(ctx, level, msg, attrs...)
	}
}

// logSpaced logs a call as log does, at the level and with the code of
// its kind, unless a line of that kind was written less than an interval
// ago: then it only counts it, and the next line written says how many
// were not (suppressed). A level the logger does not enable writes and
// counts nothing.
func (i *Interceptor) logSpaced(ctx context.Context, kind int, msg, method string, err error) {
	r := &i.spaced[kind]
	if !i.loggerOrDefault().Enabled(context.WithoutCancel(ctx), r.level) {
		return
	}
	write, suppressed := r.occurred(i.logClock.now())
	if write {
		i.log(ctx, r.level, msg, method, r.code, err, slog.Int64("suppressed", suppressed))
		return
	}
	if !i.flushing.Load() && i.flushing.CompareAndSwap(false, true) {
		i.logClock.clock.AfterFunc(logInterval, i.flush)
	}
}

// flush writes, for each kind of spaced line with lines not written, once
// none occurred for an interval, the last line of the flood, which counts
// them; a timer calls it, so that the count is written when the flood
// ends, whether or not calls come after it. While lines of a kind wait to
// be counted, it sets the timer again for the earliest time they may be.
func (i *Interceptor) flush() {
	var next time.Duration // 0: no line waits
	for k := range i.spaced {
		r := &i.spaced[k]
		n, wait := r.ended(i.logClock.now())
		if n > 0 {
			i.loggerOrDefault().LogAttrs(context.Background(), r.level, r.over,
				slog.String("code", r.code.String()), slog.Int64("suppressed", n))
		}
		if wait > 0 && (next == 0 || wait < next) {
			next = wait
		}
	}
	i.flushing.Store(false)
	if next == 0 {
		// A line not written after its kind was read above found the
		// timer still set: count it an interval on.
		for k := range i.spaced {
			if i.spaced[k].suppressed.Load() > 0 {
				next = logInterval
			}
		}
	}
	if next > 0 && i.flushing.CompareAndSwap(false, true) {
		i.logClock.clock.AfterFunc(next, i.flush)
	}
}

// setLogClock makes the spaced log lines count time on c, from its present
// time.
func (i *Interceptor) setLogClock(c clock.Clock) {
	i.logClock = logClock{clock: c, start: c.Now()}
}

// loggerOrDefault returns the logger: WithLogger's, or slog.Default().
func (i *Interceptor) loggerOrDefault() *slog.Logger {
	if i.logger == nil {
		return slog.Default()
	}
	return i.logger
}
