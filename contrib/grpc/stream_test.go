package ratelimitgrpc_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/ratelimit-go/ratelimit"
	ratelimitgrpc "github.com/ratelimit-go/ratelimit/contrib/grpc"
	"github.com/ratelimit-go/ratelimit/store/memstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const (
	talkMethod   = "/ratelimitgrpc.test.Chat/Talk"   // bidirectional
	uploadMethod = "/ratelimitgrpc.test.Chat/Upload" // client-streaming
)

// chatServer is a service whose Talk answers each message with "ack " and
// the message, and whose Upload counts the messages and answers the count
// at the end. It records the errors its handlers' RecvMsg returned, but
// io.EOF.
type chatServer struct {
	// goOn makes Talk answer a refused message with "refused " and the
	// status code, and go on reading, instead of returning the error.
	goOn bool

	mu   sync.Mutex
	errs []error
}

func (c *chatServer) recvErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, err)
}

// codes returns the codes of the errors the handlers received.
func (c *chatServer) codes() []codes.Code {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []codes.Code
	for _, err := range c.errs {
		out = append(out, status.Code(err))
	}
	return out
}

func (c *chatServer) talk(ss grpc.ServerStream) error {
	for {
		m := new(wrapperspb.StringValue)
		err := ss.RecvMsg(m)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			c.recvErr(err)
			if !c.goOn {
				return err
			}
			if err := ss.SendMsg(wrapperspb.String("refused " + status.Code(err).String())); err != nil {
				return err
			}
		default:
			if err := ss.SendMsg(wrapperspb.String("ack " + m.GetValue())); err != nil {
				return err
			}
		}
	}
}

func (c *chatServer) upload(ss grpc.ServerStream) error {
	var n int64
	for {
		err := ss.RecvMsg(new(wrapperspb.StringValue))
		if errors.Is(err, io.EOF) {
			return ss.SendMsg(wrapperspb.Int64(n))
		}
		if err != nil {
			c.recvErr(err)
			return err
		}
		n++
	}
}

var (
	talkDesc   = grpc.StreamDesc{StreamName: "Talk", ServerStreams: true, ClientStreams: true}
	uploadDesc = grpc.StreamDesc{StreamName: "Upload", ClientStreams: true}
)

// serveChat starts a gRPC server with the chat and health services on a
// loopback port behind the stream interceptors, and returns a connection
// to it.
func serveChat(t *testing.T, chat *chatServer, stream ...grpc.StreamServerInterceptor) *grpc.ClientConn {
	t.Helper()
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(stream...))
	talk, upload := talkDesc, uploadDesc
	talk.Handler = func(_ any, ss grpc.ServerStream) error { return chat.talk(ss) }
	upload.Handler = func(_ any, ss grpc.ServerStream) error { return chat.upload(ss) }
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "ratelimitgrpc.test.Chat",
		HandlerType: (*any)(nil),
		Streams:     []grpc.StreamDesc{talk, upload},
	}, chat)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// say sends a message on a Talk stream and returns the answer.
func say(t *testing.T, cs grpc.ClientStream, msg string) (string, error) {
	t.Helper()
	// io.EOF: the server ended the stream, whose status RecvMsg returns.
	if err := cs.SendMsg(wrapperspb.String(msg)); err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	reply := new(wrapperspb.StringValue)
	if err := cs.RecvMsg(reply); err != nil {
		return "", err
	}
	return reply.GetValue(), nil
}

// remaining returns what is left of a limit for the loopback client.
func remaining(t *testing.T, lim *ratelimit.Limiter, name string) float64 {
	t.Helper()
	st, err := lim.Value(context.Background(), name, "127.0.0.1")
	require.NoError(t, err)
	return st.Remaining
}

var fivePerMinute = ratelimit.Config{Kind: ratelimit.TokenBucket, Rate: 5, Period: time.Minute}

