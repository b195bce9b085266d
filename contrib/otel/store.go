package ratelimitotel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/driver"
	"github.com/ratelimit-go/ratelimit/internal/deadline"
	"github.com/ratelimit-go/ratelimit/internal/isnil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// The names of the spans around store calls.
const (
	SpanApply         = "ratelimit.store.apply"
	SpanApplyBatch    = "ratelimit.store.apply_batch"
	SpanLoad          = "ratelimit.store.load"
	SpanDelete        = "ratelimit.store.delete"
	SpanDeleteExpired = "ratelimit.store.delete_expired"
	SpanNow           = "ratelimit.store.now"
)

// errNoClock is returned by Now of a wrapped store that keeps no clock of
// its own; a Limiter never asks, since OwnClock reports false.
var errNoClock = errors.New("ratelimitotel: the wrapped store keeps no clock of its own (OwnClock is false): use the Limiter's clock")

// WrapStore returns a Store that calls s inside a span for each call:
// Apply, Load, Delete, and, when s has them, ApplyBatch, DeleteExpired and
// Now. Spans are named SpanApply and so on, start on a tracer of the
// TracerProvider (WithTracerProvider; the global one by default) named
// ScopeName, carry the names of the limits the call touches (never the
// keys; a limit given inline by the name the call gave it, see LimitsKey),
// and record the store's error (its text made UTF-8, which exporters need).
//
// The Store returned implements driver.BatchApplier and DeleteExpired
// when s does, and driver.TimeSource and driver.RecordClock always:
// OwnClock reports s's answer, false when s is no TimeSource, and
// RecordNow s's Now when s is no RecordClock, so that a Limiter treats
// the wrapper as it would s. It is never a driver.Binder:
// a BoundLimit would decide calls without passing through the wrapper,
// so a Limiter decides every call through Apply and its span, with the
// same answers. Unwrap returns s.
//
// It is an io.Closer always: Close closes s when s is one (redisstore's
// and boltstore's stores are), and does nothing otherwise (but fail with
// driver.ErrZeroStore, as Now does, when s is a store its constructor did
// not make, &memstore.Store{}, whose calls all fail so), so that the
// wrapper can stand for the store it wraps wherever the store is closed
// (st := WrapStore(bs); defer st.(io.Closer).Close()).
//
// WrapStore returns nil when s is nil or holds a nil pointer (a store
// whose New failed, kept instead of its error), so that ratelimit.New
// refuses it with its error, as it would s: a wrapper around it would be
// accepted, and panic on the first decision.
//
// A nil Option (an option variable never set), or a provider that is a
// nil pointer, is a programming error, which ratelimit.New and
// NewObserver refuse with an error. WrapStore
// returns none: it panics at once, with an error matching
// ErrInvalidOption that names the option's place, as httplimit's Wrap
// does for a nil handler. Returning nil would have New blame the store,
// and a wrapper without the option meant would go unseen.
func WrapStore(s ratelimit.Store, opts ...Option) ratelimit.Store {
	c, err := newConfig("WrapStore", opts)
	if err != nil {
		panic(err)
	}
	if isnil.Is(s) {
		return nil
	}
	t := &tracedStore{next: s, tracer: c.tp.Tracer(ScopeName), attrs: c.attrs}
	t.clock, _ = s.(driver.TimeSource)
	b, isBatch := s.(driver.BatchApplier)
	if e, ok := s.(driver.Expirer); ok {
		if isBatch {
			return &struct {
				*tracedStore
				batch
				expire
			}{t, batch{t, b}, expire{t, e}}
		}
		return &struct {
			*tracedStore
			expire
		}{t, expire{t, e}}
	}
	if isBatch {
		return &struct {
			*tracedStore
			batch
		}{t, batch{t, b}}
	}
	return t
}

// tracedStore is the part of a wrapped store every store has; WrapStore returns
// it, or a type that embeds it with the wrapped store's other methods.
type tracedStore struct {
	next   ratelimit.Store
	clock  driver.TimeSource // nil when next keeps no clock
	tracer trace.Tracer
	attrs  []attribute.KeyValue
}

