package ratelimitgrpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit/internal/isnil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultMaxWait is the longest delay UnaryClientInterceptor waits out
// unless MaxWait says otherwise.
const DefaultMaxWait = 10 * time.Second

type clientConfig struct {
	all     bool
	maxWait time.Duration
	clock   clock.Clock
	nilOpt  int // the position (from 1) of the first nil ClientOption; 0 when none
}

// ClientOption configures UnaryClientInterceptor.
type ClientOption func(*clientConfig)

// RetryAll makes every call wait out a refusal and retry, as if given
// WaitRetry.
func RetryAll() ClientOption { return func(c *clientConfig) { c.all = true } }

// MaxWait sets the longest delay the interceptor waits out (default
// DefaultMaxWait); a refusal asking for longer is returned at once. Zero
// waits out only a refusal that asks for no delay.
//
// A negative d is a mistake (no delay is that short, and no refusal would
// ever be waited out): the interceptor then makes no call, and answers
// each with an error that says so, which matches ErrInvalidOption and
// whose gRPC status is codes.InvalidArgument.
func MaxWait(d time.Duration) ClientOption { return func(c *clientConfig) { c.maxWait = d } }

// WithClock sets the clock the interceptor waits on and measures the
// time left before a call's deadline on (default: the real one). Tests
// pass a mock, set to the time their deadlines are counted from.
//
// A nil clock (nil, or a nil *clock.Mock) is a mistake, as it is to
// ratelimit.WithClock: the interceptor then makes no call, and answers
// each as it does a negative MaxWait. Leave WithClock out for the real
// clock.
func WithClock(c clock.Clock) ClientOption { return func(cc *clientConfig) { cc.clock = c } }

// waitRetry is the CallOption of WaitRetry; it passes through the invoker
// unchanged.
type waitRetry struct{ grpc.EmptyCallOption }

// WaitRetry asks UnaryClientInterceptor to wait out a refusal of this call
// and retry it once.
func WaitRetry() grpc.CallOption { return waitRetry{} }

// UnaryClientInterceptor returns a client interceptor that retries a call
// refused for a while: when a call given WaitRetry (every call, with
// RetryAll) fails with ResourceExhausted or Unavailable and a
// google.rpc.RetryInfo detail, as Interceptor answers, it waits the
// detail's delay and makes the call once more, and returns that second
// answer. It waits only when the call's deadline leaves time for the
// retry after the delay, and the delay is at most MaxWait; otherwise, or
// without RetryInfo, it returns the refusal at once.
//
// Retry only calls that may run twice: the server refused the first
// before running it when the refusal is the Interceptor's, but a
// RetryInfo may come from elsewhere. gRPC's own retry policy honours the
// pushback trailer (PushbackTrailer) as well: use one or the other.
//
// A nil ClientOption (an option variable never set) is a mistake, as a
// nil Option is to New and to ratelimit.New: with no error to return,
// the interceptor then makes no call, and answers each as it does a
// negative MaxWait, rather than take it for the option left out.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	c := clientConfig{maxWait: DefaultMaxWait, clock: clock.New()}
	for k, o := range opts {
		if o == nil {
			if c.nilOpt == 0 {
				c.nilOpt = k + 1
			}
			continue
		}
		o(&c)
	}
	if err := c.check(); err != nil {
		// UnaryClientInterceptor returns no error: every call says it.
		return func(context.Context, string, any, any, *grpc.ClientConn, grpc.UnaryInvoker, ...grpc.CallOption) error {
			return err
		}
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || !(c.all || asked(opts)) {
			return err
		}
		wait, ok := retryDelay(err)
		if !ok || wait > c.maxWait {
			return err
		}
		if deadline, has := ctx.Deadline(); has && deadline.Sub(c.clock.Now()) <= wait {
			return err // the retry could not finish in time
		}
		if wait > 0 {
			t := c.clock.Timer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return status.FromContextError(ctx.Err()).Err()
			case <-t.C:
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// check returns the error every call answers when the options cannot
// work as given, and nil when they can.
func (c *clientConfig) check() error {
	var errs []error
	if c.nilOpt != 0 {
		errs = append(errs, fmt.Errorf("ratelimitgrpc: UnaryClientInterceptor was given a nil ClientOption (option %d): "+
			"leave it out, or pass the option it was meant to be: %w", c.nilOpt, ErrInvalidOption))
	}
	if c.maxWait < 0 {
		errs = append(errs, fmt.Errorf("ratelimitgrpc: UnaryClientInterceptor was given MaxWait(%v), and no delay is that short: "+
			"give the longest delay to wait out, or 0 to wait out only a refusal that asks for none: %w", c.maxWait, ErrInvalidOption))
	}
	if isnil.Is(c.clock) {
		given := "nil"
		if c.clock != nil {
			given = fmt.Sprintf("(%T)(nil)", c.clock)
		}
		errs = append(errs, fmt.Errorf("ratelimitgrpc: UnaryClientInterceptor was given WithClock(%s), a nil clock: "+
			"leave WithClock out for the real clock, or pass clock.NewMock() in tests: %w", given, ErrInvalidOption))
	}
	if len(errs) == 0 {
		return nil
	}
	return &clientOptionError{err: errors.Join(errs...)}
}

// clientOptionError is the error of every call through a
// UnaryClientInterceptor whose options cannot work: it matches
// ErrInvalidOption, and its status is InvalidArgument with its text, so
// that the caller's code names the mistake rather than Unknown.
type clientOptionError struct{ err error }

func (e *clientOptionError) Error() string { return e.err.Error() }

func (e *clientOptionError) Unwrap() error { return e.err }

// GRPCStatus returns the status of the error: InvalidArgument.
func (e *clientOptionError) GRPCStatus() *status.Status {
	return status.New(codes.InvalidArgument, e.err.Error())
}

func asked(opts []grpc.CallOption) bool {
	for _, o := range opts {
		if _, ok := o.(waitRetry); ok {
			return true
		}
	}
	return false
}

// retryDelay returns the delay of the RetryInfo detail of a refusal:
// ResourceExhausted or Unavailable.
func retryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || (st.Code() != codes.ResourceExhausted && st.Code() != codes.Unavailable) {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().IsValid() {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}