// With WithStreamMessages, a stream carries no more messages than the
// limit grants calls: the open pays for the first message, each further
// message costs a token, and the one past the limit is refused, with the
// unary call's RetryInfo and pushback, when the handler returns it.
func TestStreamMessages(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"chat": fivePerMinute})
	ic, err := ratelimitgrpc.New(lim, []string{"chat"}, ratelimitgrpc.WithStreamMessages())
	require.NoError(t, err)
	chat := &chatServer{}
	conn := serveChat(t, chat, ic.Stream())

	cs, err := conn.NewStream(ctx, &talkDesc, talkMethod)
	require.NoError(t, err)
	for i := range 5 {
		got, err := say(t, cs, strconv.Itoa(i+1))
		require.NoError(t, err, "message %d", i+1)
		assert.Equal(t, "ack "+strconv.Itoa(i+1), got)
	}
	_, err = say(t, cs, "6")
	require.Error(t, err)
	st := status.Convert(err)
	assert.Equal(t, codes.ResourceExhausted, st.Code())
	assert.Equal(t, "rate limit exceeded: retry after 12s", st.Message())
	wait, ok := retryInfo(t, err)
	require.True(t, ok, "a RetryInfo detail")
	assert.Equal(t, 12*time.Second, wait, "a token every 12 s")
	assert.Equal(t, []string{"12000"}, cs.Trailer().Get(ratelimitgrpc.PushbackTrailer))
	assert.Equal(t, []codes.Code{codes.ResourceExhausted}, chat.codes(), "the handler saw the refusal, and ended the stream with it")
	assert.Zero(t, remaining(t, lim, "chat"), "the refused message spent nothing more")

	// A client-streaming call: all ten messages are sent before the
	// server reads them; the sixth is refused.
	lim2 := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"chat": fivePerMinute})
	ic2, err := ratelimitgrpc.New(lim2, []string{"chat"}, ratelimitgrpc.WithStreamMessages())
	require.NoError(t, err)
	chat2 := &chatServer{}
	conn2 := serveChat(t, chat2, ic2.Stream())
	up, err := conn2.NewStream(ctx, &uploadDesc, uploadMethod)
	require.NoError(t, err)
	for i := range 10 {
		if err := up.SendMsg(wrapperspb.String(strconv.Itoa(i + 1))); err != nil {
			require.ErrorIs(t, err, io.EOF, "the server ended the stream")
			break
		}
	}
	require.NoError(t, up.CloseSend())
	err = up.RecvMsg(new(wrapperspb.Int64Value))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, []string{"12000"}, up.Trailer().Get(ratelimitgrpc.PushbackTrailer))
	assert.Equal(t, []codes.Code{codes.ResourceExhausted}, chat2.codes())
	assert.Zero(t, remaining(t, lim2, "chat"))
}

// Without WithStreamMessages a stream is decided once, when it opens,
// whatever it carries; with it naming some methods, only theirs are
// decided message by message; a server-streaming call, which carries one
// message, costs a token either way.
func TestStreamMessagesNotDecided(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, c := range []struct {
		name string
		opts []ratelimitgrpc.Option
	}{
		{"default", nil},
		{"other method", []ratelimitgrpc.Option{ratelimitgrpc.WithStreamMessages(uploadMethod)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"chat": fivePerMinute})
			ic, err := ratelimitgrpc.New(lim, []string{"chat"}, c.opts...)
			require.NoError(t, err)
			conn := serveChat(t, &chatServer{}, ic.Stream())
			cs, err := conn.NewStream(ctx, &talkDesc, talkMethod)
			require.NoError(t, err)
			for i := range 20 {
				got, err := say(t, cs, strconv.Itoa(i+1))
				require.NoError(t, err, "message %d", i+1)
				assert.Equal(t, "ack "+strconv.Itoa(i+1), got)
			}
			require.NoError(t, cs.CloseSend())
			require.ErrorIs(t, cs.RecvMsg(new(wrapperspb.StringValue)), io.EOF)
			assert.Equal(t, 4.0, remaining(t, lim, "chat"), "the open alone was charged")
		})
	}
	t.Run("server-streaming", func(t *testing.T) {
		lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"chat": fivePerMinute})
		ic, err := ratelimitgrpc.New(lim, []string{"chat"}, ratelimitgrpc.WithStreamMessages())
		require.NoError(t, err)
		conn := serveChat(t, &chatServer{}, ic.Stream())
		watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		_, err = watch.Recv()
		require.NoError(t, err)
		assert.Equal(t, 4.0, remaining(t, lim, "chat"))
	})
}