var (
	_ driver.TimeSource  = (*tracedStore)(nil)
	_ driver.RecordClock = (*tracedStore)(nil)
	_ io.Closer          = (*tracedStore)(nil)
)

// start starts the span of a store call, and reports whether it records,
// so that attributes are built only for a span that keeps them.
func (s *tracedStore) start(ctx context.Context, name string) (context.Context, storeSpan, bool) {
	ctx, span := s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
	rec := span.IsRecording()
	if rec && len(s.attrs) > 0 {
		span.SetAttributes(s.attrs...)
	}
	return ctx, storeSpan{Span: span}, rec
}

// storeSpan is the span of one store call. A method defers its
// endPanicked, so that the span ends, as an error, when the store panics;
// the panic goes on as it is (it is not recovered).
type storeSpan struct {
	trace.Span
	ended bool
}

// end records err, if any, and ends the span of a call made with ctx.
// The status is Error unless the call failed because ctx ended
// (callerEnded): the caller gave up, and the store did not fail.
func (s *storeSpan) end(ctx context.Context, err error) {
	if err != nil {
		msg, readable, caller := readError(ctx, err)
		if readable && utf8.ValidString(msg) {
			s.RecordError(err)
		} else {
			msg = strings.ToValidUTF8(msg, "\uFFFD") // exporters need UTF-8
			s.recordError(err, msg)
		}
		if !caller {
			s.SetStatus(codes.Error, msg)
		}
	}
	s.ended = true
	s.End()
}

// readError returns the text of err, the error of a store call made with
// ctx, whether that text is err's own, and whether err is the caller's
// (callerEnded). An error that is, or wraps, a nil pointer (a typed nil
// returned as an error, a common bug), or whose methods panic, is not
// read: its text is said in its stead, and it is no caller's. The Limiter
// takes such an error for a store failure and does not panic; the
// wrapper, which returns it as it is, must not panic before it.
func readError(ctx context.Context, err error) (msg string, readable, caller bool) {
	defer func() {
		if p := recover(); p != nil {
			msg = fmt.Sprintf("the store returned an error of type %T whose methods panic: %v", err, p)
			readable, caller = false, false
		}
	}()
	if n := isnil.InError(err); n != nil {
		what := fmt.Sprintf("a nil %T", n)
		if n != err {
			what = fmt.Sprintf("an error of type %T that wraps a nil %T", err, n)
		}
		return "the store returned " + what + ": a nil pointer returned as an error", false, false
	}
	return err.Error(), true, callerEnded(ctx, err)
}

// recordError records err as RecordError does, an exception event of its
// type and text, with msg, err's text made UTF-8, for its text. A store's
// error may name, unquoted, a key that is not UTF-8 (one of its own, or a
// server's message); OTLP's protobuf refuses such a string, and the
// exporter drops the whole batch of spans with it.
func (s *storeSpan) recordError(err error, msg string) {
	s.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(
		semconv.ExceptionType(errorType(err)), semconv.ExceptionMessage(msg)))
}

// errorType names the type of err as the SDK's RecordError does.
func errorType(err error) string {
	t := reflect.TypeOf(err)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String() // a pointer, or another unnamed type
	}
	return t.PkgPath() + "." + t.Name()
}

// callerEnded reports whether err, the error of a store call made with
// ctx, is ctx's own: ctx was canceled or its deadline passed, and err
// matches that (context.Canceled or context.DeadlineExceeded). A store's
// own timeout, with ctx live, is no caller's; nor is an error of another
// cause that came as ctx ended.
//
// The deadline is read by the rule of internal/deadline, as the Redis and
// PostgreSQL stores read it. A deadline the wall clock is past, of a
// context that has not ended (Unmet), is one whose timer is due and runs
// a moment later, or one of another clock, a Limiter's mock (its
// AfterFunc and Cancel bound their calls by it) that the wall clock is
// past long before the mock reaches it. A client that stops a read at
// the deadline may return before its context reports its end, so for an
// error matching context.DeadlineExceeded callerEnded waits a moment
// (deadline.Await) for ctx to end: then the deadline was the caller's, and
// otherwise another clock's, and the timeout the store's own. A deadline
// with a monotonic clock reading, which this used to take for the wall
// clock's, is no proof: a mock set from time.Now has one.
func callerEnded(ctx context.Context, err error) bool {
	cerr := ctx.Err()
	if cerr == nil && errors.Is(err, context.DeadlineExceeded) {
		switch _, st := deadline.Of(ctx); st {
		case deadline.Met:
			cerr = ctx.Err()
		case deadline.Unmet:
			cerr = deadline.Await(ctx)
		}
	}
	return cerr != nil && errors.Is(err, cerr)
}

