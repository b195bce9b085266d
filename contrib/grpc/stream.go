package ratelimitgrpc

import (
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// messageStream is the stream a handler is given under WithStreamMessages:
// its RecvMsg decides each message after the first, which the stream's
// open paid for, by the limits and the key the open was decided by.
type messageStream struct {
	grpc.ServerStream
	ic     *Interceptor
	method string
	names  []string
	key    string
	// first is set once the first message, paid for by the open, was
	// received. RecvMsg is called by one goroutine at a time (as
	// grpc.ServerStream requires), which alone reads and writes it.
	first bool
	// refused is the last refusal RecvMsg returned, for Stream to send
	// its pushback if the handler ends the stream with it; atomic, for a
	// handler that returns while one of its goroutines still receives.
	refused atomic.Pointer[messageRefusal]
}

// messageRefusal is a refusal of a message: the error RecvMsg returned,
// and its pushback trailer.
type messageRefusal struct {
	err      error
	pushback metadata.MD
}

// RecvMsg receives the client's next message and decides it: it returns
// the refusal's status as an error, and drops the message, when the
// limits do not grant it. End of stream (io.EOF) and the stream's own
// errors are returned as they are, and spend nothing.
//
// The message is decoded into m before it is decided: a refused one is
// cleared from m (Reset, which every generated protocol buffer message
// has), so that a handler that reads m after the error, or reuses m for
// the next call, does not work on a message the limits refused.
func (s *messageStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if !s.first {
		s.first = true
		return nil
	}
	st, pushback := s.ic.charge(s.Context(), &messageUnit, s.method, s.names, s.key)
	if st == nil {
		return nil
	}
	if r, ok := m.(interface{ Reset() }); ok {
		r.Reset()
	}
	err := st.Err()
	if pushback != nil {
		s.refused.Store(&messageRefusal{err: err, pushback: pushback})
	}
	return err
}