// A handler that goes on after a refusal gets the next message the
// limits grant; the stream ends with the handler's own status, without
// the refusal's pushback.
func TestStreamMessagesHandlerGoesOn(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mock := clock.NewMock()
	lim := newLimiter(t, nil, mock, ratelimit.Limits{"chat": fivePerMinute})
	ic, err := ratelimitgrpc.New(lim, []string{"chat"}, ratelimitgrpc.WithStreamMessages(talkMethod))
	require.NoError(t, err)
	chat := &chatServer{goOn: true}
	conn := serveChat(t, chat, ic.Stream())
	cs, err := conn.NewStream(ctx, &talkDesc, talkMethod)
	require.NoError(t, err)

	// t0: the open and four more messages drain the bucket.
	for i := range 5 {
		_, err := say(t, cs, strconv.Itoa(i+1))
		require.NoError(t, err)
	}
	for _, want := range []string{"refused ResourceExhausted", "refused ResourceExhausted"} {
		got, err := say(t, cs, "more")
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	mock.Add(12 * time.Second) // t12 s: a token
	got, err := say(t, cs, "7")
	require.NoError(t, err)
	assert.Equal(t, "ack 7", got)
	got, err = say(t, cs, "8")
	require.NoError(t, err)
	assert.Equal(t, "refused ResourceExhausted", got)

	require.NoError(t, cs.CloseSend())
	require.ErrorIs(t, cs.RecvMsg(new(wrapperspb.StringValue)), io.EOF, "the handler's status: OK")
	assert.Empty(t, cs.Trailer().Get(ratelimitgrpc.PushbackTrailer), "no pushback with an OK status")
}

// A message decided while the store is down follows its limits' failure
// policy, as a call does: fail closed, Unavailable with the breaker's
// cool-down, logged at most once a second; fail open, it goes on.
func TestStreamMessagesStoreDown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mock := clock.NewMock()
	store := &flakyStore{Store: must(memstore.New())}
	lim, err := ratelimit.New(store, ratelimit.Limits{
		"closed": {Kind: ratelimit.TokenBucket, Rate: 1000, Period: time.Minute},
		"open":   {Kind: ratelimit.TokenBucket, Rate: 1000, Period: time.Minute, FailOpen: true},
	}, ratelimit.WithClock(mock), ratelimit.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	var logs bytes.Buffer
	ic, err := ratelimitgrpc.New(lim, []string{"closed"}, ratelimitgrpc.WithMethod(uploadMethod, "open"),
		ratelimitgrpc.WithStreamMessages(), ratelimitgrpc.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	require.NoError(t, err)
	ratelimitgrpc.SetLogClock(ic, mock)

	t.Run("fail closed", func(t *testing.T) {
		chat := &chatServer{}
		conn := serveChat(t, chat, ic.Stream())
		cs, err := conn.NewStream(ctx, &talkDesc, talkMethod)
		require.NoError(t, err)
		for _, msg := range []string{"1", "2"} {
			_, err := say(t, cs, msg)
			require.NoError(t, err)
		}
		store.down.Store(true)
		defer store.down.Store(false)
		_, err = say(t, cs, "3")
		st := status.Convert(err)
		assert.Equal(t, codes.Unavailable, st.Code())
		assert.Equal(t, "rate limit unavailable: retry after 2s", st.Message())
		wait, ok := retryInfo(t, err)
		require.True(t, ok)
		assert.Equal(t, ratelimit.DefaultBreakerCooldown, wait)
		assert.Equal(t, []string{"2000"}, cs.Trailer().Get(ratelimitgrpc.PushbackTrailer))
		assert.Equal(t, []codes.Code{codes.Unavailable}, chat.codes())
		assert.Equal(t, []string{messageRefusedLine + " suppressed=0"}, logLines(t, &logs))
		assert.Contains(t, logs.String(), `"method":"`+talkMethod+`"`)
		assert.Contains(t, logs.String(), "connection refused", "the store's error is logged")
		assert.NotContains(t, logs.String(), "127.0.0.1", "the key is not")
	})
	logs.Reset()
	mock.Add(time.Minute)

	t.Run("logged once a second", func(t *testing.T) {
		chat := &chatServer{goOn: true}
		conn := serveChat(t, chat, ic.Stream())
		cs, err := conn.NewStream(ctx, &talkDesc, talkMethod)
		require.NoError(t, err)
		_, err = say(t, cs, "free")
		require.NoError(t, err)
		store.down.Store(true)
		defer store.down.Store(false)
		for range 10 {
			got, err := say(t, cs, "more")
			require.NoError(t, err)
			assert.Equal(t, "refused Unavailable", got)
		}
		assert.Equal(t, []string{messageRefusedLine + " suppressed=0"}, logLines(t, &logs))
		mock.Add(time.Second)
		assert.Equal(t, []string{messageRefusedLine + " suppressed=0", refusalsOverLine + " suppressed=9"}, logLines(t, &logs),
			"a second after the last refusal not logged, its count")
		mock.Add(time.Second)
		_, err = say(t, cs, "more")
		require.NoError(t, err)
		assert.Equal(t, []string{messageRefusedLine + " suppressed=0", refusalsOverLine + " suppressed=9", messageRefusedLine + " suppressed=0"},
			logLines(t, &logs))
	})

	t.Run("fail open", func(t *testing.T) {
		conn := serveChat(t, &chatServer{}, ic.Stream())
		up, err := conn.NewStream(ctx, &uploadDesc, uploadMethod)
		require.NoError(t, err)
		store.down.Store(true)
		defer store.down.Store(false)
		for i := range 10 {
			require.NoError(t, up.SendMsg(wrapperspb.String(strconv.Itoa(i+1))))
		}
		require.NoError(t, up.CloseSend())
		n := new(wrapperspb.Int64Value)
		require.NoError(t, up.RecvMsg(n))
		assert.Equal(t, int64(10), n.GetValue())
	})
}

const messageRefusedLine = "ratelimitgrpc: stream message refused: the store is unavailable and the limits fail closed"

// fakeStream is a server stream of queued messages, on a context of the
// test's.
type fakeStream struct {
	grpc.ServerStream // nil: what the tests do not call panics
	ctx               context.Context
	msgs              []string
	trailer           metadata.MD
}

func (s *fakeStream) Context() context.Context { return s.ctx }

func (s *fakeStream) RecvMsg(m any) error {
	if len(s.msgs) == 0 {
		return io.EOF
	}
	m.(*wrapperspb.StringValue).Value, s.msgs = s.msgs[0], s.msgs[1:]
	return nil
}

func (s *fakeStream) SetTrailer(md metadata.MD) { s.trailer = metadata.Join(s.trailer, md) }

// A message is decided with the stream's context: once the client is
// gone, RecvMsg returns Canceled, and the message spends nothing.
func TestStreamMessagesHonourContext(t *testing.T) {
	ctx, cancel := context.WithCancel(withPeer(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}))
	defer cancel()
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"chat": fivePerMinute})
	ic, err := ratelimitgrpc.New(lim, []string{"chat"}, ratelimitgrpc.WithStreamMessages(),
		ratelimitgrpc.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	ss := &fakeStream{ctx: ctx, msgs: []string{"1", "2", "3"}}
	var errs []error
	err = ic.Stream()(nil, ss, &grpc.StreamServerInfo{FullMethod: talkMethod, IsClientStream: true, IsServerStream: true},
		func(_ any, ss grpc.ServerStream) error {
			for range 3 {
				errs = append(errs, ss.RecvMsg(new(wrapperspb.StringValue)))
				if len(errs) == 2 {
					cancel() // the client goes away
				}
			}
			return errs[2]
		})
	require.Len(t, errs, 3)
	assert.NoError(t, errs[0])
	assert.NoError(t, errs[1])
	assert.Equal(t, codes.Canceled, status.Code(errs[2]))
	assert.Equal(t, codes.Canceled, status.Code(err))
	assert.Empty(t, ss.trailer)
	assert.Equal(t, 3.0, remaining(t, lim, "chat"), "the open and the second message; not the third")
}