// endPanicked ends the span of a call that did not return: the store
// panicked.
func (s *storeSpan) endPanicked() {
	if !s.ended {
		s.SetStatus(codes.Error, "the store panicked")
		s.End()
	}
}

// Apply calls the wrapped store's Apply in a span named SpanApply.
func (s *tracedStore) Apply(ctx context.Context, op *driver.Op, out []driver.Decision) error {
	ctx, span, rec := s.start(ctx, SpanApply)
	defer span.endPanicked()
	// A nil op is the store's to refuse (driver.ErrInvalidOp), as the
	// span then records: it has no attributes.
	if rec && op != nil {
		span.SetAttributes(ModeKey.String(modeName(op.Mode)), ReserveKey.Bool(op.Reserve), itemNames(op.Items))
		if op.Settle != nil {
			span.SetAttributes(SettleKey.String(op.Settle.Kind.String()))
		}
	}
	err := s.next.Apply(ctx, op, out)
	if rec && err == nil && op != nil {
		// Of the op's items only: out may be longer, and what lies
		// past them is not the op's. (A store refuses a shorter out.)
		mine := out[:min(len(op.Items), len(out))]
		ok := true
		for _, d := range mine {
			ok = ok && d.OK
		}
		span.SetAttributes(OKKey.Bool(ok))
		// A settlement found before is said alike in every decision.
		if op.Settle != nil && len(mine) > 0 && mine[0].Settled != 0 {
			span.SetAttributes(SettledKey.String(mine[0].Settled.String()), SettledOwnKey.Bool(mine[0].Own))
		}
	}
	span.end(ctx, err)
	return err
}

// Load calls the wrapped store's Load in a span named SpanLoad.
func (s *tracedStore) Load(ctx context.Context, ids []driver.RecordID, out []driver.Record) error {
	ctx, span, rec := s.start(ctx, SpanLoad)
	defer span.endPanicked()
	if rec {
		span.SetAttributes(idNames(ids), RecordsKey.Int(len(ids)))
	}
	err := s.next.Load(ctx, ids, out)
	span.end(ctx, err)
	return err
}

// Delete calls the wrapped store's Delete in a span named SpanDelete.
func (s *tracedStore) Delete(ctx context.Context, ids []driver.RecordID) error {
	ctx, span, rec := s.start(ctx, SpanDelete)
	defer span.endPanicked()
	if rec {
		span.SetAttributes(idNames(ids), RecordsKey.Int(len(ids)))
	}
	err := s.next.Delete(ctx, ids)
	span.end(ctx, err)
	return err
}

// OwnClock reports whether the wrapped store takes the time from its own
// clock: false when it is no driver.TimeSource.
func (s *tracedStore) OwnClock() bool { return s.clock != nil && s.clock.OwnClock() }

// Now calls the wrapped store's Now in a span named SpanNow. A store that
// is no driver.TimeSource has no time to give: Now returns an error (the
// context's, when it is done, as package driver requires, and the
// store's matching driver.ErrZeroStore when its constructor did not make
// it), and OwnClock false tells a Limiter not to ask.
func (s *tracedStore) Now(ctx context.Context) (int64, error) {
	if s.clock == nil {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := s.zeroErr(); err != nil {
			return 0, err
		}
		return 0, errNoClock
	}
	ctx, span, _ := s.start(ctx, SpanNow)
	defer span.endPanicked()
	now, err := s.clock.Now(ctx)
	span.end(ctx, err)
	return now, err
}