// A refused message is dropped: a handler that calls RecvMsg with a
// message of its own, and goes on using it after an error (or reuses one
// message for every call), finds it empty, not holding the message the
// limits refused. RecvMsg had decoded the refused message into m before
// deciding it, and left it there.
func TestStreamMessagesRefusedIsDropped(t *testing.T) {
	ctx := withPeer(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1})
	lim := newLimiter(t, nil, clock.NewMock(), ratelimit.Limits{"chat": {Kind: ratelimit.TokenBucket, Rate: 2, Period: time.Minute}})
	ic, err := ratelimitgrpc.New(lim, []string{"chat"}, ratelimitgrpc.WithStreamMessages())
	require.NoError(t, err)
	ss := &fakeStream{ctx: ctx, msgs: []string{"1", "2", "3", "4"}}
	type recv struct {
		value string
		code  codes.Code
	}
	var got []recv
	err = ic.Stream()(nil, ss, &grpc.StreamServerInfo{FullMethod: talkMethod, IsClientStream: true, IsServerStream: true},
		func(_ any, ss grpc.ServerStream) error {
			m := new(wrapperspb.StringValue)
			for {
				err := ss.RecvMsg(m)
				if errors.Is(err, io.EOF) {
					return nil
				}
				got = append(got, recv{m.GetValue(), status.Code(err)})
			}
		})
	require.NoError(t, err)
	assert.Equal(t, []recv{{"1", codes.OK}, {"2", codes.OK}, {"", codes.ResourceExhausted}, {"", codes.ResourceExhausted}}, got)
}