// RecordNow calls the wrapped store's RecordNow (driver.RecordClock: the
// clock of the server that holds id, of a store over several servers) in
// a span named SpanNow, as Now does; a store that is no RecordClock keeps
// one clock for every record, and is asked its Now. A Limiter asks it
// rather than Now, as it would s.
func (s *tracedStore) RecordNow(ctx context.Context, id driver.RecordID) (int64, error) {
	rc, ok := s.next.(driver.RecordClock)
	if !ok || s.clock == nil {
		return s.Now(ctx)
	}
	ctx, span, _ := s.start(ctx, SpanNow)
	defer span.endPanicked()
	now, err := rc.RecordNow(ctx, id)
	span.end(ctx, err)
	return now, err
}

// Close closes the wrapped store when it is an io.Closer, and returns its
// error; it returns nil for a store that is none, which has nothing to
// close, unless its constructor did not make it (zeroErr). It makes no
// span: closing is no call of a Limiter's.
func (s *tracedStore) Close() error {
	if c, ok := s.next.(io.Closer); ok {
		return c.Close()
	}
	return s.zeroErr()
}

// zeroErr returns the error, matching driver.ErrZeroStore, of a wrapped
// store its constructor did not make (&memstore.Store{}), or nil: the
// wrapper's Now of a store that keeps no clock, and its Close of one that
// has no Close, have no call of the store to pass on, and a store's zero
// value must fail them with that error as it fails the others. It asks
// the store without a call (driver.CheckZero); a store that cannot tell
// is taken for one its constructor made.
func (s *tracedStore) zeroErr() error { return driver.CheckZero(s.next) }

// Unwrap returns the wrapped store.
func (s *tracedStore) Unwrap() ratelimit.Store { return s.next }

type batch struct {
	s    *tracedStore
	next driver.BatchApplier
}

// ApplyBatch calls the wrapped store's ApplyBatch in a span named
// SpanApplyBatch.
func (b batch) ApplyBatch(ctx context.Context, ops []*driver.Op, outs [][]driver.Decision) error {
	ctx, span, rec := b.s.start(ctx, SpanApplyBatch)
	defer span.endPanicked()
	if rec {
		var items []driver.Item
		for _, op := range ops {
			if op != nil { // refused by the store, as the span records
				items = append(items, op.Items...)
			}
		}
		span.SetAttributes(OpsKey.Int(len(ops)), itemNames(items))
	}
	err := b.next.ApplyBatch(ctx, ops, outs)
	span.end(ctx, err)
	return err
}

type expire struct {
	s    *tracedStore
	next driver.Expirer
}

// DeleteExpired calls the wrapped store's DeleteExpired in a span named
// SpanDeleteExpired.
func (e expire) DeleteExpired(ctx context.Context, now time.Time) (int, error) {
	ctx, span, rec := e.s.start(ctx, SpanDeleteExpired)
	defer span.endPanicked()
	n, err := e.next.DeleteExpired(ctx, now)
	if rec {
		span.SetAttributes(RecordsKey.Int(n))
	}
	span.end(ctx, err)
	return n, err
}

func modeName(m driver.Mode) string {
	switch m {
	case driver.ModeLimit:
		return "limit"
	case driver.ModeCheck:
		return "check"
	case driver.ModeRefund:
		return "refund"
	}
	return "unknown"
}

// itemNames is the LimitsKey attribute of items: their names, once each.
func itemNames(items []driver.Item) attribute.KeyValue {
	names := make([]string, 0, len(items))
	for _, it := range items {
		names = appendNew(names, it.Name)
	}
	return LimitsKey.StringSlice(names)
}

// idNames is the LimitsKey attribute of ids: their names, once each.
func idNames(ids []driver.RecordID) attribute.KeyValue {
	names := make([]string, 0, 1)
	for _, id := range ids {
		names = appendNew(names, id.Name)
	}
	return LimitsKey.StringSlice(names)
}

func appendNew(names []string, name string) []string {
	name = strings.ToValidUTF8(name, "\uFFFD") // exporters need UTF-8
	for _, n := range names {
		if n == name {
			return names
		}
	}
	return append(names, name)
}
